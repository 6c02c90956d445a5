package workspace

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

func TestEscapesRefused(t *testing.T) {
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"abs": root, "up": "..", "file": "../secret"} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	d := Dir{Path: ws}
	for _, p := range []string{"../secret", "/etc/passwd", "abs/secret", "up/secret", "file", "a/../../secret"} {
		if _, err := d.ReadFile(p, 1<<20); err == nil {
			t.Errorf("ReadFile(%q) succeeded", p)
		} else if k := errdefs.KindOf(err); k != errdefs.InvalidArgumentKind && k != errdefs.PermissionDeniedKind {
			t.Errorf("ReadFile(%q) = %v (kind %v), want invalid argument or permission denied", p, err, k)
		}
		if err := d.WriteFile(p, []byte("x"), 0o644); err == nil {
			t.Errorf("WriteFile(%q) succeeded", p)
		}
	}
	if _, err := d.List("up"); err == nil {
		t.Error(`List("up") succeeded`)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "secret")); string(b) != "s" {
		t.Errorf("secret changed to %q", b)
	}
	if err := d.WriteFile("a/b/c.txt", []byte("hi"), 0); err != nil {
		t.Fatal(err)
	}
	if b, err := d.ReadFile("a/b/c.txt", 1<<20); err != nil || string(b) != "hi" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	if _, err := d.ReadFile("missing", 1<<20); !errdefs.IsNotFound(err) {
		t.Errorf("ReadFile(missing) = %v, want not found", err)
	}
}

// TestReadFileBounded: a file over the limit is refused from its size
// before it is read (a 4 TiB sparse file costs nothing), one within it is
// read whole, and what is not a regular file (a FIFO the sandbox made,
// which would block a plain open) is refused at once.
func TestReadFileBounded(t *testing.T) {
	ws := t.TempDir()
	d := Dir{Path: ws}
	huge, err := os.Create(filepath.Join(ws, "huge"))
	if err != nil {
		t.Fatal(err)
	}
	if err := huge.Truncate(4 << 40); err != nil {
		t.Fatal(err)
	}
	huge.Close()
	if err := os.WriteFile(filepath.Join(ws, "small"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = d.ReadFile("huge", 10<<20)
	if errdefs.KindOf(err) != errdefs.TooLargeKind || !strings.Contains(err.Error(), "4.0 TiB") || !strings.Contains(err.Error(), "10.0 MiB") {
		t.Errorf("ReadFile(huge) = %v, want too large naming 4.0 TiB and 10.0 MiB", err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Errorf("refusing a 4 TiB file allocated %d bytes", grew)
	}
	if b, err := d.ReadFile("small", 10); err != nil || string(b) != "0123456789" {
		t.Errorf("ReadFile(small, 10) = %q, %v", b, err)
	}
	if _, err := d.ReadFile("small", 9); errdefs.KindOf(err) != errdefs.TooLargeKind {
		t.Errorf("ReadFile(small, 9) = %v, want too large", err)
	}
	for _, p := range []string{"fifo", "."} {
		if _, err := d.ReadFile(p, 10); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ReadFile(%s) = %v, want invalid argument", p, err)
		}
	}
	f, size, err := d.Open("huge")
	if err != nil || size != 4<<40 {
		t.Fatalf("Open(huge) = %d, %v", size, err)
	}
	f.Close()
}

// TestReadFileGrowing: a file that grows between the size check and the
// read is cut at the limit and refused, never read past it.
func TestReadFileGrowing(t *testing.T) {
	ws := t.TempDir()
	d := Dir{Path: ws}
	p := filepath.Join(ws, "grows")
	if err := os.WriteFile(p, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, size, err := d.Open("grows")
	if err != nil || size != 3 {
		t.Fatalf("Open = %d, %v", size, err)
	}
	defer f.Close()
	if err := os.WriteFile(p, []byte("abcdefghij"), 0o644); err != nil {
		t.Fatal(err)
	}
	// ReadFile's read of an open file, as if the growth came after its stat.
	b, err := readBounded(f, "grows", 5)
	if errdefs.KindOf(err) != errdefs.TooLargeKind || len(b) != 0 {
		t.Errorf("reading a file grown past the limit = %q, %v; want too large", b, err)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 10 << 20: "10.0 MiB", 4 << 40: "4.0 TiB", 1536: "1.5 KiB"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
