package agent

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// attachRecorded attaches to every ready sandbox in the state dir. One that
// the driver no longer has is marked failed (reported, and removed once the
// control plane no longer places it); other attach errors are fatal, because
// guessing would lose work.
func (a *Agent) attachRecorded(ctx context.Context) error {
	recs, err := a.store.List()
	if err != nil {
		return err
	}
	for _, r := range recs {
		b := &box{rec: r}
		if len(r.AllowedHosts) > 0 && r.State != sandbox.Failed {
			// Its proxy went with the old process; its namespaces did not,
			// unless the host rebooted (they live on a tmpfs): then they
			// are made again, and the sandbox's new init joins them.
			s, p := egress.Namespaces(r.Key)
			_, errS := os.Stat(s)
			_, errP := os.Stat(p)
			fresh := errS != nil && errP != nil
			if _, err := a.openNetwork(ctx, r.Key, r.Tenant, r.AllowedHosts, fresh); err != nil {
				a.log.Warn("egress network not reopened: the sandbox has no way out", "session_id", r.Key, "err", err)
			}
		}
		if r.State == sandbox.Ready {
			sb, err := a.driverFor(r.Ref).Attach(ctx, r.Ref)
			switch {
			case err == nil:
				b.sb = sb
				a.log.Info("re-attached to sandbox", "session_id", r.Key, "id", r.Ref.ID)
			case errdefs.IsNotFound(err):
				b.rec.State, b.rec.Message = sandbox.Failed, fmt.Sprintf("lost while the agent was down: %v", err)
				a.log.Warn("recorded sandbox is gone", "session_id", r.Key, "err", err)
				if err := a.store.Put(b.rec); err != nil {
					return err
				}
			default:
				return fmt.Errorf("attaching to sandbox %s: %w", r.Key, err)
			}
		}
		a.boxes[r.Key] = b
	}
	return nil
}

// reconcile makes the host hold only sandboxes the control plane placed
// here: recorded ones not placed are destroyed, and sandboxes the driver has
// without a record (a crash between Create and the record) are adopted when
// placed and destroyed otherwise.
func (a *Agent) reconcile(ctx context.Context, placed []string) {
	a.reconcileMu.Lock()
	defer a.reconcileMu.Unlock()
	want := map[string]bool{}
	for _, k := range placed {
		want[k] = true
	}
	a.mu.Lock()
	a.placed = maps.Clone(want)
	var stale []string
	for k := range a.boxes {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	a.mu.Unlock()
	for _, k := range stale {
		a.log.Info("removing sandbox the control plane no longer places here", "session_id", k)
		if err := a.destroyLocked(ctx, k); err != nil {
			a.log.Error("removing leftover sandbox", "session_id", k, "err", err)
		}
	}
	refs, err := a.listAll(ctx)
	if err != nil {
		// The others' are reconciled: a driver that did not answer has
		// nothing of its own removed.
		a.log.Error("listing the drivers' sandboxes", "err", err)
	}
	for _, ref := range refs {
		if a.pool.isKnown(ref.Key) {
			continue // pooled, not yet claimed
		}
		a.mu.Lock()
		b := a.boxes[ref.Key]
		a.mu.Unlock()
		if b != nil && b.rec.Ref.ID == ref.ID && b.rec.State != sandbox.Evicted {
			continue // ours; an evicted one is a crash mid-eviction: remove it
		}
		if b == nil && want[ref.Key] {
			if err := a.adopt(ctx, ref); err != nil {
				a.log.Error("adopting unrecorded sandbox", "session_id", ref.Key, "err", err)
			}
			continue
		}
		a.log.Info("removing leftover sandbox", "session_id", ref.Key, "id", ref.ID)
		if err := a.driverFor(ref).Destroy(ctx, ref); err != nil {
			a.log.Error("removing leftover sandbox", "session_id", ref.Key, "err", err)
		} else {
			a.removeStrayNetwork(ctx, ref.Key)
		}
	}
}

func (a *Agent) adopt(ctx context.Context, ref driver.Ref) error {
	sb, err := a.driverFor(ref).Attach(ctx, ref)
	if err != nil {
		return err
	}
	now := a.cfg.Now()
	rec := sandbox.Record{Key: ref.Key, Ref: ref, Spec: driver.Spec{Key: ref.Key}, State: sandbox.Ready, CreatedAt: now, LastUsed: now}
	if err := a.store.Put(rec); err != nil {
		return err
	}
	a.mu.Lock()
	a.boxes[ref.Key] = &box{rec: rec, sb: sb}
	a.mu.Unlock()
	a.log.Info("adopted unrecorded sandbox", "session_id", ref.Key, "id", ref.ID)
	return nil
}

// apply carries out one assignment and says how it went.
func (a *Agent) apply(ctx context.Context, as *pb.Assignment) *pb.AssignmentResult {
	res := &pb.AssignmentResult{AssignmentId: as.Id}
	var err error
	switch act := as.Action.(type) {
	case *pb.Assignment_Ensure:
		a.setPlaced(act.Ensure.GetKey(), true)
		err = a.ensure(ctx, act.Ensure)
		if err == nil {
			res.Sandbox = a.status(act.Ensure.Key)
		}
	case *pb.Assignment_Destroy:
		a.reconcileMu.Lock()
		err = a.destroyLocked(ctx, act.Destroy.GetKey())
		a.reconcileMu.Unlock()
		a.setPlaced(act.Destroy.GetKey(), false)
	default:
		err = errdefs.InvalidArgument("assignment %s has no action this agent knows", as.Id)
	}
	if err != nil {
		a.log.Warn("assignment failed", "assignment_id", as.Id, "err", err)
		res.ErrorKind, res.ErrorMessage = errdefs.KindOf(err).String(), err.Error()
	}
	return res
}

// setPlaced notes an assignment's word on whether key is placed here, once
// the placements are known at all.
func (a *Agent) setPlaced(key string, placed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.placed == nil:
	case placed:
		a.placed[key] = true
	default:
		delete(a.placed, key)
	}
}

func limitsFromPB(l *pb.Limits) driver.Limits {
	return driver.Limits{CPUMillis: l.GetCpuMillis(), MemoryBytes: l.GetMemoryBytes(), Pids: l.GetPids(), DiskBytes: l.GetDiskBytes()}
}

func limitsPB(l driver.Limits) *pb.Limits {
	return &pb.Limits{CpuMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, Pids: l.Pids, DiskBytes: l.DiskBytes}
}

// withDefaults fills zero limits from the agent's defaults.
func (a *Agent) withDefaults(l driver.Limits) driver.Limits {
	return withDefaultLimits(l, a.cfg.DefaultLimits)
}

// ensure makes the sandbox exist and be ready.
func (a *Agent) ensure(ctx context.Context, e *pb.EnsureSandbox) error {
	if e.GetKey() == "" {
		return errdefs.InvalidArgument("ensure: a sandbox key is required")
	}
	d, err := a.driverOf(e.Runtime)
	if err != nil {
		return err
	}
	if _, ok := e.Labels[driver.PoolLabel]; ok {
		return errdefs.InvalidArgument("ensure %s: the label %s is the host agent's own", e.Key, driver.PoolLabel)
	}
	a.reconcileMu.Lock()
	defer a.reconcileMu.Unlock()
	a.mu.Lock()
	b := a.boxes[e.Key]
	a.mu.Unlock()
	if b != nil && b.rec.State != sandbox.Failed && a.driverFor(b.rec.Ref) != d {
		// One key, one sandbox: a sandbox of another runtime is not what
		// this ensure asks for, and replacing it would lose its workspace.
		return errdefs.FailedPrecondition("sandbox %s exists here with runtime %s, not %s", e.Key, cmp.Or(a.runtimeOf(b.rec.Ref), b.rec.Ref.Provider), cmp.Or(e.Runtime, a.cfg.Runtime))
	}
	if b != nil && b.rec.State == sandbox.Ready {
		// Idempotent, if the sandbox is really there.
		_, err := d.Attach(ctx, b.rec.Ref)
		if err == nil {
			return nil
		}
		if !errdefs.IsNotFound(err) {
			return fmt.Errorf("checking sandbox %s: %w", e.Key, err)
		}
		a.log.Warn("sandbox lost while the agent ran", "session_id", e.Key, "err", err)
		a.mu.Lock()
		b.rec.State = sandbox.Failed
		a.mu.Unlock()
	}
	lost := ""
	if b != nil && b.rec.State == sandbox.Failed {
		// Its driver sandbox is gone; start again from the spec, and say so:
		// a session must never lose its files silently.
		lost = "replaces a sandbox that was lost, with its workspace"
		if err := a.destroyLocked(ctx, e.Key); err != nil {
			return err
		}
		b = nil
	}
	spec := driver.Spec{Key: e.Key, Image: e.Image, Limits: limitsFromPB(e.Limits), Env: e.Env, Labels: e.Labels}
	hosts := e.AllowedHosts
	if b != nil { // evicted: come back as it was (its network kept)
		spec, hosts = b.rec.Spec, b.rec.AllowedHosts
	}
	req := requestFromPB(e.Request)
	if err := a.checkCapacity(e.Key, a.requestOf(req, spec.Limits)); err != nil {
		return err
	}
	done := false // the sandbox is recorded: its network stays
	if len(hosts) > 0 && b == nil {
		// Its egress network first: the sandbox joins its namespace, and
		// its only way out is the proxy (package egress).
		n, err := a.openNetwork(ctx, e.Key, e.Tenant, hosts, true)
		if err != nil {
			return fmt.Errorf("making the egress network of %s: %w", e.Key, err)
		}
		spec.NetworkNamespace, spec.Env = n.Namespace(), withEgress(spec.Env, n)
		defer func() {
			if !done {
				a.closeNetwork(context.WithoutCancel(ctx), e.Key)
			}
		}()
	}
	// A fresh sandbox (not an evicted one coming back) may come from the
	// warm pool (whose sandboxes have no network); otherwise, or when the
	// claim fails, it is created cold.
	ref, warm := driver.Ref{}, false
	if b == nil && spec.NetworkNamespace == "" {
		// Refilled (or grown with the demand) in the background, after
		// this ensure.
		defer a.pool.kickNow()
		ref, warm = a.claimPooled(ctx, d, spec)
	}
	if !warm {
		var err error
		if ref, err = d.Create(ctx, spec); err != nil {
			return fmt.Errorf("creating sandbox %s: %w", e.Key, err)
		}
	}
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		a.destroyRef(ctx, ref)
		return fmt.Errorf("attaching to new sandbox %s: %w", e.Key, err)
	}
	now := a.cfg.Now()
	rec := sandbox.Record{Key: e.Key, Ref: ref, Spec: spec, State: sandbox.Ready, CreatedAt: now, LastUsed: now, Message: lost, Request: req, Tenant: e.Tenant, AllowedHosts: hosts}
	if b != nil && b.rec.Archive != "" {
		if err := restoreWorkspace(ctx, sb, b.rec.Archive); err != nil {
			a.destroyRef(ctx, ref)
			return fmt.Errorf("restoring the workspace of evicted sandbox %s: %w", e.Key, err)
		}
		rec.CreatedAt = b.rec.CreatedAt
	}
	if err := a.store.Put(rec); err != nil {
		a.destroyRef(ctx, ref)
		return err
	}
	if b != nil && b.rec.Archive != "" {
		_ = os.RemoveAll(b.rec.Archive)
	}
	a.mu.Lock()
	a.boxes[e.Key] = &box{rec: rec, sb: sb}
	a.mu.Unlock()
	done = true
	a.log.Info("sandbox ready", "session_id", e.Key, "id", ref.ID, "restored", b != nil, "warm", warm)
	return nil
}

func (a *Agent) destroyRef(ctx context.Context, ref driver.Ref) {
	if err := a.driverFor(ref).Destroy(ctx, ref); err != nil {
		a.log.Error("cleaning up half-made sandbox", "session_id", ref.Key, "err", err)
	}
}

func requestFromPB(r *pb.Resources) sandbox.Request {
	return sandbox.Request{CPUMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), DiskBytes: r.GetDiskBytes()}
}

// requestOf is what a sandbox reserves here: its request, or for one
// without (an older control plane, an older record) its limits with the
// agent's defaults, as before requests were apart from limits.
func (a *Agent) requestOf(r sandbox.Request, l driver.Limits) Resources {
	if r != (sandbox.Request{}) {
		return Resources(r)
	}
	l = a.withDefaults(l)
	return Resources{CPUMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, DiskBytes: l.DiskBytes}
}

// allocated sums the requests of ready sandboxes, except key's.
func (a *Agent) allocated(except string) Resources {
	a.mu.Lock()
	defer a.mu.Unlock()
	var r Resources
	for k, b := range a.boxes {
		if k == except || b.rec.State != sandbox.Ready {
			continue
		}
		q := a.requestOf(b.rec.Request, b.rec.Spec.Limits)
		if b.rec.Paused { // its CPU and memory are free until it resumes
			r.DiskBytes += pausedDisk(q, b.rec.PausedDiskBytes)
			continue
		}
		r.DiskBytes += q.DiskBytes
		r.CPUMillis += q.CPUMillis
		r.MemoryBytes += q.MemoryBytes
	}
	return r
}

// pausedDisk is the disk a paused sandbox reserves: what it held when it
// was paused (measured: it cannot grow meanwhile, and may hold more than
// its request, its checkpoint being beside its disk image), or its whole
// request when that was not measured.
func pausedDisk(q Resources, measured int64) int64 {
	if measured > 0 {
		return measured
	}
	return q.DiskBytes
}

// admissible is what the sandboxes' requests may add up to here: what the
// control plane schedules against (Registered.schedulable: the
// allocatable resources times its overcommit ratios), so that the two
// checks agree, and cfg.Allocatable for what it did not say.
func (a *Agent) admissible() Resources {
	a.mu.Lock()
	s := a.schedulable
	a.mu.Unlock()
	alloc := a.cfg.Allocatable
	return Resources{
		CPUMillis:   cmp.Or(s.CPUMillis, alloc.CPUMillis),
		MemoryBytes: cmp.Or(s.MemoryBytes, alloc.MemoryBytes),
		DiskBytes:   cmp.Or(s.DiskBytes, alloc.DiskBytes),
	}
}

// checkCapacity refuses a request that does not fit in what is left.
func (a *Agent) checkCapacity(key string, want Resources) error {
	used, have := a.allocated(key), a.admissible()
	for _, c := range []struct {
		what             string
		want, used, have int64
	}{
		{"CPU (millicores)", want.CPUMillis, used.CPUMillis, have.CPUMillis},
		{"memory (bytes)", want.MemoryBytes, used.MemoryBytes, have.MemoryBytes},
		{"disk (bytes)", want.DiskBytes, used.DiskBytes, have.DiskBytes},
	} {
		if c.have > 0 && c.used+c.want > c.have {
			return errdefs.ResourceExhausted("host %s cannot fit sandbox %s: %s requested %d, %d of %d schedulable in use",
				a.cfg.HostID, key, c.what, c.want, c.used, c.have)
		}
	}
	return nil
}

// destroyLocked removes the sandbox for key: the driver's sandbox, any kept
// workspace and the record. Absent is fine. The caller holds reconcileMu.
func (a *Agent) destroyLocked(ctx context.Context, key string) error {
	a.pool.commandEnded(key) // no first command to wait for
	a.mu.Lock()
	b := a.boxes[key]
	a.mu.Unlock()
	if b == nil {
		return nil
	}
	if b.rec.State != sandbox.Evicted {
		if err := a.driverFor(b.rec.Ref).Destroy(ctx, b.rec.Ref); err != nil {
			return fmt.Errorf("destroying sandbox %s: %w", key, err)
		}
	}
	if b.rec.Spec.NetworkNamespace != "" {
		a.closeNetwork(ctx, key)
	}
	if b.rec.Archive != "" {
		if err := os.RemoveAll(b.rec.Archive); err != nil {
			return fmt.Errorf("removing kept workspace of %s: %w", key, err)
		}
	}
	if err := a.forgetExecutions(key); err != nil {
		return err
	}
	if err := a.store.Delete(key); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.boxes, key)
	a.mu.Unlock()
	a.log.Info("sandbox destroyed", "session_id", key)
	return nil
}

// evictLocked keeps the sandbox's workspace in the state dir and removes the
// sandbox. The caller holds reconcileMu.
func (a *Agent) evictLocked(ctx context.Context, key, reason string) error {
	a.mu.Lock()
	b := a.boxes[key]
	if b.inflight > 0 {
		a.mu.Unlock()
		return errdefs.Conflict("sandbox %s is running a command", key)
	}
	b.evicting = true // use refuses it from now on
	a.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			a.mu.Lock()
			b.evicting = false
			a.mu.Unlock()
		}
	}()
	dir := sandbox.ArchiveDir(a.cfg.archivesDir(), key)
	if err := archiveWorkspace(ctx, b.sb, dir); err != nil {
		return fmt.Errorf("keeping the workspace of %s: %w", key, err)
	}
	rec := b.rec
	rec.State, rec.Archive, rec.Message = sandbox.Evicted, dir, "evicted under "+reason
	// The record first: a crash now leaves an evicted record and a sandbox
	// the next reconciliation removes, never a lost workspace.
	if err := a.store.Put(rec); err != nil {
		return err
	}
	if err := a.driverFor(b.rec.Ref).Destroy(ctx, b.rec.Ref); err != nil {
		return fmt.Errorf("removing evicted sandbox %s: %w", key, err)
	}
	ok = true
	now := a.cfg.Now()
	a.mu.Lock()
	a.boxes[key] = &box{rec: rec}
	a.evictions = append(a.evictions, &pb.Eviction{Key: key, Reason: reason, EvictedAt: timestamppb.New(now)})
	a.mu.Unlock()
	a.log.Warn("evicted idle sandbox", "session_id", key, "reason", reason, "workspace_kept_in", dir)
	return nil
}

// evictedArchive returns where the workspace of key's evicted sandbox is
// kept, if it is.
func (a *Agent) evictedArchive(key string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.boxes[key]
	if b == nil || b.rec.State != sandbox.Evicted || b.rec.Archive == "" {
		return "", false
	}
	return b.rec.Archive, true
}

// archiveWorkspace copies every regular file of the sandbox's workspace to
// dir (built beside it and renamed into place).
func archiveWorkspace(ctx context.Context, sb driver.Sandbox, dir string) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	var walk func(rel string) error
	walk = func(rel string) error {
		files, err := sb.ListFiles(ctx, rel)
		if err != nil {
			return err
		}
		for _, f := range files {
			p := f.Path
			switch {
			case f.Mode.IsDir():
				if err := os.MkdirAll(filepath.Join(tmp, filepath.FromSlash(p)), 0o700); err != nil {
					return err
				}
				if err := walk(p); err != nil {
					return err
				}
			case f.Mode.IsRegular():
				dst := filepath.Join(tmp, filepath.FromSlash(p))
				if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
					return err
				}
				if err := copyOut(ctx, sb, p, dst, f.Mode.Perm()|0o600); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// copyOut copies the workspace file p to dst on the host, streamed.
func copyOut(ctx context.Context, sb driver.Sandbox, p, dst string, mode fs.FileMode) error {
	r, _, err := sb.OpenFile(ctx, p)
	if errdefs.IsNotFound(err) {
		return nil // removed since the listing
	}
	if err != nil {
		return err
	}
	defer r.Close()
	w, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return fmt.Errorf("copying %s: %w", p, err)
	}
	return w.Close()
}

// restoreWorkspace writes the files kept in dir back into the sandbox.
func restoreWorkspace(ctx context.Context, sb driver.Sandbox, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = copyIn(ctx, sb, path.Clean(filepath.ToSlash(rel)), fi.Mode().Perm(), f)
		return err
	})
}

// status describes the sandbox for key, or nil.
func (a *Agent) status(key string) *pb.SandboxStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.boxes[key]
	if b == nil {
		return nil
	}
	return a.statusLocked(b)
}

// statusLocked needs a.mu held.
func (a *Agent) statusLocked(b *box) *pb.SandboxStatus {
	st := pb.SandboxState_SANDBOX_STATE_READY
	switch b.rec.State {
	case sandbox.Evicted:
		st = pb.SandboxState_SANDBOX_STATE_EVICTED
	case sandbox.Failed:
		st = pb.SandboxState_SANDBOX_STATE_FAILED
	}
	return &pb.SandboxStatus{
		Key: b.rec.Key, State: st, Provider: b.rec.Ref.Provider, Image: b.rec.Spec.Image,
		Limits: limitsPB(a.withDefaults(b.rec.Spec.Limits)), LastUsedAt: timestamppb.New(b.rec.LastUsed), Message: b.rec.Message,
		Paused: b.rec.Paused,
	}
}

// statuses describes every sandbox, by key.
func (a *Agent) statuses() []*pb.SandboxStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := make([]string, 0, len(a.boxes))
	for k := range a.boxes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]*pb.SandboxStatus, 0, len(keys))
	for _, k := range keys {
		out = append(out, a.statusLocked(a.boxes[k]))
	}
	return out
}
