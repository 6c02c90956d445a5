package raftfsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
)

// DefaultRecentKeys is how many idempotency keys an FSM remembers by default.
const DefaultRecentKeys = 100_000

// snapshotState is the replicated state as snapshots carry it. Tenant usage
// and the recent-key index are derived on Restore.
type snapshotState struct {
	// Index is the log index of the last command applied to this state.
	// Snapshots carry it so that a restored node knows what it holds.
	Index      uint64                         `json:"index,omitempty"`
	Members    map[string]string              `json:"members"` // node id → HTTP address
	Hosts      map[string]*scheduler.Host     `json:"hosts"`
	Placements map[string]scheduler.Placement `json:"placements"`
	Runners    map[string]RunnerAssignment    `json:"runners"`
	Quotas     map[string]scheduler.Quota     `json:"quotas"`
	Recent     []RecentKey                    `json:"recent"` // oldest first

	// The host protocol's state (fleet.go).
	HostCA        *HostCA                   `json:"host_ca,omitempty"`
	JoinTokens    map[string]JoinTokenState `json:"join_tokens,omitempty"` // by hex SHA-256 of the secret
	JoinedHosts   map[string]bool           `json:"joined_hosts,omitempty"`
	HostEndpoints map[string]string         `json:"host_endpoints,omitempty"` // node id → HostService address

	// The nodes' trust (trust.go): their CA, its key sealed, and their
	// one-time join tokens.
	NodeCA     *NodeCA                   `json:"node_ca,omitempty"`
	NodeTokens map[string]JoinTokenState `json:"node_tokens,omitempty"` // by hex SHA-256 of the secret

	// Drains by host (drain.go): running, or finished until the host is
	// uncordoned.
	Drains map[string]*Drain `json:"drains,omitempty"`
}

// RecentKey is one remembered idempotency key and its result.
type RecentKey struct {
	Key    string `json:"key"`
	Result Result `json:"result"`
}

// FSM is the raft.FSM. Read it through View (under Read) and write it only
// through raft.
type FSM struct {
	defQuota  scheduler.Quota
	maxRecent int

	// mu guards everything below. Apply and Restore hold it for writing,
	// readers for reading.
	mu    sync.RWMutex
	s     snapshotState
	usage map[string]scheduler.Usage // derived from s.Placements
	// byHost indexes s.Placements: host id → session keys.
	byHost map[string]map[string]struct{}
	// tenantOnHost is derived from s.Placements: host id → tenant → the
	// sum of the requests of the tenant's placements there, and their
	// number.
	tenantOnHost map[string]map[string]tenantHost
	recent       map[string]Result // derived from s.Recent
	// hostList is s.Hosts in id order, rebuilt when a host is added.
	hostList []*scheduler.Host
	// index files s.Hosts by pool, provider and zone for Place
	// (scheduler.Index): updated by every command that changes a host,
	// rebuilt on restore.
	index *scheduler.Index

	// watch, if set, is told of every host whose placements change.
	watch atomic.Pointer[func(hostID string)]

	// changed is closed, and replaced, after every log applied and every
	// restore: waiters (Node.Wait, Node.WaitApplied) block on it instead of
	// polling. Load it before reading the state it should tell about.
	changed atomic.Pointer[chan struct{}]

	// applied mirrors s.Index for readers that must not take mu. It is
	// this FSM's own count, not raft's AppliedIndex: raft advances that when
	// it hands a batch of logs to the FSM goroutine, before they are applied,
	// so a read gated on raft's figure could miss the write it waited for.
	applied atomic.Uint64
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an empty FSM. defaultQuota applies to tenants without their
// own; maxRecent bounds the idempotency table (0: DefaultRecentKeys). Every
// replica must be given the same values.
func NewFSM(defaultQuota scheduler.Quota, maxRecent int) *FSM {
	if maxRecent <= 0 {
		maxRecent = DefaultRecentKeys
	}
	f := &FSM{defQuota: defaultQuota, maxRecent: maxRecent}
	ch := make(chan struct{})
	f.changed.Store(&ch)
	f.reset(snapshotState{})
	return f
}

// reset installs s and rebuilds what is derived from it. Call with mu held.
func (f *FSM) reset(s snapshotState) {
	if s.Members == nil {
		s.Members = map[string]string{}
	}
	if s.Hosts == nil {
		s.Hosts = map[string]*scheduler.Host{}
	}
	if s.Placements == nil {
		s.Placements = map[string]scheduler.Placement{}
	}
	if s.Runners == nil {
		s.Runners = map[string]RunnerAssignment{}
	}
	if s.Quotas == nil {
		s.Quotas = map[string]scheduler.Quota{}
	}
	if s.JoinTokens == nil {
		s.JoinTokens = map[string]JoinTokenState{}
	}
	if s.JoinedHosts == nil {
		s.JoinedHosts = map[string]bool{}
	}
	if s.HostEndpoints == nil {
		s.HostEndpoints = map[string]string{}
	}
	if s.NodeTokens == nil {
		s.NodeTokens = map[string]JoinTokenState{}
	}
	if s.Drains == nil {
		s.Drains = map[string]*Drain{}
	}
	f.s = s
	f.rebuildHostList()
	f.index = scheduler.NewIndex(f.hostList...)
	f.usage = map[string]scheduler.Usage{}
	f.byHost = map[string]map[string]struct{}{}
	f.tenantOnHost = map[string]map[string]tenantHost{}
	for _, p := range s.Placements {
		f.account(p, 1)
	}
	f.recent = make(map[string]Result, len(s.Recent))
	for _, r := range s.Recent {
		f.recent[r.Key] = r.Result
	}
}

// account adds (sign 1) or removes (sign -1) a placement's share of its
// tenant's usage and of the host index. Call with mu held for writing.
func (f *FSM) account(p scheduler.Placement, sign int64) {
	keys := f.byHost[p.HostID]
	if sign > 0 {
		if keys == nil {
			keys = map[string]struct{}{}
			f.byHost[p.HostID] = keys
		}
		keys[p.SessionID] = struct{}{}
	} else {
		delete(keys, p.SessionID)
		if len(keys) == 0 {
			delete(f.byHost, p.HostID)
		}
	}
	f.index.Count(p.HostID, p.Tenant, int(sign))
	onHost := f.tenantOnHost[p.HostID]
	if onHost == nil {
		onHost = map[string]tenantHost{}
		f.tenantOnHost[p.HostID] = onHost
	}
	th := onHost[p.Tenant]
	th.sandboxes += int(sign)
	if sign > 0 {
		th.allocated = th.allocated.Add(p.Resources)
	} else {
		th.allocated = th.allocated.Sub(p.Resources)
	}
	switch {
	case th.sandboxes > 0:
		onHost[p.Tenant] = th
	case len(onHost) == 1:
		delete(f.tenantOnHost, p.HostID)
	default:
		delete(onHost, p.Tenant)
	}
	u := f.usage[p.Tenant]
	if p.Paused() {
		u.PausedSandboxes += int(sign)
	} else {
		u.Sandboxes += int(sign)
		u.CPUMillis += sign * p.Resources.CPUMillis
		u.MemoryMiB += sign * p.Resources.MemoryMiB
	}
	if u == (scheduler.Usage{}) {
		delete(f.usage, p.Tenant)
		return
	}
	f.usage[p.Tenant] = u
}

// tenantHost is what one tenant's placements hold on one host.
type tenantHost struct {
	allocated scheduler.Resources // the sum of their requests
	sandboxes int
}

// handler applies one command type's payload at a log index.
type handler func(f *FSM, index uint64, payload json.RawMessage) (any, error)

// handle makes the handler of command c from a function over its typed
// payload and result.
func handle[P, R any](c Cmd[P, R], fn func(f *FSM, index uint64, p P) (R, error)) handler {
	return func(f *FSM, index uint64, raw json.RawMessage) (any, error) {
		var p P
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, errdefs.InvalidArgument("decoding %s payload: %v", c.Type, err)
		}
		return fn(f, index, p)
	}
}

// handlers is the dispatch table: one entry per command.
var handlers = map[CommandType]handler{
	CmdMember:        handle(Member, applyMember),
	CmdRegisterHost:  handle(RegisterHost, applyRegisterHost),
	CmdSetHostStatus: handle(SetHostStatus, applySetHostStatus),
	CmdPlace:         handle(Place, applyPlace),
	CmdPlaceBatch:    handle(placeBatch, applyPlaceBatch),
	CmdRelease:       handle(Release, applyRelease),
	CmdAssignRunner:  handle(AssignRunner, applyAssignRunner),
	CmdSetQuota:      handle(SetQuota, applySetQuota),

	CmdSetHostCA:        handle(SetHostCA, applySetHostCA),
	CmdAddJoinToken:     handle(AddJoinToken, applyAddJoinToken),
	CmdConsumeJoinToken: handle(ConsumeJoinToken, applyConsumeJoinToken),
	CmdMovePlacement:    handle(MovePlacement, applyMovePlacement),
	CmdSetHostEndpoint:  handle(SetHostEndpoint, applySetHostEndpoint),

	CmdSetNodeCA:        handle(SetNodeCA, applySetNodeCA),
	CmdAddNodeToken:     handle(AddNodeToken, applyAddNodeToken),
	CmdConsumeNodeToken: handle(ConsumeNodeToken, applyConsumeNodeToken),
	CmdReseal:           handle(Reseal, applyReseal),

	CmdSetReady:  handle(SetReady, applySetReady),
	CmdSetPaused: handle(SetPaused, applySetPaused),
	CmdSetFence:  handle(SetFence, applySetFence),
	CmdLiftFence: handle(LiftFence, applyLiftFence),
	CmdSetWarm:   handle(SetWarm, applySetWarm),

	CmdSetHostHealth: handle(SetHostHealth, applySetHostHealth),

	CmdStartDrain: handle(StartDrain, applyStartDrain),
	CmdDrainStep:  handle(RecordDrainStep, applyDrainStep),
	CmdEndDrain:   handle(EndDrain, applyEndDrain),
}

// Apply implements raft.FSM. It returns a *Result.
func (f *FSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Every log handed here counts as applied, the undecodable one too:
	// it changed nothing, and a waiter on its index must not hang.
	defer func() {
		f.s.Index = l.Index
		f.applied.Store(l.Index)
		f.broadcast()
	}()
	if l.Type != raft.LogCommand {
		return &Result{}
	}
	if bytes.HasPrefix(l.Data, batchPrefix) {
		return f.applyBatchEntry(l)
	}
	var c Command
	if err := json.Unmarshal(l.Data, &c); err != nil {
		return errResult(errdefs.InvalidArgument("decoding command at index %d: %v", l.Index, err))
	}
	return f.apply(l.Index, c)
}

// broadcast wakes every waiter on changed. Call with mu held for writing,
// after the change.
func (f *FSM) broadcast() {
	ch := make(chan struct{})
	close(*f.changed.Swap(&ch))
}

// Changed returns a channel closed at the next change of the state (a log
// applied, a snapshot restored). Take it before reading what you wait for.
func (f *FSM) Changed() <-chan struct{} { return *f.changed.Load() }

// Applied is the log index of the last command applied to this FSM (or
// held by the snapshot it was restored from): every write at or below it is
// visible to Read.
func (f *FSM) Applied() uint64 { return f.applied.Load() }

// apply runs c. Call with mu held for writing.
func (f *FSM) apply(index uint64, c Command) *Result {
	if r, ok := f.replay(c.IdempotencyKey); ok {
		return r
	}
	h, ok := handlers[c.Type]
	if !ok {
		return f.record(c, errResult(errdefs.InvalidArgument("unknown command type %q", c.Type)))
	}
	return f.record(c, result(c.Type, func() (any, error) { return h(f, index, c.Payload) }))
}

// result runs a command's handler and encodes what it returned.
func result(t CommandType, run func() (any, error)) *Result {
	v, err := run()
	if err != nil {
		return errResult(err)
	}
	if each, ok := v.(batchResults); ok {
		return &Result{batch: each} // for the leader's batcher, never encoded
	}
	b, err := json.Marshal(v)
	if err != nil {
		return errResult(fmt.Errorf("encoding %s result: %w", t, err))
	}
	return &Result{Value: b}
}

// replay returns the result recorded for key, marked replayed, or false.
// Call with mu held.
func (f *FSM) replay(key string) (*Result, bool) {
	if key == "" {
		return nil, false
	}
	r, ok := f.recent[key]
	if !ok {
		return nil, false
	}
	r.Replayed = true
	return &r, true
}

// record remembers r under c's idempotency key, if it has one, and
// returns it. Call with mu held for writing.
func (f *FSM) record(c Command, r *Result) *Result {
	if c.IdempotencyKey != "" {
		f.remember(c.IdempotencyKey, *r)
	}
	return r
}

// remember records a key's result, forgetting the oldest beyond maxRecent.
// Call with mu held for writing.
func (f *FSM) remember(key string, r Result) {
	f.recent[key] = r
	f.s.Recent = append(f.s.Recent, RecentKey{Key: key, Result: r})
	if over := len(f.s.Recent) - f.maxRecent; over > 0 {
		for _, old := range f.s.Recent[:over] {
			delete(f.recent, old.Key)
		}
		// Copy to let the dropped prefix be collected.
		f.s.Recent = append([]RecentKey(nil), f.s.Recent[over:]...)
	}
}

func errResult(err error) *Result {
	return &Result{Err: &ResultError{Kind: errdefs.KindOf(err), Msg: err.Error()}}
}

func applyMember(f *FSM, _ uint64, m MemberPayload) (MemberPayload, error) {
	if m.ID == "" {
		return m, errdefs.InvalidArgument("member needs an id")
	}
	if m.HTTPAddr == "" {
		delete(f.s.Members, m.ID)
	} else {
		f.s.Members[m.ID] = m.HTTPAddr
	}
	return m, nil
}

func applyRegisterHost(f *FSM, _ uint64, h scheduler.Host) (scheduler.Host, error) {
	if h.ID == "" {
		return h, errdefs.InvalidArgument("host needs an id")
	}
	if h.Status == "" {
		h.Status = scheduler.StatusReady
	}
	// Allocation is the FSM's own: the sum of the host's placements. Being
	// eligible and draining are the operator's: a host that registers again
	// keeps them. Warm counts come with heartbeats (SetWarm): kept until
	// the next.
	h.Allocated = scheduler.Resources{}
	if old, ok := f.s.Hosts[h.ID]; ok {
		h.Allocated, h.Eligible, h.Draining, h.Warm = old.Allocated, old.Eligible, old.Draining, old.Warm
		// Health: the conditions come with heartbeats (SetHostHealth),
		// kept until the next, except the heartbeat's own: a host that
		// registers is heard from. A provider whose health is as before
		// keeps the time it has been so.
		if len(h.Conditions) == 0 {
			for _, c := range old.Conditions {
				if c.Type != scheduler.ConditionHeartbeat {
					h.Conditions = append(h.Conditions, c)
				}
			}
		}
		for i, p := range h.Offers {
			if o, ok := old.Offer(p.Name); ok && o.Healthy == p.Healthy && o.Reason == p.Reason && !o.Since.IsZero() {
				h.Offers[i].Since = o.Since
			}
		}
		*old = h // keep the pointer hostList holds
		f.index.Update(old)
		return h, nil
	}
	f.s.Hosts[h.ID] = &h
	f.insertHost(&h)
	f.index.Update(&h)
	return h, nil
}

func applySetHostStatus(f *FSM, _ uint64, p HostStatusPayload) (scheduler.Host, error) {
	h, ok := f.s.Hosts[p.ID]
	if !ok {
		return scheduler.Host{}, errdefs.NotFound("host %s", p.ID)
	}
	if p.Status != nil {
		if *p.Status != scheduler.StatusReady && *p.Status != scheduler.StatusDown {
			return scheduler.Host{}, errdefs.InvalidArgument("host status %q", *p.Status)
		}
		h.Status = *p.Status
	}
	if p.Eligible != nil {
		h.Eligible = *p.Eligible
	}
	if p.Draining != nil {
		h.Draining = *p.Draining
		if !h.Draining {
			// Uncordoned: a drain running stops (its runner sees the
			// record gone), a finished one is forgotten.
			delete(f.s.Drains, p.ID)
		}
	}
	f.index.Update(h)
	return *h, nil
}

func applyPlace(f *FSM, index uint64, p PlacePayload) (scheduler.Placement, error) {
	return placePlan(f, fmt.Sprintf("sbx-%d", index), p)
}

// placePlan commits p's plan, re-planning a stale one, and names its
// sandbox sandboxID unless p names it. Call with mu held for writing.
func placePlan(f *FSM, sandboxID string, p PlacePayload) (scheduler.Placement, error) {
	if p.Plan.HostID == "" && p.Request != nil {
		// No plan: the proposer's state found no host (it may lag this
		// one's), so the FSM plans, as below.
		p.Plan = scheduler.Plan{SessionID: p.Request.SessionID, Tenant: p.Request.Tenant}
	}
	if cur, ok := f.s.Placements[p.Plan.SessionID]; ok && (cur.HostID == p.Plan.HostID || p.Plan.HostID == "") {
		return cur, nil // placement is idempotent per session
	}
	err := scheduler.Admit(fsmView{f}, p.Plan, f.quota(p.Plan.Tenant))
	if p.Plan.HostID == "" {
		err = errdefs.Conflict("no plan")
	}
	if errdefs.KindOf(err) == errdefs.ConflictKind && p.Request != nil && p.Config != nil {
		// The plan went stale between planning and commit (say, concurrent
		// placements filled its host). Plan again here, over this
		// replica's state with the payload's config: every replica reaches
		// the same plan, and the caller is spared a round trip.
		plan, perr := scheduler.Place(fsmView{f}, *p.Request, *p.Config)
		if perr != nil {
			return scheduler.Placement{}, perr
		}
		if plan.Existing {
			return f.s.Placements[plan.SessionID], nil
		}
		p.Plan = plan
		err = scheduler.Admit(fsmView{f}, p.Plan, f.quota(p.Plan.Tenant))
	}
	if err != nil {
		return scheduler.Placement{}, err
	}
	pl := scheduler.Placement{
		SessionID: p.Plan.SessionID, Tenant: p.Plan.Tenant, HostID: p.Plan.HostID,
		SandboxID: p.SandboxID, Resources: p.Plan.Resources, Limits: p.Plan.Limits,
		Runtime: p.Plan.Runtime, Provider: p.Plan.Provider, Image: p.Plan.Image, Pids: p.Plan.Pids,
		AllowedHosts: p.Plan.AllowedHosts,
	}
	if pl.SandboxID == "" {
		pl.SandboxID = sandboxID
	}
	f.place(pl)
	f.takeWarm(pl)
	return pl, nil
}

func applyRelease(f *FSM, _ uint64, p ReleasePayload) (scheduler.Placement, error) {
	pl, ok := f.s.Placements[p.SessionID]
	if !ok {
		return pl, errdefs.NotFound("placement for session %s", p.SessionID)
	}
	f.unplace(pl)
	return pl, nil
}

func applyAssignRunner(f *FSM, _ uint64, p AssignRunnerPayload) (RunnerAssignment, error) {
	if p.SessionID == "" || p.NodeID == "" {
		return RunnerAssignment{}, errdefs.InvalidArgument("runner assignment needs a session and a node")
	}
	a := f.s.Runners[p.SessionID]
	if p.IfEpoch != nil && *p.IfEpoch != a.Epoch {
		return a, nil
	}
	a = RunnerAssignment{SessionID: p.SessionID, NodeID: p.NodeID, Epoch: a.Epoch + 1}
	f.s.Runners[p.SessionID] = a
	return a, nil
}

func applySetQuota(f *FSM, _ uint64, p SetQuotaPayload) (scheduler.Quota, error) {
	q := p.Quota
	if p.Tenant == "" {
		return q, errdefs.InvalidArgument("quota needs a tenant")
	}
	if q.ConcurrentSandboxes < 0 || q.CPUMillis < 0 || q.MemoryMiB < 0 {
		return q, errdefs.InvalidArgument("quota must not be negative: %+v", q)
	}
	u := f.usage[p.Tenant]
	for _, c := range []struct {
		name         string
		limit, inUse int64
	}{
		{"concurrent_sandboxes", int64(q.ConcurrentSandboxes), int64(u.Sandboxes)},
		{"cpu_millis", q.CPUMillis, u.CPUMillis},
		{"memory_mib", q.MemoryMiB, u.MemoryMiB},
	} {
		if c.limit > 0 && c.limit < c.inUse {
			return q, errdefs.FailedPrecondition("tenant %s: quota %s %d is below current usage %d", p.Tenant, c.name, c.limit, c.inUse)
		}
	}
	f.s.Quotas[p.Tenant] = q
	return q, nil
}

// quota is a tenant's quota: its own, or the default. A tenant's own
// quota without a host share has the default's (an operator's quota
// override names no share). Call with mu held.
func (f *FSM) quota(tenant string) scheduler.Quota {
	q, ok := f.s.Quotas[tenant]
	if !ok {
		return f.defQuota
	}
	if q.HostSharePercent == 0 {
		q.HostSharePercent = f.defQuota.HostSharePercent
	}
	return q
}

// Read runs fn with a view of the FSM's current state, holding the read lock:
// fn must not keep what the view returns.
func (f *FSM) Read(fn func(v View)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(View{fsmView{f}})
}

// View is a read-only look at the FSM: a scheduler.View plus the rest of the
// state.
type View struct{ fsmView }

var (
	_ scheduler.View    = View{}
	_ scheduler.Indexed = fsmView{}
)

type fsmView struct{ f *FSM }

// rebuildHostList sorts the hosts into hostList. Call with mu held for writing.
func (f *FSM) rebuildHostList() {
	l := make([]*scheduler.Host, 0, len(f.s.Hosts))
	for _, h := range f.s.Hosts {
		l = append(l, h)
	}
	sort.Slice(l, func(i, j int) bool { return l[i].ID < l[j].ID })
	f.hostList = l
}

// insertHost adds a new host to hostList, in id order, in a new slice (a
// reader may hold the old one). Call with mu held for writing.
func (f *FSM) insertHost(h *scheduler.Host) {
	i, _ := slices.BinarySearchFunc(f.hostList, h.ID, func(e *scheduler.Host, id string) int { return strings.Compare(e.ID, id) })
	f.hostList = slices.Insert(slices.Clip(f.hostList), i, h)
}

func (v fsmView) Hosts() []*scheduler.Host { return v.f.hostList }

// Index implements scheduler.Indexed: Place looks only at the candidates.
func (v fsmView) Index() *scheduler.Index { return v.f.index }

func (v fsmView) Host(id string) (*scheduler.Host, bool) { h, ok := v.f.s.Hosts[id]; return h, ok }

func (v fsmView) Placement(key string) (scheduler.Placement, bool) {
	p, ok := v.f.s.Placements[key]
	return p, ok
}

func (v fsmView) Usage(tenant string) scheduler.Usage { return v.f.usage[tenant] }

func (v fsmView) TenantAllocated(hostID, tenant string) scheduler.Resources {
	return v.f.tenantOnHost[hostID][tenant].allocated
}

func (v fsmView) TenantSandboxes(hostID, tenant string) int {
	return v.f.tenantOnHost[hostID][tenant].sandboxes
}

// Quota returns a tenant's quota.
func (v fsmView) Quota(tenant string) scheduler.Quota { return v.f.quota(tenant) }

// Placements returns every placement, in session key order.
func (v View) Placements() []scheduler.Placement {
	out := make([]scheduler.Placement, 0, len(v.f.s.Placements))
	for _, p := range v.f.s.Placements {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SessionID < out[j].SessionID })
	return out
}

// Runner returns a session's runner assignment, or false.
func (v View) Runner(sessionID string) (RunnerAssignment, bool) {
	a, ok := v.f.s.Runners[sessionID]
	return a, ok
}

// Runners returns every runner assignment, in session key order.
func (v View) Runners() []RunnerAssignment {
	out := make([]RunnerAssignment, 0, len(v.f.s.Runners))
	for _, a := range v.f.s.Runners {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SessionID < out[j].SessionID })
	return out
}

// Member returns a node's HTTP address, or "".
func (v View) Member(id string) string { return v.f.s.Members[id] }

// RecentKeys returns how many idempotency keys are remembered.
func (v View) RecentKeys() int { return len(v.f.s.Recent) }

// Snapshot implements raft.FSM: the state encoded as JSON.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	b, err := json.Marshal(f.s)
	if err != nil {
		return nil, fmt.Errorf("encoding snapshot: %w", err)
	}
	return jsonSnapshot(b), nil
}

// Restore implements raft.FSM, replacing the state with a snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var s snapshotState
	if err := json.NewDecoder(rc).Decode(&s); err != nil {
		return fmt.Errorf("decoding snapshot: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reset(s)
	f.applied.Store(s.Index)
	f.placementsChanged("")
	f.broadcast()
	return nil
}

type jsonSnapshot []byte

func (s jsonSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return fmt.Errorf("writing snapshot: %w", err)
	}
	return sink.Close()
}

func (s jsonSnapshot) Release() {}
