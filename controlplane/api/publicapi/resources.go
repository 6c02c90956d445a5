package publicapi

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/errdefs"
)

// Session resources, as the Managed Agents API has them:
//
//	POST   /v1/sessions                                      resources[] on create
//	GET    /v1/sessions/{session_id}/resources               list (limit, page)
//	POST   /v1/sessions/{session_id}/resources               add a file
//	GET    /v1/sessions/{session_id}/resources/{resource_id} get
//	POST   /v1/sessions/{session_id}/resources/{resource_id} update (github_repository only: refused)
//	DELETE /v1/sessions/{session_id}/resources/{resource_id} delete {id, type:"session_resource_deleted"}
//
// File and memory_store resources are taken (a memory store only at
// create, memory.go says how it is mounted): a file of the tenant's (the Files API),
// mounted read-only in the session's sandbox at mount_path (default
// /mnt/session/uploads/<file_id>; a relative path is taken beneath
// /mnt/session/uploads and reported resolved; tools.UploadPath says what
// else is allowed, all beneath /mnt/session/uploads). A github_repository needs
// the sandbox's egress to clone, which corral does not have yet: it is
// refused with a 400 that says so. The resources are kept on the session row (its resources column,
// the wire objects themselves); the fleet stages them into the session's
// sandbox before its next tool call (fleet/resources.go).

// maxResources bounds a session's resources.
const maxResources = 100

// SessionResourceIDPrefix is the prefix of session resource ids.
const SessionResourceIDPrefix = "sesrsc_"

// sessionResource is the wire form of a file resource, as the session
// stores it.
type sessionResource struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	FileID    string `json:"file_id,omitempty"`
	MountPath string `json:"mount_path"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
	// A memory_store's (memory.go): the store, its access, the
	// instructions, and its name and description as they were attached.
	MemoryStoreID string  `json:"memory_store_id,omitempty"`
	Access        string  `json:"access,omitempty"`
	Instructions  *string `json:"instructions,omitempty"`
	Name          *string `json:"name,omitempty"`
	Description   *string `json:"description,omitempty"`
}

// resourceParams is a resource as a create or an add sends it.
type resourceParams struct {
	Type               json.RawMessage `json:"type"`
	FileID             json.RawMessage `json:"file_id"`
	MountPath          json.RawMessage `json:"mount_path"`
	URL                json.RawMessage `json:"url"`
	Checkout           json.RawMessage `json:"checkout"`
	AuthorizationToken json.RawMessage `json:"authorization_token"`
	MemoryStoreID      json.RawMessage `json:"memory_store_id"`
	Access             json.RawMessage `json:"access"`
	Instructions       json.RawMessage `json:"instructions"`
}

// decodeResource validates one resource: a file, its id and mount path.
// It does not look the file up (checkFiles does).
func decodeResource(raw json.RawMessage, path string) (sessionResource, error) {
	var p resourceParams
	if err := field(raw, path, &p); err != nil {
		return sessionResource{}, err
	}
	typ := "file"
	if present(p.Type) && !isNull(p.Type) {
		if err := field(p.Type, path+".type", &typ); err != nil {
			return sessionResource{}, err
		}
	}
	switch typ {
	case "file":
	case "github_repository":
		return sessionResource{}, errdefs.InvalidArgument("%s: github_repository resources are not supported by this server yet: cloning a repository needs the sandbox's network egress, which corral does not provide yet; upload the files you need (POST /v1/files) and mount them as file resources", path)
	case "memory_store":
		return decodeMemoryResource(p, path)
	default:
		return sessionResource{}, enumError(path+".type", typ, []string{"file", "github_repository", "memory_store"})
	}
	for name, v := range map[string]json.RawMessage{"url": p.URL, "checkout": p.Checkout, "authorization_token": p.AuthorizationToken,
		"memory_store_id": p.MemoryStoreID, "access": p.Access, "instructions": p.Instructions} {
		if present(v) {
			return sessionResource{}, errdefs.InvalidArgument("%s.%s: not a field of a file resource", path, name)
		}
	}
	fileID, err := stringField(p.FileID, path+".file_id")
	if err != nil {
		return sessionResource{}, err
	}
	if !validID(fileID) || !strings.HasPrefix(fileID, store.FileIDPrefix) {
		return sessionResource{}, errdefs.InvalidArgument("%s.file_id: %q is not the id of a file", path, truncate(fileID))
	}
	mount := tools.Uploads + "/" + fileID
	if present(p.MountPath) && !isNull(p.MountPath) {
		if err := field(p.MountPath, path+".mount_path", &mount); err != nil {
			return sessionResource{}, err
		}
		if mount != "" && !strings.HasPrefix(mount, "/") {
			// Relative to the uploads (the SDK's agents-with-files
			// example mounts "data.csv"); reported resolved.
			mount = tools.Uploads + "/" + mount
		}
		if _, err := tools.UploadPath(mount); err != nil {
			return sessionResource{}, errdefs.InvalidArgument("%s.mount_path: %v", path, truncateErr(err))
		}
		if mount == tools.Skills || strings.HasPrefix(mount, tools.Skills+"/") {
			return sessionResource{}, errdefs.InvalidArgument("%s.mount_path: %s is where the session's skills are; mount files elsewhere", path, tools.Skills)
		}
		if mount == tools.Reserved || strings.HasPrefix(mount, tools.Reserved+"/") {
			return sessionResource{}, errdefs.InvalidArgument("%s.mount_path: %s is reserved for what the host stages itself; mount files elsewhere", path, tools.Reserved)
		}
	}
	return sessionResource{Type: "file", FileID: fileID, MountPath: mount}, nil
}

// truncateErr bounds an error's text that quotes what the caller sent.
func truncateErr(err error) string {
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// errSelfHostedResources refuses resources for a self-hosted session:
// they are mounted in corral's sandboxes, and its tools run on the
// tenant's worker, which corral mounts nothing into.
var errSelfHostedResources = errdefs.InvalidArgument("resources are mounted in corral's sandboxes; a self_hosted environment's sessions run their tools on the tenant's worker, so they take no resources")

// errSelfHostedSkills: a skill's files are staged in corral's sandboxes,
// and nothing hands them to a tenant's worker yet; a skill the model is
// told of but cannot read is refused rather than offered.
var errSelfHostedSkills = errdefs.InvalidArgument("skills are staged in corral's sandboxes; a self_hosted environment's sessions run their tools on the tenant's worker, which corral does not hand skills to yet: use an agent without skills (or agent_with_overrides with skills: [])")

// decodeResources validates a create's resources[], at most maxResources.
func decodeResources(raw json.RawMessage) ([]sessionResource, error) {
	if !present(raw) || isNull(raw) {
		return nil, nil
	}
	items, err := rawList(raw, "resources", maxResources)
	if err != nil {
		return nil, err
	}
	var out []sessionResource
	for i, it := range items {
		r, err := decodeResource(it, fmt.Sprintf("resources[%d]", i))
		if err != nil {
			return nil, err
		}
		if err := checkMountFree(out, r.MountPath, fmt.Sprintf("resources[%d]", i)); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// checkMountFree refuses a mount path that another resource's mount path
// equals, or that lies beneath or above it (a file cannot be a directory
// too).
func checkMountFree(have []sessionResource, mount, path string) error {
	if mount == "" {
		return nil // a memory store's: checkMemoryStores places it
	}
	for _, o := range have {
		if o.Type != "file" {
			continue
		}
		if o.MountPath == mount || strings.HasPrefix(o.MountPath, mount+"/") || strings.HasPrefix(mount, o.MountPath+"/") {
			return errdefs.InvalidArgument("%s.mount_path: %s collides with the mount path %s of resource file %s", path, mount, o.MountPath, o.FileID)
		}
	}
	return nil
}

// checkFiles refuses resources whose files the tenant in ctx does not
// have.
func (h *Handler) checkFiles(ctx context.Context, rs []sessionResource, path func(i int) string) error {
	if err := h.checkMemoryStores(ctx, rs, path); err != nil {
		return err
	}
	for i, r := range rs {
		if r.Type != "file" {
			continue
		}
		if _, err := h.store.Files().Get(ctx, r.FileID); errdefs.IsNotFound(err) {
			return errdefs.InvalidArgument("%s.file_id: no file %s", path(i), r.FileID)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// stamp gives new resources their ids and times.
func stamp(rs []sessionResource, now time.Time) {
	for i := range rs {
		rs[i].ID = SessionResourceIDPrefix + rand.Text()
		rs[i].CreatedAt, rs[i].UpdatedAt = ts(now), ts(now)
	}
}

// storedResources decodes a session's resources column.
func storedResources(s store.Session) ([]sessionResource, error) {
	if len(s.Resources) == 0 {
		return nil, nil
	}
	var rs []sessionResource
	if err := json.Unmarshal(s.Resources, &rs); err != nil {
		return nil, fmt.Errorf("decoding the resources of session %s: %w", s.ID, err)
	}
	return rs, nil
}

// sessionID reads and checks the {session_id} of a resources route.
func sessionIDParam(r *http.Request) (string, error) {
	id := r.PathValue("session_id")
	if !validID(id) {
		return "", errdefs.NotFound("%q is not the id of a session", truncate(id))
	}
	return id, nil
}

func (h *Handler) listResources(w http.ResponseWriter, r *http.Request) {
	id, err := sessionIDParam(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	limit, err := queryLimit(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	list := "resources:" + id
	c, err := decodeCursor(q, list, "asc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	s, err := h.store.Sessions().Get(r.Context(), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rs, err := storedResources(s)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// Oldest first, in the order they were added; a cursor holds the id
	// of the last one sent.
	if c != nil {
		i := slices.IndexFunc(rs, func(x sessionResource) bool { return x.ID == c.ID })
		rs = rs[i+1:] // a resource deleted since: from the start
	}
	out := page[sessionResource]{Data: []sessionResource{}}
	if len(rs) > limit {
		rs = rs[:limit]
		last := rs[len(rs)-1]
		out.NextPage = cursor{List: list, Order: "asc", ID: last.ID}.encode()
	}
	out.Data = append(out.Data, rs...)
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) addResource(w http.ResponseWriter, r *http.Request) {
	id, err := sessionIDParam(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The session first: a session of another tenant is a 404, whatever
	// the body.
	if s, err := h.store.Sessions().Get(r.Context(), id); err != nil || s.SelfHosted {
		if err == nil {
			err = errSelfHostedResources
		}
		h.fail(w, r, err)
		return
	}
	res, err := decodeResource(b, "request body")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if res.Type == "memory_store" {
		h.fail(w, r, errMemoryStoreAtCreate)
		return
	}
	if err := h.checkFiles(r.Context(), []sessionResource{res}, func(int) string { return "request body" }); err != nil {
		h.fail(w, r, err)
		return
	}
	one := []sessionResource{res}
	stamp(one, time.Now())
	res = one[0]
	_, err = h.store.Sessions().SetResources(r.Context(), id, func(cur store.Session) (json.RawMessage, error) {
		rs, err := storedResources(cur)
		if err != nil {
			return nil, err
		}
		if len(rs) >= maxResources {
			return nil, errdefs.InvalidArgument("session %s has %d resources; at most %d are allowed", id, len(rs), maxResources)
		}
		if err := checkMountFree(rs, res.MountPath, "request body"); err != nil {
			return nil, err
		}
		return json.Marshal(append(rs, res))
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (h *Handler) getResource(w http.ResponseWriter, r *http.Request) {
	id, err := sessionIDParam(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	s, err := h.store.Sessions().Get(r.Context(), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rs, err := storedResources(s)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rid := r.PathValue("resource_id")
	i := slices.IndexFunc(rs, func(x sessionResource) bool { return x.ID == rid })
	if i < 0 {
		h.fail(w, r, errdefs.NotFound("session %s has no resource %s", id, truncate(rid)))
		return
	}
	writeJSON(w, http.StatusOK, rs[i])
}

// updateResource answers the update of a resource: only a
// github_repository's authorization_token can change, and a session has
// none.
func (h *Handler) updateResource(w http.ResponseWriter, r *http.Request) {
	id, err := sessionIDParam(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if _, err := readBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	s, err := h.store.Sessions().Get(r.Context(), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rs, err := storedResources(s)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rid := r.PathValue("resource_id")
	if !slices.ContainsFunc(rs, func(x sessionResource) bool { return x.ID == rid }) {
		h.fail(w, r, errdefs.NotFound("session %s has no resource %s", id, truncate(rid)))
		return
	}
	h.fail(w, r, errdefs.InvalidArgument("resource %s is a file: only a github_repository resource's authorization_token can be updated (delete the file resource and add another instead)", rid))
}

func (h *Handler) deleteResource(w http.ResponseWriter, r *http.Request) {
	id, err := sessionIDParam(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	rid := r.PathValue("resource_id")
	_, err = h.store.Sessions().SetResources(r.Context(), id, func(cur store.Session) (json.RawMessage, error) {
		rs, err := storedResources(cur)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(rs, func(x sessionResource) bool { return x.ID == rid })
		if i < 0 {
			return nil, errdefs.NotFound("session %s has no resource %s", id, truncate(rid))
		}
		if rs[i].Type == "memory_store" {
			return nil, errMemoryStoreAtCreate
		}
		return json.Marshal(slices.Delete(rs, i, i+1))
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": rid, "type": "session_resource_deleted"})
}
