package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/envbuild"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Environment package builds (envbuild): the leader runs them one after
// another on a gVisor host the tenant may use (its pools, as its
// sandboxes'), streams their logs into the build's record, exports the
// image into the blob store, and a session's first placement runs the
// image its environment's packages were built into, waiting for the
// build while it runs. A host other than the build's imports the image
// from the blob store before the session's sandbox is made there.

// Builds is what the fleet needs of the build records (store.Builds).
type Builds interface {
	// Next claims a build to run, in any tenant: a pending one, or one
	// whose builder last reported before staleBefore (a leader that
	// died). ok is false when there is none.
	Next(ctx context.Context, staleBefore time.Time) (job BuildJob, ok bool, err error)
	// Progress records a running build's log so far and its host (ctx
	// carries its tenant).
	Progress(ctx context.Context, key, hostID, log string) error
	// Finish records a build's end (ctx carries its tenant).
	Finish(ctx context.Context, key string, r BuildResult) error
	// OfSession returns the build whose image the session's sandbox runs
	// (ctx carries its tenant); a zero Key when it runs its class's.
	OfSession(ctx context.Context, sessionID string) (BuildState, error)
	// Stale returns, across tenants, finished builds last asked for
	// before before that no session pins (at most a page of them).
	Stale(ctx context.Context, before time.Time) ([]StaleBuild, error)
	// Remove deletes the build of key (ctx carries its tenant) if it is
	// still unused since before; false when it was kept.
	Remove(ctx context.Context, key string, before time.Time) (bool, error)
}

// StaleBuild is a build the sweep may remove: its image, on the hosts,
// and its archive in the blob store ("" none).
type StaleBuild struct {
	Tenant              tenant.ID
	Key, Image, BlobKey string
}

// BuildJob is a claimed build.
type BuildJob struct {
	Tenant    tenant.ID
	Key       string
	Image     string
	BaseImage string
	Packages  envbuild.Packages
	Mirrors   envbuild.Mirrors
}

// BuildResult is a build's end: Failed with Error (for the tenant), or
// ready on HostID with the image's Digest, LayerBytes and the BlobKey of
// its archive ("" when the export failed: only HostID has it); or Retry:
// it could not run now (no host, its host busy or unreachable), and is
// pending again.
type BuildResult struct {
	Retry      bool
	Failed     bool
	Error      string
	Log        string
	HostID     string
	Digest     string
	LayerBytes int64
	BlobKey    string
}

// BuildState is a build as a session waits for it.
type BuildState struct {
	Key     string
	Status  string // pending, building, ready, failed
	Image   string
	Error   string
	HostID  string
	BlobKey string
}

// Build statuses, as store.Builds keeps them.
const (
	BuildReady  = "ready"
	BuildFailed = "failed"
)

// Defaults of the builder.
const (
	// defaultBuildTimeout bounds one build on its host.
	defaultBuildTimeout = 30 * time.Minute
	// buildStale is how long a running build's record may go without
	// progress before another leader takes it over (the builder writes
	// progress every buildProgressEvery, and at least once a minute).
	buildStale = 3 * time.Minute
	// buildProgressEvery is how often a running build's log is written.
	buildProgressEvery = 2 * time.Second
	// buildPollEvery is how often the builder looks for builds when none
	// was asked for on this node (BuildRequested wakes it at once), and
	// how often a session on a node that does not run the build looks at
	// its record.
	buildPollEvery = 2 * time.Second
	// maxBuildLog is the log tail the builder keeps and records.
	maxBuildLog = 64 << 10
	// maxImageArchive bounds an exported image's archive.
	maxImageArchive = 8 << 30
)

// maxConcurrentBuilds bounds the builds a leader runs at once.
const maxConcurrentBuilds = 4

// builds is the fleet's builder state.
type builds struct {
	// kick wakes the builder: a build was asked for on this node.
	kick chan struct{}

	// mu guards the fields below.
	mu *sync.Mutex
	// done is closed, and replaced, whenever a build this node ran ends:
	// the sessions waiting on this node wake at once.
	done chan struct{}
	// hosts are the hosts running one of this node's builds.
	hosts map[string]bool
}

func newBuilds() builds {
	return builds{kick: make(chan struct{}, 1), mu: new(sync.Mutex), done: make(chan struct{}), hosts: map[string]bool{}}
}

// slots is how many more builds this node may start now.
func (b *builds) slots() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maxConcurrentBuilds - len(b.hosts)
}

func (b *builds) busy(hostID string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hosts[hostID]
}

func (b *builds) take(hostID string) {
	b.mu.Lock()
	b.hosts[hostID] = true
	b.mu.Unlock()
}

func (b *builds) give(hostID string) {
	b.mu.Lock()
	delete(b.hosts, hostID)
	b.mu.Unlock()
}

// BuildRequested wakes the builder of this node (a no-op unless it
// leads): a build was asked for.
func (f *Fleet) BuildRequested() {
	select {
	case f.builds.kick <- struct{}{}:
	default:
	}
}

func (f *Fleet) buildEnded() {
	f.builds.mu.Lock()
	close(f.builds.done)
	f.builds.done = make(chan struct{})
	f.builds.mu.Unlock()
}

func (f *Fleet) buildDone() <-chan struct{} {
	f.builds.mu.Lock()
	defer f.builds.mu.Unlock()
	return f.builds.done
}

// RunBuilds runs, while this node leads, the builds asked for, until ctx
// ends: up to maxConcurrentBuilds at once, each on a host that runs no
// other of this node's builds (a host runs one build at a time). It
// sweeps the builds no session has used for Config.BuildRetention too
// (SweepBuilds). Without Config.Builds it returns at once.
func (f *Fleet) RunBuilds(ctx context.Context) {
	if f.cfg.Builds == nil {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// A poll as well as the kick: a build asked for on another node
	// wakes no one here.
	t := time.NewTicker(buildPollEvery)
	defer t.Stop()
	sweep := time.NewTicker(min(max(f.cfg.BuildRetention/4, time.Second), time.Hour))
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sweep.C:
			if f.node.IsLeader() {
				if err := f.SweepBuilds(ctx, f.cfg.Now().Add(-f.cfg.BuildRetention)); err != nil && ctx.Err() == nil {
					f.log.Warn("sweeping unused environment builds", "err", err)
				}
			}
			continue
		case <-t.C:
		case <-f.builds.kick:
		}
		for f.node.IsLeader() && ctx.Err() == nil && f.builds.slots() > 0 {
			job, ok, err := f.cfg.Builds.Next(ctx, f.cfg.Now().Add(-buildStale))
			if err != nil {
				if ctx.Err() == nil {
					f.log.Warn("looking for environment builds", "err", err)
				}
				break
			}
			if !ok {
				break
			}
			hostID, addr, err := f.buildHost(job)
			if err != nil {
				// No free host: pending again, for the next tick.
				f.finishBuild(ctx, job, BuildResult{Retry: true, Error: err.Error()}, f.cfg.Now())
				break
			}
			f.builds.take(hostID)
			wg.Go(func() {
				defer f.BuildRequested() // a slot and a host are free: look again
				defer f.builds.give(hostID)
				f.runBuild(ctx, job, hostID, addr)
			})
		}
	}
}

// runBuild runs one claimed build on a host and records its end.
func (f *Fleet) runBuild(ctx context.Context, job BuildJob, hostID, addr string) {
	start := f.cfg.Now()
	f.finishBuild(ctx, job, f.build(tenant.With(ctx, job.Tenant), job, hostID, addr), start)
}

// finishBuild records a build's end and wakes the sessions waiting here.
func (f *Fleet) finishBuild(ctx context.Context, job BuildJob, res BuildResult, start time.Time) {
	tctx := tenant.With(context.WithoutCancel(ctx), job.Tenant)
	log := f.log.With("tenant", job.Tenant, "build", job.Key)
	if err := f.cfg.Builds.Finish(tctx, job.Key, res); err != nil {
		log.Warn("recording an environment build's end", "err", err)
	}
	f.buildEnded()
	switch {
	case res.Retry:
		log.Info("environment build put back (it could not run now)", "host_id", res.HostID, "why", res.Error)
	case res.Failed:
		log.Info("environment build failed", "host_id", res.HostID, "err", res.Error, "took", f.cfg.Now().Sub(start))
	default:
		log.Info("environment build ready", "host_id", res.HostID, "image", job.Image, "layer_bytes", res.LayerBytes, "exported", res.BlobKey != "", "took", f.cfg.Now().Sub(start))
	}
}

// build runs job on a host and exports its image.
func (f *Fleet) build(ctx context.Context, job BuildJob, hostID, addr string) BuildResult {
	c, err := f.client(hostID, addr)
	if err != nil {
		f.log.Warn("connecting to a build host", "host_id", hostID, "err", err)
		return BuildResult{Retry: true, Error: "the build host could not be reached", HostID: hostID}
	}
	steps := envbuild.Plan(job.Packages, job.Mirrors)
	req := &pb.BuildImageRequest{Ref: job.Image, BaseImage: job.BaseImage, Steps: steps, AllowedHosts: job.Mirrors.Hosts(),
		Limits: limitsPB(f.cfg.BuildRequest.Limits, f.cfg.BuildRequest.Pids), Timeout: durationpb.New(defaultBuildTimeout),
		Tenant: string(job.Tenant), AuditId: "build_" + job.Key[:min(len(job.Key), 24)]}
	bctx, cancel := context.WithTimeout(ctx, defaultBuildTimeout+time.Minute)
	defer cancel()
	stream, err := c.BuildImage(bctx, req)
	if err != nil {
		return f.buildFailed(hostID, "", err)
	}
	var (
		logTail  tail
		result   *pb.BuildImageResult
		lastSave = f.cfg.Now()
	)
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return f.buildFailed(hostID, logTail.String(), err)
		}
		switch m := msg.Msg.(type) {
		case *pb.BuildImageResponse_Log:
			logTail.Add(m.Log)
		case *pb.BuildImageResponse_Result:
			result = m.Result
		}
		if now := f.cfg.Now(); now.Sub(lastSave) >= buildProgressEvery {
			lastSave = now
			if err := f.cfg.Builds.Progress(ctx, job.Key, hostID, logTail.String()); err != nil {
				f.log.Warn("recording an environment build's progress", "build", job.Key, "err", err)
			}
		}
	}
	if result == nil {
		return BuildResult{Failed: true, Error: "the build host ended the build without a result", Log: logTail.String(), HostID: hostID}
	}
	out := BuildResult{Log: logTail.String(), HostID: hostID, Digest: result.Digest, LayerBytes: result.LayerBytes}
	if f.cfg.Blobs != nil {
		key := buildBlobKey(job)
		if err := f.exportImage(ctx, c, job.Image, key); err != nil {
			// The image is on its build host; sessions placed elsewhere
			// cannot get it, which their tool call says.
			f.log.Warn("exporting an environment build's image", "build", job.Key, "host_id", hostID, "err", err)
		} else {
			out.BlobKey = key
		}
	}
	return out
}

// buildBlobKey is where a build's image archive is kept.
func buildBlobKey(job BuildJob) string {
	return "builds/" + string(job.Tenant) + "/" + job.Key + ".tar"
}

// buildFailed is the result of a build the host refused or that broke
// off: a failed step or the timeout is the tenant's to read (its message
// is the step's output); anything else is logged and told in general.
func (f *Fleet) buildFailed(hostID, log string, err error) BuildResult {
	err = errgrpc.FromStatus(err)
	switch errdefs.KindOf(err) {
	case errdefs.FailedPreconditionKind, errdefs.DeadlineExceededKind, errdefs.InvalidArgumentKind:
		return BuildResult{Failed: true, Error: err.Error(), Log: log, HostID: hostID}
	}
	switch errdefs.KindOf(err) {
	case errdefs.ResourceExhaustedKind, errdefs.UnavailableKind, errdefs.CanceledKind:
		// The host runs another build, is gone, or this node stopped
		// leading: the build runs again at the builder's next look.
		return BuildResult{Retry: true, Error: err.Error(), Log: log, HostID: hostID}
	}
	f.log.Warn("an environment build broke off", "host_id", hostID, "err", err)
	return BuildResult{Failed: true, Error: "the build could not finish on its host (" + errdefs.KindOf(err).String() + "); it is tried again when a session asks for it 5 minutes from now", Log: log, HostID: hostID}
}

// buildHost chooses the build's host with the scheduler, as for a sandbox
// of the tenant's (its pools, a healthy gVisor host that offers limited
// networking when the build reaches mirrors) among the hosts running no
// build of this node's, without placing anything.
func (f *Fleet) buildHost(job BuildJob) (hostID, addr string, err error) {
	req := f.cfg.BuildRequest
	req.SessionID, req.Tenant = "build/"+job.Key, string(job.Tenant)
	req.AllowedHosts = job.Mirrors.Hosts()
	req = f.withPlacement(req)
	free := func(h *scheduler.Host) bool { return !f.builds.busy(h.ID) }
	f.node.Read(func(v raftfsm.View) {
		var plan scheduler.Plan
		if plan, err = scheduler.PlaceMove(v, req, f.cfg.Scheduler, free); err != nil {
			return
		}
		hostID = plan.HostID
		if h, ok := v.Host(hostID); ok {
			addr = h.Address
		}
	})
	if err != nil {
		f.log.Info("no host for an environment build", "tenant", job.Tenant, "build", job.Key, "err", err)
		return "", "", errdefs.Unavailable("no gVisor host this tenant may use can run the build now")
	}
	return hostID, addr, nil
}

// exportImage streams image from its build host into the blob store.
func (f *Fleet) exportImage(ctx context.Context, c pb.SandboxServiceClient, image, key string) error {
	stream, err := c.ExportImage(ctx, &pb.ExportImageRequest{Image: image, MaxBytes: maxImageArchive})
	if err != nil {
		return errgrpc.FromStatus(err)
	}
	pr, pw := io.Pipe()
	go func() {
		var n int64
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				pw.Close()
				return
			}
			if err != nil {
				pw.CloseWithError(errgrpc.FromStatus(err))
				return
			}
			if n += int64(len(msg.Data)); n > maxImageArchive {
				pw.CloseWithError(errdefs.ResourceExhausted("the image archive passed %d bytes", int64(maxImageArchive)))
				return
			}
			if _, err := pw.Write(msg.Data); err != nil {
				return
			}
		}
	}()
	err = f.cfg.Blobs.Put(ctx, key, pr)
	pr.CloseWithError(err) // ends the reader above if Put stopped early
	return err
}

// sessionImage is the image a session's sandbox runs when its environment
// has packages: it waits while their build runs (woken when one ends on
// this node, and looking at the record every buildPollEvery), and says
// why when it failed. "" runs the class's image.
func (f *Fleet) sessionImage(ctx context.Context, sessionID string) (BuildState, error) {
	if f.cfg.Builds == nil {
		return BuildState{}, nil
	}
	for {
		done := f.buildDone()
		st, err := f.cfg.Builds.OfSession(ctx, sessionID)
		if err != nil {
			return st, fmt.Errorf("reading the build of session %s's packages: %w", sessionID, err)
		}
		switch st.Status {
		case "", BuildReady:
			return st, nil
		case BuildFailed:
			return st, errdefs.FailedPrecondition("this session's environment's packages failed to build: %s. Fix the environment's packages (a session created after a change builds them again, and one created later retries a failed build); the build's log: corral builds ls --environment ID --log", summary(st.Error))
		}
		t := time.NewTimer(buildPollEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return st, errdefs.Wrap(errdefs.DeadlineExceededKind, ctx.Err(), "this session's environment's packages are still being built (build %s is %s); try again shortly", st.Key[:min(len(st.Key), 12)], st.Status)
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
}

// ensureImage brings a build's image to the host a session's sandbox was
// placed on, from the blob store, unless it is the build's own host.
func (f *Fleet) ensureImage(ctx context.Context, st BuildState, hostID string) error {
	if st.Key == "" || hostID == st.HostID {
		return nil
	}
	if st.BlobKey == "" || f.cfg.Blobs == nil {
		return errdefs.FailedPrecondition("this session's environment's packages were built on host %s and their image could not be kept in the blob store; its sandbox can run only there", st.HostID)
	}
	c, err := f.hostClient(hostID)
	if err != nil {
		return err
	}
	return importImage(ctx, c, f.cfg.Blobs.Get, st.Image, st.BlobKey)
}

// SweepBuilds removes the finished builds no session pins that nobody
// asked for since before (RunBuilds: Config.BuildRetention ago): the row
// first (so a session that asks from then on builds anew), then the
// archive in the blob store and the image on every host that is up. A
// host that is down keeps its copy (logged).
func (f *Fleet) SweepBuilds(ctx context.Context, before time.Time) error {
	stale, err := f.cfg.Builds.Stale(ctx, before)
	if err != nil {
		return err
	}
	var hosts []string
	f.node.Read(func(v raftfsm.View) {
		for _, h := range v.Hosts() {
			if h.Address != "" && h.Status != scheduler.StatusDown {
				hosts = append(hosts, h.ID)
			}
		}
	})
	for _, b := range stale {
		log := f.log.With("tenant", b.Tenant, "build", b.Key)
		removed, err := f.cfg.Builds.Remove(tenant.With(ctx, b.Tenant), b.Key, before)
		if err != nil {
			return err
		}
		if !removed {
			continue // asked for, or pinned, meanwhile
		}
		if b.BlobKey != "" && f.cfg.Blobs != nil {
			if err := f.cfg.Blobs.Delete(ctx, b.BlobKey); err != nil {
				log.Warn("removing an unused build's image archive", "blob", b.BlobKey, "err", err)
			}
		}
		for _, id := range hosts {
			c, err := f.hostClient(id)
			if err == nil {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err = c.RemoveImage(rctx, &pb.RemoveImageRequest{Image: b.Image})
				cancel()
			}
			if err != nil {
				log.Warn("removing an unused build's image from a host", "host_id", id, "image", b.Image, "err", errgrpc.FromStatus(err))
			}
		}
		log.Info("unused environment build removed", "image", b.Image)
	}
	return nil
}

// bringImage brings a moved placement's image to its new host when it is
// the image of its session's packages: a drain's move, or rescheduling
// after host loss, waits for a sandbox that host can make only with it.
func (f *Fleet) bringImage(ctx context.Context, pl scheduler.Placement) error {
	if f.cfg.Builds == nil || !strings.HasPrefix(pl.Image, envbuild.ImagePrefix) {
		return nil
	}
	st, err := f.cfg.Builds.OfSession(tenant.With(ctx, tenant.ID(pl.Tenant)), pl.SessionID)
	if err != nil {
		return err
	}
	return f.ensureImage(ctx, st, pl.HostID)
}

// importImage streams the archive under key to a host's ImportImage. The
// host answers at the first message when it has the image already.
func importImage(ctx context.Context, c pb.SandboxServiceClient, get func(context.Context, string) (io.ReadCloser, error), image, key string) error {
	r, err := get(ctx, key)
	if err != nil {
		return fmt.Errorf("reading image archive %s: %w", key, err)
	}
	defer r.Close()
	size, err := sizeOf(r)
	if err != nil {
		return err
	}
	stream, err := c.ImportImage(ctx)
	if err != nil {
		return errgrpc.FromStatus(err)
	}
	sendErr := stream.Send(&pb.ImportImageRequest{Image: image, Size: size})
	buf := make([]byte, 1<<20)
	for sendErr == nil {
		n, rerr := r.Read(buf)
		if n > 0 {
			sendErr = stream.Send(&pb.ImportImageRequest{Data: buf[:n]})
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("reading image archive %s: %w", key, rerr)
		}
	}
	// A Send that failed with io.EOF means the host answered early (it
	// has the image, or refused): its answer says which.
	if sendErr != nil && !errors.Is(sendErr, io.EOF) {
		return errgrpc.FromStatus(sendErr)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return errgrpc.FromStatus(err)
	}
	return nil
}

// sizeOf is the size of a blob's reader, which ImportImage's first
// message carries: blob.Dir's files and S3's bodies both tell it.
func sizeOf(r io.Reader) (int64, error) {
	type stater interface{ Size() int64 }
	if s, ok := r.(stater); ok {
		return s.Size(), nil
	}
	if s, ok := r.(io.Seeker); ok {
		cur, err := s.Seek(0, io.SeekCurrent)
		if err != nil {
			return 0, err
		}
		end, err := s.Seek(0, io.SeekEnd)
		if err != nil {
			return 0, err
		}
		_, err = s.Seek(cur, io.SeekStart)
		return end - cur, err
	}
	return 0, errors.New("the blob store's reader tells no size")
}

// summary is a build error in one line: its first line (which step, its
// exit) and, when it has more, its last (what the step said last: apt's
// "E: Unable to locate package ..."). Session errors are read one line.
func summary(msg string) string {
	lines := strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' || r == '\r' })
	switch len(lines) {
	case 0:
		return "no reason was recorded"
	case 1:
		return lines[0]
	}
	first := lines[0]
	if i := strings.Index(first, "): "); i >= 0 { // "step apt failed (exit 100): <output>"
		first = first[:i+1]
	}
	return strings.TrimSpace(first) + " ... " + strings.TrimSpace(lines[len(lines)-1])
}

// tail keeps the last maxBuildLog bytes of a build's log lines.
type tail struct{ b []byte }

func (t *tail) Add(line string) {
	t.b = append(t.b, line...)
	t.b = append(t.b, '\n')
	if len(t.b) > 2*maxBuildLog {
		t.b = append(t.b[:0], t.b[len(t.b)-maxBuildLog:]...)
	}
}

func (t *tail) String() string {
	s := string(t.b)
	if len(s) > maxBuildLog {
		s = s[len(s)-maxBuildLog:]
	}
	return strings.ToValidUTF8(s, "")
}

// limitsPB is a scheduler limit in the host protocol's terms.
func limitsPB(l scheduler.Resources, pids int64) *pb.Limits {
	return &pb.Limits{CpuMillis: l.CPUMillis, MemoryBytes: l.MemoryMiB << 20, DiskBytes: l.DiskMiB << 20, Pids: pids}
}
