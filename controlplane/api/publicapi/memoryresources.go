package publicapi

import (
	"context"
	"encoding/json"
	"strings"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/errdefs"
)

// Memory store resources. A session names its stores when it is created
// (at most maxSessionStores; they cannot be added, changed or removed
// after, as the API has it); each is mounted at /mnt/memory/<name>, its
// name made a single path component (characters outside letters, digits,
// ".", "_" and "-" become "_"). The host stages a store's memories anew
// before every tool call (a memory changed through the API is there at
// the next call): read_only, root's and unchangeable in the sandbox;
// read_write (the API's default), the sandbox user's, and what a tool
// step changes there is committed to the store as the session's versions
// after the step, conflicts with other writers told to the model
// (fleet/memorycommit.go).

// maxSessionStores bounds a session's memory stores (the API's), and
// maxMemoryInstructions their instructions.
const (
	maxSessionStores      = 8
	maxMemoryInstructions = 4096
)

// errMemoryStoreAtCreate refuses a memory store added or removed after
// the session was created.
var errMemoryStoreAtCreate = errdefs.InvalidArgument("memory stores are attached when a session is created (resources[] on POST /v1/sessions) and cannot be added or removed after")

// decodeMemoryResource validates a memory_store resource. The store is
// looked up, and its name taken, by checkMemoryStores.
func decodeMemoryResource(p resourceParams, path string) (sessionResource, error) {
	for name, v := range map[string]json.RawMessage{"file_id": p.FileID, "mount_path": p.MountPath, "url": p.URL, "checkout": p.Checkout,
		"authorization_token": p.AuthorizationToken} {
		if present(v) {
			return sessionResource{}, errdefs.InvalidArgument("%s.%s: not a field of a memory_store resource", path, name)
		}
	}
	id, err := stringField(p.MemoryStoreID, path+".memory_store_id")
	if err != nil {
		return sessionResource{}, err
	}
	if !validID(id) || !strings.HasPrefix(id, store.MemoryStoreIDPrefix) {
		return sessionResource{}, errdefs.InvalidArgument("%s.memory_store_id: %q is not the id of a memory store", path, truncate(id))
	}
	res := sessionResource{Type: "memory_store", MemoryStoreID: id, Access: "read_write"}
	if present(p.Access) && !isNull(p.Access) {
		if err := field(p.Access, path+".access", &res.Access); err != nil {
			return sessionResource{}, err
		}
	}
	switch res.Access {
	case "read_only", "read_write":
	default:
		return sessionResource{}, enumError(path+".access", res.Access, []string{"read_only", "read_write"})
	}
	if present(p.Instructions) && !isNull(p.Instructions) {
		var in string
		if err := field(p.Instructions, path+".instructions", &in); err != nil {
			return sessionResource{}, err
		}
		if err := checkLen(in, path+".instructions", 0, maxMemoryInstructions); err != nil {
			return sessionResource{}, err
		}
		res.Instructions = &in
	}
	return res, nil
}

// memoryDir makes a store's name one path component beneath /mnt/memory.
func memoryDir(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	d := string(b)
	if d == "." || d == ".." {
		d = strings.Repeat("_", len(d))
	}
	return d
}

// checkMemoryStores looks up the memory stores rs names (the tenant's,
// not archived, each once, at most maxSessionStores) and fills in their
// names, descriptions and mount paths.
func (h *Handler) checkMemoryStores(ctx context.Context, rs []sessionResource, path func(i int) string) error {
	n := 0
	dirs := map[string]string{}
	for i := range rs {
		r := &rs[i]
		if r.Type != "memory_store" {
			continue
		}
		if n++; n > maxSessionStores {
			return errdefs.InvalidArgument("%s: a session takes at most %d memory stores", path(i), maxSessionStores)
		}
		m, err := h.store.MemoryStores().Get(ctx, r.MemoryStoreID)
		if errdefs.IsNotFound(err) {
			return errdefs.InvalidArgument("%s.memory_store_id: no memory store %s", path(i), r.MemoryStoreID)
		} else if err != nil {
			return err
		}
		if m.ArchivedAt != nil {
			return errdefs.InvalidArgument("%s.memory_store_id: memory store %s is archived", path(i), r.MemoryStoreID)
		}
		d := memoryDir(m.Name)
		if other, dup := dirs[d]; dup {
			return errdefs.InvalidArgument("%s: memory stores %s and %s would both mount at %s/%s (their names); rename one", path(i), other, m.ID, tools.Memory, d)
		}
		dirs[d] = m.ID
		r.Name, r.Description, r.MountPath = &m.Name, &m.Description, tools.Memory+"/"+d
	}
	return nil
}
