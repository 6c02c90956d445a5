package agent

import (
	"path"
	"strings"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/internal/workspace"
	"corral.dev/corral/internal/errdefs"
)

// The file calls (ReadFile, WriteFile, ListFiles) on a session's mounts
// rather than its workspace: a path absolute beneath one of them names a
// file there. The uploads are read-only; the outputs are the sandbox
// user's; in the memory, a read_write store's directory (the area's
// writable record, memoryarea.go) is writable and the rest read-only. A
// write goes through a root on the directory it may change (a store's own,
// for memory), so a link the sandbox made leads nowhere else; what the
// host makes there is the sandbox user's, so the agent can change it after.

// Where the mounts appear inside a sandbox.
const (
	uploadsMount = driver.UploadsMount
	outputsMount = driver.OutputsMount
	memoryMount  = driver.MemoryMount
)

// mountFile resolves p, absolute beneath a mount, for a read or a write:
// the directory to work in, p beneath it, and the prefix that names the
// directory inside the sandbox (for listings).
func mountFile(sb driver.Sandbox, p string, write bool) (dir workspace.Dir, rel, prefix string, err error) {
	if strings.ContainsRune(p, 0) {
		return workspace.Dir{}, "", "", errdefs.InvalidArgument("path %q contains a NUL byte", p)
	}
	c := path.Clean(p)
	dirs, err := sessionDirs(sb)
	if err != nil {
		return workspace.Dir{}, "", "", err
	}
	var owner *workspace.Owner
	if dirs.Writer != nil {
		owner = &workspace.Owner{UID: dirs.Writer.UID, GID: dirs.Writer.GID}
	}
	beneath := func(m string) (string, bool) {
		if c == m {
			return ".", true
		}
		rest, ok := strings.CutPrefix(c, m+"/")
		return rest, ok
	}
	if rest, ok := beneath(uploadsMount); ok {
		if write {
			return workspace.Dir{}, "", "", errdefs.PermissionDenied("%s is read-only: the session's file resources are mounted there", uploadsMount)
		}
		return workspace.Dir{Path: dirs.Uploads}, rest, uploadsMount, nil
	}
	if rest, ok := beneath(outputsMount); ok {
		return workspace.Dir{Path: dirs.Outputs, Owner: owner}, rest, outputsMount, nil
	}
	if rest, ok := beneath(memoryMount); ok {
		if dirs.Memory == "" {
			return workspace.Dir{}, "", "", errdefs.NotFound("this sandbox has no %s", memoryMount)
		}
		if !write {
			return workspace.Dir{Path: dirs.Memory}, rest, memoryMount, nil
		}
		store, within, _ := strings.Cut(rest, "/")
		ad, err := areaDirs(dirs, "memory")
		if err != nil {
			return workspace.Dir{}, "", "", err
		}
		set, err := loadWritable(ad)
		if err != nil {
			return workspace.Dir{}, "", "", err
		}
		if rest == "." || !set[store] {
			return workspace.Dir{}, "", "", errdefs.PermissionDenied("%s is read-only: only a read_write memory store's directory can be written", path.Join(memoryMount, store))
		}
		if within == "" {
			within = "."
		}
		return workspace.Dir{Path: path.Join(ad.Uploads, store), Owner: owner}, within, memoryMount + "/" + store, nil
	}
	return workspace.Dir{}, "", "", errdefs.InvalidArgument("path %s is outside the workspace and the session's mounts", p)
}

// listMount lists a directory beneath a mount, entries named absolutely.
func listMount(sb driver.Sandbox, p string) ([]driver.FileInfo, error) {
	dir, rel, prefix, err := mountFile(sb, p, false)
	if err != nil {
		return nil, err
	}
	files, err := dir.List(rel)
	if err != nil {
		return nil, err
	}
	for i := range files {
		files[i].Path = path.Join(prefix, files[i].Path)
	}
	return files, nil
}
