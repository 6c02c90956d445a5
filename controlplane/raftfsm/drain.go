package raftfsm

import (
	"time"

	"corral.dev/corral/internal/errdefs"
)

// A drain lives in Raft, so that it outlives the call that asked for it:
// the leader's fleet runs every drain that has not finished (a new leader
// takes over those of the old), records each sandbox's step here, and ends
// the drain here. Anyone can follow it from any node by reading the record.
const (
	CmdStartDrain CommandType = "start_drain" // StartDrainPayload
	CmdDrainStep  CommandType = "drain_step"  // DrainStepPayload
	CmdEndDrain   CommandType = "end_drain"   // EndDrainPayload
)

// The typed drain commands.
var (
	StartDrain      = Cmd[StartDrainPayload, Drain]{CmdStartDrain}
	RecordDrainStep = Cmd[DrainStepPayload, Drain]{CmdDrainStep}
	EndDrain        = Cmd[EndDrainPayload, Drain]{CmdEndDrain}
)

// maxDrainSteps bounds the steps a drain's record keeps: a host's
// sandboxes, each with a few retries, fit; a follower that falls further
// behind sees the counts, not every line.
const maxDrainSteps = 1024

// Drain is a host's drain as Raft keeps it.
type Drain struct {
	HostID string `json:"host_id"`
	// Deadline is when the sandboxes that have not moved are evicted.
	Deadline time.Time `json:"deadline"`
	// MaxParallel bounds the sandboxes moved at once.
	MaxParallel int       `json:"max_parallel"`
	Started     time.Time `json:"started"`
	// Total is the number of sandboxes on the host when the drain began.
	Total     int `json:"total"`
	Moved     int `json:"moved"`      // moved_live included
	MovedLive int `json:"moved_live"` // checkpointed and restored
	Evicted   int `json:"evicted"`
	// Steps are the last maxDrainSteps steps, oldest first; Seq counts
	// every step recorded, so a follower asks for the steps after the
	// last Seq it saw.
	Steps []DrainStep `json:"steps,omitempty"`
	Seq   int         `json:"seq"`
	// Finished is when the drain ended (zero while it runs).
	Finished time.Time `json:"finished,omitzero"`
}

// Running reports whether the drain has not finished.
func (d Drain) Running() bool { return d.Finished.IsZero() }

// Remaining is how many of the sandboxes the drain began with are neither
// moved nor evicted.
func (d Drain) Remaining() int { return max(0, d.Total-d.Moved-d.Evicted) }

// After returns the steps recorded after seq, oldest first (those still
// kept).
func (d Drain) After(seq int) []DrainStep {
	for i, s := range d.Steps {
		if s.Seq > seq {
			return d.Steps[i:]
		}
	}
	return nil
}

// DrainStep is one sandbox's step in a drain.
type DrainStep struct {
	Seq       int    `json:"seq"`
	SessionID string `json:"session_key"`
	// State is one of the fleet's drain states (moved_live, moved,
	// moved_without_workspace, retrying, evicted).
	State string `json:"state"`
	// To is the host it moved to; Blob where its workspace is kept when
	// it moved without it; Error why this attempt failed.
	To    string `json:"to,omitempty"`
	Blob  string `json:"blob,omitempty"`
	Error string `json:"error,omitempty"`
	// Message is the step's line for the operator.
	Message string `json:"message"`
}

// The step states that finish a sandbox, and how they count.
const (
	drainMovedLive             = "moved_live"
	drainMoved                 = "moved"
	drainMovedWithoutWorkspace = "moved_without_workspace"
	drainEvicted               = "evicted"
)

// StartDrainPayload starts a drain of a host: it becomes ineligible and
// draining. A drain of a host already draining is left as it is and
// returned (the caller follows it); a finished one is replaced.
type StartDrainPayload struct {
	HostID      string    `json:"host_id"`
	Deadline    time.Time `json:"deadline"`
	MaxParallel int       `json:"max_parallel"`
	Started     time.Time `json:"started"`
}

// DrainStepPayload records a step of a running drain.
type DrainStepPayload struct {
	HostID string    `json:"host_id"`
	Step   DrainStep `json:"step"`
}

// EndDrainPayload ends a running drain at At.
type EndDrainPayload struct {
	HostID string    `json:"host_id"`
	At     time.Time `json:"at"`
}

func applyStartDrain(f *FSM, _ uint64, p StartDrainPayload) (Drain, error) {
	h, ok := f.s.Hosts[p.HostID]
	switch {
	case !ok:
		return Drain{}, errdefs.NotFound("host %s", p.HostID)
	case p.MaxParallel <= 0 || p.Deadline.IsZero():
		return Drain{}, errdefs.InvalidArgument("a drain needs a deadline and a positive max_parallel")
	}
	if d, ok := f.s.Drains[p.HostID]; ok && d.Running() {
		return *d, nil
	}
	h.Eligible, h.Draining = false, true
	f.index.Update(h)
	d := &Drain{HostID: p.HostID, Deadline: p.Deadline, MaxParallel: p.MaxParallel, Started: p.Started, Total: len(f.byHost[p.HostID])}
	f.s.Drains[p.HostID] = d
	return *d, nil
}

func applyDrainStep(f *FSM, _ uint64, p DrainStepPayload) (Drain, error) {
	d, ok := f.s.Drains[p.HostID]
	if !ok || !d.Running() {
		return Drain{}, errdefs.FailedPrecondition("host %s has no drain running", p.HostID)
	}
	d.Seq++
	st := p.Step
	st.Seq = d.Seq
	switch st.State {
	case drainMovedLive:
		d.Moved++
		d.MovedLive++
	case drainMoved, drainMovedWithoutWorkspace:
		d.Moved++
	case drainEvicted:
		d.Evicted++
	}
	d.Steps = append(d.Steps, st)
	if over := len(d.Steps) - maxDrainSteps; over > 0 {
		d.Steps = append(d.Steps[:0:0], d.Steps[over:]...)
	}
	return *d, nil
}

func applyEndDrain(f *FSM, _ uint64, p EndDrainPayload) (Drain, error) {
	d, ok := f.s.Drains[p.HostID]
	if !ok {
		return Drain{}, errdefs.NotFound("host %s has no drain", p.HostID)
	}
	if d.Running() {
		d.Finished = p.At
	}
	return *d, nil
}

// Drain returns the host's drain, running or finished (until the host is
// uncordoned or removed).
func (v View) Drain(hostID string) (Drain, bool) {
	d, ok := v.f.s.Drains[hostID]
	if !ok {
		return Drain{}, false
	}
	out := *d
	out.Steps = append([]DrainStep(nil), d.Steps...)
	return out, true
}

// RunningDrains returns the drains that have not finished, without their
// steps.
func (v View) RunningDrains() []Drain {
	var out []Drain
	for _, d := range v.f.s.Drains {
		if d.Running() {
			c := *d
			c.Steps = nil
			out = append(out, c)
		}
	}
	return out
}
