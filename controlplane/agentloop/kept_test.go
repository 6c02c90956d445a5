package agentloop

import (
	"fmt"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/model"
)

// The kept copies stay within their count and their bytes, forgetting the
// least recently kept first, and a copy too large is not kept at all.
func TestKeptCopiesAreBounded(t *testing.T) {
	copyOf := func(textBytes int) session {
		s := session{loaded: true, at: map[string]int{}}
		s.extend([]Event{{ID: "e", Seq: 1, Content: []model.Block{{Type: "text", Text: strings.Repeat("x", textBytes)}}}})
		return s
	}
	k := newKeptCopies(3, 10_000)
	for i := range 4 {
		k.put(fmt.Sprint(i), copyOf(100))
	}
	if _, ok := k.byID["0"]; ok || k.lru.Len() != 3 {
		t.Fatalf("after 4 puts into 3 places: %d kept, the oldest kept: %v", k.lru.Len(), ok)
	}
	k.put("big", copyOf(9_000)) // the oldest others go to make room
	if _, ok := k.byID["big"]; !ok || k.lru.Len() != 2 || k.bytes > 10_000 {
		t.Fatalf("%d copies of %d bytes kept (big kept: %v), want big and one other within 10000", k.lru.Len(), k.bytes, ok)
	}
	if _, ok := k.byID["3"]; !ok {
		t.Fatal("the most recent other copy was dropped before an older one")
	}
	if s := k.take("big"); !s.loaded || k.bytes != k.byID["3"].Value.(keptCopy).s.size {
		t.Fatalf("take: %v, %d bytes left", s.loaded, k.bytes)
	}
	k.put("huge", copyOf(maxKeptCopyBytes))
	if _, ok := k.byID["huge"]; ok || k.lru.Len() != 1 {
		t.Fatal("a copy over maxKeptCopyBytes was kept")
	}
}
