// Package blob stores opaque objects by key: the workspaces a drain carries
// from one host to another pass through it, workspace snapshots live in it,
// and so does the content of the Files API's files (files/<tenant>/<file
// id>; their metadata is in the store). Dir, on the local filesystem, is
// the default; S3 keeps them in an S3-compatible bucket.
package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"corral.dev/corral/internal/errdefs"
)

// Store keeps objects by key. Keys are slash-separated relative paths of
// letters, digits, '-', '_', '.' and '/' (no "..").
type Store interface {
	// Put stores r's bytes under key, replacing any object there. The object
	// is visible only once complete.
	Put(ctx context.Context, key string, r io.Reader) error
	// Get opens the object under key; a missing key is errdefs.NotFound.
	// The caller closes it.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes the object; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// DeletePrefix removes every object under the folder prefix (a valid
	// key: "snapshots/abc" removes "snapshots/abc/1.tar" and the like).
	DeletePrefix(ctx context.Context, prefix string) error
	// List calls fn for every complete object under the folder prefix, as
	// DeletePrefix takes it, in no set order, until fn returns an error
	// (which List returns). An object put or deleted meanwhile may or may
	// not be seen.
	List(ctx context.Context, prefix string, fn func(Object) error) error
}

// Object is a stored object as List sees it.
type Object struct {
	Key      string
	Size     int64
	Modified time.Time
}

// Dir is a Store in a local directory.
type Dir struct{ root string }

var _ Store = (*Dir)(nil)

// NewDir returns a Store keeping objects under root, created (0700) if
// needed.
func NewDir(root string) (*Dir, error) {
	if !filepath.IsAbs(root) {
		return nil, errdefs.InvalidArgument("blob directory %q must be an absolute path", root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("creating blob directory: %w", err)
	}
	return &Dir{root: root}, nil
}

// ValidKey reports whether key is a valid object key.
func ValidKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/") {
		return errdefs.InvalidArgument("blob key %q: want a relative path", key)
	}
	for _, part := range strings.Split(key, "/") {
		if part == "" || part == "." || part == ".." {
			return errdefs.InvalidArgument("blob key %q: empty, \".\" and \"..\" parts are not allowed", key)
		}
		for _, r := range part {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
				return errdefs.InvalidArgument("blob key %q: character %q is not allowed", key, r)
			}
		}
	}
	return nil
}

func (d *Dir) path(key string) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

// Put writes the object through a temporary file renamed into place.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".put-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // no-op after the rename
	if _, err := io.Copy(f, ctxReader{ctx, r}); err != nil {
		f.Close()
		return fmt.Errorf("storing blob %s: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

// Get opens the object.
func (d *Dir) Get(_ context.Context, key string) (io.ReadCloser, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFound("blob %s", key)
	}
	return f, err
}

// Delete removes the object.
func (d *Dir) Delete(_ context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// DeletePrefix removes the folder prefix and everything in it.
func (d *Dir) DeletePrefix(_ context.Context, prefix string) error {
	p, err := d.path(prefix)
	if err != nil {
		return err
	}
	return os.RemoveAll(p)
}

// List walks the folder prefix. Put's temporary files (".put-*") are
// not objects and are left out.
func (d *Dir) List(ctx context.Context, prefix string, fn func(Object) error) error {
	p, err := d.path(prefix)
	if err != nil {
		return err
	}
	err = filepath.WalkDir(p, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone meanwhile, or an empty folder
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".put-") {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		rel, err := filepath.Rel(d.root, path)
		if err != nil {
			return err
		}
		return fn(Object{Key: filepath.ToSlash(rel), Size: fi.Size(), Modified: fi.ModTime()})
	})
	return err
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
