package containerd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/containerd/v2/pkg/rootfs"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// A build sandbox (BuildImage) is a gVisor container like a session's,
// with these differences: its commands run as root (the Sentry's root:
// package maintainer scripts need it, and the host's root is never
// theirs) with the default capabilities; its root file system is
// writable and written through to its containerd snapshot, which is what
// gets committed; it has no workspace or session mounts, only a tmpfs
// /tmp that is not committed.
//
// runsc keeps a container's root file system writes in an overlay of its
// own by default (--overlay2=root:self: a file-backed upper layer inside
// the sandbox's view), so the snapshot would stay empty. Build sandboxes
// therefore run through a second wrapper, runsc-build beside the state,
// that also passes --overlay2=none: writes then go through the gofer to
// the snapshot's overlay mount on the host. (The runc shim takes no runtime
// flags of its own: platform.go.) gVisor's own shim is not supported for
// builds.
//
// Its container is labelled corral.state=building and never becomes
// ready: List never returns it, and after a crash the host's Reconcile
// removes it with the half-made sandboxes. Its id starts with
// driver.BuildIDPrefix; so does its host directory (an empty marker made
// first, which Reconcile also removes), and the host agent keys the
// build's egress network by the same id.

const (
	stateBuilding = "building"
	labelBuild    = "corral.build" // the ref being built

	// DefaultBuildDiskBytes bounds what a build writes when neither the
	// request nor the driver's Limits say.
	DefaultBuildDiskBytes = 4 << 30
	// buildTmpBytes sizes a build sandbox's /tmp tmpfs (in its memory).
	buildTmpBytes = 256 << 20
	// buildTail is how much of a failed step's output its error quotes.
	buildTail = 2 << 10
	// diskCheckEvery is how often a running step's writes are measured.
	diskCheckEvery = 2 * time.Second
)

// buildWrapperPath is the runsc wrapper of build sandboxes, written by
// the driver's first build (so a host that never builds has none).
func (d *Driver) buildWrapperPath() (string, error) {
	d.buildMu.Lock()
	defer d.buildMu.Unlock()
	if d.buildWrapper == "" {
		p, err := writeBuildWrapper(d.cfg)
		if err != nil {
			return "", err
		}
		d.buildWrapper = p
	}
	return d.buildWrapper, nil
}

// writeBuildWrapper writes the build sandboxes' runsc wrapper (runsc with
// the host's platform and --overlay2=none); only for gVisor through the
// runc shim.
func writeBuildWrapper(cfg Config) (string, error) {
	if cfg.Runtime != RuntimeGVisor || cfg.GVisorShim != ShimRunc {
		return "", nil
	}
	flags := "--overlay2=none"
	if cfg.GVisorPlatform != "" && cfg.GVisorPlatform != PlatformSystrap {
		flags = "--platform=" + cfg.GVisorPlatform + " " + flags
	}
	script := fmt.Appendf(nil, "#!/bin/sh\nexec %s %s \"$@\"\n", shellQuote(cfg.RunscPath), flags)
	return writeScript(cfg.StateDir, "runsc-build", script)
}

// writeScript writes an executable script at dir/name atomically, unless
// it holds script already.
func writeScript(dir, name string, script []byte) (string, error) {
	path := filepath.Join(dir, name)
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, script) {
		return path, nil
	}
	tmp, err := os.CreateTemp(dir, name+"-*")
	if err != nil {
		return "", fmt.Errorf("runsc wrapper %s: %w", name, err)
	}
	_, werr := tmp.Write(script)
	if err := tmp.Chmod(0o755); werr == nil {
		werr = err
	}
	if err := tmp.Close(); werr == nil {
		werr = err
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("runsc wrapper %s: %w", name, werr)
	}
	return path, nil
}

var _ driver.ImageBuilder = (*Driver)(nil)

// RemoveImage implements driver.ImageBuilder: it removes an image a build
// made or an import brought (one labelled corral.build); the images an
// operator imported are never this driver's to remove.
func (d *Driver) RemoveImage(ctx context.Context, name string) error {
	ctx = d.ns(ctx)
	img, err := d.client.ImageService().Get(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return kindOf(err, "image %q", name)
	}
	if img.Labels[labelBuild] == "" {
		return errdefs.FailedPrecondition("image %q was not built here", name)
	}
	if err := d.client.ImageService().Delete(ctx, name, images.SynchronousDelete()); err != nil && !cerrdefs.IsNotFound(err) {
		return kindOf(err, "removing image %q", name)
	}
	return nil
}

// Image implements driver.ImageBuilder.
func (d *Driver) Image(ctx context.Context, name string) (driver.BuiltImage, error) {
	ctx = d.ns(ctx)
	img, err := d.client.ImageService().Get(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return driver.BuiltImage{}, errdefs.NotFound("image %q is not present on this host", name)
	}
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "image %q", name)
	}
	m, err := images.Manifest(ctx, d.client.ContentStore(), img.Target, platforms.Default())
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "image %q: its manifest", name)
	}
	out := driver.BuiltImage{Digest: img.Target.Digest.String()}
	if n := len(m.Layers); n > 0 {
		out.LayerBytes = m.Layers[n-1].Size
	}
	return out, nil
}

func newBuildID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return driver.BuildIDPrefix + hex.EncodeToString(b[:])
}

// BuildImage implements driver.ImageBuilder (see the comment above).
func (d *Driver) BuildImage(ctx context.Context, spec driver.BuildSpec) (driver.BuiltImage, error) {
	if d.cfg.Runtime != RuntimeGVisor {
		return driver.BuiltImage{}, errdefs.Unimplemented("image builds run only under gVisor (this host runs %s): package scripts must never run in runc", d.cfg.Runtime)
	}
	if d.cfg.GVisorShim != ShimRunc {
		return driver.BuiltImage{}, errdefs.Unimplemented("image builds need gVisor through the runc shim (this host uses gVisor's own shim)")
	}
	if len(spec.Steps) == 0 || spec.Ref == "" || spec.BaseImage == "" {
		return driver.BuiltImage{}, errdefs.InvalidArgument("a build needs a ref, a base image and steps")
	}
	out := spec.Output
	if out == nil {
		out = io.Discard
	}
	ctx = d.ns(ctx)
	// The lease keeps the base image, the layer, config and manifest
	// from garbage collection until the image record holds them.
	lctx, done, err := d.client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour))
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: lease", spec.Ref)
	}
	defer done(context.WithoutCancel(lctx))
	ctx = lctx
	base, err := d.client.GetImage(ctx, spec.BaseImage)
	if cerrdefs.IsNotFound(err) {
		return driver.BuiltImage{}, errdefs.FailedPrecondition("build %s: base image %q is not present on this host", spec.Ref, spec.BaseImage)
	}
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: base image %q", spec.Ref, spec.BaseImage)
	}
	if ok, err := base.IsUnpacked(ctx, d.cfg.Snapshotter); err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: base image %q", spec.Ref, spec.BaseImage)
	} else if !ok {
		if err := base.Unpack(ctx, d.cfg.Snapshotter); err != nil {
			return driver.BuiltImage{}, kindOf(err, "build %s: unpacking base image %q", spec.Ref, spec.BaseImage)
		}
	}

	wrapper, err := d.buildWrapperPath()
	if err != nil {
		return driver.BuiltImage{}, err
	}
	id := newBuildID()
	// Removed on every path, after the build's own ctx may have ended.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := d.removeBuild(rctx, id); err != nil {
			d.cfg.Logger.Error("removing a build sandbox", "sandbox", id, "ref", spec.Ref, "err", err)
		}
	}()
	// The marker a crash leaves for Reconcile, before anything else.
	if err := os.Mkdir(dirsFor(d.cfg.StateDir, id).root, 0o700); err != nil {
		return driver.BuiltImage{}, fmt.Errorf("build %s: %w", spec.Ref, err)
	}
	var netns string
	env := map[string]string{"HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}
	if spec.Network != nil {
		ns, nenv, err := spec.Network(ctx, id)
		if err != nil {
			return driver.BuiltImage{}, fmt.Errorf("build %s: its network: %w", spec.Ref, err)
		}
		netns = ns
		maps.Copy(env, nenv)
	}
	lim := withDefaults(spec.Limits, d.cfg.Limits)
	if lim.DiskBytes == 0 {
		lim.DiskBytes = DefaultBuildDiskBytes
	}
	c, err := d.client.NewContainer(ctx, id,
		client.WithContainerLabels(map[string]string{labelProvider: d.name, labelKey: id, labelDir: d.cfg.StateDir, labelState: stateBuilding, labelBuild: spec.Ref}),
		client.WithSnapshotter(d.cfg.Snapshotter),
		client.WithNewSnapshot(id, base),
		client.WithRuntime("io.containerd.runc.v2", &options.Options{BinaryName: wrapper}),
		client.WithNewSpec(d.buildSpecOpts(base, lim, env, netns)...),
	)
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: container", spec.Ref)
	}
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: starting its sandbox", spec.Ref)
	}
	if err := task.Start(ctx); err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: starting its sandbox", spec.Ref)
	}
	b := &build{d: d, c: c, task: task, id: id, out: out, disk: lim.DiskBytes}
	for _, step := range spec.Steps {
		if err := b.step(ctx, step); err != nil {
			return driver.BuiltImage{}, err
		}
	}
	if err := d.stopTask(ctx, c); err != nil {
		return driver.BuiltImage{}, fmt.Errorf("build %s: stopping its sandbox: %w", spec.Ref, err)
	}
	return d.commit(ctx, spec.Ref, base, id, lim.DiskBytes)
}

// removeBuild removes build sandbox id and everything of it. A build
// cut short has just had its task killed, and runsc may refuse to kill a
// sandbox again while it dies: its exit is awaited and the removal tried
// again, a few times.
func (d *Driver) removeBuild(ctx context.Context, id string) error {
	err := d.remove(ctx, id)
	for i := 0; err != nil && i < 3 && ctx.Err() == nil; i++ {
		d.cfg.Logger.Warn("removing a build sandbox; trying again once its task has exited", "sandbox", id, "err", err)
		if c, lerr := d.client.LoadContainer(ctx, id); lerr == nil {
			if task, terr := c.Task(ctx, nil); terr == nil {
				_ = awaitExit(ctx, task, 10*time.Second)
			}
		}
		err = d.remove(ctx, id)
	}
	return err
}

// buildSpecOpts is a build sandbox's spec: root, a writable root file
// system, the image's environment with env over it, the limits, /tmp a
// tmpfs.
func (d *Driver) buildSpecOpts(img client.Image, lim driver.Limits, env map[string]string, netns string) []oci.SpecOpts {
	period := uint64(100000)
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		kv = append(kv, k+"="+env[k])
	}
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs("/bin/sh", "-c", initScript),
		oci.WithProcessCwd("/"),
		oci.WithUIDGID(0, 0),
		oci.WithEnv(kv),
		oci.WithHostname("build"),
		oci.WithNoNewPrivileges,
		oci.WithMounts([]specs.Mount{{Type: "tmpfs", Source: "tmpfs", Destination: "/tmp", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", buildTmpBytes)}}}),
		oci.WithMemoryLimit(uint64(lim.MemoryBytes)),
		oci.WithCPUCFS(lim.CPUMillis*int64(period)/1000, period),
		// As a session's (spec.go): gVisor enforces RLIMIT_NPROC, the
		// host's pids cgroup counts the runtime's threads too.
		withRlimit("RLIMIT_NPROC", uint64(lim.Pids)),
		oci.WithPidsLimit(2*lim.Pids + gvisorPidsOverhead),
	}
	if netns != "" {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns}))
	}
	return opts
}

// build is one running build sandbox.
type build struct {
	d    *Driver
	c    client.Container
	task client.Task
	id   string
	out  io.Writer
	disk int64 // bytes the snapshot may hold
}

// step writes the step's files and runs its command, failing on a
// non-zero exit.
func (b *build) step(ctx context.Context, s driver.BuildStep) error {
	fmt.Fprintf(b.out, "corral: step %s: %s\n", s.Name, strings.Join(s.Command, " "))
	for _, p := range slices.Sorted(maps.Keys(s.Files)) {
		// Written from inside the sandbox, so a symlink an earlier step
		// made leads nowhere on the host.
		tail := &tailBuffer{max: buildTail}
		code, err := b.exec(ctx, s.Name, []string{"/bin/sh", "-c", `mkdir -p -- "${1%/*}/" && cat > "$1" && chmod 0644 "$1"`, "sh", p}, nil, bytes.NewReader(s.Files[p]), tail)
		if err != nil {
			return fmt.Errorf("step %s: writing %s: %w", s.Name, p, err)
		}
		if code != 0 {
			return errdefs.FailedPrecondition("step %s failed: writing %s (exit %d): %s", s.Name, p, code, tail.String())
		}
	}
	tail := &tailBuffer{max: buildTail}
	w := io.MultiWriter(b.out, tail)
	// Standard error joins standard output in the sandbox, so lines stay
	// whole and in order.
	argv := append([]string{"/bin/sh", "-c", `exec "$@" 2>&1`, "sh"}, s.Command...)
	code, err := b.exec(ctx, s.Name, argv, s.Env, nil, w)
	if err != nil {
		return fmt.Errorf("step %s: %w", s.Name, err)
	}
	if code != 0 {
		return errdefs.FailedPrecondition("step %s failed (exit %d): %s", s.Name, code, tail.String())
	}
	return b.checkDisk(ctx, s.Name)
}

// checkDisk fails the build once its snapshot holds more than the bound.
func (b *build) checkDisk(ctx context.Context, step string) error {
	u, err := b.d.client.SnapshotService(b.d.cfg.Snapshotter).Usage(ctx, b.id)
	if err != nil {
		return kindOf(err, "step %s: measuring its writes", step)
	}
	if u.Size > b.disk {
		return errdefs.ResourceExhausted("step %s: the build wrote %d bytes, over its disk bound of %d", step, u.Size, b.disk)
	}
	return nil
}

// exec runs argv as root in the build sandbox to its end and returns its
// exit code. The end of ctx, or writes over the disk bound (measured every
// diskCheckEvery: nothing signals a snapshot's growth), kill the whole
// sandbox: the build is over.
func (b *build) exec(ctx context.Context, step string, argv []string, env map[string]string, stdin io.Reader, out io.Writer) (int, error) {
	// Standard output and error are copied by two goroutines.
	out = &lockedWriter{w: out}
	info, err := b.c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return 0, kindOf(err, "build sandbox %s", b.id)
	}
	var spec specs.Spec
	if info.Spec == nil || json.Unmarshal(info.Spec.GetValue(), &spec) != nil || spec.Process == nil {
		return 0, fmt.Errorf("build sandbox %s: reading its spec", b.id)
	}
	proc := *spec.Process
	proc.Args, proc.Terminal = argv, false
	if len(env) > 0 {
		all := map[string]string{}
		for _, kv := range proc.Env {
			k, v, _ := strings.Cut(kv, "=")
			all[k] = v
		}
		maps.Copy(all, env)
		proc.Env = proc.Env[:0:0]
		for _, k := range slices.Sorted(maps.Keys(all)) {
			proc.Env = append(proc.Env, k+"="+all[k])
		}
	}
	bg := context.WithoutCancel(ctx)
	streams := cio.WithStreams(nil, out, out)
	var in *stdinCloser
	if stdin != nil {
		in = &stdinCloser{r: stdin, eof: make(chan struct{})}
		streams = cio.WithStreams(in, out, out)
	}
	execID := strings.TrimPrefix(newID(), "corral-")
	p, err := b.task.Exec(bg, execID, &proc, cio.NewCreator(streams))
	if err != nil {
		return 0, kindOf(err, "build sandbox %s: exec", b.id)
	}
	defer func() { _, _ = p.Delete(bg, client.WithProcessKill) }()
	exited, err := p.Wait(bg)
	if err != nil {
		return 0, kindOf(err, "build sandbox %s: exec", b.id)
	}
	if err := p.Start(bg); err != nil {
		p.IO().Cancel()
		return 0, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "starting %q", argv[0])
	}
	in.closeAtEOF(bg, p, exited)
	tick := time.NewTicker(diskCheckEvery)
	defer tick.Stop()
	var cause error
	for cause == nil {
		select {
		case st := <-exited:
			drain(p, ioGrace)
			if err := st.Error(); err != nil {
				return 0, kindOf(err, "build sandbox %s: waiting", b.id)
			}
			return int(st.ExitCode()), nil
		case <-ctx.Done():
			cause = ctx.Err()
		case <-tick.C:
			cause = b.checkDisk(ctx, step)
		}
	}
	_ = b.task.Kill(bg, syscall.SIGKILL, client.WithKillAll)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
	drain(p, killedIOGrace)
	return 0, cause
}

// drain waits for a process's output copy to finish, at most grace: a
// daemon the step left running may hold its pipes open.
func drain(p client.Process, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		p.IO().Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		p.IO().Cancel()
		<-done
	}
}

// commit makes snapshot id's changes over its parent a layer, and an image
// named ref of base's config and layers with it on top; then unpacks it.
// Everything it writes is under ctx's lease until the image holds it.
func (d *Driver) commit(ctx context.Context, ref string, base client.Image, id string, maxBytes int64) (driver.BuiltImage, error) {
	cs := d.client.ContentStore()
	layer, err := rootfs.CreateDiff(ctx, id, d.client.SnapshotService(d.cfg.Snapshotter), d.client.DiffService(),
		diff.WithMediaType(ocispec.MediaTypeImageLayerGzip), diff.WithReference("corral-build-"+id))
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: the layer", ref)
	}
	if layer.Size > maxBytes {
		return driver.BuiltImage{}, errdefs.ResourceExhausted("build %s: its layer is %d bytes, over the bound of %d", ref, layer.Size, maxBytes)
	}
	info, err := cs.Info(ctx, layer.Digest)
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: the layer", ref)
	}
	diffID, err := digest.Parse(info.Labels[labels.LabelUncompressed])
	if err != nil {
		return driver.BuiltImage{}, fmt.Errorf("build %s: the layer has no uncompressed digest: %w", ref, err)
	}
	manifest, err := images.Manifest(ctx, cs, base.Target(), platforms.Default())
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: base manifest", ref)
	}
	raw, err := content.ReadBlob(ctx, cs, manifest.Config)
	if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: base config", ref)
	}
	// The config is rewritten from a generic map, so fields this code does
	// not know survive.
	var config map[string]json.RawMessage
	var rootFS ocispec.RootFS
	var history []ocispec.History
	if err := json.Unmarshal(raw, &config); err != nil {
		return driver.BuiltImage{}, fmt.Errorf("build %s: base config: %w", ref, err)
	}
	if err := json.Unmarshal(config["rootfs"], &rootFS); err != nil {
		return driver.BuiltImage{}, fmt.Errorf("build %s: base config's rootfs: %w", ref, err)
	}
	if h, ok := config["history"]; ok {
		if err := json.Unmarshal(h, &history); err != nil {
			return driver.BuiltImage{}, fmt.Errorf("build %s: base config's history: %w", ref, err)
		}
	}
	if len(history) == 0 {
		// Each layer has its history entry, or none has.
		for range rootFS.DiffIDs {
			history = append(history, ocispec.History{CreatedBy: "base image"})
		}
	}
	now := time.Now().UTC()
	rootFS.DiffIDs = append(rootFS.DiffIDs, diffID)
	history = append(history, ocispec.History{Created: &now, CreatedBy: "corral build " + ref, Comment: "packages"})
	for k, v := range map[string]any{"rootfs": rootFS, "history": history, "created": now} {
		if config[k], err = json.Marshal(v); err != nil {
			return driver.BuiltImage{}, err
		}
	}
	configBlob, err := json.Marshal(config)
	if err != nil {
		return driver.BuiltImage{}, err
	}
	configDesc := ocispec.Descriptor{MediaType: manifest.Config.MediaType, Digest: digest.FromBytes(configBlob), Size: int64(len(configBlob))}
	if err := content.WriteBlob(ctx, cs, "corral-build-config-"+id, bytes.NewReader(configBlob), configDesc); err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: writing its config", ref)
	}
	mediaType := manifest.MediaType
	if mediaType == "" {
		mediaType = ocispec.MediaTypeImageManifest
	}
	layerDesc := ocispec.Descriptor{MediaType: layer.MediaType, Digest: layer.Digest, Size: layer.Size}
	if mediaType == images.MediaTypeDockerSchema2Manifest {
		layerDesc.MediaType = images.MediaTypeDockerSchema2LayerGzip
	}
	newManifest := ocispec.Manifest{Versioned: manifest.Versioned, MediaType: mediaType, Config: configDesc, Layers: append(slices.Clone(manifest.Layers), layerDesc)}
	if newManifest.SchemaVersion == 0 {
		newManifest.SchemaVersion = 2
	}
	manifestBlob, err := json.Marshal(newManifest)
	if err != nil {
		return driver.BuiltImage{}, err
	}
	manifestDesc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(manifestBlob), Size: int64(len(manifestBlob))}
	// The references garbage collection follows from the manifest.
	gc := map[string]string{"containerd.io/gc.ref.content.config": configDesc.Digest.String()}
	for i, l := range newManifest.Layers {
		gc["containerd.io/gc.ref.content.l."+strconv.Itoa(i)] = l.Digest.String()
	}
	if err := content.WriteBlob(ctx, cs, "corral-build-manifest-"+id, bytes.NewReader(manifestBlob), manifestDesc, content.WithLabels(gc)); err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: writing its manifest", ref)
	}
	rec := images.Image{Name: ref, Target: manifestDesc, Labels: map[string]string{labelBuild: "1"}}
	is := d.client.ImageService()
	if _, err := is.Create(ctx, rec); cerrdefs.IsAlreadyExists(err) {
		_, err = is.Update(ctx, rec, "target", "labels")
		if err != nil {
			return driver.BuiltImage{}, kindOf(err, "build %s: image record", ref)
		}
	} else if err != nil {
		return driver.BuiltImage{}, kindOf(err, "build %s: image record", ref)
	}
	if err := client.NewImage(d.client, rec).Unpack(ctx, d.cfg.Snapshotter); err != nil {
		_ = is.Delete(context.WithoutCancel(ctx), ref)
		return driver.BuiltImage{}, kindOf(err, "build %s: unpacking", ref)
	}
	return driver.BuiltImage{Digest: manifestDesc.Digest.String(), LayerBytes: layer.Size}, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(strings.ToValidUTF8(string(t.b), "?")) }

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
