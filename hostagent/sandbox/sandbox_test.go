package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"corral.dev/corral/hostagent/driver"
)

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs := []Record{
		{Key: "b/../x", Ref: driver.Ref{Provider: "fake", Key: "b/../x", ID: "1"}, State: Ready, Spec: driver.Spec{Env: map[string]string{"TOKEN": "t"}}},
		{Key: "a", Ref: driver.Ref{Provider: "fake", Key: "a", ID: "2"}, State: Evicted, Archive: "/x"},
	}
	for _, r := range recs {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	recs[1].State = Ready // a second Put replaces
	if err := s.Put(recs[1]); err != nil {
		t.Fatal(err)
	}
	got, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key != "a" || got[0].State != Ready || got[1].Ref.ID != "1" || got[1].Spec.Env["TOKEN"] != "t" {
		t.Fatalf("List = %+v", got)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		fi, _ := os.Stat(filepath.Join(dir, e.Name()))
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", e.Name(), fi.Mode())
		}
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if got, _ := s.List(); len(got) != 1 {
		t.Fatalf("after delete: %+v", got)
	}
	// A corrupt record is an error, not a forgotten sandbox.
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o600)
	if _, err := s.List(); err == nil {
		t.Fatal("corrupt record went unnoticed")
	}
}
