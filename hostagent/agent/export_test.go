package agent

import "corral.dev/corral/internal/tracing"

// TraceProvider is the agent's tracer provider, nil with tracing off.
func (a *Agent) TraceProvider() *tracing.Provider { return a.tracing }

// ValidateBuild is validateBuild, for the request bound tests.
var ValidateBuild = validateBuild

// EgressAudited is how many connections the agent's proxies have audited
// since it started, and a channel signalled after each new record (the
// audit's Added: nothing in the agent reads it).
func (a *Agent) EgressAudited() (int64, <-chan struct{}) {
	t := a.nets.audit.Totals()
	return t.Allowed + t.Denied, a.nets.audit.Added()
}

// EgressAcked is the highest heartbeat seq whose ack the agent has
// applied, and a channel closed at its next ack.
func (a *Agent) EgressAcked() (uint64, <-chan struct{}) {
	a.nets.sentMu.Lock()
	defer a.nets.sentMu.Unlock()
	return a.nets.acked, a.nets.ackedCh
}
