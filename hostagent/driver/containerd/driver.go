package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cerrdefs "github.com/containerd/errdefs"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// Labels on every container the driver makes.
const (
	labelProvider = "corral.provider"
	labelKey      = "corral.key"
	labelDir      = "corral.state-dir"
	labelState    = "corral.state" // stateCreating until the task runs, then stateReady
	labelUser     = "corral.label/"

	stateCreating = "creating"
	stateReady    = "ready"
)

// Driver runs sandboxes as containerd containers.
type Driver struct {
	cfg    Config
	client *client.Client
	name   string
	// runscWrapper runs runsc on Config.GVisorPlatform ("": runsc itself;
	// platform.go).
	runscWrapper string
	// spawnSource is the host file new gVisor sandboxes mount as the
	// compiled spawner: Config.SpawnBinary's copy, named by its content
	// (installSpawner), or "".
	spawnSource string
	// buildMu guards buildWrapper, the runsc wrapper of build sandboxes,
	// written by the first build (build.go).
	buildMu      sync.Mutex
	buildWrapper string

	// keys holds a lock per sandbox key that Create and Claim hold, so one
	// key gets one sandbox, while sandboxes of other keys (a warm pool's
	// refill, a claim) are made beside it.
	keys keyedLocks
	// runs holds a lock per sandbox (container id) that starting,
	// restoring, pausing and exporting its task hold, so two callers never
	// restore one sandbox twice, and no resume removes a checkpoint image
	// while it is read. One sandbox's checkpoint or transfer, which may
	// take seconds, holds up no other sandbox.
	runs keyedLocks

	// servers are the sandboxes' command servers (serve.go).
	servers servers
}

// keyedLocks is a mutex per string, made on first use and dropped when
// nobody holds or waits for it.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int // holders and waiters; the entry goes at zero
}

// lock takes key's lock and returns its release.
func (k *keyedLocks) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// lockKey takes the lock of a sandbox key and returns its release.
func (d *Driver) lockKey(key string) (unlock func()) { return d.keys.lock(key) }

// lockRun takes the lock of a sandbox's task and returns its release.
func (d *Driver) lockRun(id string) (unlock func()) { return d.runs.lock(id) }

var _ driver.Driver = (*Driver)(nil)

// New validates cfg, connects to containerd and checks that it answers.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if p := socketPath(cfg.Address); p != "" {
		if _, err := os.Stat(p); err != nil {
			return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "containerd is not reachable: socket %s is missing (is it running? scripts/runtime/containerd.sh start)", p)
		}
	}
	c, err := client.New(cfg.Address, client.WithDefaultNamespace(cfg.Namespace), client.WithTimeout(5*time.Second))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "containerd is not reachable at %s", cfg.Address)
	}
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Version(vctx); err != nil {
		c.Close()
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "containerd is not reachable at %s", cfg.Address)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		c.Close()
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	wrapper, err := writeRunscWrapper(cfg)
	if err != nil {
		c.Close()
		return nil, err
	}
	spawnSource, err := installSpawner(cfg)
	if err != nil {
		c.Close()
		return nil, err
	}
	d := &Driver{cfg: cfg, client: c, name: providerName(cfg.Runtime), runscWrapper: wrapper, spawnSource: spawnSource}
	// Copies of older spawner builds no sandbox mounts: a few MB each, one
	// per upgrade. Left for the next start if this fails.
	if removed, err := d.pruneSpawners(vctx); err != nil {
		cfg.Logger.Warn("removing unused spawner builds", "err", err)
	} else if len(removed) > 0 {
		cfg.Logger.Info("removed spawner builds no sandbox uses", "builds", removed)
	}
	return d, nil
}

// Close closes the connection to containerd. Sandboxes keep running.
func (d *Driver) Close() error { return d.client.Close() }

// Client is the containerd client, for the host agent's health checks.
func (d *Driver) Client() *client.Client { return d.client }

// Name is "containerd-gvisor" or "containerd-runc".
func (d *Driver) Name() string { return d.name }

// Namespace is the containerd namespace of the driver's containers.
func (d *Driver) Namespace() string { return d.cfg.Namespace }

func (d *Driver) ns(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, d.cfg.Namespace)
}

// kindOf translates a containerd error into corral's vocabulary.
func kindOf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	if errdefs.KindOf(err) != errdefs.Unknown {
		return fmt.Errorf(format+": %w", append(args, err)...)
	}
	k := errdefs.Unknown
	switch {
	case cerrdefs.IsNotFound(err):
		k = errdefs.NotFoundKind
	case cerrdefs.IsAlreadyExists(err):
		k = errdefs.AlreadyExistsKind
	case cerrdefs.IsInvalidArgument(err):
		k = errdefs.InvalidArgumentKind
	case cerrdefs.IsFailedPrecondition(err):
		k = errdefs.FailedPreconditionKind
	case cerrdefs.IsUnavailable(err):
		k = errdefs.UnavailableKind
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf(format+": %w", append(args, err)...)
	}
	return errdefs.Wrap(k, err, format, args...)
}

func (d *Driver) runtime() (string, any) {
	if d.cfg.Runtime == RuntimeGVisor && d.cfg.GVisorShim == ShimRunsc {
		return "io.containerd.runsc.v1", nil
	}
	if d.cfg.Runtime == RuntimeGVisor {
		return "io.containerd.runc.v2", &options.Options{BinaryName: d.runscBinary()}
	}
	return "io.containerd.runc.v2", nil
}

func (d *Driver) filter(extra ...string) string {
	f := []string{
		fmt.Sprintf(`labels.%q==%q`, labelProvider, d.name),
		fmt.Sprintf(`labels.%q==%q`, labelDir, d.cfg.StateDir),
	}
	return strings.Join(append(f, extra...), ",")
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "corral-" + hex.EncodeToString(b[:])
}

// Create makes or returns the sandbox for spec.Key. On failure nothing of the
// new sandbox is left behind.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (driver.Ref, error) {
	if spec.Key == "" {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox key is required")
	}
	if spec.Image == "" {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox %q: an image is required", spec.Key)
	}
	if l := spec.Limits; l.CPUMillis < 0 || l.MemoryBytes < 0 || l.Pids < 0 || l.DiskBytes < 0 {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox %q: negative limits %+v", spec.Key, l)
	}
	if p := spec.NetworkNamespace; p != "" {
		if st, err := os.Stat(p); !filepath.IsAbs(p) || err != nil || st.IsDir() {
			return driver.Ref{}, errdefs.InvalidArgument("sandbox %q: network namespace %q is not a namespace file", spec.Key, p)
		}
	}
	ctx = d.ns(ctx)
	defer d.lockKey(spec.Key)()
	existing, err := d.client.Containers(ctx, d.filter(fmt.Sprintf(`labels.%q==%q`, labelKey, spec.Key)))
	if err != nil {
		return driver.Ref{}, kindOf(err, "looking up sandbox %q", spec.Key)
	}
	for _, c := range existing {
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil {
			continue
		}
		if info.Labels[labelState] == stateReady {
			return d.ref(c.ID(), info.Labels), nil
		}
		// Half-made by a create that crashed: remove it and start over.
		if err := d.remove(ctx, c.ID()); err != nil {
			return driver.Ref{}, fmt.Errorf("removing half-made sandbox %s: %w", c.ID(), err)
		}
	}
	id := newID()
	labels, err := d.create(ctx, id, spec)
	if err != nil {
		if rerr := d.remove(context.WithoutCancel(ctx), id); rerr != nil {
			d.cfg.Logger.Error("removing a sandbox that failed to start", "sandbox", id, "err", rerr)
		}
		return driver.Ref{}, err
	}
	if _, pooled := spec.Labels[driver.PoolLabel]; pooled && d.mountsSpawner() {
		// A warm pool's sandbox is ready when its command server is:
		// its claim's first command is served (serve.go).
		d.serveNow(id)
	}
	return d.ref(id, labels), nil
}

// ref is the Ref of container id with these containerd labels.
func (d *Driver) ref(id string, labels map[string]string) driver.Ref {
	ref := driver.Ref{Provider: d.name, Key: labels[labelKey], ID: id}
	for k, v := range labels {
		if name, ok := strings.CutPrefix(k, labelUser); ok {
			if ref.Labels == nil {
				ref.Labels = map[string]string{}
			}
			ref.Labels[name] = v
		}
	}
	return ref
}

func (d *Driver) create(ctx context.Context, id string, spec driver.Spec) (map[string]string, error) {
	ctx, done, err := d.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(10*time.Minute))
	if err != nil {
		return nil, kindOf(err, "creating sandbox %q: lease", spec.Key)
	}
	defer done(context.WithoutCancel(ctx))
	img, err := d.client.GetImage(ctx, spec.Image)
	if cerrdefs.IsNotFound(err) && d.cfg.Pull {
		img, err = d.pull(ctx, spec.Image)
		if err != nil {
			return nil, err
		}
	} else if cerrdefs.IsNotFound(err) {
		return nil, errdefs.NotFound("image %q is not present on this host: import it first, or let the host pull from a registry (--pull-images)", spec.Image)
	}
	if err != nil {
		return nil, kindOf(err, "creating sandbox %q: image %q", spec.Key, spec.Image)
	}
	unpacked, err := img.IsUnpacked(ctx, d.cfg.Snapshotter)
	if err != nil {
		return nil, kindOf(err, "creating sandbox %q: image %q", spec.Key, spec.Image)
	}
	if !unpacked {
		if err := img.Unpack(ctx, d.cfg.Snapshotter); err != nil {
			return nil, kindOf(err, "creating sandbox %q: unpacking image %q", spec.Key, spec.Image)
		}
	}
	dirs := dirsFor(d.cfg.StateDir, id)
	for _, dir := range []string{dirs.root, dirs.workspace, dirs.uploads, dirs.outputs, dirs.memory} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating sandbox %q: %w", spec.Key, err)
		}
	}
	for _, dir := range []string{dirs.workspace, dirs.outputs} {
		if err := os.Chown(dir, SandboxUID, SandboxGID); err != nil {
			return nil, fmt.Errorf("creating sandbox %q: %w", spec.Key, err)
		}
	}
	if err := mountWorkspace(ctx, dirs, withDefaults(spec.Limits, d.cfg.Limits).DiskBytes); err != nil {
		return nil, fmt.Errorf("creating sandbox %q: %w", spec.Key, err)
	}
	labels := map[string]string{labelProvider: d.name, labelKey: spec.Key, labelDir: d.cfg.StateDir, labelState: stateCreating}
	for k, v := range spec.Labels {
		labels[labelUser+k] = v
	}
	rtName, rtOpts := d.runtime()
	c, err := d.client.NewContainer(ctx, id,
		client.WithContainerLabels(labels),
		client.WithSnapshotter(d.cfg.Snapshotter),
		client.WithNewSnapshot(id, img),
		client.WithRuntime(rtName, rtOpts),
		client.WithNewSpec(d.specOpts(img, spec, dirs)...),
	)
	if err != nil {
		return nil, kindOf(err, "creating sandbox %q: container", spec.Key)
	}
	if err := d.startTask(ctx, c); err != nil {
		return nil, fmt.Errorf("creating sandbox %q: %w", spec.Key, err)
	}
	labels, err = c.SetLabels(ctx, map[string]string{labelState: stateReady})
	if err != nil {
		return nil, kindOf(err, "creating sandbox %q: marking ready", spec.Key)
	}
	return labels, nil
}

// startTask starts the container's init process, discarding its output.
func (d *Driver) startTask(ctx context.Context, c client.Container) error {
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		return kindOf(err, "starting %s (%s)", c.ID(), d.name)
	}
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), client.WithProcessKill)
		return kindOf(err, "starting %s (%s)", c.ID(), d.name)
	}
	return nil
}

func checkProvider(name string, ref driver.Ref) error {
	if ref.Provider != name {
		return errdefs.InvalidArgument("sandbox %s belongs to provider %q, not %q", ref.ID, ref.Provider, name)
	}
	return nil
}

// load returns the ready container with id and its metadata (as fetched
// by the one lookup), or an error of kind not found.
func (d *Driver) load(ctx context.Context, id string) (client.Container, containers.Container, error) {
	c, err := d.client.LoadContainer(ctx, id)
	if cerrdefs.IsNotFound(err) {
		return nil, containers.Container{}, errdefs.NotFound("sandbox %s does not exist (destroyed or never created)", id)
	}
	if err != nil {
		return nil, containers.Container{}, kindOf(err, "loading sandbox %s", id)
	}
	info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return nil, containers.Container{}, kindOf(err, "loading sandbox %s", id)
	}
	if info.Labels[labelProvider] != d.name || info.Labels[labelDir] != d.cfg.StateDir {
		return nil, containers.Container{}, errdefs.NotFound("sandbox %s is not managed by this driver (%s, %s)", id, d.name, d.cfg.StateDir)
	}
	if info.Labels[labelState] != stateReady {
		return nil, containers.Container{}, errdefs.NotFound("sandbox %s was never completely created", id)
	}
	return c, info, nil
}

// Attach returns the sandbox behind ref. A sandbox whose init process has
// stopped (a host reboot, an OOM kill of init) gets a new one; its workspace
// is on disk and intact.
func (d *Driver) Attach(ctx context.Context, ref driver.Ref) (driver.Sandbox, error) {
	if err := checkProvider(d.name, ref); err != nil {
		return nil, err
	}
	ctx = d.ns(ctx)
	c, _, err := d.load(ctx, ref.ID)
	if err != nil {
		return nil, err
	}
	// A paused sandbox stays paused: its first Exec resumes it.
	if paused, err := d.paused(ctx, c); err != nil {
		return nil, err
	} else if !paused {
		if err := d.ensureRunning(ctx, c); err != nil {
			return nil, err
		}
	}
	return &sandbox{d: d, ref: ref, dirs: dirsFor(d.cfg.StateDir, ref.ID)}, nil
}

// ensureRunning makes the container's task run: a paused sandbox is
// restored from its checkpoint, a stopped one gets a new init.
func (d *Driver) ensureRunning(ctx context.Context, c client.Container) error {
	defer d.lockRun(c.ID())()
	ckpt := checkpointDir(d.cfg.StateDir, c.ID())
	// The common case, a running task, in one call to containerd (the
	// client's Task and Status would make two).
	if resp, err := d.client.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: c.ID()}); err == nil &&
		resp.GetProcess().GetStatus() == tasktypes.Status_RUNNING && !pidGone(resp.GetProcess().GetPid()) {
		return dropUsedCheckpoint(c.ID(), ckpt)
	}
	task, err := c.Task(ctx, nil)
	if err == nil {
		st, err := task.Status(ctx)
		if err != nil {
			return kindOf(err, "sandbox %s: task status", c.ID())
		}
		if st.Status == client.Running && hostProcessGone(task) {
			// Killed on the host (the OOM killer): the shim says so in
			// a moment, and the task can be removed only then.
			if err := awaitExit(ctx, task, 10*time.Second); err != nil {
				return errdefs.Unavailable("sandbox %s: its process on the host ended and its shim has not seen it: %v", c.ID(), err)
			}
			st.Status = client.Stopped
		}
		if st.Status == client.Running {
			return dropUsedCheckpoint(c.ID(), ckpt)
		}
		if _, err := task.Delete(ctx); err != nil && !cerrdefs.IsNotFound(err) {
			return kindOf(err, "sandbox %s: removing its stopped task", c.ID())
		}
	} else if !cerrdefs.IsNotFound(err) {
		return kindOf(err, "sandbox %s: task", c.ID())
	}
	// After a host reboot a disk-limited workspace needs mounting again.
	if err := mountWorkspace(ctx, dirsFor(d.cfg.StateDir, c.ID()), 0); err != nil {
		return fmt.Errorf("sandbox %s: %w", c.ID(), err)
	}
	if _, err := os.Stat(ckpt); err == nil {
		return d.restore(ctx, c)
	}
	d.cfg.Logger.Info("restarting a sandbox's stopped init", "sandbox", c.ID())
	return d.startTask(ctx, c)
}

// dropUsedCheckpoint removes the checkpoint image of a running sandbox:
// one left by a resume that ended before removing it.
func dropUsedCheckpoint(id, ckpt string) error {
	if err := os.RemoveAll(ckpt); err != nil {
		return fmt.Errorf("sandbox %s: removing a used checkpoint: %w", id, err)
	}
	return nil
}

// awaitExit waits at most d for task to be reported as exited.
func awaitExit(ctx context.Context, task client.Task, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	exited, err := task.Wait(ctx)
	if err != nil {
		return err
	}
	select {
	case st := <-exited:
		// A wait cut short by ctx sends its error.
		return st.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Destroy removes the sandbox's task, container, snapshot and host
// directories. What is already gone is not an error.
func (d *Driver) Destroy(ctx context.Context, ref driver.Ref) error {
	if err := checkProvider(d.name, ref); err != nil {
		return err
	}
	if ref.ID == "" || ref.ID == "." || ref.ID == ".." || strings.ContainsAny(ref.ID, `/\`) {
		return errdefs.InvalidArgument("bad sandbox id %q", ref.ID)
	}
	ctx = d.ns(ctx)
	c, err := d.client.LoadContainer(ctx, ref.ID)
	if err == nil {
		labels, lerr := c.Labels(ctx)
		if lerr == nil && (labels[labelProvider] != d.name || labels[labelDir] != d.cfg.StateDir) {
			return errdefs.PermissionDenied("sandbox %s is not managed by this driver", ref.ID)
		}
	} else if !cerrdefs.IsNotFound(err) {
		return kindOf(err, "destroying sandbox %s", ref.ID)
	}
	d.servers.forget(ref.ID)
	return d.remove(ctx, ref.ID)
}

// remove deletes everything of sandbox id that exists.
func (d *Driver) remove(ctx context.Context, id string) error {
	return d.removeIn(ctx, d.cfg.StateDir, id)
}

// removeIn deletes everything of sandbox id, whose host directories are
// under stateDir, that exists.
func (d *Driver) removeIn(ctx context.Context, stateDir, id string) error {
	c, err := d.client.LoadContainer(ctx, id)
	switch {
	case cerrdefs.IsNotFound(err):
	case err != nil:
		return kindOf(err, "removing sandbox %s", id)
	default:
		if err := d.stopTask(ctx, c); err != nil {
			return err
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !cerrdefs.IsNotFound(err) {
			return kindOf(err, "removing sandbox %s: container", id)
		}
	}
	// A snapshot left by a create that failed before its container existed.
	if err := d.client.SnapshotService(d.cfg.Snapshotter).Remove(ctx, id); err != nil && !cerrdefs.IsNotFound(err) {
		return kindOf(err, "removing sandbox %s: snapshot", id)
	}
	if err := unmountWorkspace(dirsFor(stateDir, id)); err != nil {
		return fmt.Errorf("removing sandbox %s: %w", id, err)
	}
	if err := os.RemoveAll(dirsFor(stateDir, id).root); err != nil {
		return fmt.Errorf("removing sandbox %s: host directories: %w", id, err)
	}
	return nil
}

// stopTask kills and deletes the container's task, if it has one.
func (d *Driver) stopTask(ctx context.Context, c client.Container) error {
	task, err := c.Task(ctx, nil)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return kindOf(err, "removing sandbox %s: task", c.ID())
	}
	st, err := task.Status(ctx)
	if err != nil && !cerrdefs.IsNotFound(err) {
		return kindOf(err, "removing sandbox %s: task status", c.ID())
	}
	if err == nil && st.Status != client.Stopped && st.Status != client.Created {
		exited, err := task.Wait(ctx)
		if err != nil {
			return kindOf(err, "removing sandbox %s: waiting", c.ID())
		}
		if err := task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !cerrdefs.IsNotFound(err) {
			return kindOf(err, "removing sandbox %s: kill", c.ID())
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			return errdefs.Unavailable("removing sandbox %s: its task did not stop 30s after SIGKILL", c.ID())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Without force: runsc refuses to force-delete a stopped sandbox.
	if _, err := task.Delete(ctx); err != nil && !cerrdefs.IsNotFound(err) {
		if _, err2 := task.Delete(ctx, client.WithProcessKill); err2 != nil && !cerrdefs.IsNotFound(err2) {
			return kindOf(err, "removing sandbox %s: deleting task", c.ID())
		}
	}
	return nil
}

// List returns the ready sandboxes this driver manages, with the times
// containerd created their containers.
func (d *Driver) List(ctx context.Context) ([]driver.Ref, error) {
	ctx = d.ns(ctx)
	cs, err := d.client.Containers(ctx, d.filter(fmt.Sprintf(`labels.%q==%q`, labelState, stateReady)))
	if err != nil {
		return nil, kindOf(err, "listing sandboxes")
	}
	refs := make([]driver.Ref, 0, len(cs))
	for _, c := range cs {
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil {
			continue
		}
		ref := d.ref(c.ID(), info.Labels)
		ref.Created = info.CreatedAt
		if ref.Paused, err = d.paused(ctx, c); err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

// Orphans returns the containers of this driver's provider whose state
// dir is gone, whoever made them: the host agent that owned them had its
// state deleted (a test's temporary directory, a host rebuilt), so no agent
// can ever reach them again, and nothing else removes them. Containers of
// state dirs that exist (other agents on this containerd) are never
// returned. Each Ref carries its container's creation time, and the state
// dir in Data["state_dir"].
func (d *Driver) Orphans(ctx context.Context) ([]driver.Ref, error) {
	ctx = d.ns(ctx)
	cs, err := d.client.Containers(ctx, fmt.Sprintf(`labels.%q==%q`, labelProvider, d.name))
	if err != nil {
		return nil, kindOf(err, "listing orphaned sandboxes")
	}
	var refs []driver.Ref
	for _, c := range cs {
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil {
			continue
		}
		if dir := info.Labels[labelDir]; stateDirGone(dir) && dir != d.cfg.StateDir {
			ref := d.ref(c.ID(), info.Labels)
			ref.Created, ref.Data = info.CreatedAt, map[string]string{"state_dir": dir}
			refs = append(refs, ref)
		}
	}
	return refs, nil
}

// stateDirGone reports whether dir, a container's state-dir label, names
// an absolute path that no longer exists.
func stateDirGone(dir string) bool {
	if !filepath.IsAbs(dir) {
		return false
	}
	_, err := os.Lstat(dir)
	return errors.Is(err, fs.ErrNotExist)
}

// DestroyOrphan removes a container Orphans returned, as Destroy does,
// provided its state dir is still gone.
func (d *Driver) DestroyOrphan(ctx context.Context, ref driver.Ref) error {
	if err := checkProvider(d.name, ref); err != nil {
		return err
	}
	if ref.ID == "" || ref.ID == "." || ref.ID == ".." || strings.ContainsAny(ref.ID, `/\`) {
		return errdefs.InvalidArgument("bad sandbox id %q", ref.ID)
	}
	ctx = d.ns(ctx)
	c, err := d.client.LoadContainer(ctx, ref.ID)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return kindOf(err, "destroying orphaned sandbox %s", ref.ID)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return kindOf(err, "destroying orphaned sandbox %s", ref.ID)
	}
	dir := labels[labelDir]
	if labels[labelProvider] != d.name || dir == d.cfg.StateDir || !stateDirGone(dir) {
		return errdefs.PermissionDenied("sandbox %s is not an orphan: its state dir %q is this driver's or still exists", ref.ID, dir)
	}
	return d.removeIn(ctx, dir, ref.ID)
}

// Reconcile removes half-made leftovers of crashed creates and destroys:
// containers never marked ready, and host directories without a container.
// The host agent calls it on start, before using List. It returns the ids
// it removed.
func (d *Driver) Reconcile(ctx context.Context) ([]string, error) {
	ctx = d.ns(ctx)
	cs, err := d.client.Containers(ctx, d.filter())
	if err != nil {
		return nil, kindOf(err, "reconciling: listing containers")
	}
	var removed []string
	known := map[string]bool{}
	for _, c := range cs {
		known[c.ID()] = true
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil || info.Labels[labelState] == stateReady {
			continue
		}
		if err := d.remove(ctx, c.ID()); err != nil {
			return removed, fmt.Errorf("reconciling: %w", err)
		}
		removed = append(removed, c.ID())
	}
	entries, err := os.ReadDir(d.cfg.StateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return removed, fmt.Errorf("reconciling: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "corral-") || known[e.Name()] {
			continue
		}
		if err := d.remove(ctx, e.Name()); err != nil {
			return removed, fmt.Errorf("reconciling: %w", err)
		}
		removed = append(removed, e.Name())
	}
	d.cfg.Logger.Info("reconciled sandboxes", "removed", len(removed), "state_dir", filepath.Clean(d.cfg.StateDir))
	return removed, nil
}

// pull fetches ref from its registry and unpacks it, under the lease of the
// create that needs it.
func (d *Driver) pull(ctx context.Context, ref string) (client.Image, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.PullTimeout)
	defer cancel()
	plain := func(host string) (bool, error) { return slices.Contains(d.cfg.PlainHTTPRegistries, host), nil }
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(plain)),
	})
	start := time.Now()
	img, err := d.client.Pull(ctx, ref, client.WithPullUnpack, client.WithPullSnapshotter(d.cfg.Snapshotter), client.WithResolver(resolver))
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, errdefs.NotFound("image %q: not in its registry: %v", ref, err)
		}
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "pulling image %q", ref)
	}
	d.cfg.Logger.Info("pulled image", "image", ref, "duration", time.Since(start))
	return img, nil
}
