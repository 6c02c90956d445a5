package seal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

func TestSealOpenAndRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seal.key")
	oldID, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("creating over a key file: %v", err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", st.Mode())
	}
	ring, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ring.Seal("host-ca-key", []byte("secret"))
	if err != nil || s.KeyID != oldID {
		t.Fatalf("seal: %+v %v", s, err)
	}
	if strings.Contains(string(s.Data), "secret") {
		t.Fatal("the envelope holds the plaintext")
	}
	if got, err := ring.Open("host-ca-key", s); err != nil || string(got) != "secret" {
		t.Fatalf("open: %q %v", got, err)
	}
	// Another purpose, tampered data: refused as a wrong key.
	if _, err := ring.Open("node-ca-key", s); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("open as another purpose: %v", err)
	}
	bad := s
	bad.Data = append([]byte{}, s.Data...)
	bad.Data[0] ^= 1
	if _, err := ring.Open("host-ca-key", bad); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("open tampered: %v", err)
	}

	// A key added to the file seals from then on (the ring rereads the file
	// for a key id it lacks); the old key still opens.
	newID, err := AddKey(path)
	if err != nil || newID == oldID {
		t.Fatalf("add key: %s %v", newID, err)
	}
	other, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := other.Seal("host-ca-key", []byte("two"))
	if s2.KeyID != newID {
		t.Fatalf("sealed under %s, want the new key %s", s2.KeyID, newID)
	}
	if got, err := ring.Open("host-ca-key", s2); err != nil || string(got) != "two" {
		t.Fatalf("the old ring opening under the new key (after rereading): %q %v", got, err)
	}
	if got, err := other.Open("host-ca-key", s); err != nil || string(got) != "secret" {
		t.Fatalf("the old key in the new ring: %q %v", got, err)
	}

	// A file with another key: a clear error naming both ids.
	wrong := filepath.Join(t.TempDir(), "wrong.key")
	if _, err := Create(wrong); err != nil {
		t.Fatal(err)
	}
	w, _ := Load(wrong)
	_, err = w.Open("host-ca-key", s)
	if !errors.Is(err, ErrWrongKey) || errdefs.KindOf(err) != errdefs.FailedPreconditionKind || !strings.HasPrefix(err.Error(), "wrong seal key: ") || !strings.Contains(err.Error(), oldID) {
		t.Fatalf("open with the wrong key: %v", err)
	}
}

func TestLoadRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"empty": "# nothing\n", "short": "abcd\n", "not hex": strings.Repeat("z", 64) + "\n"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing key file loaded")
	}
}
