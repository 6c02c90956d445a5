package publicapi

import (
	"net/http"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
)

// Memory versions: a store's history of writes, listed newest first,
// each with its author; redaction clears a version's content and keeps
// its record (memory.go has the routes).

type memoryVersionResponse struct {
	Type             string         `json:"type"`
	ID               string         `json:"id"`
	MemoryID         string         `json:"memory_id"`
	MemoryStoreID    string         `json:"memory_store_id"`
	Operation        string         `json:"operation"`
	Path             *string        `json:"path"`
	Content          *string        `json:"content"`
	ContentSHA256    *string        `json:"content_sha256"`
	ContentSizeBytes *int64         `json:"content_size_bytes"`
	CreatedBy        *actorResponse `json:"created_by"`
	CreatedAt        string         `json:"created_at"`
	RedactedAt       *string        `json:"redacted_at"`
	RedactedBy       *actorResponse `json:"redacted_by"`
}

func memoryVersionOut(v store.MemoryVersion, full bool) memoryVersionResponse {
	out := memoryVersionResponse{Type: "memory_version", ID: v.ID, MemoryID: v.MemoryID, MemoryStoreID: v.StoreID, Operation: v.Operation,
		Path: v.Path, ContentSHA256: v.SHA256, ContentSizeBytes: v.SizeBytes, CreatedBy: actorOut(&v.CreatedBy),
		CreatedAt: ts(v.CreatedAt), RedactedAt: tsPtr(v.RedactedAt), RedactedBy: actorOut(v.RedactedBy)}
	if full {
		out.Content = v.Content
	}
	return out
}

func (h *Handler) listMemoryVersions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	full, err := queryView(r, "basic")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var opts store.MemoryVersionListOptions
	if opts.Limit, err = queryLimit(q); err != nil {
		h.fail(w, r, err)
		return
	}
	if full && opts.Limit > 20 {
		opts.Limit = 20
	}
	if opts.CreatedGte, err = queryTime(q, "created_at[gte]"); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.CreatedLte, err = queryTime(q, "created_at[lte]"); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.MemoryID = q.Get("memory_id"); opts.MemoryID != "" && !validID(opts.MemoryID) {
		h.fail(w, r, errdefs.InvalidArgument("memory_id: %q is not the id of a memory", truncate(opts.MemoryID)))
		return
	}
	switch op := q.Get("operation"); op {
	case "", store.MemoryCreated, store.MemoryModified, store.MemoryDeleted:
		opts.Operation = op
	default:
		h.fail(w, r, enumError("operation", op, []string{store.MemoryCreated, store.MemoryModified, store.MemoryDeleted}))
		return
	}
	for _, a := range []struct{ param, typ string }{{"session_id", store.ActorSession}, {"api_key_id", store.ActorAPI},
		{"user_id", store.ActorUser}, {"service_account_id", store.ActorServiceAccount}} {
		v := q.Get(a.param)
		if v == "" {
			continue
		}
		if opts.Actor != nil {
			h.fail(w, r, errdefs.InvalidArgument("%s: only one of session_id, api_key_id, user_id and service_account_id may be given", a.param))
			return
		}
		if !validID(v) {
			h.fail(w, r, errdefs.InvalidArgument("%s: %q is not an id", a.param, truncate(v)))
			return
		}
		opts.Actor = &store.Actor{Type: a.typ, ID: v}
	}
	storeID := r.PathValue("id")
	list := "memory_versions:" + storeID
	c, err := decodeCursor(q, list, "desc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if c != nil {
		opts.After = c.key()
	}
	vs, more, err := h.store.MemoryStores().ListVersions(r.Context(), storeID, opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[memoryVersionResponse]{Data: []memoryVersionResponse{}}
	for _, v := range vs {
		out.Data = append(out.Data, memoryVersionOut(v, full))
	}
	if more && len(vs) > 0 {
		last := vs[len(vs)-1]
		out.NextPage = keyCursor(list, "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) getMemoryVersion(w http.ResponseWriter, r *http.Request) {
	full, err := queryView(r, "full")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	v, err := h.store.MemoryStores().GetVersion(r.Context(), r.PathValue("id"), r.PathValue("version_id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryVersionOut(v, full))
}

func (h *Handler) redactMemoryVersion(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	v, err := h.store.MemoryStores().RedactVersion(r.Context(), r.PathValue("id"), r.PathValue("version_id"), actorOf(r.Context()))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryVersionOut(v, true))
}
