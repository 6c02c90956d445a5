package publicapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
)

// Memory stores, as the Managed Agents API has them (versions in
// memoryversions.go, session resources in memoryresources.go):
//
//	POST   /v1/memory_stores                        create {name, description?, metadata?}
//	GET    /v1/memory_stores                        list (limit, page, include_archived, created_at[gte|lte])
//	GET    /v1/memory_stores/{id}                   get
//	POST   /v1/memory_stores/{id}                   update {name?, description?, metadata?}
//	POST   /v1/memory_stores/{id}/archive           archive (read-only from then on)
//	DELETE /v1/memory_stores/{id}                   delete, with every memory and version
//	POST   /v1/memory_stores/{id}/memories          create {path, content}
//	GET    /v1/memory_stores/{id}/memories          list in path order (path_prefix, depth, limit, page, view)
//	GET    /v1/memory_stores/{id}/memories/{memory_id}    get (view full by default)
//	POST   /v1/memory_stores/{id}/memories/{memory_id}    update {path?, content?, precondition?}
//	DELETE /v1/memory_stores/{id}/memories/{memory_id}    delete (expected_content_sha256)
//	GET    /v1/memory_stores/{id}/memory_versions          list, newest first (memory_id, operation, session_id, api_key_id, ...)
//	GET    /v1/memory_stores/{id}/memory_versions/{version_id}         get
//	POST   /v1/memory_stores/{id}/memory_versions/{version_id}/redact  redact
//
// A content_sha256 precondition that does not hold is a 409 and changes
// nothing. Every write records a version with who made it: the API key
// (api_actor), the principal (user_actor), or the session whose agent
// wrote through the store's mount (session_actor). The store owns the
// bounds (store.MaxMemoryBytes and the store's totals).

// maxMemorySegments bounds a listing's depth (a memory path's segments).
const maxMemorySegments = store.MaxMemorySegments

// memoryPath checks a memory path as the API has it (store.CheckMemoryPath).
func memoryPath(p, what string) error { return store.CheckMemoryPath(p, what) }

// memoryPrefix checks a path_prefix: "/" or a path that ends with "/".
func memoryPrefix(p string) error {
	if p == "/" {
		return nil
	}
	if !strings.HasSuffix(p, "/") {
		return errdefs.InvalidArgument("path_prefix %q must end with /", truncate(p))
	}
	return memoryPath(strings.TrimSuffix(p, "/"), "path_prefix")
}

// memoryContent checks a memory's content: UTF-8 within the bound.
func memoryContent(s, what string) error {
	if !utf8.ValidString(s) {
		return errdefs.InvalidArgument("%s is not valid UTF-8", what)
	}
	if len(s) > store.MaxMemoryBytes {
		return errdefs.TooLarge("%s is %d bytes; at most %d are allowed", what, len(s), store.MaxMemoryBytes)
	}
	return nil
}

// sha256Param checks a content_sha256 as the API has it.
func sha256Param(s, what string) error {
	if len(s) != 64 || strings.Trim(s, "0123456789abcdef") != "" {
		return errdefs.InvalidArgument("%s must be 64 lowercase hexadecimal characters", what)
	}
	return nil
}

// actorOf is who the request's principal is, as memory versions record it.
func actorOf(ctx context.Context) store.Actor {
	p, _ := auth.From(ctx)
	if p.Method == auth.MethodAPIKey && p.KeyID != "" {
		return store.Actor{Type: store.ActorAPI, ID: p.KeyID}
	}
	return store.Actor{Type: store.ActorUser, ID: p.PrincipalID}
}

type memoryStoreResponse struct {
	Type        string            `json:"type"`
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Metadata    map[string]string `json:"metadata"`
	CreatedAt   string            `json:"created_at"`
	UpdatedAt   string            `json:"updated_at"`
	ArchivedAt  *string           `json:"archived_at"`
}

func memoryStoreOut(m store.MemoryStore) memoryStoreResponse {
	return memoryStoreResponse{Type: "memory_store", ID: m.ID, Name: m.Name, Description: m.Description, Metadata: m.Metadata,
		CreatedAt: ts(m.CreatedAt), UpdatedAt: ts(m.UpdatedAt), ArchivedAt: tsPtr(m.ArchivedAt)}
}

type memoryResponse struct {
	Type             string  `json:"type"`
	ID               string  `json:"id"`
	MemoryStoreID    string  `json:"memory_store_id"`
	MemoryVersionID  string  `json:"memory_version_id"`
	Path             string  `json:"path"`
	Content          *string `json:"content"`
	ContentSHA256    string  `json:"content_sha256"`
	ContentSizeBytes int64   `json:"content_size_bytes"`
	CreatedAt        string  `json:"created_at"`
	UpdatedAt        string  `json:"updated_at"`
}

func memoryOut(m store.Memory, full bool) memoryResponse {
	out := memoryResponse{Type: "memory", ID: m.ID, MemoryStoreID: m.StoreID, MemoryVersionID: m.VersionID, Path: m.Path,
		ContentSHA256: m.SHA256, ContentSizeBytes: m.SizeBytes, CreatedAt: ts(m.CreatedAt), UpdatedAt: ts(m.UpdatedAt)}
	if full {
		out.Content = &m.Content
	}
	return out
}

type actorResponse struct {
	Type             string `json:"type"`
	APIKeyID         string `json:"api_key_id,omitempty"`
	UserID           string `json:"user_id,omitempty"`
	ServiceAccountID string `json:"service_account_id,omitempty"`
	SessionID        string `json:"session_id,omitempty"`
}

func actorOut(a *store.Actor) *actorResponse {
	if a == nil || a.Type == "" {
		return nil
	}
	out := &actorResponse{Type: a.Type}
	switch a.Type {
	case store.ActorAPI:
		out.APIKeyID = a.ID
	case store.ActorSession:
		out.SessionID = a.ID
	case store.ActorServiceAccount:
		out.ServiceAccountID = a.ID
	default:
		out.UserID = a.ID
	}
	return out
}

// Bounds of a store's name and description.
const (
	maxMemoryStoreName        = 255
	maxMemoryStoreDescription = 2048
)

type memoryStoreFields struct {
	Name        json.RawMessage `json:"name"`
	Description json.RawMessage `json:"description"`
	Metadata    json.RawMessage `json:"metadata"`
}

func (h *Handler) createMemoryStore(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var f memoryStoreFields
	if err := decodeObject(b, "request body", &f); err != nil {
		h.fail(w, r, err)
		return
	}
	var m store.MemoryStore
	if m.Name, err = stringField(f.Name, "name"); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := checkLen(m.Name, "name", 1, maxMemoryStoreName); err != nil {
		h.fail(w, r, err)
		return
	}
	if present(f.Description) && !isNull(f.Description) {
		if err := field(f.Description, "description", &m.Description); err != nil {
			h.fail(w, r, err)
			return
		}
		if err := checkLen(m.Description, "description", 0, maxMemoryStoreDescription); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	if m.Metadata, err = metadataCreate(f.Metadata); err != nil {
		h.fail(w, r, err)
		return
	}
	m, err = h.store.MemoryStores().Create(r.Context(), m)
	h.writeMemoryStore(w, r, m, err)
}

func (h *Handler) writeMemoryStore(w http.ResponseWriter, r *http.Request, m store.MemoryStore, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryStoreOut(m))
}

func (h *Handler) getMemoryStore(w http.ResponseWriter, r *http.Request) {
	m, err := h.store.MemoryStores().Get(r.Context(), r.PathValue("id"))
	h.writeMemoryStore(w, r, m, err)
}

func (h *Handler) updateMemoryStore(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var f memoryStoreFields
	if err := decodeObject(b, "request body", &f); err != nil {
		h.fail(w, r, err)
		return
	}
	m, err := h.store.MemoryStores().Update(r.Context(), r.PathValue("id"), func(cur store.MemoryStore) (store.MemoryStore, error) {
		if present(f.Name) && !isNull(f.Name) {
			if err := field(f.Name, "name", &cur.Name); err != nil {
				return cur, err
			}
			if err := checkLen(cur.Name, "name", 1, maxMemoryStoreName); err != nil {
				return cur, err
			}
		}
		if present(f.Description) {
			cur.Description = ""
			if !isNull(f.Description) {
				if err := field(f.Description, "description", &cur.Description); err != nil {
					return cur, err
				}
			}
			if err := checkLen(cur.Description, "description", 0, maxMemoryStoreDescription); err != nil {
				return cur, err
			}
		}
		md, err := metadataPatch(cur.Metadata, f.Metadata, true)
		cur.Metadata = md
		return cur, err
	})
	h.writeMemoryStore(w, r, m, err)
}

func (h *Handler) archiveMemoryStore(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	m, err := h.store.MemoryStores().Archive(r.Context(), r.PathValue("id"))
	h.writeMemoryStore(w, r, m, err)
}

func (h *Handler) deleteMemoryStore(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	if err := h.store.MemoryStores().Delete(r.Context(), id); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "type": "memory_store_deleted"})
}

func (h *Handler) listMemoryStores(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var opts store.MemoryStoreListOptions
	var err error
	if opts.Limit, err = queryLimit(q); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.IncludeArchived, err = queryBool(q, "include_archived"); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.CreatedGte, err = queryTime(q, "created_at[gte]"); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.CreatedLte, err = queryTime(q, "created_at[lte]"); err != nil {
		h.fail(w, r, err)
		return
	}
	c, err := decodeCursor(q, "memory_stores", "desc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if c != nil {
		opts.After = c.key()
	}
	ms, more, err := h.store.MemoryStores().List(r.Context(), opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[memoryStoreResponse]{Data: []memoryStoreResponse{}}
	for _, m := range ms {
		out.Data = append(out.Data, memoryStoreOut(m))
	}
	if more && len(ms) > 0 {
		last := ms[len(ms)-1]
		out.NextPage = keyCursor("memory_stores", "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// queryView parses view: basic or full, def when absent.
func queryView(r *http.Request, def string) (bool, error) {
	v := r.URL.Query().Get("view")
	if v == "" {
		v = def
	}
	if v != "basic" && v != "full" {
		return false, enumError("view", v, []string{"basic", "full"})
	}
	return v == "full", nil
}

type memoryFields struct {
	Path         json.RawMessage `json:"path"`
	Content      json.RawMessage `json:"content"`
	Precondition json.RawMessage `json:"precondition"`
}

func (h *Handler) createMemory(w http.ResponseWriter, r *http.Request) {
	full, err := queryView(r, "basic")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var f memoryFields
	if err := decodeObject(b, "request body", &f); err != nil {
		h.fail(w, r, err)
		return
	}
	if present(f.Precondition) {
		h.fail(w, r, errdefs.InvalidArgument("precondition: not a field of a memory create"))
		return
	}
	path, err := stringField(f.Path, "path")
	if err == nil {
		err = memoryPath(path, "path")
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !present(f.Content) || isNull(f.Content) {
		h.fail(w, r, errdefs.InvalidArgument("content is required (\"\" for an empty memory)"))
		return
	}
	var content string
	if err := field(f.Content, "content", &content); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := memoryContent(content, "content"); err != nil {
		h.fail(w, r, err)
		return
	}
	m, err := h.store.MemoryStores().CreateMemory(r.Context(), r.PathValue("id"), path, content, actorOf(r.Context()))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryOut(m, full))
}

func (h *Handler) getMemory(w http.ResponseWriter, r *http.Request) {
	full, err := queryView(r, "full")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	m, err := h.store.MemoryStores().GetMemory(r.Context(), r.PathValue("id"), r.PathValue("memory_id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryOut(m, full))
}

func (h *Handler) updateMemory(w http.ResponseWriter, r *http.Request) {
	full, err := queryView(r, "basic")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var f memoryFields
	if err := decodeObject(b, "request body", &f); err != nil {
		h.fail(w, r, err)
		return
	}
	var u store.MemoryUpdate
	if present(f.Path) && !isNull(f.Path) {
		var p string
		if err := field(f.Path, "path", &p); err != nil {
			h.fail(w, r, err)
			return
		}
		if err := memoryPath(p, "path"); err != nil {
			h.fail(w, r, err)
			return
		}
		u.Path = &p
	}
	if present(f.Content) && !isNull(f.Content) {
		var c string
		if err := field(f.Content, "content", &c); err != nil {
			h.fail(w, r, err)
			return
		}
		if err := memoryContent(c, "content"); err != nil {
			h.fail(w, r, err)
			return
		}
		u.Content = &c
	}
	if present(f.Precondition) && !isNull(f.Precondition) {
		var pc struct {
			Type          string `json:"type"`
			ContentSHA256 string `json:"content_sha256"`
		}
		if err := field(f.Precondition, "precondition", &pc); err != nil {
			h.fail(w, r, err)
			return
		}
		if pc.Type != "" && pc.Type != "content_sha256" {
			h.fail(w, r, enumError("precondition.type", pc.Type, []string{"content_sha256"}))
			return
		}
		if err := sha256Param(pc.ContentSHA256, "precondition.content_sha256"); err != nil {
			h.fail(w, r, err)
			return
		}
		u.ExpectSHA256 = pc.ContentSHA256
	}
	m, err := h.store.MemoryStores().UpdateMemory(r.Context(), r.PathValue("id"), r.PathValue("memory_id"), u, actorOf(r.Context()))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryOut(m, full))
}

func (h *Handler) deleteMemory(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	expect := r.URL.Query().Get("expected_content_sha256")
	if expect != "" {
		if err := sha256Param(expect, "expected_content_sha256"); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	id := r.PathValue("memory_id")
	if err := h.store.MemoryStores().DeleteMemory(r.Context(), r.PathValue("id"), id, expect, actorOf(r.Context())); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "type": "memory_deleted"})
}

type memoryPrefixResponse struct {
	Type string `json:"type"`
	Path string `json:"path"`
}

func (h *Handler) listMemories(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	full, err := queryView(r, "basic")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var opts store.MemoryListOptions
	if opts.Limit, err = queryLimit(q); err != nil {
		h.fail(w, r, err)
		return
	}
	if full && opts.Limit > 20 {
		opts.Limit = 20 // the API's cap with view=full
	}
	if opts.Prefix = q.Get("path_prefix"); opts.Prefix != "" {
		if err := memoryPrefix(opts.Prefix); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	if s := q.Get("depth"); s != "" {
		if opts.Depth, err = strconv.Atoi(s); err != nil || opts.Depth < 0 || opts.Depth > maxMemorySegments {
			h.fail(w, r, errdefs.InvalidArgument("depth: %q is not an integer from 0 to %d", truncate(s), maxMemorySegments))
			return
		}
	}
	storeID := r.PathValue("id")
	list := fmt.Sprintf("memories:%s:%d:%s", storeID, opts.Depth, opts.Prefix)
	c, err := decodeCursor(q, list, "asc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if c != nil {
		opts.From = c.ID
	}
	items, next, err := h.store.MemoryStores().ListMemories(r.Context(), storeID, opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[any]{Data: []any{}}
	for _, it := range items {
		if it.Memory != nil {
			out.Data = append(out.Data, memoryOut(*it.Memory, full))
		} else {
			out.Data = append(out.Data, memoryPrefixResponse{Type: "memory_prefix", Path: it.Prefix})
		}
	}
	if next != "" {
		out.NextPage = cursor{List: list, Order: "asc", ID: next}.encode()
	}
	writeJSON(w, http.StatusOK, out)
}

// memoryRoutes are the memory store routes, which Register mounts with
// the rest.
func (h *Handler) memoryRoutes() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"POST /v1/memory_stores":                                          h.createMemoryStore,
		"GET /v1/memory_stores":                                           h.listMemoryStores,
		"GET /v1/memory_stores/{id}":                                      h.getMemoryStore,
		"POST /v1/memory_stores/{id}":                                     h.updateMemoryStore,
		"POST /v1/memory_stores/{id}/archive":                             h.archiveMemoryStore,
		"DELETE /v1/memory_stores/{id}":                                   h.deleteMemoryStore,
		"POST /v1/memory_stores/{id}/memories":                            h.createMemory,
		"GET /v1/memory_stores/{id}/memories":                             h.listMemories,
		"GET /v1/memory_stores/{id}/memories/{memory_id}":                 h.getMemory,
		"POST /v1/memory_stores/{id}/memories/{memory_id}":                h.updateMemory,
		"DELETE /v1/memory_stores/{id}/memories/{memory_id}":              h.deleteMemory,
		"GET /v1/memory_stores/{id}/memory_versions":                      h.listMemoryVersions,
		"GET /v1/memory_stores/{id}/memory_versions/{version_id}":         h.getMemoryVersion,
		"POST /v1/memory_stores/{id}/memory_versions/{version_id}/redact": h.redactMemoryVersion,
	}
}
