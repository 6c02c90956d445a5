package server

import "sync"

// sessionFacts remembers, on this node, the sessions seen without a budget
// and those seen without vaults, so that the reads before each model
// request that would find none are skipped. Both are fixed for good when a
// session is created: a budget can be changed or removed later, never
// added (the API's budget_create_only refusal), and vault_ids never
// change (a session update refuses them). A session seen without one never
// gets one, and nothing here needs telling when another node changes a
// session. The sets are bounded: past maxSessionFacts sessions each starts
// afresh (a forgotten session is read again, once).
type sessionFacts struct {
	mu sync.Mutex
	// noBudget and noVaults, guarded by mu, are session ids.
	noBudget, noVaults map[string]struct{}
}

// maxSessionFacts bounds each set: about 40 bytes an entry.
const maxSessionFacts = 100_000

func newSessionFacts() *sessionFacts {
	return &sessionFacts{noBudget: map[string]struct{}{}, noVaults: map[string]struct{}{}}
}

func (f *sessionFacts) hasNoBudget(id string) bool {
	return f != nil && f.has(func() map[string]struct{} { return f.noBudget }, id)
}

func (f *sessionFacts) hasNoVaults(id string) bool {
	return f != nil && f.has(func() map[string]struct{} { return f.noVaults }, id)
}

func (f *sessionFacts) setNoBudget(id string) {
	if f != nil {
		f.set(&f.noBudget, id)
	}
}

func (f *sessionFacts) setNoVaults(id string) {
	if f != nil {
		f.set(&f.noVaults, id)
	}
}

// has looks id up in the set that set returns, under mu.
func (f *sessionFacts) has(set func() map[string]struct{}, id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := set()[id]
	return ok
}

// set adds id to *set, which it starts afresh past maxSessionFacts.
func (f *sessionFacts) set(set *map[string]struct{}, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(*set) >= maxSessionFacts {
		*set = map[string]struct{}{}
	}
	(*set)[id] = struct{}{}
}
