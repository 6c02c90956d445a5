package containerd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/internal/workspace"
	"corral.dev/corral/internal/errdefs"
)

// Pause and resume, gVisor only.
//
// What was found on the build machines (containerd v2.2.9, the runc shim
// io.containerd.runc.v2 with the runc option BinaryName set to runsc):
// containerd's own task checkpoint and restore work through the runc shim
// with runsc, so the driver does not call runsc itself.
//
//   - Checkpoint: the Tasks service's Checkpoint with runc CheckpointOptions
//     {ImagePath, Exit} makes the shim run
//     `runsc --root /run/containerd/runc/<namespace> checkpoint --image-path DIR --work-path W`
//     (the shim's --root is its default, /run/containerd/runc/<namespace>;
//     runsc ignores --work-path). With Exit the sandbox stops once saved.
//     Any option runsc lacks breaks it: `ctr containers checkpoint` (the
//     client's container Checkpoint) asks for file locks and runsc refuses
//     `--file-locks`. The client's Task.Checkpoint pauses the task around
//     the checkpoint (runsc pause/resume: two more runsc calls); the driver
//     calls the service directly instead.
//   - Restore: a new task with the runc option CriuImagePath
//     (client.WithRestoreImagePath) makes the shim run `runsc restore
//     --image-path DIR --detach --bundle ...` instead of create. The
//     restored task is an ordinary containerd task: exec, kill, delete,
//     the agent's reattach after a restart all work as before.
//   - gVisor's own shim (io.containerd.runsc.v1) does not implement task
//     checkpoint (RUNTIME-NOTES.md); Pause refuses it. runc would need
//     CRIU, which these machines lack; Pause refuses it too.
//
// State on disk: <StateDir>/<id>/checkpoint holds the image of a paused
// sandbox (checkpoint.tmp while it is written). A sandbox is paused when
// that directory exists and its task is not running. The image holds the
// sandbox's memory (bounded by its memory limit) and the Sentry's state;
// /tmp, a tmpfs inside gVisor, travels in it. The workspace stays where it
// is. Resume removes the image; Destroy removes it with the rest.
const checkpointDirName = "checkpoint"

func checkpointDir(stateDir, id string) string {
	return filepath.Join(dirsFor(stateDir, id).root, checkpointDirName)
}

// noEgressCheckpoint refuses to checkpoint a sandbox in its own network
// namespace (Spec.NetworkNamespace, an egress network): verified here,
// runsc's restore brings its processes back but not its network ("network
// is unreachable" after a resume), so such a sandbox is neither paused nor
// moved live. Kind failed precondition: the host agent and the control
// plane then keep it running, evict it or move it by workspace.
func noEgressCheckpoint(info containers.Container, what string) error {
	var s specs.Spec
	if err := json.Unmarshal(info.Spec.GetValue(), &s); err != nil {
		return fmt.Errorf("sandbox %s: reading its spec: %w", info.ID, err)
	}
	if s.Linux == nil {
		return nil
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace && ns.Path != "" {
			return errdefs.FailedPrecondition("sandbox %s has egress (its own network namespace): gVisor's restore does not bring its network back, so it is not %s", info.ID, what)
		}
	}
	return nil
}

// canPause refuses runtimes and shims without a working checkpoint.
func (d *Driver) canPause() error {
	switch {
	case d.cfg.Runtime != RuntimeGVisor:
		return errdefs.Unimplemented("the %s driver cannot pause sandboxes: checkpoints need gVisor (runc would need CRIU)", d.name)
	case !d.cfg.Pausable:
		return errdefs.Unimplemented("this host's sandboxes are not pausable: their commands run through runsc exec, whose processes a restore kills (start the host with --pausable-sandboxes)")
	case d.cfg.GVisorShim == ShimRunsc:
		return errdefs.Unimplemented("gVisor's shim io.containerd.runsc.v1 does not implement containerd's task checkpoint: run gVisor through the runc shim (GVisorShim %q) to pause sandboxes", ShimRunc)
	}
	return nil
}

// paused reports whether the container's sandbox is checkpointed and
// stopped.
func (d *Driver) paused(ctx context.Context, c client.Container) (bool, error) {
	if _, err := os.Stat(checkpointDir(d.cfg.StateDir, c.ID())); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", c.ID(), err)
	}
	running, err := d.running(ctx, c)
	return !running, err
}

// running reports whether the container has a running task.
func (d *Driver) running(ctx context.Context, c client.Container) (bool, error) {
	task, err := c.Task(ctx, nil)
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, kindOf(err, "sandbox %s: task", c.ID())
	}
	st, err := task.Status(ctx)
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, kindOf(err, "sandbox %s: task status", c.ID())
	}
	return st.Status == client.Running, nil
}

// Pause checkpoints the sandbox into its state dir and stops it: its
// memory and the runtime's processes are freed; its workspace stays.
func (d *Driver) Pause(ctx context.Context, ref driver.Ref) error {
	if err := checkProvider(d.name, ref); err != nil {
		return err
	}
	if err := d.canPause(); err != nil {
		return err
	}
	ctx = d.ns(ctx)
	c, info, err := d.load(ctx, ref.ID)
	if err != nil {
		return err
	}
	if err := noEgressCheckpoint(info, "paused"); err != nil {
		return err
	}
	defer d.lockRun(ref.ID)()
	if p, err := d.paused(ctx, c); err != nil || p {
		return err
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return kindOf(err, "pausing sandbox %s: task", ref.ID)
	}
	// Its command server ends first (serve.go).
	d.stopServer(ctx, ref.ID)
	if st, err := task.Status(ctx); err != nil {
		return kindOf(err, "pausing sandbox %s: task status", ref.ID)
	} else if st.Status != client.Running {
		return errdefs.FailedPrecondition("pausing sandbox %s: its task is %s, not running", ref.ID, st.Status)
	}
	dir := checkpointDir(d.cfg.StateDir, ref.ID)
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", ref.ID, err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", ref.ID, err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		return kindOf(err, "pausing sandbox %s: waiting", ref.ID)
	}
	opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: true, ImagePath: tmp})
	if err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", ref.ID, err)
	}
	start := time.Now()
	if _, err := d.client.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{ContainerID: ref.ID, Options: opts}); err != nil {
		_ = os.RemoveAll(tmp)
		return kindOf(err, "pausing sandbox %s: checkpoint", ref.ID)
	}
	// The image is complete: from here on the sandbox is paused, whatever
	// becomes of this call.
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", ref.ID, err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		return errdefs.Unavailable("pausing sandbox %s: its task did not stop 30s after the checkpoint", ref.ID)
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := task.Delete(ctx); err != nil && !cerrdefs.IsNotFound(err) {
		return kindOf(err, "pausing sandbox %s: deleting its stopped task", ref.ID)
	}
	d.cfg.Logger.Info("paused sandbox", "sandbox", ref.ID, "checkpoint_bytes", dirSize(dir), "duration", time.Since(start))
	return nil
}

// Resume restores a paused sandbox from its checkpoint and removes it.
func (d *Driver) Resume(ctx context.Context, ref driver.Ref) error {
	if err := checkProvider(d.name, ref); err != nil {
		return err
	}
	if err := d.canPause(); err != nil {
		return err
	}
	ctx = d.ns(ctx)
	c, _, err := d.load(ctx, ref.ID)
	if err != nil {
		return err
	}
	return d.ensureRunning(ctx, c)
}

// restore starts the container's task from its checkpoint image, then
// removes the image. The caller found no running task.
func (d *Driver) restore(ctx context.Context, c client.Container) error {
	dir := checkpointDir(d.cfg.StateDir, c.ID())
	start := time.Now()
	task, err := c.NewTask(ctx, cio.NullIO, client.WithRestoreImagePath(dir), d.withRunscBinary)
	if err != nil {
		return kindOf(err, "resuming sandbox %s", c.ID())
	}
	if err := task.Start(ctx); err != nil {
		if _, derr := task.Delete(context.WithoutCancel(ctx), client.WithProcessKill); derr != nil && !cerrdefs.IsNotFound(derr) {
			d.cfg.Logger.Warn("removing a task whose restore failed", "sandbox", c.ID(), "err", derr)
		}
		return kindOf(err, "resuming sandbox %s", c.ID())
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("resumed sandbox %s: removing its checkpoint: %w", c.ID(), err)
	}
	d.cfg.Logger.Info("resumed sandbox", "sandbox", c.ID(), "duration", time.Since(start))
	return nil
}

// withRunscBinary keeps the container's runc option BinaryName in the
// task's options, which WithRestoreImagePath replaces.
func (d *Driver) withRunscBinary(_ context.Context, _ *client.Client, ti *client.TaskInfo) error {
	if o, ok := ti.Options.(*options.Options); ok && d.cfg.Runtime == RuntimeGVisor && d.cfg.GVisorShim == ShimRunc {
		o.BinaryName = d.runscBinary()
	}
	return nil
}

// dirSize is the bytes of the regular files under dir (0 on error).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

var _ driver.DiskMeter = (*Driver)(nil)

// DiskUsed implements driver.DiskMeter: the blocks allocated under the
// sandbox's state directory (its disk image, as sparse as it is, the
// checkpoint of a paused sandbox, staged uploads; the mounts beneath it
// are not entered, their files are the disk image's), and what its
// root file system's snapshot holds.
func (d *Driver) DiskUsed(ctx context.Context, ref driver.Ref) (int64, error) {
	if err := checkProvider(d.name, ref); err != nil {
		return 0, err
	}
	ctx = d.ns(ctx)
	_, info, err := d.load(ctx, ref.ID)
	if err != nil {
		return 0, err
	}
	dirs := dirsFor(d.cfg.StateDir, ref.ID)
	// The disk image's blocks are allocated as its file system writes back
	// (up to half a minute after a command wrote): flushed first, so that
	// what is counted is all the image will hold.
	if disk := diskMountPath(dirs); mounted(disk) {
		if err := syncFS(disk); err != nil {
			return 0, fmt.Errorf("sandbox %s: flushing its disk: %w", ref.ID, err)
		}
	}
	n, err := workspace.AllocatedBytes(dirs.root)
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: its disk use: %w", ref.ID, err)
	}
	if info.SnapshotKey != "" {
		u, err := d.client.SnapshotService(cmp.Or(info.Snapshotter, d.cfg.Snapshotter)).Usage(ctx, info.SnapshotKey)
		if err != nil && !cerrdefs.IsNotFound(err) {
			return 0, kindOf(err, "sandbox %s: its root file system's disk use", ref.ID)
		}
		n += u.Size
	}
	return n, nil
}

// syncFS flushes the file system that holds dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
