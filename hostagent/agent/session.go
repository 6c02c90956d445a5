package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"sync"
	"syscall"
	"unicode"
	"unicode/utf8"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// A session's mounts, from the host side (driver.SessionDirs).
//
// Uploads: the control plane says which files the sandbox must show
// (SyncUploads) and sends the missing ones (StageUpload). A file is
// written into the staging directory (same file system, not shown in the
// sandbox), made root's with mode 0444, and renamed into place, so the
// sandbox sees it whole or not at all; its parent directories are made
// root's, 0755. The uploads directory itself is root's and bind-mounted
// read-only: the sandbox's user (uid 1000) can neither change a file nor
// add, rename or remove one. What the host staged is kept in a manifest
// (staging/manifest.json: path → file id), so a sync after a restart of
// either side removes exactly the files no longer wanted.
//
// Outputs: ExportOutputs walks the outputs directory through an os.Root
// (nothing resolves outside it), sends regular files only, opened without
// following a final symbolic link and checked again once open, and skips
// the rest with a reason.

// Bounds of the session mounts.
const (
	maxUploads         = 100
	maxUploadPath      = 1024
	maxUploadComponent = 255
	maxUploadDepth     = 16
	// maxUploadBytes bounds one staged file (the Files API's limit is
	// 500 MiB by default; an operator may raise it).
	maxUploadBytes = 4 << 30
	maxManifest    = 1 << 20

	defaultOutputFiles = 1000
	defaultOutputBytes = 1 << 30
	maxOutputFiles     = 10_000
	maxOutputBytes     = 16 << 30
	maxOutputDepth     = 16
	// maxOutputEntries bounds the directory entries an export visits,
	// whatever they are.
	maxOutputEntries = 100_000
	maxOutputReasons = 10
	outputChunk      = 1 << 20
)

// uploadLocks serialise the uploads calls of one sandbox.
type uploadLocks struct {
	mu sync.Mutex
	// m holds a lock per sandbox key; never pruned (one small mutex per
	// session this host served).
	m map[string]*sync.Mutex
}

func (l *uploadLocks) lock(key string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sync.Mutex{}
	}
	m := l.m[key]
	if m == nil {
		m = &sync.Mutex{}
		l.m[key] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// sessionDirs returns the sandbox's mount directories.
func sessionDirs(sb driver.Sandbox) (driver.Dirs, error) {
	sd, ok := sb.(driver.SessionDirs)
	if !ok {
		return driver.Dirs{}, errdefs.Unimplemented("sandboxes of provider %s have no session mounts", sb.Ref().Provider)
	}
	return sd.SessionDirs(), nil
}

// maxMemoryUploads bounds the memory area's files: a session mounts at
// most 8 stores of at most 2,000 memories each (the control plane's
// bounds), and this host takes no more than that.
const maxMemoryUploads = 16_000

// areaDirs returns the directories of a mount area: "" the uploads;
// "memory" the memory stores, staged and tracked beside the uploads' (a
// manifest of their own, on the memory's file system), with its writable
// directories (memoryarea.go).
func areaDirs(d driver.Dirs, area string) (driver.Dirs, error) {
	switch area {
	case "":
		return d, nil
	case "memory":
		if d.Memory == "" {
			return driver.Dirs{}, errdefs.Unimplemented("this sandbox has no memory mount")
		}
		if err := ensureStaging(d); err != nil {
			return driver.Dirs{}, err
		}
		staging := d.MemoryStaging
		if staging == "" {
			staging = filepath.Join(d.Staging, "memory")
		}
		return driver.Dirs{Uploads: d.Memory, Outputs: d.Outputs, Staging: staging, Writer: d.Writer}, nil
	}
	return driver.Dirs{}, errdefs.InvalidArgument("unknown mount area %q", area)
}

// uploadPath checks a path relative to the uploads directory.
func uploadPath(p string) error {
	switch {
	case p == "" || len(p) > maxUploadPath:
		return errdefs.InvalidArgument("upload path: want 1 to %d bytes", maxUploadPath)
	case !utf8.ValidString(p) || strings.ContainsFunc(p, func(c rune) bool { return c == '\\' || unicode.IsControl(c) }):
		return errdefs.InvalidArgument("upload path %q: not valid UTF-8, or a control character or backslash", p)
	case path.IsAbs(p) || path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../"):
		return errdefs.InvalidArgument("upload path %q: want a clean relative path inside the uploads", p)
	}
	parts := strings.Split(p, "/")
	if len(parts) > maxUploadDepth {
		return errdefs.InvalidArgument("upload path %q: more than %d deep", p, maxUploadDepth)
	}
	for _, part := range parts {
		if len(part) > maxUploadComponent {
			return errdefs.InvalidArgument("upload path %q: a component longer than %d bytes", p, maxUploadComponent)
		}
	}
	return nil
}

func checkUpload(u *pb.Upload) error {
	if u == nil {
		return errdefs.InvalidArgument("an upload is required")
	}
	if err := uploadPath(u.Path); err != nil {
		return err
	}
	if u.FileId == "" || len(u.FileId) > 128 || strings.ContainsFunc(u.FileId, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-')
	}) {
		return errdefs.InvalidArgument("upload %s: %q is not a file id", u.Path, u.FileId)
	}
	return nil
}

// manifest is what the host staged in a sandbox's uploads: path → file id.
type manifest map[string]string

func manifestPath(d driver.Dirs) string { return filepath.Join(d.Staging, "manifest.json") }

func loadManifest(d driver.Dirs) (manifest, error) {
	f, err := os.Open(manifestPath(d))
	if errors.Is(err, fs.ErrNotExist) {
		return manifest{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxManifest+1))
	if err != nil {
		return nil, err
	}
	m := manifest{}
	if len(b) > maxManifest || json.Unmarshal(b, &m) != nil {
		// Only this agent writes it: start again, staging everything.
		return manifest{}, nil
	}
	return m, nil
}

// ensureStaging makes the staging directory, whose parent must exist (a
// destroyed sandbox's has gone: no directory is made again for it).
func ensureStaging(d driver.Dirs) error {
	if err := os.Mkdir(d.Staging, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("staging directory: %w", err)
	}
	return nil
}

func saveManifest(d driver.Dirs, m manifest) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(d.Staging, "manifest-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), manifestPath(d))
}

// removeUpload removes one staged file and the directories it leaves
// empty, up to the uploads directory; what is gone already is no error.
func removeUpload(root *os.Root, p string) error {
	if err := root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
		if root.Remove(dir) != nil { // not empty (or gone): stop
			break
		}
	}
	return nil
}

// SyncUploads removes the staged files not listed and names the listed
// ones missing.
func (s *sandboxServer) SyncUploads(ctx context.Context, req *pb.SyncUploadsRequest) (*pb.SyncUploadsResponse, error) {
	if limit := map[string]int{"": maxUploads, "memory": maxMemoryUploads}[req.Area]; len(req.Uploads) > limit {
		return nil, errdefs.InvalidArgument("at most %d uploads (got %d)", limit, len(req.Uploads))
	}
	if len(req.Writable) > 0 && req.Area != "memory" {
		return nil, errdefs.InvalidArgument("only the memory area has writable directories")
	}
	want := map[string]string{}
	for _, u := range req.Uploads {
		if err := checkUpload(u); err != nil {
			return nil, err
		}
		if _, dup := want[u.Path]; dup {
			return nil, errdefs.InvalidArgument("upload %s is listed twice", u.Path)
		}
		want[u.Path] = u.FileId
	}
	for p := range want {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if _, ok := want[dir]; ok {
				return nil, errdefs.InvalidArgument("upload %s lies beneath upload %s, a file", p, dir)
			}
		}
	}
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return nil, err
	}
	defer done()
	dirs, err := sessionDirs(sb)
	if err != nil {
		return nil, err
	}
	defer s.a.uploads.lock(req.Key)()
	if err := ensureStaging(dirs); err != nil {
		return nil, err
	}
	if dirs, err = areaDirs(dirs, req.Area); err != nil {
		return nil, err
	}
	if err := ensureStaging(dirs); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dirs.Uploads)
	if err != nil {
		return nil, fmt.Errorf("uploads of %s: %w", req.Key, err)
	}
	defer root.Close()
	writable, err := makeWritable(root, dirs, req.Writable)
	if err != nil {
		return nil, fmt.Errorf("memory of %s: %w", req.Key, err)
	}
	m, err := loadManifest(dirs)
	if err != nil {
		return nil, fmt.Errorf("uploads manifest of %s: %w", req.Key, err)
	}
	changed := false
	for _, p := range slices.Sorted(maps.Keys(m)) {
		if want[p] == m[p] {
			continue
		}
		rm := removeUpload
		if writable[topDir(p)] {
			rm = removeWritable
			if _, ok := want[p]; ok {
				// The session's copy, perhaps its committed write:
				// told below; a new version is staged over it.
				rm = func(*os.Root, string) error { return nil }
			}
		}
		if err := rm(root, p); err != nil {
			return nil, fmt.Errorf("removing upload %s of %s: %w", p, req.Key, err)
		}
		delete(m, p)
		changed = true
	}
	out := &pb.SyncUploadsResponse{}
	for _, u := range req.Uploads {
		p := u.Path
		fi, err := root.Lstat(p)
		switch {
		case m[p] == u.FileId && err == nil && fi.Mode().IsRegular():
			continue
		case writable[topDir(p)] && u.Sha256 != "" && err == nil && hasContent(root, p, fi, u.Sha256):
			// The session's own write, committed as this version.
			m[p], changed = u.FileId, true
			continue
		}
		out.Missing = append(out.Missing, p)
	}
	slices.Sort(out.Missing)
	if changed {
		if err := saveManifest(dirs, m); err != nil {
			return nil, fmt.Errorf("uploads manifest of %s: %w", req.Key, err)
		}
	}
	return out, nil
}

// StageUpload writes one upload: to a temporary file in the staging
// directory, then renamed into place.
func (s *sandboxServer) StageUpload(stream pb.SandboxService_StageUploadServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := checkUpload(first.Upload); err != nil {
		return err
	}
	if first.Size < 0 || first.Size > maxUploadBytes {
		return errdefs.InvalidArgument("upload %s: size %d is not from 0 to %d", first.Upload.Path, first.Size, int64(maxUploadBytes))
	}
	sb, done, err := s.a.use(first.Key)
	if err != nil {
		return err
	}
	defer done()
	dirs, err := sessionDirs(sb)
	if err != nil {
		return err
	}
	defer s.a.uploads.lock(first.Key)()
	if err := ensureStaging(dirs); err != nil {
		return err
	}
	if dirs, err = areaDirs(dirs, first.Area); err != nil {
		return err
	}
	if err := ensureStaging(dirs); err != nil {
		return err
	}
	p := first.Upload.Path
	tmp, err := os.CreateTemp(dirs.Staging, "upload-*")
	if err != nil {
		return fmt.Errorf("staging upload %s: %w", p, err)
	}
	staged := false
	defer func() {
		if !staged {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	r := &recvReader{buf: first.Data, recv: func() ([]byte, error) {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return m.Data, nil
	}}
	n, err := io.Copy(tmp, io.LimitReader(r, first.Size+1))
	switch {
	case err != nil:
		return fmt.Errorf("staging upload %s: %w", p, err)
	case n != first.Size:
		return errdefs.InvalidArgument("upload %s: %d bytes sent, want %d", p, n, first.Size)
	}
	root, err := os.OpenRoot(dirs.Uploads)
	if err != nil {
		return fmt.Errorf("uploads of %s: %w", first.Key, err)
	}
	defer root.Close()
	w, rest, writable := (*os.Root)(nil), "", false
	if first.Area == "memory" { // only the memory area has writable directories
		w, rest, writable = writableDir(root, dirs, p)
	}
	if writable {
		// A read_write memory store's: the sandbox's, links and all.
		if err := stageWritable(w, tmp, dirs, rest); err != nil {
			return fmt.Errorf("staging memory %s: %w", p, err)
		}
	} else {
		if err := tmp.Chmod(0o444); err != nil {
			return fmt.Errorf("staging upload %s: %w", p, err)
		}
		if err := tmp.Close(); err != nil {
			return fmt.Errorf("staging upload %s: %w", p, err)
		}
		if dir := path.Dir(p); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("staging upload %s: %w", p, err)
			}
		}
		// The uploads directory is the host's alone (read-only in the
		// sandbox), so nothing in it is a link; the root above checked the
		// parents.
		if err := os.Rename(tmp.Name(), filepath.Join(dirs.Uploads, filepath.FromSlash(p))); err != nil {
			return fmt.Errorf("staging upload %s: %w", p, err)
		}
	}
	staged = true
	m, err := loadManifest(dirs)
	if err != nil {
		return fmt.Errorf("uploads manifest of %s: %w", first.Key, err)
	}
	m[p] = first.Upload.FileId
	if err := saveManifest(dirs, m); err != nil {
		return fmt.Errorf("uploads manifest of %s: %w", first.Key, err)
	}
	return stream.SendAndClose(&pb.StageUploadResponse{})
}

// outputsExport is one ExportOutputs in progress.
type outputsExport struct {
	root     *os.Root
	stream   pb.SandboxService_ExportOutputsServer
	known    map[string]*pb.KnownOutput
	maxFiles int64
	maxBytes int64
	entries  int
	done     pb.OutputsDone
}

func (x *outputsExport) skip(format string, args ...any) {
	x.done.Skipped++
	if len(x.done.Reasons) < maxOutputReasons {
		x.done.Reasons = append(x.done.Reasons, fmt.Sprintf(format, args...))
	}
}

// ExportOutputs streams the regular files beneath the outputs directory.
func (s *sandboxServer) ExportOutputs(req *pb.ExportOutputsRequest, stream pb.SandboxService_ExportOutputsServer) error {
	x := &outputsExport{stream: stream, known: map[string]*pb.KnownOutput{}, maxFiles: req.MaxFiles, maxBytes: req.MaxBytes}
	if x.maxFiles <= 0 {
		x.maxFiles = defaultOutputFiles
	}
	if x.maxBytes <= 0 {
		x.maxBytes = defaultOutputBytes
	}
	x.maxFiles, x.maxBytes = min(x.maxFiles, maxOutputFiles), min(x.maxBytes, maxOutputBytes)
	if len(req.Known) > maxOutputFiles {
		return errdefs.InvalidArgument("at most %d known outputs (got %d)", maxOutputFiles, len(req.Known))
	}
	for _, k := range req.Known {
		x.known[k.Path] = k
	}
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return err
	}
	defer done()
	dirs, err := sessionDirs(sb)
	if err != nil {
		return err
	}
	if req.MemoryDir != "" {
		x.root, err = openWritable(dirs, req.MemoryDir)
		if err != nil {
			return fmt.Errorf("memory %s of %s: %w", req.MemoryDir, req.Key, err)
		}
	} else if x.root, err = os.OpenRoot(dirs.Outputs); err != nil {
		return fmt.Errorf("outputs of %s: %w", req.Key, err)
	}
	defer x.root.Close()
	if err := x.dir(".", 0); err != nil && !errors.Is(err, errStopWalk) {
		return err
	}
	return stream.Send(&pb.ExportOutputsResponse{Msg: &pb.ExportOutputsResponse_Done{Done: &x.done}})
}

// outputName checks one entry's name and returns its path.
func outputName(dir, name string) (string, error) {
	p := name
	if dir != "." {
		p = dir + "/" + name
	}
	switch {
	case !utf8.ValidString(name) || strings.ContainsFunc(name, func(c rune) bool { return c == '\\' || unicode.IsControl(c) }):
		return "", fmt.Errorf("%q: not valid UTF-8, or a control character or backslash in its name", p)
	case len(name) > maxUploadComponent || len(p) > maxUploadPath:
		return "", fmt.Errorf("%q: name too long", p)
	}
	return p, nil
}

// dir sends the files beneath dir, in name order.
func (x *outputsExport) dir(dir string, depth int) error {
	f, err := x.root.Open(dir)
	if err != nil {
		x.skip("%s: %v", dir, errors.Unwrap(err))
		return nil
	}
	var entries []fs.DirEntry
	for {
		batch, err := f.ReadDir(256)
		entries = append(entries, batch...)
		x.entries += len(batch)
		if x.entries > maxOutputEntries {
			f.Close()
			x.skip("more than %d entries: the rest are left out", maxOutputEntries)
			return errStopWalk
		}
		if err != nil {
			break // io.EOF, or the directory went
		}
	}
	f.Close()
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range entries {
		p, err := outputName(dir, e.Name())
		if err != nil {
			x.skip("%v", err)
			continue
		}
		switch t := e.Type(); {
		case t.IsDir() && depth+1 >= maxOutputDepth:
			x.skip("%s: more than %d directories deep", p, maxOutputDepth)
		case t.IsDir():
			if err := x.dir(p, depth+1); err != nil {
				return err
			}
		case t.IsRegular():
			if err := x.file(p); err != nil {
				return err
			}
		default:
			x.skip("%s: not a regular file (%s)", p, t.Type())
		}
	}
	return nil
}

// errStopWalk ends a walk that reached a bound; what was sent stands.
var errStopWalk = errors.New("stop")

// file sends one regular file, or skips it.
func (x *outputsExport) file(p string) error {
	f, err := x.root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		x.skip("%s: %v", p, errors.Unwrap(err))
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		x.skip("%s: %v", p, err)
		return nil
	case !fi.Mode().IsRegular():
		x.skip("%s: not a regular file", p)
		return nil
	case x.done.Files >= x.maxFiles:
		x.skip("%s: past the %d files an export sends", p, x.maxFiles)
		return nil
	}
	size := fi.Size()
	unchanged := false
	if k := x.known[p]; k != nil && k.Size == size {
		h := sha256.New()
		if n, err := io.Copy(h, io.LimitReader(f, size)); err != nil || n != size {
			x.skip("%s: changed while it was read", p)
			return nil
		}
		unchanged = hex.EncodeToString(h.Sum(nil)) == k.Sha256
		if !unchanged {
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				x.skip("%s: %v", p, err)
				return nil
			}
		}
	}
	// Content sent is bounded; an unchanged file sends none.
	if !unchanged && x.done.Bytes+size > x.maxBytes {
		x.skip("%s: %d bytes would pass the %d bytes an export sends", p, size, x.maxBytes)
		return nil
	}
	if err := x.stream.Send(&pb.ExportOutputsResponse{Msg: &pb.ExportOutputsResponse_File{File: &pb.OutputFile{Path: p, Size: size, Unchanged: unchanged}}}); err != nil {
		return err
	}
	x.done.Files++
	if unchanged {
		return nil
	}
	x.done.Bytes += size
	buf := make([]byte, outputChunk)
	for left := size; left > 0; {
		n, err := io.ReadFull(f, buf[:min(left, outputChunk)])
		if n > 0 {
			if serr := x.stream.Send(&pb.ExportOutputsResponse{Msg: &pb.ExportOutputsResponse_Data{Data: buf[:n]}}); serr != nil {
				return serr
			}
			left -= int64(n)
		}
		if err != nil && left > 0 {
			// Its size was announced: the export cannot go on.
			return errdefs.Conflict("output %s shrank while it was sent; export again", p)
		}
	}
	return nil
}
