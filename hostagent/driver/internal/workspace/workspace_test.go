package workspace

import (
	"os"
	"path/filepath"
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
		if _, err := d.ReadFile(p); err == nil {
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
	if b, err := d.ReadFile("a/b/c.txt"); err != nil || string(b) != "hi" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	if _, err := d.ReadFile("missing"); !errdefs.IsNotFound(err) {
		t.Errorf("ReadFile(missing) = %v, want not found", err)
	}
}
