package agent_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver/drivertest"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func exportWorkspace(t *testing.T, c pb.SandboxServiceClient, key string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.ExportWorkspace(ctx, &pb.ExportWorkspaceRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes()
		}
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(m.Data)
	}
}

func importWorkspace(c pb.SandboxServiceClient, key string, archive []byte) (*pb.ImportWorkspaceResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.ImportWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	// A Send fails with io.EOF once the server has ended the call (it
	// refused the archive): CloseAndRecv then says why.
	err = st.Send(&pb.ImportWorkspaceRequest{Key: key})
	for err == nil && len(archive) > 0 { // small pieces: entries span messages
		k := min(len(archive), 700)
		err = st.Send(&pb.ImportWorkspaceRequest{Data: archive[:k]})
		archive = archive[k:]
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	res, err := st.CloseAndRecv()
	return res, errgrpc.FromStatus(err)
}

func TestWorkspaceExportImport(t *testing.T) {
	e := setup(t)
	e.start()
	for _, k := range []string{"src", "dst"} {
		if _, err := e.ensure(k, nil); err != nil {
			t.Fatal(err)
		}
	}
	c := e.sandboxClient()
	ctx := context.Background()
	big := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB: several chunks
	files := map[string][]byte{"top.txt": []byte("hello"), "dir/sub/deep.bin": big}
	for p, data := range files {
		if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "src", Path: p, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	archive := exportWorkspace(t, c, "src")
	res, err := importWorkspace(c, "dst", archive)
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 2 || res.Bytes != int64(len(big)+5) {
		t.Fatalf("import result %v", res)
	}
	for p, data := range files {
		got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "dst", Path: p})
		if err != nil || !bytes.Equal(got.Data, data) {
			t.Fatalf("%s after import: %d bytes, %v", p, len(got.GetData()), err)
		}
	}
}

func TestWorkspaceImportRefusesEscapes(t *testing.T) {
	e := setup(t)
	e.start()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	for _, hdr := range []*tar.Header{
		{Typeflag: tar.TypeReg, Name: "../escape.txt", Size: 1},
		{Typeflag: tar.TypeReg, Name: "a/../../escape.txt", Size: 1},
		{Typeflag: tar.TypeReg, Name: "/etc/escape.txt", Size: 1},
		{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "/etc"},
		{Typeflag: tar.TypeLink, Name: "hard", Linkname: "/etc/passwd"},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			tw.Write([]byte("x"))
		}
		tw.Close()
		if _, err := importWorkspace(c, "s1", buf.Bytes()); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("importing %q (type %c): %v, want invalid argument", hdr.Name, hdr.Typeflag, err)
		}
	}
	ls, err := c.ListFiles(context.Background(), &pb.ListFilesRequest{Key: "s1"})
	if err != nil || len(ls.Files) != 0 {
		t.Fatalf("workspace after refused imports: %v, %v", ls.GetFiles(), err)
	}
	if _, err := importWorkspace(c, "nope", nil); !errdefs.IsNotFound(err) {
		t.Fatalf("import into a missing sandbox: %v", err)
	}
}

// TestWorkspaceMovesFilesOverTheReadLimit: export and import stream files
// (never read whole), so a file above the host's ReadFile limit moves too.
func TestWorkspaceMovesFilesOverTheReadLimit(t *testing.T) {
	e := setup(t)
	const size = 20 << 20 // over driver.DefaultMaxReadBytes
	e.fake.Handle("big", func(ctx context.Context, p *drivertest.Proc) int {
		f := filepath.Join(p.Dir, "big.bin")
		if os.WriteFile(f, nil, 0o644) != nil || os.Truncate(f, size) != nil {
			return 1
		}
		return 0
	})
	r := e.start()
	defer r.stop()
	for _, k := range []string{"src", "dst"} {
		if _, err := e.ensure(k, nil); err != nil {
			t.Fatal(err)
		}
	}
	c := e.sandboxClient()
	if _, res, err := execStream(t, c, "src", "big"); err != nil || res.ExitCode != 0 {
		t.Fatalf("making the file: %v %v", res, err)
	}
	res, err := importWorkspace(c, "dst", exportWorkspace(t, c, "src"))
	if err != nil || res.Files != 1 || res.Bytes != size {
		t.Fatalf("import = %v, %v; want one file of %d bytes", res, err, size)
	}
	l, err := c.ListFiles(context.Background(), &pb.ListFilesRequest{Key: "dst"})
	if err != nil || len(l.Files) != 1 || l.Files[0].Size != size {
		t.Fatalf("dst lists %v, %v", l, err)
	}
}

// exportSince exports key's workspace as an increment over since (nil:
// whole) and returns the archive and the host's taken_at.
func exportSince(t *testing.T, c pb.SandboxServiceClient, key string, since *timestamppb.Timestamp) ([]byte, time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.ExportWorkspace(ctx, &pb.ExportWorkspaceRequest{Key: key, Since: since})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var taken time.Time
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), taken
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.TakenAt != nil {
			taken = m.TakenAt.AsTime()
		}
		buf.Write(m.Data)
	}
}

// An increment holds the content of the files changed since the snapshot
// it follows and only the names of the others, a few bytes each, in list
// entries; a file changed right after that snapshot began is in it.
func TestWorkspaceIncrement(t *testing.T) {
	e := setup(t)
	e.start()
	if _, err := e.ensure("inc", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	ctx := context.Background()
	const n = 2000
	for i := range n {
		if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "inc", Path: fmt.Sprintf("many/f%04d.txt", i), Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	// The files' ctimes are to be older than the next increment's slack
	// (50 ms): a wait on the clock itself, not a guess at a race.
	<-time.After(200 * time.Millisecond)
	full, taken := exportSince(t, c, "inc", nil)
	if taken.IsZero() {
		t.Fatal("the export gave no taken_at")
	}
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "inc", Path: "many/f0007.txt", Data: []byte("changed")}); err != nil {
		t.Fatal(err)
	}
	inc, _ := exportSince(t, c, "inc", timestamppb.New(taken))
	content := map[string]string{}
	listed := 0
	tr := tar.NewReader(bytes.NewReader(inc))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		switch {
		case hdr.PAXRecords["CORRAL.unchanged"] == "list":
			listed += bytes.Count(b, []byte{0})
		case hdr.Typeflag == tar.TypeReg:
			content[hdr.Name] = string(b)
		}
	}
	if content["many/f0007.txt"] != "changed" || len(content) != 1 || listed != n-1 {
		t.Errorf("increment: %d with content (f0007 %q), %d listed; want %d files in all", len(content), content["many/f0007.txt"], listed, n)
	}
	t.Logf("whole: %d bytes; increment: %d bytes (%d files with content, %d named)", len(full), len(inc), len(content), listed)
	if len(inc) > len(full)/20 {
		t.Errorf("the increment is %d bytes against %d whole", len(inc), len(full))
	}
}
