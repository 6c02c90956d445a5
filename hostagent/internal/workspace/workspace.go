// Package workspace reads, writes and lists files of a sandbox's workspace
// from the host side, confined to the workspace directory: paths are
// relative, ".." is refused, and symlinks (which the sandbox can create
// freely) are followed only while they stay inside the directory, through
// os.Root, so a link to /etc or to the parent cannot reach the host.
package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// Dir is a workspace directory on the host.
type Dir struct {
	// Path is the directory on the host.
	Path string
	// Owner, if set, owns every file and directory created through Dir (the
	// sandbox's user, so it can change them).
	Owner *Owner
}

// Owner is a numeric user and group.
type Owner struct{ UID, GID int }

// Clean checks that p names something inside the workspace and returns it
// cleaned ("." for the workspace itself).
func Clean(p string) (string, error) {
	if p == "" || p == "." {
		return ".", nil
	}
	if strings.ContainsRune(p, 0) {
		return "", errdefs.InvalidArgument("path %q contains a NUL byte", p)
	}
	if filepath.IsAbs(p) {
		return "", errdefs.InvalidArgument("path %q is absolute; workspace paths are relative", p)
	}
	if !filepath.IsLocal(p) {
		return "", errdefs.InvalidArgument("path %q leaves the workspace", p)
	}
	return filepath.Clean(p), nil
}

func (d Dir) open() (*os.Root, error) {
	r, err := os.OpenRoot(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFound("workspace %s is gone", d.Path)
	}
	if err != nil {
		return nil, fmt.Errorf("opening workspace: %w", err)
	}
	return r, nil
}

// classify gives an error from os.Root its kind.
func classify(op, p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.Wrap(errdefs.NotFoundKind, err, "%s %s", op, p)
	case escapes(err):
		return errdefs.Wrap(errdefs.PermissionDeniedKind, err, "%s %s: a symlink leads outside the workspace", op, p)
	case errors.Is(err, fs.ErrPermission):
		return errdefs.Wrap(errdefs.PermissionDeniedKind, err, "%s %s", op, p)
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR):
		return errdefs.Wrap(errdefs.InvalidArgumentKind, err, "%s %s", op, p)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// escapes reports whether err is os.Root refusing a path that leaves it. The
// standard library does not export that error; its text is stable.
func escapes(err error) bool {
	return errors.Is(err, syscall.EXDEV) || strings.Contains(err.Error(), "path escapes from parent")
}

// Open opens the regular file at p for reading and returns it with its
// size. Anything else is refused (invalid argument) without blocking: a
// FIFO the sandbox made is opened non-blocking and never read.
func (d Dir) Open(p string) (*os.File, int64, error) {
	p, err := Clean(p)
	if err != nil {
		return nil, 0, err
	}
	r, err := d.open()
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	f, err := r.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, classify("reading", p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, classify("reading", p, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		what := "not a regular file"
		if fi.IsDir() {
			what = "a directory"
		}
		return nil, 0, errdefs.InvalidArgument("reading %s: it is %s", p, what)
	}
	return f, fi.Size(), nil
}

// ReadFile returns the contents of the file at p, at most max bytes: a
// larger file is refused (kind too large) from its size before anything is
// read, and one that grows while it is read is cut off at max+1 bytes and
// refused too. Nothing is allocated from the size the file claims.
func (d Dir) ReadFile(p string, max int64) ([]byte, error) {
	if max <= 0 {
		return nil, errdefs.InvalidArgument("reading %s: a positive limit is required", p)
	}
	f, size, err := d.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size > max {
		return nil, TooLarge(size, max)
	}
	return readBounded(f, p, max)
}

// readBounded reads r to its end, refusing it once it passes max bytes.
func readBounded(r io.Reader, p string, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, classify("reading", p, err)
	}
	if int64(len(b)) > max {
		return nil, errdefs.TooLarge("the file grew past %s while it was read; reads are limited to %s", HumanBytes(max), HumanBytes(max))
	}
	return b, nil
}

// TooLarge is the error of a read refused for its size.
func TooLarge(size, max int64) error {
	return errdefs.TooLarge("the file is %s; reads are limited to %s", HumanBytes(size), HumanBytes(max))
}

// HumanBytes writes n in binary units, one decimal: "4.0 TiB", "512 B".
func HumanBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"} {
		v /= 1024
		unit = u
		if v < 1024 {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// WriteFile creates or replaces the file at p, creating its parent
// directories.
func (d Dir) WriteFile(p string, data []byte, mode fs.FileMode) error {
	f, err := d.Create(p, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return classify("writing", p, err)
	}
	return classify("writing", p, f.Close())
}

// Create creates or truncates the file at p for writing, creating its
// parent directories, owned by d.Owner and with mode's permission bits
// (zero: 0644): for what streams a file in (a workspace's import).
func (d Dir) Create(p string, mode fs.FileMode) (*os.File, error) {
	p, err := Clean(p)
	if err != nil {
		return nil, err
	}
	if p == "." {
		return nil, errdefs.InvalidArgument("cannot write the workspace directory itself")
	}
	if mode == 0 {
		mode = 0o644
	}
	r, err := d.open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := d.mkdirAll(r, filepath.Dir(p)); err != nil {
		return nil, err
	}
	f, err := r.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode.Perm())
	if err != nil {
		return nil, classify("writing", p, err)
	}
	if d.Owner != nil {
		if err := f.Chown(d.Owner.UID, d.Owner.GID); err != nil {
			f.Close()
			return nil, classify("writing", p, err)
		}
	}
	if err := f.Chmod(mode.Perm()); err != nil {
		f.Close()
		return nil, classify("writing", p, err)
	}
	return f, nil
}

// mkdirAll creates dir and its missing parents inside r, owned by d.Owner.
func (d Dir) mkdirAll(r *os.Root, dir string) error {
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, string(filepath.Separator))
	for i := range parts {
		sub := filepath.Join(parts[:i+1]...)
		err := r.Mkdir(sub, 0o755)
		if errors.Is(err, fs.ErrExist) {
			fi, serr := r.Stat(sub)
			if serr != nil {
				return classify("creating directory", sub, serr)
			}
			if !fi.IsDir() {
				return errdefs.InvalidArgument("creating directory %s: a file is in the way", sub)
			}
			continue
		}
		if err != nil {
			return classify("creating directory", sub, err)
		}
		if d.Owner != nil {
			if err := r.Lchown(sub, d.Owner.UID, d.Owner.GID); err != nil {
				return classify("creating directory", sub, err)
			}
		}
	}
	return nil
}

// MaxListEntries bounds the entries of one directory that List returns.
const MaxListEntries = 100_000

// List returns the entries of the directory at p, paths relative to the
// workspace. Symlinks are listed, not followed.
func (d Dir) List(p string) ([]driver.FileInfo, error) {
	p, err := Clean(p)
	if err != nil {
		return nil, err
	}
	r, err := d.open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open(p)
	if err != nil {
		return nil, classify("listing", p, err)
	}
	defer f.Close()
	// In batches, so that a directory of millions of entries is refused
	// before it is held in memory.
	var entries []fs.DirEntry
	for {
		batch, err := f.ReadDir(1024)
		entries = append(entries, batch...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, classify("listing", p, err)
		}
		if len(entries) > MaxListEntries {
			return nil, errdefs.TooLarge("listing %s: it has more than %d entries", p, MaxListEntries)
		}
	}
	out := make([]driver.FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue // removed while listing
		}
		out = append(out, driver.FileInfo{
			Path:    filepath.Join(p, e.Name()),
			Size:    fi.Size(),
			Mode:    fi.Mode(),
			ModTime: fi.ModTime(),
			Changed: changed(fi),
		})
	}
	return out, nil
}

// changed is an entry's ctime; where the system gives none, its ModTime.
func changed(fi fs.FileInfo) time.Time {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	}
	return fi.ModTime()
}

// AllocatedBytes sums the bytes allocated to the files beneath root on
// root's own file system (st_blocks: a sparse file counts what it holds,
// not its size). Mounts beneath root are not entered.
func AllocatedBytes(root string) (int64, error) {
	var top syscall.Stat_t
	if err := syscall.Lstat(root, &top); err != nil {
		return 0, err
	}
	var n int64
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		}
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		if st.Dev != top.Dev { // a mount
			if e.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		n += st.Blocks * 512
		return nil
	})
	return n, err
}
