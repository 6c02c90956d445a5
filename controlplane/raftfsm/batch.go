package raftfsm

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"corral.dev/corral/internal/errdefs"
)

// CmdPlaceBatch commits several placements in one log entry: the leader
// groups the place commands that reach it together (placeBatcher).
const CmdPlaceBatch CommandType = "place_batch" // PlaceBatchPayload

// placeBatch is the typed CmdPlaceBatch, the leader's batcher's own: its
// result is one Result per item, in order, handed to the batcher as Go
// values through the raft future (batchResults), never encoded.
var placeBatch = Cmd[PlaceBatchPayload, batchResults]{CmdPlaceBatch}

// PlaceBatchPayload is place commands applied one after the other in one
// log entry. Each keeps its own idempotency key and gets its own result:
// an item is admitted, or re-planned, on the state the items before it
// left, and one that fails fails alone. A batch carries no key of its
// own; a caller whose item's outcome is unknown retries that item alone,
// and its key makes it take effect once.
//
// An item's sandbox, unless it names one, is "sbx-<index>-<i>", i its
// position: unique, and the same on every replica. Every node must know
// this command before a leader proposes one (a node of an older version
// refuses it as an unknown command type): upgrade every node, then let
// the leader batch.
type PlaceBatchPayload struct {
	Items []PlaceItem `json:"items"`
}

// PlaceItem is one place command of a batch: its idempotency key and its
// payload. The payload is decoded with the batch, in one pass.
type PlaceItem struct {
	Key   string       `json:"idempotency_key"`
	Place PlacePayload `json:"place"`
}

// placeItemOut is PlaceItem as the batcher encodes it, from the command
// as it came (its payload already encoded).
type placeItemOut struct {
	Key   string          `json:"idempotency_key"`
	Place json.RawMessage `json:"place"`
}

// batchResults is what applying a place_batch returns: the items'
// results, for the leader's batcher.
type batchResults []Result

// DefaultPlaceBatch is how many placements one place_batch entry holds at
// most, by default (Config.PlaceBatch).
const DefaultPlaceBatch = 128

// placeBatchers is how many batches may be committing at once: while
// they all are, the place commands that arrive queue and go together in
// the next. A leader that is idle commits a command at once, alone.
const placeBatchers = 4

// batchPrefix starts every place_batch entry the batcher writes (a
// Command's JSON names its type first): FSM.Apply decodes those, the
// biggest entries, in one pass, envelope and items together, rather than
// the envelope and then its payload. An entry without it goes through
// the table like any command.
var batchPrefix = []byte(`{"type":"` + CmdPlaceBatch + `",`)

// applyBatchEntry applies a log entry that starts with batchPrefix, as
// apply would. Call with mu held for writing.
func (f *FSM) applyBatchEntry(l *raft.Log) *Result {
	var c struct {
		Type           CommandType       `json:"type"`
		IdempotencyKey string            `json:"idempotency_key"`
		Payload        PlaceBatchPayload `json:"payload"`
	}
	if err := json.Unmarshal(l.Data, &c); err != nil {
		return errResult(errdefs.InvalidArgument("decoding command at index %d: %v", l.Index, err))
	}
	cmd := Command{Type: c.Type, IdempotencyKey: c.IdempotencyKey}
	if r, ok := f.replay(cmd.IdempotencyKey); ok {
		return r
	}
	return f.record(cmd, result(cmd.Type, func() (any, error) { return applyPlaceBatch(f, l.Index, c.Payload) }))
}

func applyPlaceBatch(f *FSM, index uint64, p PlaceBatchPayload) (batchResults, error) {
	out := make(batchResults, len(p.Items))
	for i, it := range p.Items {
		out[i] = *f.applyBatchItem(index, i, it)
	}
	return out, nil
}

// applyBatchItem applies the i-th item of a place_batch at index, as
// apply applies a place command of its own. Call with mu held for writing.
func (f *FSM) applyBatchItem(index uint64, i int, it PlaceItem) *Result {
	if r, ok := f.replay(it.Key); ok {
		return r
	}
	c := Command{Type: CmdPlace, IdempotencyKey: it.Key}
	return f.record(c, result(CmdPlace, func() (any, error) {
		return placePlan(f, fmt.Sprintf("sbx-%d-%d", index, i), it.Place)
	}))
}

// placeBatcher groups the place commands that reach the leader at once
// into place_batch entries: one log entry, one apply on each replica and
// one wake-up of the waiters for many placements. placeBatchers workers
// each take the first command waiting and every other waiting then, up to
// max, and commit them; a lone command is committed as it came, a place
// command. So the wait a command adds is at most the commit of the
// batches before it, and none while the leader is idle.
type placeBatcher struct {
	max int
	in  chan placeCall
	// commit applies an encoded command through raft on the leader
	// (Node.applyLocal).
	commit func(body []byte) (Result, error)
	// done is closed when the node stops.
	done <-chan struct{}

	// entries and placements count what was committed, for tests and
	// the benchmark (placements per entry).
	entries, placements atomic.Int64
}

// errStopping answers the place commands queued on a leader that stops:
// unavailable, so a follower that forwarded one retries it with the next
// leader (under its key); a caller on the stopping node itself gets
// canceled from Node.applyCommand.
var errStopping = errdefs.Wrap(errdefs.UnavailableKind, raft.ErrRaftShutdown, "node stopping")

type placeCall struct {
	c     Command
	reply chan placeReply // buffered: the worker never blocks on it
}

type placeReply struct {
	r   Result
	err error
}

func newPlaceBatcher(max int, commit func([]byte) (Result, error), done <-chan struct{}) *placeBatcher {
	if max <= 0 {
		max = DefaultPlaceBatch
	}
	return &placeBatcher{max: max, in: make(chan placeCall, 4*max), commit: commit, done: done}
}

// apply commits a place command in the next batch and returns its own
// result, as Node.applyLocal would. Its payload must decode as a
// PlacePayload (see batchable).
func (b *placeBatcher) apply(ctx context.Context, c Command) (Result, error) {
	call := placeCall{c: c, reply: make(chan placeReply, 1)}
	select {
	case b.in <- call:
	case <-ctx.Done():
		return Result{}, errdefs.Wrap(errdefs.UnavailableKind, ctx.Err(), "queueing %s", c.Type)
	case <-b.done:
		return Result{}, errStopping
	}
	select {
	case rep := <-call.reply:
		return rep.r, rep.err
	case <-ctx.Done():
		// The command may still commit: the caller retries under its key.
		return Result{}, errdefs.Wrap(errdefs.UnavailableKind, ctx.Err(), "committing %s", c.Type)
	case <-b.done:
		return Result{}, errStopping
	}
}

// batchable reports whether a command forwarded from another node may go
// in a batch: a place command whose payload decodes. One that does not
// is committed alone, and fails alone in the FSM: in a batch it would
// fail the batch's decoding on every replica, and so its neighbours. (A
// command made here by Apply always decodes.)
func batchable(c Command) bool {
	return c.Type == CmdPlace && json.Unmarshal(c.Payload, new(PlacePayload)) == nil
}

// run is one worker: it commits batches until the node stops.
func (b *placeBatcher) run() {
	for {
		var first placeCall
		select {
		case first = <-b.in:
		case <-b.done:
			return
		}
		calls := []placeCall{first}
	more:
		for len(calls) < b.max {
			select {
			case c := <-b.in:
				calls = append(calls, c)
			default:
				break more
			}
		}
		b.commitBatch(calls)
	}
}

// commitBatch commits calls in one entry and answers each.
func (b *placeBatcher) commitBatch(calls []placeCall) {
	answer := func(r Result, err error) {
		for _, c := range calls {
			c.reply <- placeReply{r, err}
		}
	}
	cmd := calls[0].c
	if len(calls) > 1 {
		items := make([]placeItemOut, len(calls))
		for i, c := range calls {
			items[i] = placeItemOut{Key: c.c.IdempotencyKey, Place: c.c.Payload}
		}
		var err error
		if cmd, err = NewCommand(CmdPlaceBatch, "", struct {
			Items []placeItemOut `json:"items"`
		}{items}); err != nil {
			answer(Result{}, err)
			return
		}
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		answer(Result{}, fmt.Errorf("encoding command: %w", err))
		return
	}
	r, err := b.commit(body)
	b.entries.Add(1)
	b.placements.Add(int64(len(calls)))
	if err != nil || len(calls) == 1 {
		answer(r, err)
		return
	}
	each := r.batch
	if r.Err != nil || len(each) != len(calls) {
		answer(Result{}, fmt.Errorf("place_batch at index %d answered %d results for %d placements: %v", r.Index, len(each), len(calls), r.Error()))
		return
	}
	for i, c := range calls {
		each[i].Index = r.Index
		c.reply <- placeReply{each[i], nil}
	}
}
