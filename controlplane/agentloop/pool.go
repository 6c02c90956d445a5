package agentloop

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// LockFunc takes the right to run a session's loop. ok is false when
// another node holds it; that node re-checks for work after it lets go, so
// nothing is left waiting. runCtx, derived from ctx, is what the loop runs
// under while it holds the right: it may carry what the Store needs to prove
// the right (a runner epoch) and may end when the right is lost.
type LockFunc func(ctx context.Context, sessionID string) (runCtx context.Context, unlock func(), ok bool, err error)

// ErrNotRunner is in the chain of a Store error that says this node is no
// longer the session's runner (another took it over): the loop stops at
// once, without retrying, and leaves the session to the new runner.
var ErrNotRunner = errors.New("this node is no longer the session's runner")

// ErrHandOver is the cause (context.Cause) of a loop's context that ended
// because the session goes to another runner (this node stops): work
// started outside this process, such as a command running in the sandbox,
// is left for the next runner to pick up rather than stopped. Any other
// end of the context (an interrupt, a deleted tenant) means stop.
var ErrHandOver = errors.New("the session is handed over to its next runner")

// ErrInterrupted is the cause (context.Cause) of a step's context that
// ended because the client interrupted the session: the step stops (a
// running tool call is killed) and the loop goes on to end the turn.
var ErrInterrupted = errors.New("the session was interrupted")

// Pool runs session loops in this process: at most one goroutine per
// session, woken whenever the session gets new input.
type Pool struct {
	loop   *Loop
	lock   LockFunc
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	// backoff is the wait before a loop's retry n (1-based) after a
	// failed run: n seconds, at most 10.
	backoff func(n int) time.Duration

	mu sync.Mutex
	// active guarded by mu: sessions with a goroutine.
	active map[string]*worker
	// kept guarded by mu: the sessions' copies their last loop left (see
	// keep), so that the next wake reads only what changed since.
	kept *keptCopies
}

// worker is one session's goroutine.
type worker struct {
	// again, guarded by Pool.mu, records a wake that arrived while it ran.
	again  bool
	tenant tenant.ID
	cancel context.CancelFunc
	// interrupt, guarded by Pool.mu, ends the running Run (nil between
	// runs).
	interrupt context.CancelCauseFunc
	// link, guarded by Pool.mu, is the span context of the latest wake
	// that brought input (WakeFrom), for the next Run's steps; invalid
	// when none did.
	link trace.SpanContext
}

// NewPool returns a pool that runs loops with r, each under lock.
func NewPool(r *Loop, lock LockFunc, log *slog.Logger) *Pool {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	backoff := func(n int) time.Duration { return time.Duration(min(n, 10)) * time.Second }
	return &Pool{loop: r, lock: lock, log: log, ctx: ctx, cancel: cancel, backoff: backoff, active: map[string]*worker{},
		kept: newKeptCopies(maxKeptCopies, maxKeptBytes)}
}

// Active is how many session loops run in this process now.
func (p *Pool) Active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.active)
}

// Wake makes sure the session's loop runs until it waits for input again.
func (p *Pool) Wake(t tenant.ID, sessionID string) {
	p.WakeFrom(context.Background(), t, sessionID)
}

// WakeFrom is Wake for input sent in the trace of ctx (a request's): the
// steps of the Run it starts, or of the next Run when one is under way,
// are spans under ctx's span. Only the span context is kept: the loop
// outlives the request, and ctx's end and other values mean nothing to it.
// A Run that takes in several wakes' input continues the latest one's.
func (p *Pool) WakeFrom(ctx context.Context, t tenant.ID, sessionID string) {
	link := trace.SpanContextFromContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return
	}
	if l, ok := p.active[sessionID]; ok {
		l.again = true
		if link.IsValid() {
			l.link = link
		}
		if l.interrupt != nil {
			go p.checkInterrupt(sessionID, l)
		}
		return
	}
	ctx, cancel := context.WithCancel(tenant.With(p.ctx, t))
	l := &worker{tenant: t, cancel: cancel, link: link}
	p.active[sessionID] = l
	p.wg.Add(1)
	go p.run(ctx, sessionID, l)
}

// checkInterrupt ends the loop's running step if the wake brought an
// interrupt: a tool call can run for minutes, and the client must not wait
// for it to end.
func (p *Pool) checkInterrupt(sessionID string, l *worker) {
	ctx, cancel := context.WithTimeout(tenant.With(p.ctx, l.tenant), 30*time.Second)
	defer cancel()
	pending, err := p.loop.InterruptPending(ctx, sessionID)
	if err != nil {
		p.log.Warn("looking for an interrupt", "session_id", sessionID, "err", err)
		return
	}
	if !pending {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.interrupt != nil {
		l.interrupt(ErrInterrupted)
	}
}

// StopTenant cancels the running loops of tenant t's sessions (the tenant is
// being deleted) without waiting for them.
func (p *Pool) StopTenant(t tenant.ID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.active {
		if l.tenant == t {
			l.cancel()
		}
	}
}

// Stop cancels running loops, handing their sessions over (ErrHandOver),
// and waits for them. A loop stopped mid-step resumes from the log the next
// time the session is woken, here or on another node.
func (p *Pool) Stop() {
	p.cancel(ErrHandOver)
	p.wg.Wait()
}

func (p *Pool) run(ctx context.Context, sessionID string, l *worker) {
	defer p.wg.Done()
	defer l.cancel()
	leave := func() {
		p.mu.Lock()
		delete(p.active, sessionID)
		p.mu.Unlock()
	}
	// failures counts the runs that failed in a row, and lasting those of
	// them whose error was not transient (kind unavailable: the database
	// restarting, the cluster electing a leader). The loop gives up after
	// maxLasting of the latter; it keeps trying through the former, at
	// most 10s apart.
	const maxLasting = 5
	failures, lasting := 0, 0
	// s is the session as the last Run left it: an earlier loop's copy to
	// start from, checked before use (Loop.resume), and kept for the next
	// loop when this one leaves.
	p.mu.Lock()
	s := p.kept.take(sessionID)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.kept.put(sessionID, s)
		p.mu.Unlock()
	}()
	for ctx.Err() == nil {
		runCtx, unlock, ok, err := p.lock(ctx, sessionID)
		interrupted := false
		if err == nil && ok {
			stepCtx, interrupt := context.WithCancelCause(runCtx)
			p.mu.Lock()
			l.interrupt = interrupt
			link := l.link
			l.link = trace.SpanContext{}
			p.mu.Unlock()
			if link.IsValid() {
				stepCtx = trace.ContextWithSpanContext(stepCtx, link)
			}
			err = p.loop.run(stepCtx, sessionID, &s)
			p.mu.Lock()
			l.interrupt = nil
			p.mu.Unlock()
			interrupted = errors.Is(context.Cause(stepCtx), ErrInterrupted)
			interrupt(nil)
			if lasting+1 >= maxLasting && givesUp(ctx, err, interrupted) {
				// The last try failed: while the right to run the session
				// is still held, end it as a session whose loop stopped.
				p.giveUp(runCtx, sessionID, err)
			}
			unlock()
		}
		switch {
		case ctx.Err() != nil:
			leave()
			return
		case interrupted:
			continue // the next step ends the turn
		case errors.Is(err, ErrNotRunner):
			p.log.Info("session loop stopped: another node runs the session now", "session_id", sessionID, "err", err)
			leave()
			return
		case err != nil && errdefs.IsNotFound(err):
			leave() // the session is gone
			return
		case err != nil:
			failures++
			transient := errdefs.IsUnavailable(err)
			if !transient {
				lasting++
			}
			p.log.Warn("session loop failed; retrying", "session_id", sessionID, "attempt", failures, "transient", transient, "err", err)
			if lasting >= maxLasting {
				p.log.Error("session loop gave up; the session is idle with a session.error and resumes when it gets new input", "session_id", sessionID)
				s.drop()
				// New input may have woken it since the give-up's idle
				// was committed: that wake found this loop still active,
				// so this loop takes it, with its count of failures anew.
				p.mu.Lock()
				if l.again {
					l.again = false
					p.mu.Unlock()
					failures, lasting = 0, 0
					continue
				}
				delete(p.active, sessionID)
				p.mu.Unlock()
				return
			}
			select {
			case <-ctx.Done():
				leave()
				return
			case <-time.After(p.backoff(failures)):
			}
			continue
		}
		failures, lasting = 0, 0
		if ok {
			// Input another node appended while we held the lock found it
			// taken; look once more now that it is free.
			if pending, err := p.loop.pending(ctx, sessionID, &s); err == nil && pending {
				continue
			}
		}
		// Leave the active set only if no wake came in meanwhile; Wake
		// decides under the same lock whether to start a goroutine.
		p.mu.Lock()
		if l.again {
			l.again = false
			p.mu.Unlock()
			continue
		}
		delete(p.active, sessionID)
		p.mu.Unlock()
		return
	}
	leave()
}

// givesUp reports whether a run that ended with err counts toward giving
// up on the session (a lasting failure, as Pool.run counts them).
func givesUp(ctx context.Context, err error, interrupted bool) bool {
	return err != nil && ctx.Err() == nil && !interrupted && !errors.Is(err, ErrNotRunner) &&
		!errdefs.IsNotFound(err) && !errdefs.IsUnavailable(err)
}

// giveUp ends a session whose loop failed for good: it appends a
// session.error (classified; the cause goes to the log) and idles the
// session, so that it is never left running with nothing to run it, and a
// client sees why its turn ended. The commit is one of its own, with no
// event of the step that failed (one that could not be stored, say).
func (p *Pool) giveUp(ctx context.Context, sessionID string, cause error) {
	r := p.loop
	msg := "the session's agent loop failed repeatedly and stopped (internal error); send a new message to try again"
	if m := TenantMessage(cause); m != "internal error" {
		msg = "the session's agent loop stopped: " + m
	}
	err := r.Store.Commit(ctx, sessionID, Commit{
		Events: []Out{
			r.errorEvent(ErrorInfo{Type: "unknown_error", Message: msg, RetryStatus: "exhausted"}),
			r.idle(StopReason{Type: "retries_exhausted"}),
		},
		Status: "idle",
	})
	if err != nil {
		p.log.Error("ending a session whose loop gave up", "session_id", sessionID, "err", err, "cause", cause)
		return
	}
	p.log.Error("session loop gave up: the session is idle with a session.error", "session_id", sessionID, "err", cause)
}

// InterruptPending reports whether the session has an unprocessed
// user.interrupt.
func (r *Loop) InterruptPending(ctx context.Context, sessionID string) (bool, error) {
	queued, err := r.Store.Queued(ctx, sessionID)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(queued, func(e Event) bool { return e.Type == UserInterrupt }), nil
}

// pending reports whether the session has a step to take, s being the
// session as the last Run left it (waiting for input). Only what was
// appended since can change that, so when nothing was, the answer is no
// without deciding again. s may be stale in what another runner consumed
// meanwhile; that can only make the answer yes where it is no, and the
// loop's next Run, which reads the session whole, finds nothing to do.
func (r *Loop) pending(ctx context.Context, sessionID string, s *session) (bool, error) {
	changed, err := r.refresh(ctx, sessionID, s)
	if err != nil || !changed {
		return false, err
	}
	act, err := Decide(s.agent, s.log, r.Config)
	if err != nil {
		return false, err
	}
	_, wait := act.(Wait)
	return !wait, nil
}
