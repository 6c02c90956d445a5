package raftfsm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
)

// CommandType names a command; FSM.Apply dispatches on it.
type CommandType string

// The commands.
const (
	CmdMember        CommandType = "member"          // MemberPayload: set a node's HTTP address ("" removes)
	CmdRegisterHost  CommandType = "register_host"   // scheduler.Host: add or update a host
	CmdSetHostStatus CommandType = "set_host_status" // HostStatusPayload
	CmdPlace         CommandType = "place"           // PlacePayload: commit a plan
	CmdRelease       CommandType = "release"         // ReleasePayload: drop a placement
	CmdAssignRunner  CommandType = "assign_runner"   // AssignRunnerPayload: session → node, next epoch
	CmdSetQuota      CommandType = "set_quota"       // SetQuotaPayload
	CmdSetReady      CommandType = "set_ready"       // ReadyPayload: the host reported the sandbox usable, or not
	CmdSetFence      CommandType = "set_fence"       // FencePayload: a mover takes the sandbox
	CmdLiftFence     CommandType = "lift_fence"      // FencePayload: the mover lets it go
	CmdSetWarm       CommandType = "set_warm"        // WarmPayload: a host's warm pool counts changed
)

// Command is the one envelope every Raft write travels in.
type Command struct {
	Type CommandType `json:"type"`
	// IdempotencyKey identifies one logical request: applying a key again
	// returns the result recorded the first time and changes nothing.
	IdempotencyKey string          `json:"idempotency_key"`
	Payload        json.RawMessage `json:"payload"`
}

// Cmd is a command type with the types of its payload (P) and result (R).
// The commands are the variables below; Apply is the one way to write.
type Cmd[P, R any] struct{ Type CommandType }

// The typed commands, one per CommandType.
var (
	Member        = Cmd[MemberPayload, MemberPayload]{CmdMember}
	RegisterHost  = Cmd[scheduler.Host, scheduler.Host]{CmdRegisterHost}
	SetHostStatus = Cmd[HostStatusPayload, scheduler.Host]{CmdSetHostStatus}
	Place         = Cmd[PlacePayload, scheduler.Placement]{CmdPlace}
	Release       = Cmd[ReleasePayload, scheduler.Placement]{CmdRelease}
	AssignRunner  = Cmd[AssignRunnerPayload, RunnerAssignment]{CmdAssignRunner}
	SetQuota      = Cmd[SetQuotaPayload, scheduler.Quota]{CmdSetQuota}

	SetHostCA        = Cmd[HostCA, HostCA]{CmdSetHostCA}
	AddJoinToken     = Cmd[AddJoinTokenPayload, struct{}]{CmdAddJoinToken}
	ConsumeJoinToken = Cmd[ConsumeJoinTokenPayload, struct{}]{CmdConsumeJoinToken}
	MovePlacement    = Cmd[MovePayload, scheduler.Placement]{CmdMovePlacement}
	SetHostEndpoint  = Cmd[HostEndpointPayload, HostEndpointPayload]{CmdSetHostEndpoint}

	SetReady  = Cmd[ReadyPayload, scheduler.Placement]{CmdSetReady}
	SetFence  = Cmd[FencePayload, scheduler.Placement]{CmdSetFence}
	LiftFence = Cmd[FencePayload, scheduler.Placement]{CmdLiftFence}
	SetWarm   = Cmd[WarmPayload, scheduler.Host]{CmdSetWarm}
)

// Applier is what Apply needs of a node. *Node is the only implementation:
// every write goes through Apply.
type Applier interface {
	// applyCommand commits c through the leader, from any node.
	applyCommand(ctx context.Context, c Command) (Result, error)
	// WaitApplied returns once this node has applied the log at index.
	WaitApplied(ctx context.Context, index uint64) error
}

// Apply commits payload as command c from any node (a follower forwards it
// to the leader), waits until this node has applied it too, so that a Read
// here right after sees the write (read your writes), and returns the
// command's result or its error. key is the idempotency key (Key makes
// fresh ones; "" for none): a retry of the same logical request must reuse
// it. While there is no leader, or it changes, Apply retries under the same
// key until ctx ends, so a command takes effect at most once (exactly once
// when Apply returns nil).
func Apply[P, R any](ctx context.Context, a Applier, c Cmd[P, R], key string, payload P) (R, error) {
	var out R
	cmd, err := NewCommand(c.Type, key, payload)
	if err != nil {
		return out, err
	}
	r, err := a.applyCommand(ctx, cmd)
	if err != nil {
		return out, err
	}
	if err := a.WaitApplied(ctx, r.Index); err != nil {
		return out, fmt.Errorf("applying %s: %w", c.Type, err)
	}
	if err := r.Decode(&out); err != nil {
		return out, err
	}
	return out, nil
}

// Key returns a fresh idempotency key: prefix, a slash and a random
// suffix. A caller retrying one logical request reuses the key it got; a new
// request takes a new one.
func Key(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + "/" + hex.EncodeToString(b)
}

// NewCommand builds a command, encoding payload as JSON (for tests that
// apply commands to an FSM directly; everything else uses Apply).
func NewCommand(t CommandType, key string, payload any) (Command, error) {
	b, err := json.Marshal(payload)
	if err != nil {
		return Command{}, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "encoding %s payload", t)
	}
	return Command{Type: t, IdempotencyKey: key, Payload: b}, nil
}

// Result is what applying a command produced, as recorded for its key.
type Result struct {
	Value json.RawMessage `json:"value,omitempty"`
	Err   *ResultError    `json:"err,omitempty"`
	// Replayed is set when the key had already been applied.
	Replayed bool `json:"replayed,omitempty"`
	// Index is the log index the command was applied at; set by Node.Apply,
	// not recorded with the key.
	Index uint64 `json:"index,omitempty"`
	// batch is a place_batch's items' results, for the leader's batcher.
	batch batchResults
}

// ResultError is a command's error, with its errdefs kind.
type ResultError struct {
	Kind errdefs.Kind `json:"kind"`
	Msg  string       `json:"msg"`
}

// Error returns the command's error, or nil.
func (r Result) Error() error {
	if r.Err == nil {
		return nil
	}
	return &errdefs.Error{Kind: r.Err.Kind, Msg: r.Err.Msg}
}

// Decode decodes the result's value into v, or returns the command's error.
func (r Result) Decode(v any) error {
	if err := r.Error(); err != nil {
		return err
	}
	if v == nil || len(r.Value) == 0 {
		return nil
	}
	return json.Unmarshal(r.Value, v)
}

// MemberPayload records a control-plane node's HTTP address.
type MemberPayload struct {
	ID       string `json:"id"`
	HTTPAddr string `json:"http_addr"`
}

// HostStatusPayload changes a host's status; nil fields are left alone.
type HostStatusPayload struct {
	ID       string                `json:"id"`
	Status   *scheduler.HostStatus `json:"status,omitempty"`
	Eligible *bool                 `json:"eligible,omitempty"`
	Draining *bool                 `json:"draining,omitempty"`
}

// PlacePayload commits a plan. SandboxID may be empty: the FSM then names
// the sandbox after the log index, the same on every replica.
//
// Request and Config, when set, let the FSM plan again over its current
// state when Plan has gone stale, instead of refusing it with a conflict;
// the config travels with the command so that every replica plans alike.
// With them, Plan may be empty (no host): the proposer found none on its
// own state, which may lag, and the FSM plans.
type PlacePayload struct {
	Plan      scheduler.Plan     `json:"plan"`
	SandboxID string             `json:"sandbox_id,omitempty"`
	Request   *scheduler.Request `json:"request,omitempty"`
	Config    *scheduler.Config  `json:"config,omitempty"`
}

// ReleasePayload drops a session's placement.
type ReleasePayload struct {
	SessionID string `json:"session_key"`
}

// AssignRunnerPayload assigns a session's runner to a node. With IfEpoch
// set, the assignment is a compare-and-set: it happens only if the session's
// current epoch is *IfEpoch (0: never assigned), and otherwise the current
// assignment is returned unchanged.
type AssignRunnerPayload struct {
	SessionID string  `json:"session_key"`
	NodeID    string  `json:"node_id"`
	IfEpoch   *uint64 `json:"if_epoch,omitempty"`
}

// RunnerAssignment is which node runs a session, and since which epoch.
type RunnerAssignment struct {
	SessionID string `json:"session_key"`
	NodeID    string `json:"node_id"`
	Epoch     uint64 `json:"epoch"`
}

// SetQuotaPayload sets a tenant's quota, overriding the default. A limit below
// the tenant's current usage is refused with errdefs.FailedPrecondition.
type SetQuotaPayload struct {
	Tenant string          `json:"tenant"`
	Quota  scheduler.Quota `json:"quota"`
}

// ReadyPayload records whether the sandbox of a placement is usable, as its
// host reported. It applies only to the placement it names (host and
// sandbox id): a report about a sandbox since moved or replaced changes
// nothing.
type ReadyPayload struct {
	SessionID string `json:"session_key"`
	HostID    string `json:"host_id"`
	SandboxID string `json:"sandbox_id"`
	Ready     bool   `json:"ready"`
}

// WarmPayload sets a host's warm pool counts (scheduler.Host.Warm, keyed
// by scheduler.WarmKey) to what its heartbeat reported; an empty Warm
// clears them.
type WarmPayload struct {
	HostID string         `json:"host_id"`
	Warm   map[string]int `json:"warm,omitempty"`
}

// FencePayload takes (SetFence) or lets go (LiftFence) a session's
// sandbox for a move: while it is fenced, tool calls wait. Owner names the
// mover; a fence held by another owner is refused with errdefs.Conflict
// until it lapses at Until, which is checked against Now (the proposer's
// clock, so every replica decides alike).
type FencePayload struct {
	SessionID string    `json:"session_key"`
	Owner     string    `json:"owner"`
	Until     time.Time `json:"until,omitempty"`
	Now       time.Time `json:"now"`
	// Moved, on a LiftFence that ends a drain's move, records on the
	// placement how its sandbox came there (scheduler.Placement.Moved).
	Moved string `json:"moved,omitempty"`
}
