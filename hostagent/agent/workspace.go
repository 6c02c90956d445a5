package agent

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The workspace moves between hosts as a tar archive, made and unpacked
// through the driver's file API: the same path confinement as ReadFile and
// WriteFile applies (no symlink escapes), and only directories and regular
// files travel.

// ExportWorkspace streams the sandbox's workspace as a tar archive.
func (s *sandboxServer) ExportWorkspace(req *pb.ExportWorkspaceRequest, stream pb.SandboxService_ExportWorkspaceServer) error {
	sb, done, err := s.a.useFenced(req.Key) // a mover exports a fenced sandbox
	if err != nil {
		return err
	}
	defer done()
	w := &chunkStream{send: func(b []byte) error { return stream.Send(&pb.ExportWorkspaceResponse{Data: b}) }}
	tw := tar.NewWriter(w)
	if err := writeTree(stream.Context(), sb, tw, ""); err != nil {
		return fmt.Errorf("exporting the workspace of %s: %w", req.Key, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return w.flush()
}

// writeTree adds the directory rel of the workspace, recursively, to tw.
func writeTree(ctx context.Context, sb driver.Sandbox, tw *tar.Writer, rel string) error {
	files, err := sb.ListFiles(ctx, rel)
	if err != nil {
		return err
	}
	for _, f := range files {
		switch {
		case f.Mode.IsDir():
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: f.Path + "/", Mode: int64(f.Mode.Perm()), ModTime: f.ModTime}); err != nil {
				return err
			}
			if err := writeTree(ctx, sb, tw, f.Path); err != nil {
				return err
			}
		case f.Mode.IsRegular():
			if err := writeFile(ctx, sb, tw, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeFile adds one regular file to tw, streamed: never whole in memory.
// The header takes the size the open file has; a file that shrinks while it
// is copied is padded with zeros and one that grows is cut there, so the
// archive stays well formed (the sandbox may still be writing to it).
func writeFile(ctx context.Context, sb driver.Sandbox, tw *tar.Writer, f driver.FileInfo) error {
	r, size, err := sb.OpenFile(ctx, f.Path)
	if errdefs.IsNotFound(err) {
		return nil // removed since the listing
	}
	if err != nil {
		return err
	}
	defer r.Close()
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: int64(f.Mode.Perm()), Size: size, ModTime: f.ModTime}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.LimitReader(r, size))
	if err != nil {
		return fmt.Errorf("copying %s: %w", f.Path, err)
	}
	if n < size {
		_, err = io.CopyN(tw, zeros{}, size-n)
	}
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
	return stream.SendAndClose(&pb.ImportWorkspaceResponse{Files: files, Bytes: size})
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
