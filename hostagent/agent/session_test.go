package agent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// sessionDirs returns the host directories behind sandbox key's mounts.
func (e *env) sessionDirs(key string) driver.Dirs {
	e.t.Helper()
	refs, err := e.fake.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ref := range refs {
		if ref.Key == key {
			sb, err := e.fake.Attach(context.Background(), ref)
			if err != nil {
				e.t.Fatal(err)
			}
			return sb.(driver.SessionDirs).SessionDirs()
		}
	}
	e.t.Fatalf("no sandbox %s", key)
	return driver.Dirs{}
}

func stage(c pb.SandboxServiceClient, key string, u *pb.Upload, size int64, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.StageUpload(ctx)
	if err != nil {
		return err
	}
	err = st.Send(&pb.StageUploadRequest{Key: key, Upload: u, Size: size})
	for err == nil && len(data) > 0 {
		k := min(len(data), 256<<10)
		err = st.Send(&pb.StageUploadRequest{Data: data[:k]})
		data = data[k:]
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = st.CloseAndRecv()
	return errgrpc.FromStatus(err)
}

func syncUploads(t *testing.T, c pb.SandboxServiceClient, key string, us ...*pb.Upload) []string {
	t.Helper()
	resp, err := c.SyncUploads(context.Background(), &pb.SyncUploadsRequest{Key: key, Uploads: us})
	if err != nil {
		t.Fatalf("SyncUploads: %v", err)
	}
	return resp.Missing
}

// Uploads are staged whole (a temporary file renamed into place), mode
// 0444, in parent directories made for them; a sync names what is
// missing and removes what is no longer listed, with the directories it
// leaves empty; a short upload leaves nothing behind; bad paths are
// refused.
func TestUploadsStagedAndSynced(t *testing.T) {
	e := setup(t)
	e.start()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	dirs := e.sessionDirs("s1")
	big := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB: many messages
	small := &pb.Upload{Path: "a/b/c.txt", FileId: "file_small"}
	large := &pb.Upload{Path: "big.bin", FileId: "file_big"}
	if got := syncUploads(t, c, "s1", small, large); strings.Join(got, ",") != "a/b/c.txt,big.bin" {
		t.Fatalf("missing %v", got)
	}
	if err := stage(c, "s1", small, 6, []byte("small\n")); err != nil {
		t.Fatal(err)
	}
	if err := stage(c, "s1", large, int64(len(big)), big); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][]byte{"a/b/c.txt": []byte("small\n"), "big.bin": big} {
		fi, err := os.Stat(filepath.Join(dirs.Uploads, p))
		if err != nil || fi.Mode().Perm() != 0o444 {
			t.Fatalf("%s: %v %v", p, fi, err)
		}
		if got, _ := os.ReadFile(filepath.Join(dirs.Uploads, p)); !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, want %d", p, len(got), len(want))
		}
	}
	if got := syncUploads(t, c, "s1", small, large); len(got) != 0 {
		t.Fatalf("after staging, missing %v", got)
	}
	// Another file at the same path is missing until staged.
	if got := syncUploads(t, c, "s1", &pb.Upload{Path: "big.bin", FileId: "file_other"}); strings.Join(got, ",") != "big.bin" {
		t.Fatalf("a new file id at big.bin: missing %v", got)
	}
	if _, err := os.Stat(filepath.Join(dirs.Uploads, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a/b/c.txt's directories after it was no longer listed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dirs.Uploads, "big.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("big.bin (of another file id) is still there: %v", err)
	}
	// Removing again is no error.
	if got := syncUploads(t, c, "s1"); len(got) != 0 {
		t.Fatalf("empty sync: missing %v", got)
	}

	// Short or long content: refused, and nothing is left.
	if err := stage(c, "s1", small, 10, []byte("short")); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
		t.Errorf("a short upload: %v", err)
	}
	if err := stage(c, "s1", small, 2, []byte("too long")); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
		t.Errorf("a long upload: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dirs.Uploads, "a/b/c.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused upload is there: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(dirs.Staging, "upload-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left in staging: %v", left)
	}

	for _, p := range []string{"", "../x", "/etc/x", "a//b", "a/./b", "a/", ".", "a\\b", "a\x00b", strings.Repeat("d/", 17) + "f", strings.Repeat("x", 256)} {
		if _, err := c.SyncUploads(context.Background(), &pb.SyncUploadsRequest{Key: "s1", Uploads: []*pb.Upload{{Path: p, FileId: "file_x"}}}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
			t.Errorf("sync of %q: %v", p, err)
		}
		if err := stage(c, "s1", &pb.Upload{Path: p, FileId: "file_x"}, 1, []byte("x")); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
			t.Errorf("stage of %q: %v", p, err)
		}
	}
	for name, us := range map[string][]*pb.Upload{
		"twice":        {{Path: "x", FileId: "file_a"}, {Path: "x", FileId: "file_b"}},
		"beneath file": {{Path: "x", FileId: "file_a"}, {Path: "x/y", FileId: "file_b"}},
		"bad file id":  {{Path: "x", FileId: "file/../a"}},
	} {
		if _, err := c.SyncUploads(context.Background(), &pb.SyncUploadsRequest{Key: "s1", Uploads: us}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
			t.Errorf("sync %s: %v", name, err)
		}
	}
	if _, err := c.SyncUploads(context.Background(), &pb.SyncUploadsRequest{Key: "nope"}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.NotFoundKind {
		t.Errorf("sync of an unknown sandbox: %v", err)
	}
}

// exportOutputs collects an ExportOutputs stream: each file's content
// (nil when unchanged) and the end.
func exportOutputs(t *testing.T, c pb.SandboxServiceClient, req *pb.ExportOutputsRequest) (map[string][]byte, *pb.OutputsDone) {
	t.Helper()
	st, err := c.ExportOutputs(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	var cur string
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("ExportOutputs: %v", err)
		}
		switch {
		case m.GetFile() != nil:
			cur = m.GetFile().Path
			if m.GetFile().Unchanged {
				files[cur] = nil
			} else {
				files[cur] = []byte{}
			}
		case m.GetDone() != nil:
			return files, m.GetDone()
		default:
			files[cur] = append(files[cur], m.GetData()...)
		}
	}
}

// Outputs: regular files only, beneath any directory up to 16 deep; links
// (to files or directories, inside or out), FIFOs, bad names and too deep
// directories are left out with reasons; known unchanged files are sent
// without content; the file and byte bounds hold.
func TestOutputsExported(t *testing.T) {
	e := setup(t)
	e.start()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	out := e.sessionDirs("s1").Outputs
	write := func(p, data string) {
		t.Helper()
		full := filepath.Join(out, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	big := strings.Repeat("x", 3<<20)
	write("result.csv", "a,b\n1,2\n")
	write("sub/deep/n.txt", "nested")
	write("big.bin", big)
	write(strings.Repeat("d/", 16)+"toodeep.txt", "deep")
	write("bad\xffname", "bad")
	for name, target := range map[string]string{"passwd": "/etc/passwd", "inside": "result.csv", "dirlink": "/etc"} {
		if err := os.Symlink(target, filepath.Join(out, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(out, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}

	files, done := exportOutputs(t, c, &pb.ExportOutputsRequest{Key: "s1"})
	want := map[string]string{"result.csv": "a,b\n1,2\n", "sub/deep/n.txt": "nested", "big.bin": big}
	if len(files) != len(want) {
		t.Fatalf("exported %d files, want %d: %v (skipped %v)", len(files), len(want), slices.Collect(maps.Keys(files)), done.Reasons)
	}
	for p, data := range want {
		if string(files[p]) != data {
			t.Errorf("%s: %d bytes, want %d", p, len(files[p]), len(data))
		}
	}
	if done.Files != 3 || done.Bytes != int64(8+6+len(big)) || done.Skipped != 6 {
		t.Errorf("done %+v; want 3 files, 6 skipped (3 links, a FIFO, a bad name, a too deep directory)", done)
	}
	t.Logf("skipped: %q", done.Reasons)

	// Known and unchanged: no content. Known with other content: whole.
	sum := sha256.Sum256([]byte("a,b\n1,2\n"))
	files, _ = exportOutputs(t, c, &pb.ExportOutputsRequest{Key: "s1", Known: []*pb.KnownOutput{
		{Path: "result.csv", Size: 8, Sha256: hex.EncodeToString(sum[:])},
		{Path: "sub/deep/n.txt", Size: 6, Sha256: strings.Repeat("0", 64)},
	}})
	if files["result.csv"] != nil || string(files["sub/deep/n.txt"]) != "nested" || len(files["big.bin"]) != len(big) {
		t.Errorf("with known outputs: result.csv %q, n.txt %q", files["result.csv"], files["sub/deep/n.txt"])
	}

	// Bounds: one file; then bytes below big.bin.
	files, done = exportOutputs(t, c, &pb.ExportOutputsRequest{Key: "s1", MaxFiles: 1})
	if len(files) != 1 || done.Files != 1 {
		t.Errorf("max_files 1: %v, %+v", slices.Collect(maps.Keys(files)), done)
	}
	files, _ = exportOutputs(t, c, &pb.ExportOutputsRequest{Key: "s1", MaxBytes: 1 << 20})
	if _, ok := files["big.bin"]; ok || len(files) != 2 {
		t.Errorf("max_bytes 1 MiB: %v", slices.Collect(maps.Keys(files)))
	}
}

func syncMemory(t *testing.T, c pb.SandboxServiceClient, key string, writable []string, us ...*pb.Upload) []string {
	t.Helper()
	resp, err := c.SyncUploads(context.Background(), &pb.SyncUploadsRequest{Key: key, Uploads: us, Area: "memory", Writable: writable})
	if err != nil {
		t.Fatalf("SyncUploads: %v", err)
	}
	return resp.Missing
}

func stageMemory(c pb.SandboxServiceClient, key string, u *pb.Upload, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.StageUpload(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&pb.StageUploadRequest{Key: key, Upload: u, Size: int64(len(data)), Data: data, Area: "memory"}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = st.CloseAndRecv()
	return errgrpc.FromStatus(err)
}

func sum(b string) string {
	h := sha256.Sum256([]byte(b))
	return hex.EncodeToString(h[:])
}

// A read_write memory store's directory: the host stages into it files
// the sandbox may change, never through a link the sandbox made (not out
// of the area, not into another store's directory), makes a file again
// where the sandbox put a directory, leaves the sandbox's own files
// alone, takes the session's committed write as the version listed
// (not missing, not sent again), and exports the directory's changes.
// A read_only store's directory next to it is staged as uploads are.
func TestWritableMemoryArea(t *testing.T) {
	e := setup(t)
	e.start()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	dirs := e.sessionDirs("s1")
	mem := dirs.Memory
	outside := t.TempDir()

	notes := &pb.Upload{Path: "notes/a/x.md", FileId: "memver_1"}
	ro := &pb.Upload{Path: "ro/y.md", FileId: "memver_2"}
	if got := syncMemory(t, c, "s1", []string{"notes"}, notes, ro); strings.Join(got, ",") != "notes/a/x.md,ro/y.md" {
		t.Fatalf("missing %v", got)
	}
	// The sandbox plants links where the host will stage: notes/a leads
	// out of the area, and into the read-only store.
	if err := os.Symlink(outside, filepath.Join(mem, "notes/a")); err != nil {
		t.Fatal(err)
	}
	for _, u := range []*pb.Upload{notes, ro} {
		if err := stageMemory(c, "s1", u, []byte("content of "+u.Path)); err != nil {
			t.Fatalf("staging %s: %v", u.Path, err)
		}
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Fatalf("staging followed the sandbox's link out of the store: %v", left)
	}
	fi, err := os.Lstat(filepath.Join(mem, "notes/a"))
	if err != nil || !fi.IsDir() {
		t.Fatalf("notes/a is not a directory again: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(mem, "notes/a/x.md")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("the writable memory: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(mem, "ro/y.md")); err != nil || fi.Mode().Perm() != 0o444 {
		t.Fatalf("the read-only memory: %v %v", fi, err)
	}

	// The session edits x.md, adds z.md and its own directory; the host
	// exports the changes against what it staged.
	if err := os.WriteFile(filepath.Join(mem, "notes/a/x.md"), []byte("edited"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mem, "notes/z.md"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(mem, "notes/link.md")); err != nil {
		t.Fatal(err)
	}
	files, done := exportOutputs(t, c, &pb.ExportOutputsRequest{Key: "s1", MemoryDir: "notes", MaxFiles: 10, MaxBytes: 1 << 20,
		Known: []*pb.KnownOutput{{Path: "a/x.md", Size: int64(len("content of notes/a/x.md")), Sha256: sum("content of notes/a/x.md")}}})
	if string(files["a/x.md"]) != "edited" || string(files["z.md"]) != "new" || len(files) != 2 || done.Skipped != 1 {
		t.Fatalf("export = %q, %+v", files, done)
	}
	st, _ := c.ExportOutputs(context.Background(), &pb.ExportOutputsRequest{Key: "s1", MemoryDir: "ro"})
	if _, err := st.Recv(); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.FailedPreconditionKind {
		t.Fatalf("exporting a read-only store's directory: %v", err)
	}

	// The edit was committed as memver_3: listed with its sum, it is not
	// missing. z.md (memver_4) too; the sandbox's file is left as it is.
	x3 := &pb.Upload{Path: "notes/a/x.md", FileId: "memver_3", Sha256: sum("edited")}
	z4 := &pb.Upload{Path: "notes/z.md", FileId: "memver_4", Sha256: sum("new")}
	if got := syncMemory(t, c, "s1", []string{"notes"}, x3, z4, ro); len(got) != 0 {
		t.Fatalf("the session's committed writes are missing: %v", got)
	}
	// Another writer changed x.md (memver_5): missing, and staged over the
	// directory the sandbox put in its place.
	x5 := &pb.Upload{Path: "notes/a/x.md", FileId: "memver_5", Sha256: sum("theirs")}
	if err := os.Remove(filepath.Join(mem, "notes/a/x.md")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(mem, "notes/a/x.md/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := syncMemory(t, c, "s1", []string{"notes"}, x5, z4, ro); strings.Join(got, ",") != "notes/a/x.md" {
		t.Fatalf("missing %v", got)
	}
	if err := stageMemory(c, "s1", x5, []byte("theirs")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mem, "notes/a/x.md")); err != nil || string(b) != "theirs" {
		t.Fatalf("x.md = %q, %v", b, err)
	}
	// z.md deleted from the store: removed; the sandbox's own file stays.
	if err := os.WriteFile(filepath.Join(mem, "notes/mine.md"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := syncMemory(t, c, "s1", []string{"notes"}, x5, ro); len(got) != 0 {
		t.Fatalf("missing %v", got)
	}
	if _, err := os.Stat(filepath.Join(mem, "notes/z.md")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("z.md, deleted from the store, is still there: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(mem, "notes/mine.md")); err != nil || string(b) != "mine" {
		t.Errorf("the sandbox's own file: %q, %v", b, err)
	}

	// Bad writable names, and writable outside the memory area.
	for _, w := range []string{"", "a/b", "..", strings.Repeat("x", 256)} {
		if _, err := c.SyncUploads(context.Background(), &pb.SyncUploadsRequest{Key: "s1", Area: "memory", Writable: []string{w}}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
			t.Errorf("writable %q: %v", w, err)
		}
	}
	if _, err := c.SyncUploads(context.Background(), &pb.SyncUploadsRequest{Key: "s1", Writable: []string{"notes"}}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
		t.Errorf("writable uploads: %v", err)
	}
}

// The file calls on a session's mounts: the uploads are read-only; a
// read_write memory store's directory is written through a root on it
// (a link the sandbox made there leads nowhere else), the rest of the
// memory is read-only; listings name entries absolutely.
func TestFileCallsOnMounts(t *testing.T) {
	e := setup(t)
	e.start()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	dirs := e.sessionDirs("s1")
	ctx := context.Background()
	syncMemory(t, c, "s1", []string{"notes"})
	if err := os.MkdirAll(filepath.Join(dirs.Memory, "ro"), 0o755); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dirs.Memory, "notes", "out")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "/mnt/memory/notes/a/b.md", Data: []byte("memo")}); err != nil {
		t.Fatalf("writing the read_write store: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dirs.Memory, "notes/a/b.md")); err != nil || string(b) != "memo" {
		t.Fatalf("the memory on the host: %q, %v", b, err)
	}
	if r, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "/mnt/memory/notes/a/b.md"}); err != nil || string(r.Data) != "memo" {
		t.Fatalf("reading it back: %v, %v", r, err)
	}
	_, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "/mnt/memory/notes/out/x", Data: []byte("x")})
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Fatalf("a write followed the sandbox's link out of the store (%v): %v", err, left)
	}
	for _, p := range []string{"/mnt/memory/ro/x.md", "/mnt/memory/x.md", "/mnt/memory/other/x.md", "/mnt/session/uploads/x"} {
		if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: p, Data: []byte("x")}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.PermissionDeniedKind {
			t.Errorf("writing %s: %v", p, err)
		}
	}
	for _, p := range []string{"/etc/passwd", "/mnt/memory/../../etc/passwd", "/mnt/sessionx/a"} {
		if _, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: p}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
			t.Errorf("reading %s: %v", p, err)
		}
	}
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "/mnt/session/outputs/r.txt", Data: []byte("out")}); err != nil {
		t.Fatalf("writing the outputs: %v", err)
	}
	l, err := c.ListFiles(ctx, &pb.ListFilesRequest{Key: "s1", Dir: "/mnt/memory/notes/a"})
	if err != nil || len(l.Files) != 1 || l.Files[0].Path != "/mnt/memory/notes/a/b.md" {
		t.Fatalf("listing the store: %v, %v", l, err)
	}
}
