package fleet

import (
	"strings"
	"testing"
)

// A step's changes are committed in batches within the store's bounds:
// at most maxCommitChanges each and maxCommitBytes of content, in order,
// none lost or repeated.
func TestCommitBatches(t *testing.T) {
	big := strings.Repeat("x", maxCommitBytes/3+1)
	var changes []MemoryChange
	for i := range 250 {
		c := MemoryChange{Path: "/m" + strings.Repeat("i", i%7)}
		switch {
		case i%50 == 0:
			c.Content = &big
		case i%3 != 0:
			s := "small"
			c.Content = &s
		} // else a removal
		changes = append(changes, c)
	}
	batches := commitBatches(changes)
	n := 0
	for _, b := range batches {
		size := 0
		for _, c := range b {
			if c.Content != nil {
				size += len(*c.Content)
			}
			if changes[n].Path != c.Path || changes[n].Content != c.Content {
				t.Fatalf("change %d out of order", n)
			}
			n++
		}
		if len(b) == 0 || len(b) > maxCommitChanges || size > maxCommitBytes {
			t.Errorf("a batch of %d changes, %d bytes", len(b), size)
		}
	}
	if n != len(changes) || len(batches) < 3 {
		t.Fatalf("%d changes in %d batches, want %d in at least 3", n, len(batches), len(changes))
	}
	if got := commitBatches(nil); len(got) != 0 {
		t.Fatalf("no changes: %d batches", len(got))
	}
}
