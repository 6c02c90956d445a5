package hosts

import (
	"testing"
	"time"
)

// TestPlacementMemory: a placement vouches for its host's egress records
// while it lasts and for the grace after it is seen gone, on that host
// only; rejections are logged once per host per minute, with the count
// since the last line.
func TestPlacementMemory(t *testing.T) {
	const grace = 5 * time.Minute
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := newPlacements()
	p.note("h1", map[string]string{"s1": "tenant_a", "s2": "tenant_b"}, t0, grace)
	p.note("h1", map[string]string{"s2": "tenant_b"}, t0.Add(time.Minute), grace) // s1 released
	for _, c := range []struct {
		host, session string
		at            time.Duration
		tenant        string // "": rejected
	}{
		{"h1", "s1", time.Minute, "tenant_a"},
		{"h1", "s1", time.Minute + grace, "tenant_a"},
		{"h1", "s1", time.Minute + grace + time.Second, ""},
		{"h1", "s2", time.Hour, "tenant_b"}, // still placed
		{"h2", "s2", 0, ""},                 // another host
		{"h1", "s3", 0, ""},                 // never placed
	} {
		got, ok := p.tenant(c.host, c.session, t0.Add(c.at), grace)
		if got != c.tenant || ok != (c.tenant != "") {
			t.Errorf("%s on %s at +%v: %q %v, want %q", c.session, c.host, c.at, got, ok, c.tenant)
		}
	}
	// Past the grace, the next note forgets s1.
	p.note("h1", map[string]string{"s2": "tenant_b"}, t0.Add(time.Minute+grace+time.Second), grace)
	if _, ok := p.byHost["h1"]["s1"]; ok {
		t.Error("s1 remembered past its grace")
	}

	if n, ok := p.rejected("h1", 2, t0); !ok || n != 2 {
		t.Fatalf("first rejection: %d %v", n, ok)
	}
	if _, ok := p.rejected("h1", 3, t0.Add(30*time.Second)); ok {
		t.Fatal("logged twice within a minute")
	}
	if _, ok := p.rejected("h2", 1, t0.Add(30*time.Second)); !ok {
		t.Fatal("another host's first rejection not logged")
	}
	if n, ok := p.rejected("h1", 1, t0.Add(time.Minute)); !ok || n != 4 {
		t.Fatalf("a minute later: %d %v, want the 4 since the last line", n, ok)
	}
}
