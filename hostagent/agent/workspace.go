package agent

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The workspace moves between hosts as a tar archive, made and unpacked
// through the driver's file API: the same path confinement as ReadFile and
// WriteFile applies (no symlink escapes), and only directories and regular
// files travel.

// The PAX records of entries that are not files of the workspace: an
// increment's list of the files whose content is in an earlier snapshot
// (UnchangedRecord "list", named UnchangedListName, its content their
// NUL-separated names), and a file left out for the budget (no content).
const (
	UnchangedRecord   = "CORRAL.unchanged"
	SkippedRecord     = "CORRAL.skipped"
	UnchangedListName = ".corral-unchanged"
)

// ExportWorkspace streams the sandbox's workspace as a tar archive: whole,
// or an increment over the snapshot taken at req.Since.
func (s *sandboxServer) ExportWorkspace(req *pb.ExportWorkspaceRequest, stream pb.SandboxService_ExportWorkspaceServer) error {
	var src workspaceReader
	since := req.Since
	if dir, ok := s.a.evictedArchive(req.Key); ok {
		// What eviction kept of the workspace, whole: the fleet takes it
		// before it releases the placement.
		root, err := os.OpenRoot(dir)
		if err != nil {
			return fmt.Errorf("opening the kept workspace of evicted sandbox %s: %w", req.Key, err)
		}
		defer root.Close()
		src, since = archiveReader{root}, nil
	} else {
		sb, done, err := s.a.useFenced(req.Key) // a mover exports a fenced sandbox
		if err != nil {
			return err
		}
		defer done()
		src = sb
	}
	// Read before the listing: a file changed while it runs is in this
	// archive or the next increment, or both. The system's clock, not the
	// agent's (a test's may be fake): it is compared with ctimes.
	taken := timestamppb.New(time.Now())
	w := &chunkStream{send: func(b []byte) error {
		err := stream.Send(&pb.ExportWorkspaceResponse{Data: b, TakenAt: taken})
		taken = nil
		return err
	}}
	x := &exporter{sb: src, tw: tar.NewWriter(w), max: req.MaxBytes}
	if since != nil && !since.AsTime().IsZero() {
		x.since = since.AsTime().Add(-ctimeSlack)
	}
	err := x.tree(stream.Context(), "")
	if err == nil {
		err = x.flushUnchanged()
	}
	if err != nil {
		return fmt.Errorf("exporting the workspace of %s: %w", req.Key, err)
	}
	if err := x.tw.Close(); err != nil {
		return err
	}
	if err := w.flush(); err != nil {
		return err
	}
	return stream.Send(&pb.ExportWorkspaceResponse{TakenAt: taken, Files: x.files, Bytes: x.bytes, Skipped: x.skipped})
}

// workspaceReader is what an export reads: a sandbox, or the workspace an
// eviction kept.
type workspaceReader interface {
	ListFiles(ctx context.Context, dir string) ([]driver.FileInfo, error)
	OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error)
}

// archiveReader reads the workspace an eviction kept on the host, confined
// to its directory (os.Root: no link leads out).
type archiveReader struct{ root *os.Root }

func (r archiveReader) ListFiles(_ context.Context, dir string) ([]driver.FileInfo, error) {
	entries, err := fs.ReadDir(r.root.FS(), path.Clean("./"+dir))
	if err != nil {
		return nil, err
	}
	out := make([]driver.FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, driver.FileInfo{Path: path.Join(dir, e.Name()), Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime(), Changed: fi.ModTime()})
	}
	return out, nil
}

func (r archiveReader) OpenFile(_ context.Context, p string) (io.ReadCloser, int64, error) {
	f, err := r.root.Open(path.Clean("./" + p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, errdefs.NotFound("%s is gone", p)
	}
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, errdefs.InvalidArgument("%s is not a regular file", p)
	}
	return f, fi.Size(), nil
}

// ctimeSlack is how much earlier than since an increment looks: the kernel
// stamps ctime from its coarse clock, which lags the clock taken_at reads
// by up to a tick (1-10 ms), so a file written just after the last
// snapshot began can carry a ctime just before it. Files changed in those
// 50 ms before are sent again, which costs only their bytes.
const ctimeSlack = 50 * time.Millisecond

// exporter writes a workspace into a tar archive.
type exporter struct {
	sb    workspaceReader
	tw    *tar.Writer
	since time.Time // zero: every file whole
	max   int64     // positive: the content's budget
	// files and bytes count the regular files whose content was written;
	// skipped, those left out for max.
	files, bytes, skipped int64
	// unchanged gathers the names of an increment's unchanged files.
	unchanged []byte
}

// tree adds the directory rel of the workspace, recursively.
func (x *exporter) tree(ctx context.Context, rel string) error {
	files, err := x.sb.ListFiles(ctx, rel)
	if err != nil {
		return err
	}
	for _, f := range files {
		switch {
		case f.Mode.IsDir():
			if err := x.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: f.Path + "/", Mode: int64(f.Mode.Perm()), ModTime: f.ModTime}); err != nil {
				return err
			}
			if err := x.tree(ctx, f.Path); err != nil {
				return err
			}
		case f.Mode.IsRegular() && !x.since.IsZero() && f.Changed.Before(x.since):
			x.unchanged = append(append(x.unchanged, f.Path...), 0)
			if len(x.unchanged) >= unchangedChunk {
				if err := x.flushUnchanged(); err != nil {
					return err
				}
			}
		case f.Mode.IsRegular():
			if err := x.file(ctx, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// unchangedChunk is how many bytes of unchanged names an increment's list
// entry holds at most (one name more).
const unchangedChunk = 256 << 10

// flushUnchanged writes the unchanged files' names gathered so far as one
// list entry: NUL-separated (no path holds a NUL), far smaller than a
// header per file in a workspace of many files.
func (x *exporter) flushUnchanged() error {
	if len(x.unchanged) == 0 {
		return nil
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: UnchangedListName, Mode: 0o600, Size: int64(len(x.unchanged)),
		Format: tar.FormatPAX, PAXRecords: map[string]string{UnchangedRecord: "list"}}
	if err := x.tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := x.tw.Write(x.unchanged)
	x.unchanged = x.unchanged[:0]
	return err
}

// file adds one regular file, streamed: never whole in memory. The header
// takes the size the open file has; a file that shrinks while it is copied
// is padded with zeros and one that grows is cut there, so the archive
// stays well formed (the sandbox may still be writing to it).
func (x *exporter) file(ctx context.Context, f driver.FileInfo) error {
	r, size, err := x.sb.OpenFile(ctx, f.Path)
	if errdefs.IsNotFound(err) {
		return nil // removed since the listing
	}
	if err != nil {
		return err
	}
	defer r.Close()
	if x.max > 0 && x.bytes+size > x.max {
		x.skipped++
		return x.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: int64(f.Mode.Perm()), ModTime: f.ModTime,
			Format: tar.FormatPAX, PAXRecords: map[string]string{SkippedRecord: "1"}})
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: int64(f.Mode.Perm()), Size: size, ModTime: f.ModTime}
	if err := x.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(x.tw, io.LimitReader(r, size))
	if err != nil {
		return fmt.Errorf("copying %s: %w", f.Path, err)
	}
	if n < size {
		_, err = io.CopyN(x.tw, zeros{}, size-n)
	}
	x.files++
	x.bytes += size
	return err
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// chunkStream buffers writes into messages of at most maxChunk bytes.
type chunkStream struct {
	send func([]byte) error
	buf  []byte
}

func (c *chunkStream) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), maxChunk-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		if len(c.buf) == maxChunk {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (c *chunkStream) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	err := c.send(c.buf)
	c.buf = nil
	return err
}

// ImportWorkspace unpacks a tar archive into the sandbox's workspace.
func (s *sandboxServer) ImportWorkspace(stream pb.SandboxService_ImportWorkspaceServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	sb, done, err := s.a.use(first.Key)
	if err != nil {
		return err
	}
	defer done()
	r := &recvReader{buf: first.Data, recv: func() ([]byte, error) {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return m.Data, nil
	}}
	files, size, err := unpack(stream.Context(), sb, tar.NewReader(r))
	if err != nil {
		return fmt.Errorf("importing into the workspace of %s: %w", first.Key, err)
	}
	return stream.SendAndClose(&pb.ImportWorkspaceResponse{Files: files, Bytes: size, DoneAt: timestamppb.New(time.Now())}) // the system's clock, as ctimes
}

// unpack writes the archive's regular files into the workspace.
func unpack(ctx context.Context, sb driver.Sandbox, tr *tar.Reader) (files, size int64, err error) {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, size, nil
		}
		if err != nil {
			return files, size, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "reading the archive")
		}
		name, err := archiveName(hdr.Name)
		if err != nil {
			return files, size, err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			// Parents are made by WriteFile; an empty directory is not kept.
		case tar.TypeReg:
			if _, ok := hdr.PAXRecords[UnchangedRecord]; ok {
				return files, size, errdefs.InvalidArgument("archive entry %s is an increment's list of unchanged files: compose the snapshots first", name)
			}
			if _, ok := hdr.PAXRecords[SkippedRecord]; ok {
				return files, size, errdefs.InvalidArgument("archive entry %s was left out of its snapshot, with no content", name)
			}
			if name == "." {
				return files, size, errdefs.InvalidArgument("archive entry %q names the workspace itself", hdr.Name)
			}
			mode := hdr.FileInfo().Mode().Perm()
			if mode == 0 {
				mode = 0o644
			}
			n, err := copyIn(ctx, sb, name, mode, tr)
			if err != nil {
				return files, size, err
			}
			files++
			size += n
		default:
			return files, size, errdefs.InvalidArgument("archive entry %s: only directories and regular files can be imported", name)
		}
	}
}

// copyIn streams one archive entry into the workspace file name.
func copyIn(ctx context.Context, sb driver.Sandbox, name string, mode fs.FileMode, r io.Reader) (int64, error) {
	w, err := sb.CreateFile(ctx, name, mode)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(w, r)
	if err != nil {
		w.Close()
		return n, fmt.Errorf("copying archive entry %s: %w", name, err)
	}
	return n, w.Close()
}

// archiveName checks an archive entry's name: relative, inside the
// workspace, without "..". It returns the name cleaned ("." for the
// workspace itself).
func archiveName(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") {
		return "", errdefs.InvalidArgument("archive entry %q: want a relative path", name)
	}
	for _, part := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if part == ".." {
			return "", errdefs.InvalidArgument("archive entry %q: \"..\" is not allowed", name)
		}
	}
	return path.Clean(name), nil
}

// recvReader reads a byte stream that arrives in messages.
type recvReader struct {
	buf  []byte
	recv func() ([]byte, error)
}

func (r *recvReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		b, err := r.recv()
		if err != nil {
			return 0, err // io.EOF at the end of the client's stream
		}
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
