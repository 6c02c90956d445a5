package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/seal"
)

// mountRecords is fleet.Mounts over the store: a session's resources are
// on its row (the API's wire objects), its outputs are Files API files
// scoped to it, named by their path beneath the outputs directory.
type mountRecords struct {
	st *store.Store
	// ring opens the tenants' data keys (environment_variable secrets).
	ring *seal.Keyring
	// quota is the file storage limit of the tenant in ctx (0: none).
	quota func(ctx context.Context) (int64, error)
}

var _ fleet.Mounts = mountRecords{}

// EgressCredentials implements fleet.Mounts.
func (m mountRecords) EgressCredentials(ctx context.Context, sessionID string) ([]fleet.EgressCredential, bool, error) {
	cs, vaults, err := m.st.Vaults(m.ring).EgressCredentialsFor(ctx, sessionID)
	if err != nil {
		return nil, false, err
	}
	out := make([]fleet.EgressCredential, 0, len(cs))
	for _, c := range cs {
		out = append(out, fleet.EgressCredential{SecretName: c.SecretName, Placeholder: c.Placeholder, Secret: c.Secret, AllowedHosts: c.AllowedHosts})
	}
	return out, vaults, nil
}

// Resources implements fleet.Mounts: one read of the session's row.
func (m mountRecords) Resources(ctx context.Context, sessionID string) (fleet.SessionMounts, error) {
	s, err := m.st.Sessions().Get(ctx, sessionID)
	if err != nil {
		return fleet.SessionMounts{}, err
	}
	out := fleet.SessionMounts{Vaults: len(s.VaultIDs) > 0}
	if out.Files, err = m.skills(ctx, s.Agent); err != nil {
		return fleet.SessionMounts{}, fmt.Errorf("the skills of session %s: %w", sessionID, err)
	}
	if len(s.Resources) == 0 {
		return out, nil
	}
	var rs []struct {
		Type          string `json:"type"`
		FileID        string `json:"file_id"`
		MemoryStoreID string `json:"memory_store_id"`
		MountPath     string `json:"mount_path"`
		Access        string `json:"access"`
	}
	if err := json.Unmarshal(s.Resources, &rs); err != nil {
		return fleet.SessionMounts{}, fmt.Errorf("decoding the resources of session %s: %w", sessionID, err)
	}
	for _, r := range rs {
		switch r.Type {
		case "file":
			out.Files = append(out.Files, fleet.Resource{MountPath: r.MountPath, FileID: r.FileID})
		case "memory_store":
			mm, err := m.memoryMount(ctx, sessionID, r.MemoryStoreID, r.MountPath, r.Access)
			if err != nil {
				return fleet.SessionMounts{}, err
			}
			out.Memory = append(out.Memory, mm)
		}
	}
	return out, nil
}

// skills are the files of the session's skills, each as an upload
// beneath tools.Skills/<name>/, named by a file id of its own: the
// version's id and the file's index (skillFileID). A version deleted since
// the session started is left out (the model is not told of it either).
func (m mountRecords) skills(ctx context.Context, agent json.RawMessage) ([]fleet.Resource, error) {
	var snap struct {
		Skills []struct {
			Type    string `json:"type"`
			SkillID string `json:"skill_id"`
			Version string `json:"version"`
		} `json:"skills"`
	}
	if err := json.Unmarshal(agent, &snap); err != nil {
		return nil, err
	}
	var out []fleet.Resource
	for _, sk := range snap.Skills {
		if sk.Type != "custom" || sk.Version == "" {
			continue
		}
		v, err := m.st.Skills().Version(ctx, sk.SkillID, sk.Version)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for n, f := range v.Files {
			out = append(out, fleet.Resource{MountPath: tools.Skills + "/" + v.Name + "/" + f.Path, FileID: v.ID + "-" + strconv.Itoa(n)})
		}
	}
	return out, nil
}

// skillFile splits a staged skill file's id into its version and index.
func skillFile(fileID string) (versionID string, n int, ok bool) {
	if !strings.HasPrefix(fileID, store.SkillVersionIDPrefix) {
		return "", 0, false
	}
	i := strings.LastIndexByte(fileID, '-')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(fileID[i+1:])
	return fileID[:i], n, err == nil && n >= 0
}

// File implements fleet.Mounts.
func (m mountRecords) File(ctx context.Context, fileID string) (string, int64, error) {
	if vid, n, ok := skillFile(fileID); ok {
		v, err := m.st.Skills().VersionByID(ctx, vid)
		if err != nil {
			return "", 0, err
		}
		if n >= len(v.Files) {
			return "", 0, errdefs.NotFound("skill file %s not found", fileID)
		}
		tid, err := tenant.Required(ctx)
		if err != nil {
			return "", 0, err
		}
		return store.SkillFileBlobKey(string(tid), v.SkillID, v.ID, n), v.Files[n].Size, nil
	}
	f, err := m.st.Files().Get(ctx, fileID)
	return f.BlobKey, f.SizeBytes, err
}

// Outputs implements fleet.Mounts.
func (m mountRecords) Outputs(ctx context.Context, sessionID string) ([]fleet.Output, error) {
	fs, err := m.st.Files().Scope(ctx, sessionID)
	out := make([]fleet.Output, 0, len(fs))
	for _, f := range fs {
		out = append(out, fleet.Output{FileID: f.ID, Path: f.Filename, Size: f.SizeBytes, SHA256: f.SHA256, MimeType: f.MimeType, BlobKey: f.BlobKey})
	}
	return out, err
}

// NewOutput implements fleet.Mounts.
func (m mountRecords) NewOutput(ctx context.Context) (string, string, error) {
	tid, err := tenant.Required(ctx)
	if err != nil {
		return "", "", err
	}
	id := store.NewFileID()
	return id, store.FileBlobKey(string(tid), id), nil
}

// Publish implements fleet.Mounts.
func (m mountRecords) Publish(ctx context.Context, sessionID string, o fleet.Output, replaces string) (string, error) {
	quota, err := m.quota(ctx)
	if err != nil {
		return "", err
	}
	_, old, err := m.st.Files().Replace(ctx, store.File{ID: o.FileID, Filename: o.Path, MimeType: o.MimeType, SizeBytes: o.Size,
		Downloadable: true, ScopeID: sessionID, BlobKey: o.BlobKey, SHA256: o.SHA256}, replaces, quota)
	if err != nil || old == nil {
		return "", err
	}
	return old.BlobKey, nil
}

// memoryMount is a memory_store resource's memories, beneath its mount
// path.
func (m mountRecords) memoryMount(ctx context.Context, sessionID, storeID, mountPath, access string) (fleet.MemoryMount, error) {
	dir, ok := strings.CutPrefix(mountPath, tools.Memory+"/")
	if !ok || dir == "" || strings.Contains(dir, "/") {
		return fleet.MemoryMount{}, fmt.Errorf("session %s: memory store %s has mount path %q", sessionID, storeID, mountPath)
	}
	refs, err := m.st.MemoryStores().MemoryRefs(ctx, storeID)
	if err != nil {
		return fleet.MemoryMount{}, err
	}
	mm := fleet.MemoryMount{StoreID: storeID, Dir: dir, Writable: access == "read_write"}
	for _, ref := range refs {
		if p := dir + ref.Path; len(p) > tools.MaxMountPath || strings.Count(p, "/") >= 16 {
			// Deeper or longer than a mount shows (16 components, 1024
			// bytes). Never written back: a file the session makes
			// there is not read back either.
			continue
		}
		mm.Files = append(mm.Files, fleet.MemoryFile{Path: dir + ref.Path, VersionID: ref.VersionID, SHA256: ref.SHA256, Size: ref.Size})
	}
	return mm, nil
}

// CommitMemory implements fleet.Mounts: the changes are the session's
// (a session_actor's versions).
func (m mountRecords) CommitMemory(ctx context.Context, sessionID, storeID string, changes []fleet.MemoryChange) ([]fleet.MemoryConflict, error) {
	cs := make([]store.MemoryChange, len(changes))
	for i, c := range changes {
		cs[i] = store.MemoryChange{Path: c.Path, Content: c.Content, BaseSHA256: c.BaseSHA256}
	}
	res, err := m.st.MemoryStores().Commit(ctx, storeID, cs, store.Actor{Type: store.ActorSession, ID: sessionID})
	if err != nil {
		return nil, err
	}
	out := make([]fleet.MemoryConflict, len(res.Conflicts))
	for i, c := range res.Conflicts {
		out[i] = fleet.MemoryConflict{Path: c.Path, Reason: c.Reason, KeptAt: c.KeptAt}
	}
	return out, nil
}

// MemoryContent implements fleet.Mounts.
func (m mountRecords) MemoryContent(ctx context.Context, storeID, versionID string) ([]byte, error) {
	v, err := m.st.MemoryStores().GetVersion(ctx, storeID, versionID)
	if err != nil {
		return nil, err
	}
	if v.Content == nil {
		return nil, fmt.Errorf("memory version %s has no content", versionID)
	}
	return []byte(*v.Content), nil
}
