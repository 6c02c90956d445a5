package agent

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The warm pool: per class (one of the host's runtimes, an image, limits), sandboxes
// created and started before any session asks, so that a session's first
// tool call does not wait for a sandbox to boot.
//
// A pooled sandbox is made through Driver.Create with a key of its own
// ("pool-" and random hex) and the label driver.PoolLabel naming its class,
// and with nothing of any session: no environment beyond the driver's PATH
// and HOME, no labels but the pool's, its own fresh workspace (and, with a
// disk limit, its own fresh workspace image) and /tmp. Nothing runs in it
// but its init (and the driver's command server). An ensure whose
// runtime, image and limits match a class claims one: the driver's Claim
// binds the session's key, labels and environment in one step (the pool
// label goes with it), and the agent records it as the session's sandbox.
// A claimed sandbox is used once: when its session releases it, it is
// destroyed like any other, never returned to the pool. A claim that fails
// destroys the pooled sandbox and the ensure creates one cold.
//
// Pooled sandboxes hold no record in the state dir: containerd is their
// record. After a restart (kill -9 included) the agent lists the driver's
// sandboxes before it runs: a pooled one of a class it still keeps, up to
// the class's Max, goes back into the pool; any other is destroyed. While
// pooled, reconciliation and the reaper leave them alone (they know every
// pool key, from before its Create to its claim).
//
// A claim kicks the refill, which waits first for the claimed sandbox's
// first command to end (at most Config.PoolRefillHold after the last
// claim): a new gVisor sandbox's boot takes both CPUs of a small host for a
// few hundred milliseconds, and the first command of the session that
// claimed one, which usually comes at once, would share them (measured
// here: 45 ms instead of 25). Claims coming faster than the hold for long
// empty the pool; then none come, and the refill goes on.
//
// A new pooled sandbox runs one command before it is ready (warmUp): the
// shells a session's first tool call starts, so that its first start of
// them is not that call's.
//
// Size: each class is refilled, one create at a time, to Min plus the
// number of ensures of that class in the last PoolDemandWindow, at most
// Max. Members beyond the target (demand that went away) stay until they
// are claimed. Under memory or disk pressure the pool gives its sandboxes
// up before any session's sandbox is evicted, and it does not refill while
// there is pressure, nor within a demand window of giving one up. Pooled sandboxes are not counted in the host's allocated
// resources (they reserve nothing the scheduler counts); a claim is
// checked against capacity like any ensure.

// PoolClass is one warm pool class of a host.
type PoolClass struct {
	// Runtime is the runtime of the class's sandboxes, one of the host's
	// (default: the host's default runtime).
	Runtime string
	// Image is the image of the class's sandboxes. Required.
	Image string
	// Limits of the class's sandboxes; zero fields take the agent's
	// DefaultLimits. An ensure claims from the class only when its limits,
	// with the same defaults, are equal.
	Limits driver.Limits
	// Min is how many ready sandboxes the pool keeps at least; Max bounds
	// it, recent demand included.
	Min, Max int
}

// MaxPoolSize bounds PoolClass.Max.
const MaxPoolSize = 64

// DefaultPoolRefillHold is Config.PoolRefillHold's default: a first
// command comes at once after a claim when the model's first answer is a
// tool call the turn prepared for (fleet.Prepare), or later than this.
const DefaultPoolRefillHold = 500 * time.Millisecond

// PoolStatus is one class of the pool now.
type PoolStatus struct {
	Runtime string
	Image   string
	Limits  driver.Limits
	// Ready is how many unclaimed sandboxes wait; Target how many the pool
	// fills to now.
	Ready, Target int
	// IDs are the driver's ids of the ready sandboxes.
	IDs []string
}

// claimer is a driver that can bind a pooled sandbox to a session (the
// containerd driver).
type claimer interface {
	// Claim makes the never-used sandbox behind ref, made with
	// driver.PoolLabel, the sandbox of spec.Key: its labels and
	// environment become spec's. It returns the sandbox's new Ref.
	Claim(ctx context.Context, ref driver.Ref, spec driver.Spec) (driver.Ref, error)
}

type pool struct {
	window time.Duration
	hold   time.Duration // Config.PoolRefillHold
	kick   chan struct{} // capacity 1: fill soon

	// mu guards the fields below and the classes' ready and claims.
	mu      sync.Mutex
	classes []*poolClass
	// known are the keys of pooled sandboxes, from before their Create
	// until their claim or destruction: reconciliation and the reaper
	// leave them alone.
	known map[string]bool
	// changed is closed and replaced whenever a class's ready count
	// changes.
	changed chan struct{}
	// heldUntil: the pool gave a sandbox up under pressure; it does not
	// refill before then (one demand window later), so that it does not
	// fill and give up by turns.
	heldUntil time.Time
	// firstCommand holds, per key of a claimed sandbox whose first
	// command has not ended, when the refill's wait for it ends. It is a
	// matter of CPU, not of policy: the times are the machine's clock,
	// not Config.Now.
	firstCommand map[string]time.Time
}

type poolClass struct {
	PoolClass
	// driver is the Runtime's: it makes the class's sandboxes, and only
	// its sandboxes are the class's (the label names image and limits).
	driver driver.Driver
	name   string       // the value of driver.PoolLabel
	ready  []driver.Ref // oldest first
	claims []time.Time  // ensures of the class within the window
}

func newPool(cfg *Config) *pool {
	p := &pool{window: cfg.PoolDemandWindow, hold: cfg.PoolRefillHold, kick: make(chan struct{}, 1), known: map[string]bool{}, changed: make(chan struct{}),
		firstCommand: map[string]time.Time{}}
	for _, c := range cfg.Pools {
		c.Limits = withDefaultLimits(c.Limits, cfg.DefaultLimits)
		c.Runtime = cmp.Or(c.Runtime, cfg.Runtime)
		p.classes = append(p.classes, &poolClass{PoolClass: c, driver: cfg.runtimeDriver(c.Runtime), name: className(c.Image, c.Limits)})
	}
	return p
}

// className names a class in the pool label: a hash, since images carry
// characters labels may not.
func className(image string, l driver.Limits) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s|%d|%d|%d|%d", image, l.CPUMillis, l.MemoryBytes, l.Pids, l.DiskBytes))
	return "c" + hex.EncodeToString(sum[:8])
}

func withDefaultLimits(l, d driver.Limits) driver.Limits {
	if l.CPUMillis == 0 {
		l.CPUMillis = d.CPUMillis
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = d.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = d.DiskBytes
	}
	return l
}

func (p *pool) kickNow() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// claimed notes that key's sandbox was claimed: the refill waits for its
// first command.
func (p *pool) claimed(key string) {
	p.mu.Lock()
	p.firstCommand[key] = time.Now().Add(p.hold)
	p.mu.Unlock()
}

// commandEnded notes that a command of key's sandbox ended (or that the
// sandbox is gone): a refill waiting for it goes on.
func (p *pool) commandEnded(key string) {
	p.mu.Lock()
	_, waited := p.firstCommand[key]
	delete(p.firstCommand, key)
	p.mu.Unlock()
	if waited {
		p.kickNow()
	}
}

// refillHold is how long the refill still waits for claimed sandboxes'
// first commands (0: not at all).
func (p *pool) refillHold() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var wait time.Duration
	for key, until := range p.firstCommand {
		left := time.Until(until)
		if left <= 0 {
			delete(p.firstCommand, key)
		}
		wait = max(wait, left)
	}
	return wait
}

// changedLocked signals a change; p.mu is held.
func (p *pool) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// isKnown reports whether key is a pooled sandbox's.
func (p *pool) isKnown(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.known[key]
}

// target is how many ready sandboxes c should have at now; p.mu is held.
func (p *pool) targetLocked(c *poolClass, now time.Time) int {
	c.claims = slices.DeleteFunc(c.claims, func(t time.Time) bool { return now.Sub(t) >= p.window })
	return min(c.Max, c.Min+len(c.claims))
}

// take notes an ensure of the class matching its driver (its runtime's),
// image and limits (as demand) and takes its oldest ready sandbox, if any.
func (p *pool) take(d driver.Driver, image string, l driver.Limits, now time.Time) (driver.Ref, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.classes {
		if c.driver != d || c.Image != image || c.Limits != l || c.Max == 0 {
			continue
		}
		c.claims = append(c.claims, now)
		if len(c.ready) == 0 {
			return driver.Ref{}, false
		}
		ref := c.ready[0]
		c.ready = slices.Delete(c.ready, 0, 1)
		p.changedLocked()
		return ref, true
	}
	return driver.Ref{}, false
}

// forget drops a pooled sandbox's key (claimed or destroyed).
func (p *pool) forget(key string) {
	p.mu.Lock()
	delete(p.known, key)
	p.mu.Unlock()
}

// PoolChanged returns a channel closed at the next change of a pool
// class's ready count. Take it before reading Pool.
func (a *Agent) PoolChanged() <-chan struct{} {
	a.pool.mu.Lock()
	defer a.pool.mu.Unlock()
	return a.pool.changed
}

// Pool describes the warm pool's classes now, in configuration order.
func (a *Agent) Pool() []PoolStatus {
	now := a.cfg.Now()
	a.pool.mu.Lock()
	defer a.pool.mu.Unlock()
	out := make([]PoolStatus, 0, len(a.pool.classes))
	for _, c := range a.pool.classes {
		st := PoolStatus{Runtime: c.Runtime, Image: c.Image, Limits: c.Limits, Ready: len(c.ready), Target: a.pool.targetLocked(c, now)}
		for _, r := range c.ready {
			st.IDs = append(st.IDs, r.ID)
		}
		out = append(out, st)
	}
	return out
}

// warmPools is the pool as heartbeats report it.
func (a *Agent) warmPools() []*pb.WarmPool {
	var out []*pb.WarmPool
	for _, st := range a.Pool() {
		out = append(out, &pb.WarmPool{Runtime: st.Runtime, Image: st.Image, Limits: limitsPB(st.Limits), Ready: int32(st.Ready)})
	}
	return out
}

// recoverPool, before the agent runs, takes back the pooled sandboxes the
// driver holds from before a restart: those of a class still kept, up to
// its Max, after checking they are there; every other pooled sandbox is
// destroyed.
func (a *Agent) recoverPool(ctx context.Context) error {
	for _, d := range a.drivers() {
		if err := a.recoverPoolOf(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// recoverPoolOf is recoverPool for the sandboxes of one driver.
func (a *Agent) recoverPoolOf(ctx context.Context, d driver.Driver) error {
	refs, err := d.List(ctx)
	if err != nil {
		return fmt.Errorf("listing the %s driver's sandboxes for the warm pool: %w", d.Name(), err)
	}
	_, canClaim := d.(claimer)
	p := a.pool
	for _, ref := range refs {
		name := ref.Labels[driver.PoolLabel]
		if name == "" {
			continue
		}
		var class *poolClass
		for _, c := range p.classes {
			if c.driver == d && c.name == name && len(c.ready) < c.Max && canClaim {
				class = c
			}
		}
		if class != nil {
			if _, err := d.Attach(ctx, ref); err == nil {
				p.mu.Lock()
				class.ready = append(class.ready, ref)
				p.known[ref.Key] = true
				p.changedLocked()
				p.mu.Unlock()
				a.log.Info("recovered a warm pool sandbox", "id", ref.ID, "image", class.Image)
				continue
			} else {
				a.log.Warn("a warm pool sandbox from before the restart does not answer; destroying it", "id", ref.ID, "err", err)
			}
		}
		a.log.Info("destroying a warm pool sandbox of a class this host no longer keeps", "id", ref.ID, "class", name)
		if err := d.Destroy(ctx, ref); err != nil {
			return fmt.Errorf("destroying pooled sandbox %s: %w", ref.ID, err)
		}
	}
	return nil
}

// poolLoop fills the pool now, after every claim, and again after a
// failure's backoff, until ctx ends.
func (a *Agent) poolLoop(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		if hold := a.pool.refillHold(); hold > 0 {
			// A claimed sandbox's first command is about to run: it ends
			// the wait (commandEnded kicks), or the hold lapses.
			t := time.NewTimer(hold)
			select {
			case <-ctx.Done():
			case <-a.pool.kick:
			case <-t.C:
			}
			t.Stop()
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if err := a.fillPool(ctx); err != nil && ctx.Err() == nil {
			backoff = min(max(2*backoff, time.Second), time.Minute)
			a.log.Warn("filling the warm pool", "err", err, "retry_in", backoff)
		} else {
			backoff = 0
		}
		// A failed create (an image not imported yet, a full disk) has no
		// event that says it would work now: retry after the backoff.
		var (
			retry <-chan time.Time
			timer *time.Timer
		)
		if backoff > 0 {
			timer = time.NewTimer(backoff)
			retry = timer.C
		}
		select {
		case <-ctx.Done():
		case <-a.pool.kick:
		case <-retry:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// fillPool creates sandboxes, one at a time, until every class has its
// target ready.
func (a *Agent) fillPool(ctx context.Context) error {
	p := a.pool
	p.mu.Lock()
	held := p.heldUntil
	p.mu.Unlock()
	if a.cfg.Now().Before(held) {
		return errdefs.ResourceExhausted("the warm pool gave up a sandbox under pressure: it refills after %s", held.Format(time.RFC3339))
	}
	for _, c := range p.classes {
		if _, ok := c.driver.(claimer); !ok {
			continue // validatePools refused such a class with a Max
		}
		for range MaxPoolSize {
			p.mu.Lock()
			need := p.targetLocked(c, a.cfg.Now()) - len(c.ready)
			var key string
			if need > 0 {
				key = "pool-" + randomHex(8)
				p.known[key] = true // before Create: reconciliation must not take it for a leftover
			}
			p.mu.Unlock()
			if need <= 0 {
				break
			}
			if pr, err := a.cfg.Pressure(ctx); err != nil || pr.Memory || pr.Disk {
				p.forget(key)
				if err != nil {
					return fmt.Errorf("checking pressure before filling the warm pool: %w", err)
				}
				return errdefs.ResourceExhausted("the host is under memory or disk pressure: the warm pool waits")
			}
			ref, err := c.driver.Create(ctx, driver.Spec{Key: key, Image: c.Image, Limits: c.Limits,
				Labels: map[string]string{driver.PoolLabel: c.name}})
			if err != nil {
				p.forget(key)
				return fmt.Errorf("creating a pool sandbox of %s: %w", c.Image, err)
			}
			a.warmUp(ctx, c.driver, ref)
			p.mu.Lock()
			c.ready = append(c.ready, ref)
			p.changedLocked()
			p.mu.Unlock()
			a.log.Debug("added a sandbox to the warm pool", "id", ref.ID, "image", c.Image)
		}
	}
	return nil
}

// warmUpCommand is the first command a pooled sandbox runs, before it is
// ready: the shells a session's first tool call starts. A fresh gVisor
// sandbox reads a binary through its gofer the first time it starts it;
// this way the claim's first command does not (measured here: its bash
// tool call 5–6 ms slower without). It writes nothing and leaves nothing
// running, so the claim finds the sandbox untouched.
var warmUpCommand = []string{"sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash -c :; exit 0"}

// warmUp runs warmUpCommand in a new pool sandbox. A failure is logged:
// the sandbox is pooled all the same, its first command only slower.
func (a *Agent) warmUp(ctx context.Context, d driver.Driver, ref driver.Ref) {
	sb, err := d.Attach(ctx, ref)
	if err == nil {
		var res driver.ExecResult
		res, err = sb.Exec(ctx, driver.ExecRequest{Command: warmUpCommand, Timeout: time.Minute, MaxOutput: 4 << 10})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit code %d: %s", res.ExitCode, res.Stderr)
		}
	}
	if err != nil {
		a.log.Warn("warming up a pool sandbox's shell", "id", ref.ID, "err", err)
	}
}

// claimPooled gives spec a pooled sandbox of its class (of d, its
// runtime's driver), bound to it, if the pool has one; false means create
// one cold. The caller holds reconcileMu, and kicks the pool's refill once
// the sandbox is recorded (the refill's create would slow the rest of the
// ensure down).
func (a *Agent) claimPooled(ctx context.Context, d driver.Driver, spec driver.Spec) (driver.Ref, bool) {
	cl, ok := d.(claimer)
	if !ok || len(a.pool.classes) == 0 {
		return driver.Ref{}, false
	}
	ref, ok := a.pool.take(d, spec.Image, a.withDefaults(spec.Limits), a.cfg.Now())
	if !ok {
		return driver.Ref{}, false
	}
	defer a.pool.forget(ref.Key)
	claimed, err := cl.Claim(ctx, ref, spec)
	if err != nil {
		// Used at most once: a sandbox whose claim failed is not pooled again.
		a.log.Warn("claiming a warm pool sandbox failed; creating one cold", "session_id", spec.Key, "id", ref.ID, "err", err)
		a.destroyRef(context.WithoutCancel(ctx), ref)
		return driver.Ref{}, false
	}
	a.pool.claimed(spec.Key)
	a.log.Info("claimed a warm pool sandbox", "session_id", spec.Key, "id", claimed.ID)
	return claimed, true
}

// dropPooled destroys the newest unclaimed sandbox of the pool, under
// pressure, before any session's sandbox is evicted; the pool refills one
// demand window later at the earliest, and only without pressure. It
// reports whether the pool had one.
func (a *Agent) dropPooled(ctx context.Context, reason string) bool {
	p := a.pool
	p.mu.Lock()
	var ref driver.Ref
	found := false
	for _, c := range p.classes {
		if n := len(c.ready); n > 0 {
			ref, found = c.ready[n-1], true
			c.ready = c.ready[:n-1]
			p.changedLocked()
			break
		}
	}
	if found {
		p.heldUntil = a.cfg.Now().Add(p.window)
	}
	p.mu.Unlock()
	if !found {
		return false
	}
	defer p.forget(ref.Key)
	a.log.Warn("destroying a warm pool sandbox under pressure", "id", ref.ID, "reason", reason)
	if err := a.driverFor(ref).Destroy(ctx, ref); err != nil {
		a.log.Error("destroying a warm pool sandbox under pressure", "id", ref.ID, "err", err)
	}
	return true
}

// validatePools checks the pool classes of c.
func (c *Config) validatePools() error {
	seen := map[string]bool{}
	for _, p := range c.Pools {
		switch {
		case p.Image == "":
			return errdefs.InvalidArgument("a warm pool class needs an image")
		case p.Min < 0 || p.Max < p.Min || p.Max > MaxPoolSize:
			return errdefs.InvalidArgument("warm pool of %s: want 0 <= min <= max <= %d, have min %d, max %d", p.Image, MaxPoolSize, p.Min, p.Max)
		case p.Limits.CPUMillis < 0 || p.Limits.MemoryBytes < 0 || p.Limits.Pids < 0 || p.Limits.DiskBytes < 0:
			return errdefs.InvalidArgument("warm pool of %s: negative limits %+v", p.Image, p.Limits)
		}
		runtime := cmp.Or(p.Runtime, c.Runtime)
		d := c.runtimeDriver(runtime)
		if d == nil {
			return errdefs.InvalidArgument("warm pool of %s: runtime %s is not one this host runs", p.Image, runtime)
		}
		name := runtime + "|" + className(p.Image, withDefaultLimits(p.Limits, c.DefaultLimits))
		if seen[name] {
			return errdefs.InvalidArgument("warm pool of %s: the class (runtime, image and limits) is listed twice", p.Image)
		}
		seen[name] = true
		if _, ok := d.(claimer); !ok && p.Max > 0 {
			return errdefs.InvalidArgument("the %s driver cannot keep a warm pool (it cannot bind a sandbox to a session after creating it): set the pool of %s to 0", d.Name(), p.Image)
		}
	}
	if c.PoolDemandWindow < 0 {
		return errdefs.InvalidArgument("the warm pool's demand window must not be negative")
	}
	if c.PoolRefillHold < 0 {
		return errdefs.InvalidArgument("the warm pool's refill hold must not be negative")
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
