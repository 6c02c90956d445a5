package containerd

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// copyWorkspace copies every regular file of from's workspace (top level
// and one directory down: what these tests write) into to's, as the host
// agent's workspace export and import do, through the file API.
func copyWorkspace(t *testing.T, from, to driver.Sandbox) {
	t.Helper()
	ctx := context.Background()
	var walk func(dir string)
	walk = func(dir string) {
		files, err := from.ListFiles(ctx, dir)
		if err != nil {
			t.Fatalf("listing %q: %v", dir, err)
		}
		for _, f := range files {
			if f.Mode.IsDir() {
				walk(f.Path)
				continue
			}
			b, err := from.ReadFile(ctx, f.Path, 0)
			if err != nil {
				t.Fatalf("reading %s: %v", f.Path, err)
			}
			if err := to.WriteFile(ctx, f.Path, b, f.Mode.Perm()); err != nil {
				t.Fatalf("writing %s: %v", f.Path, err)
			}
		}
	}
	walk("")
}

// TestCheckpointRestoresOnAnotherDriver: a paused sandbox's checkpoint,
// exported, restores into a sandbox another driver (another state dir, as
// on another host) made of the same image: a different container id,
// different host paths behind the mounts. Its background counter goes on
// from where it was, with its /tmp, once the workspace is there too.
func TestCheckpointRestoresOnAnotherDriver(t *testing.T) {
	a := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	b := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	ctx := context.Background()
	refA, sbA := create(t, a, driver.Spec{Key: "s1"})
	if res := run(t, sbA, `echo in-tmp > /tmp/t && mkdir -p notes && echo kept > notes/a.txt`); res.ExitCode != 0 {
		t.Fatalf("writing files: %q", res.Stderr)
	}
	if res := run(t, sbA, counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: exit %d, %q", res.ExitCode, res.Stderr)
	}
	waitCount(t, sbA, 5)
	if err := a.Pause(ctx, refA); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	paused := readCount(t, sbA)
	var image bytes.Buffer
	n, err := a.ExportCheckpoint(ctx, refA, &image)
	if err != nil {
		t.Fatalf("ExportCheckpoint: %v", err)
	}
	t.Logf("checkpoint: %d bytes in files, %d in the archive", n, image.Len())

	refB, sbB := create(t, b, driver.Spec{Key: "s1"})
	if refB.ID == refA.ID {
		t.Fatalf("both drivers made container %s", refA.ID)
	}
	copyWorkspace(t, sbA, sbB)
	if err := b.RestoreCheckpoint(ctx, refB, bytes.NewReader(image.Bytes()), driver.CheckpointLimits{}); err != nil {
		t.Fatalf("RestoreCheckpoint: %v", err)
	}
	resumed := readCount(t, sbB)
	if resumed < paused {
		t.Fatalf("the counter restarted: %d after the restore, %d when paused", resumed, paused)
	}
	waitCount(t, sbB, resumed+3)
	if res := run(t, sbB, `kill -0 "$(cat /workspace/bg.pid)" && cat /tmp/t`); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "in-tmp" {
		t.Errorf("after the restore: the counter's process or /tmp is gone: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	t.Logf("counter: %d when paused on A, %d right after the restore on B", paused, resumed)
}

// TestRestoreOverEmptyWorkspaceFails: without the workspace the restored
// processes cannot find their files; the restore fails and leaves the
// sandbox running a new init, usable.
func TestRestoreOverEmptyWorkspaceFails(t *testing.T) {
	a := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	b := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	ctx := context.Background()
	refA, sbA := create(t, a, driver.Spec{Key: "s1"})
	if res := run(t, sbA, `mkdir -p d && exec 3>d/held && `+counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: exit %d, %q", res.ExitCode, res.Stderr)
	}
	waitCount(t, sbA, 3)
	if err := a.Pause(ctx, refA); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	var image bytes.Buffer
	if _, err := a.ExportCheckpoint(ctx, refA, &image); err != nil {
		t.Fatalf("ExportCheckpoint: %v", err)
	}
	refB, sbB := create(t, b, driver.Spec{Key: "s1"})
	err := b.RestoreCheckpoint(ctx, refB, bytes.NewReader(image.Bytes()), driver.CheckpointLimits{})
	t.Logf("restore over an empty workspace: %v", err)
	if err == nil {
		t.Fatal("the restore over an empty workspace succeeded")
	}
	if res := run(t, sbB, `echo ok`); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("after a failed restore the sandbox does not run commands: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// TestRestoreCheckpointRefusesHostileArchives: names that leave the image
// directory, links and sizes past the bounds are refused before anything
// runs, and the sandbox keeps its own init.
func TestRestoreCheckpointRefusesHostileArchives(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	ref, sb := create(t, d, driver.Spec{})
	archive := func(hdrs ...*tar.Header) io.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg && h.Size > 0 && h.Size < 1<<20 {
				if _, err := tw.Write(make([]byte, h.Size)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		return &buf
	}
	// A header claiming more than it carries: refused from its size.
	huge := func(size int64) io.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "pages.img", Size: size, Mode: 0o600})
		return io.MultiReader(bytes.NewReader(buf.Bytes()), strings.NewReader(strings.Repeat("x", 1024)))
	}
	for _, tc := range []struct {
		name string
		r    io.Reader
		max  driver.CheckpointLimits
		kind errdefs.Kind
	}{
		{"dotdot", archive(&tar.Header{Typeflag: tar.TypeReg, Name: "../escape", Size: 1, Mode: 0o600}), driver.CheckpointLimits{}, errdefs.InvalidArgumentKind},
		{"absolute", archive(&tar.Header{Typeflag: tar.TypeReg, Name: "/etc/x", Size: 1, Mode: 0o600}), driver.CheckpointLimits{}, errdefs.InvalidArgumentKind},
		{"symlink", archive(&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/etc/passwd"}), driver.CheckpointLimits{}, errdefs.InvalidArgumentKind},
		{"file too big", huge(1 << 40), driver.CheckpointLimits{}, errdefs.ResourceExhaustedKind},
		{"total too big", archive(
			&tar.Header{Typeflag: tar.TypeReg, Name: "a", Size: 600, Mode: 0o600},
			&tar.Header{Typeflag: tar.TypeReg, Name: "b", Size: 600, Mode: 0o600}), driver.CheckpointLimits{TotalBytes: 1000}, errdefs.ResourceExhaustedKind},
		{"too many files", archive(
			&tar.Header{Typeflag: tar.TypeDir, Name: "a/", Mode: 0o700},
			&tar.Header{Typeflag: tar.TypeDir, Name: "b/", Mode: 0o700}), driver.CheckpointLimits{Files: 1}, errdefs.ResourceExhaustedKind},
		{"empty", archive(), driver.CheckpointLimits{}, errdefs.InvalidArgumentKind},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := d.RestoreCheckpoint(context.Background(), ref, tc.r, tc.max)
			if errdefs.KindOf(err) != tc.kind {
				t.Fatalf("RestoreCheckpoint = %v, want kind %v", err, tc.kind)
			}
		})
	}
	if res := run(t, sb, `echo ok`); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("after refused archives the sandbox does not run commands: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}

func TestMigrationRefusedWithoutPausable(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	if err := d.CanMigrate(); errdefs.KindOf(err) != errdefs.UnimplementedKind {
		t.Errorf("CanMigrate without Pausable = %v, want kind unimplemented", err)
	}
}

// stallingWriter signals its first Write, then holds it until released.
type stallingWriter struct {
	started, release chan struct{}
	once             bool
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	if !w.once {
		w.once = true
		close(w.started)
	}
	<-w.release
	return len(p), nil
}

// TestExportHoldsUpNoOtherSandbox: a checkpoint streamed to a slow
// receiver (another host, across the network) holds only its own
// sandbox: another sandbox pauses and resumes meanwhile.
func TestExportHoldsUpNoOtherSandbox(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	ctx := context.Background()
	refA, _ := create(t, d, driver.Spec{Key: "a"})
	refB, sbB := create(t, d, driver.Spec{Key: "b"})
	if err := d.Pause(ctx, refA); err != nil {
		t.Fatal(err)
	}
	w := &stallingWriter{started: make(chan struct{}), release: make(chan struct{})}
	exported := make(chan error, 1)
	go func() {
		_, err := d.ExportCheckpoint(ctx, refA, w)
		exported <- err
	}()
	<-w.started
	moved := make(chan error, 1)
	go func() {
		err := d.Pause(ctx, refB)
		if err == nil {
			err = d.Resume(ctx, refB)
		}
		moved <- err
	}()
	select {
	case err := <-moved:
		if err != nil {
			t.Errorf("pausing and resuming another sandbox during an export: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Errorf("another sandbox's pause and resume waited for an export")
		close(w.release)
		<-moved
		return
	}
	close(w.release)
	if err := <-exported; err != nil {
		t.Errorf("export: %v", err)
	}
	if res := run(t, sbB, "echo ok"); string(res.Stdout) != "ok\n" {
		t.Errorf("the other sandbox after its resume: %+v", res)
	}
}
