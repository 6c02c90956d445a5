package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// DefaultMaxImageBytes is Config.MaxImageBytes's default.
const DefaultMaxImageBytes = 8 << 30

// imageChunkBytes is the most archive bytes one ExportImage message
// carries.
const imageChunkBytes = 1 << 20

// ExportImage streams an image as an OCI layout tar in chunks of at most
// imageChunkBytes, bounded by the request's max_bytes and the host's.
func (s *sandboxServer) ExportImage(req *pb.ExportImageRequest, stream pb.SandboxService_ExportImageServer) error {
	if err := validImageName("export", req.Image); err != nil {
		return err
	}
	if req.MaxBytes < 0 {
		return errdefs.InvalidArgument("export %s: negative max_bytes", req.Image)
	}
	b, err := s.a.builder()
	if err != nil {
		return err
	}
	max := s.a.cfg.MaxImageBytes
	if req.MaxBytes > 0 && req.MaxBytes < max {
		max = req.MaxBytes
	}
	w := &chunkWriter{send: func(p []byte) error { return stream.Send(&pb.ExportImageResponse{Data: p}) }}
	if err := b.ExportImage(stream.Context(), req.Image, max, w); err != nil {
		return err
	}
	return w.flush()
}

// RemoveImage removes an image a build made or an import brought.
func (s *sandboxServer) RemoveImage(ctx context.Context, req *pb.RemoveImageRequest) (*pb.RemoveImageResponse, error) {
	if err := validImageName("remove", req.Image); err != nil {
		return nil, err
	}
	b, err := s.a.builder()
	if err != nil {
		return nil, err
	}
	if err := b.RemoveImage(ctx, req.Image); err != nil {
		return nil, err
	}
	return &pb.RemoveImageResponse{}, nil
}

// chunkWriter sends what is written to it in chunks of imageChunkBytes
// (the last one shorter), each a buffer of its own.
type chunkWriter struct {
	send func([]byte) error
	buf  []byte
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if c.buf == nil {
			c.buf = make([]byte, 0, imageChunkBytes)
		}
		k := min(len(p), imageChunkBytes-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		if len(c.buf) == imageChunkBytes {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (c *chunkWriter) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	err := c.send(c.buf)
	c.buf = nil
	return err
}

// ImportImage takes an archive ExportImage sent: the first message names
// the image and its size (at most the host's MaxImageBytes); the bytes
// go to a temporary file in the state dir, exactly size of them, and the
// driver imports it, checking it holds that image alone.
func (s *sandboxServer) ImportImage(stream pb.SandboxService_ImportImageServer) error {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return errdefs.InvalidArgument("import: no message")
	}
	if err != nil {
		return err
	}
	name, size := first.Image, first.Size
	if err := validImageName("import", name); err != nil {
		return err
	}
	switch {
	case size <= 0:
		return errdefs.InvalidArgument("import %s: the archive's size is required", name)
	case size > s.a.cfg.MaxImageBytes:
		return errdefs.ResourceExhausted("import %s: the archive is %d bytes, over the host's bound of %d", name, size, s.a.cfg.MaxImageBytes)
	}
	b, err := s.a.builder()
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(s.a.cfg.StateDir, "image-import-*.tar")
	if err != nil {
		return fmt.Errorf("import %s: %w", name, err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	written := int64(0)
	for m := first; ; {
		if written += int64(len(m.Data)); written > size {
			return errdefs.InvalidArgument("import %s: the archive is longer than its size, %d bytes", name, size)
		}
		if _, err := f.Write(m.Data); err != nil {
			return fmt.Errorf("import %s: %w", name, err)
		}
		if m, err = stream.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return err
		}
	}
	if written != size {
		return errdefs.InvalidArgument("import %s: the archive ended at %d bytes of its %d", name, written, size)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	dg, err := b.ImportImage(stream.Context(), name, f)
	if err != nil {
		return err
	}
	s.a.log.Info("imported image", "image", name, "digest", dg, "bytes", size)
	return stream.SendAndClose(&pb.ImportImageResponse{Digest: dg})
}
