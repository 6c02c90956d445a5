package server

import "sync"

// sessionFacts remembers, on this node, the sessions seen without a budget
// and those seen without vaults, so that the reads before each model
// request that would find none are skipped. Both are fixed for good when a
// session is created: a budget can be changed or removed later, never
// added (the API's budget_create_only refusal), and vault_ids never
// change (a session update refuses them). A session seen without one never
// gets one, and nothing here needs telling when another node changes a
// session. A nil *sessionFacts knows nothing and remembers nothing.
type sessionFacts struct {
	noBudget, noVaults idSet
}

func newSessionFacts() *sessionFacts { return &sessionFacts{} }

func (f *sessionFacts) hasNoBudget(id string) bool { return f != nil && f.noBudget.has(id) }
func (f *sessionFacts) hasNoVaults(id string) bool { return f != nil && f.noVaults.has(id) }

func (f *sessionFacts) setNoBudget(id string) {
	if f != nil {
		f.noBudget.add(id)
	}
}

func (f *sessionFacts) setNoVaults(id string) {
	if f != nil {
		f.noVaults.add(id)
	}
}

// maxSessionFacts bounds each set: about 40 bytes an entry.
const maxSessionFacts = 100_000

// idSet is a set of session ids, bounded: past maxSessionFacts it starts
// afresh (a forgotten session is read again, once).
type idSet struct {
	mu  sync.Mutex
	ids map[string]struct{} // guarded by mu
}

func (s *idSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[id]
	return ok
}

func (s *idSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil || len(s.ids) >= maxSessionFacts {
		s.ids = map[string]struct{}{}
	}
	s.ids[id] = struct{}{}
}
