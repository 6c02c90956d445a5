package server

import (
	"fmt"
	"testing"
)

// sessionFacts answers what it was told, keeps budgets and vaults apart,
// starts a set afresh past its bound, and as a nil value knows nothing.
func TestSessionFacts(t *testing.T) {
	f := newSessionFacts()
	f.setNoBudget("sesn_a")
	f.setNoVaults("sesn_b")
	if !f.hasNoBudget("sesn_a") || f.hasNoVaults("sesn_a") || f.hasNoBudget("sesn_b") || !f.hasNoVaults("sesn_b") || f.hasNoBudget("sesn_c") {
		t.Fatalf("facts mixed up: %+v", f)
	}
	for i := range maxSessionFacts {
		f.setNoBudget(fmt.Sprintf("sesn_%d", i))
	}
	if n := len(f.noBudget.ids); n > maxSessionFacts {
		t.Fatalf("%d sessions kept, bound %d", n, maxSessionFacts)
	}
	if f.hasNoBudget("sesn_a") {
		t.Error("the set did not start afresh at its bound")
	}
	if !f.hasNoVaults("sesn_b") {
		t.Error("the budget set's bound emptied the vaults set")
	}
	var none *sessionFacts
	none.setNoBudget("sesn_a")
	if none.hasNoBudget("sesn_a") || none.hasNoVaults("sesn_a") {
		t.Error("a nil sessionFacts knows something")
	}
}
