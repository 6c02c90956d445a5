package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// The memory area's writable directories: a session's read_write memory
// stores. Everything else in the area is staged as the uploads are
// (root's, files 0444, which the sandbox's user can read and not change);
// a writable directory is the sandbox user's (driver.Dirs.Writer), and so
// are the files and directories the host stages in it (0644 and 0755), so
// the agent edits, adds and removes memories with its ordinary tools. The
// control plane reads its changes back after each tool step
// (ExportOutputs with memory_dir) and commits them to the store.
//
// The sandbox controls what is in such a directory, links included, so
// the host works in it only through an os.Root opened on the directory
// itself: nothing the host does there resolves outside it, not even into
// another store's directory. A parent directory the sandbox replaced with
// a link or a file is made a directory again, and a file it replaced with
// a directory is removed before the memory is staged over it. Which
// directories are writable is the host's own record (writable in the
// area's staging directory, which the sandbox cannot see), set by
// SyncUploads; never inferred from what is in the area.

// maxWritable bounds the writable directories of an area (a session
// mounts at most 8 stores).
const maxWritable = 16

// maxMemoryHash bounds the file SyncUploads hashes to tell that the
// session's write is the version listed (a memory is at most 100 kB).
const maxMemoryHash = 1 << 20

// writablePath is the record of the area's writable directories.
func writablePath(d driver.Dirs) string { return filepath.Join(d.Staging, "writable") }

// topDir is the first component of p: its store's directory.
func topDir(p string) string {
	top, _, _ := strings.Cut(p, "/")
	return top
}

// loadWritable reads the area's writable directories.
func loadWritable(d driver.Dirs) (map[string]bool, error) {
	b, err := os.ReadFile(writablePath(d))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for name := range strings.SplitSeq(string(b), "\n") {
		if name != "" {
			out[name] = true
		}
	}
	return out, nil
}

// checkWritableName checks a writable directory's name: one component.
func checkWritableName(name string) error {
	if err := uploadPath(name); err != nil {
		return err
	}
	if strings.Contains(name, "/") {
		return errdefs.InvalidArgument("writable directory %q: want one path component", name)
	}
	return nil
}

// makeWritable records names as the area's writable directories and
// makes each a directory of the sandbox's user. root is the area's.
func makeWritable(root *os.Root, d driver.Dirs, names []string) (map[string]bool, error) {
	if len(names) > maxWritable {
		return nil, errdefs.InvalidArgument("at most %d writable directories (got %d)", maxWritable, len(names))
	}
	set := map[string]bool{}
	for _, name := range names {
		if err := checkWritableName(name); err != nil {
			return nil, err
		}
		set[name] = true
	}
	had, err := loadWritable(d)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(set)) {
		if err := ownDir(root, d, name); err != nil {
			return nil, err
		}
	}
	if !maps.Equal(set, had) {
		tmp, err := os.CreateTemp(d.Staging, "writable-*")
		if err != nil {
			return nil, err
		}
		_, werr := tmp.WriteString(strings.Join(slices.Sorted(maps.Keys(set)), "\n"))
		if cerr := tmp.Close(); werr == nil {
			werr = cerr
		}
		if werr == nil {
			werr = os.Rename(tmp.Name(), writablePath(d))
		}
		if werr != nil {
			os.Remove(tmp.Name())
			return nil, werr
		}
	}
	return set, nil
}

// ownDir makes name, in w, a directory of the sandbox's user: made if it
// is missing, made again if something else is there.
func ownDir(w *os.Root, d driver.Dirs, name string) error {
	fi, err := w.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case fi.IsDir():
		return chownWriter(w, d, name, fi)
	default: // a link or a file the sandbox put there
		if err := w.RemoveAll(name); err != nil {
			return err
		}
	}
	if err := w.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err = w.Lstat(name)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", name)
	}
	return chownWriter(w, d, name, fi)
}

// chownWriter gives name to the sandbox's user unless it is theirs.
func chownWriter(w *os.Root, d driver.Dirs, name string, fi fs.FileInfo) error {
	if d.Writer == nil {
		return nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == d.Writer.UID && int(st.Gid) == d.Writer.GID {
		return nil
	}
	return w.Lchown(name, d.Writer.UID, d.Writer.GID)
}

// writableDir returns a root on p's store directory when it is writable.
func writableDir(root *os.Root, d driver.Dirs, p string) (*os.Root, string, bool) {
	top, rest, ok := strings.Cut(p, "/")
	if !ok {
		return nil, "", false
	}
	set, err := loadWritable(d)
	if err != nil || !set[top] {
		return nil, "", false
	}
	w, err := root.OpenRoot(top)
	if err != nil {
		return nil, "", false
	}
	return w, rest, true
}

// openWritable opens writable directory name of the session's memory for
// an export. dirs are the sandbox's session directories.
func openWritable(dirs driver.Dirs, name string) (*os.Root, error) {
	if err := checkWritableName(name); err != nil {
		return nil, err
	}
	ad, err := areaDirs(dirs, "memory")
	if err != nil {
		return nil, err
	}
	set, err := loadWritable(ad)
	if err != nil {
		return nil, err
	}
	if !set[name] {
		return nil, errdefs.FailedPrecondition("memory directory %q is not writable (SyncUploads names the writable ones)", name)
	}
	root, err := os.OpenRoot(ad.Uploads)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.OpenRoot(name)
}

// stageWritable moves tmp, the staged content of p, into its store's
// directory w (rest is p beneath it) as a file of the sandbox's user.
func stageWritable(w *os.Root, tmp *os.File, d driver.Dirs, rest string) error {
	defer w.Close()
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if d.Writer != nil {
		if err := tmp.Chown(d.Writer.UID, d.Writer.GID); err != nil {
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	dir, base := path.Split(rest)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	} else {
		parts := strings.Split(dir, "/")
		for i := range parts {
			if err := ownDir(w, d, strings.Join(parts[:i+1], "/")); err != nil {
				return err
			}
		}
	}
	parent, err := w.Open(dir)
	if err != nil {
		return err
	}
	defer parent.Close()
	// renameat against the opened directory: nothing of the path is
	// resolved again, and a link at base is replaced, not followed.
	err = unix.Renameat(unix.AT_FDCWD, tmp.Name(), int(parent.Fd()), base)
	if errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		// The sandbox made a directory where the memory is.
		if err = w.RemoveAll(rest); err == nil {
			err = unix.Renameat(unix.AT_FDCWD, tmp.Name(), int(parent.Fd()), base)
		}
	}
	if err != nil {
		return fmt.Errorf("renaming into %s: %w", rest, err)
	}
	return nil
}

// removeWritable removes the file the host staged at p in a writable
// directory, whose memory is gone: what the sandbox made of it since (a
// directory) is the sandbox's and stays, as do the directories around it.
func removeWritable(root *os.Root, p string) error {
	top, rest, ok := strings.Cut(p, "/")
	if !ok {
		return nil
	}
	w, err := root.OpenRoot(top)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer w.Close()
	fi, err := w.Lstat(rest)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return nil
	}
	if err := w.Remove(rest); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// hasContent reports whether p, in a writable directory, is a regular
// file whose content has SHA-256 sum (hex).
func hasContent(root *os.Root, p string, fi fs.FileInfo, sum string) bool {
	if !fi.Mode().IsRegular() || fi.Size() > maxMemoryHash {
		return false
	}
	top, rest, ok := strings.Cut(p, "/")
	if !ok {
		return false
	}
	w, err := root.OpenRoot(top)
	if err != nil {
		return false
	}
	defer w.Close()
	f, err := w.OpenFile(rest, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, maxMemoryHash+1)); err != nil {
		return false
	}
	return hex.EncodeToString(h.Sum(nil)) == sum
}
