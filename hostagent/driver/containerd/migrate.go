package containerd

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// Live migration: a paused sandbox's checkpoint image leaves as a tar
// archive (ExportCheckpoint), and a sandbox made on another host with the
// same image and spec restores from it (RestoreCheckpoint).
//
// What was found on the build machines (runsc of gvisor.dev/gvisor
// v0.0.0-20260905035102-160fafc42237 through containerd's runc shim): an
// image taken of sandbox X under one state dir restores as another
// container, with another container id, another rootfs snapshot of the same
// image and other host paths behind /workspace, /mnt/session/uploads and
// /mnt/session/outputs. runsc's restore compares the checkpointed spec with
// the new one (runsc/specutils/restore.go) but leaves out what may differ
// between hosts: mount sources, namespace paths, device numbers; the rest
// must match, which it does for two sandboxes of one image and the same
// limits made by this driver. Files the sandbox's processes hold open or
// have looked up are found again by path on restore (their sizes and
// modification times are not compared), so the workspace must be in place
// before the restore: a restore over an empty workspace fails when a file
// it knew is missing. The restored sandbox's background processes keep
// running with their memory, /tmp (a tmpfs inside gVisor) and their
// counters; the processes runsc exec started are killed by any restore, so
// only a pausable host's sandboxes (spawn.go) move live.

// Bounds of a checkpoint archive read by RestoreCheckpoint, beyond the
// sandbox's memory limit: the image holds the sandbox's memory (at most its
// limit; /tmp's tmpfs is within it) and the Sentry's own state.
const (
	checkpointOverheadBytes = 256 << 20
	checkpointMaxFiles      = 64
)

// CanMigrate implements driver.Migrator: the checkpoints Pause takes.
func (d *Driver) CanMigrate() error { return d.canPause() }

var _ driver.Migrator = (*Driver)(nil)

// ExportCheckpoint implements driver.Migrator.
func (d *Driver) ExportCheckpoint(ctx context.Context, ref driver.Ref, w io.Writer) (int64, error) {
	if err := checkProvider(d.name, ref); err != nil {
		return 0, err
	}
	if err := d.canPause(); err != nil {
		return 0, err
	}
	ctx = d.ns(ctx)
	c, info, err := d.load(ctx, ref.ID)
	if err != nil {
		return 0, err
	}
	if err := noEgressCheckpoint(info, "moved live"); err != nil {
		return 0, err
	}
	// Under its run lock: no resume removes the image while it is read.
	defer d.lockRun(ref.ID)()
	if p, err := d.paused(ctx, c); err != nil {
		return 0, err
	} else if !p {
		return 0, errdefs.FailedPrecondition("exporting the checkpoint of sandbox %s: it is not paused", ref.ID)
	}
	dir := checkpointDir(d.cfg.StateDir, ref.ID)
	tw := tar.NewWriter(w)
	var total int64
	// The spawner build the sandbox's init runs, first (RestoreCheckpoint).
	build := []byte(spawnerBuild(info.Spec.GetValue()))
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: spawnerBuildEntry, Mode: 0o600, Size: int64(len(build))}); err != nil {
		return 0, fmt.Errorf("exporting the checkpoint of sandbox %s: %w", ref.ID, err)
	}
	if _, err := tw.Write(build); err != nil {
		return 0, fmt.Errorf("exporting the checkpoint of sandbox %s: %w", ref.ID, err)
	}
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		switch {
		case e.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: filepath.ToSlash(rel) + "/", Mode: 0o700})
		case !e.Type().IsRegular():
			return nil // runsc writes regular files only
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: filepath.ToSlash(rel), Mode: 0o600, Size: fi.Size()}); err != nil {
			return err
		}
		n, err := io.Copy(tw, io.LimitReader(f, fi.Size()))
		total += n
		if err == nil && n < fi.Size() {
			err = fmt.Errorf("%s shrank while it was read", rel)
		}
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return total, fmt.Errorf("exporting the checkpoint of sandbox %s: %w", ref.ID, err)
	}
	return total, nil
}

// RestoreCheckpoint implements driver.Migrator.
func (d *Driver) RestoreCheckpoint(ctx context.Context, ref driver.Ref, r io.Reader, max driver.CheckpointLimits) error {
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
	max = d.checkpointLimits(info.Spec.GetValue(), max)
	defer d.lockRun(ref.ID)()
	dir := checkpointDir(d.cfg.StateDir, ref.ID)
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("restoring sandbox %s: %w", ref.ID, err)
	}
	start := time.Now()
	size, err := unpackCheckpoint(tmp, r, max)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("restoring sandbox %s: %w", ref.ID, err)
	}
	received := time.Since(start)
	if err := sameSpawner(tmp, info.Spec.GetValue()); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("restoring sandbox %s: %w", ref.ID, err)
	}
	// From here the sandbox's own init goes: it restarts if the restore
	// fails.
	if err := d.stopTask(ctx, c); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("restoring sandbox %s: %w", ref.ID, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return d.restartAfter(ctx, c, tmp, fmt.Errorf("restoring sandbox %s: %w", ref.ID, err))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return d.restartAfter(ctx, c, tmp, fmt.Errorf("restoring sandbox %s: %w", ref.ID, err))
	}
	if err := d.restore(ctx, c); err != nil {
		return d.restartAfter(ctx, c, dir, fmt.Errorf("restoring sandbox %s from another host's checkpoint: %w", ref.ID, err))
	}
	d.cfg.Logger.Info("restored sandbox from a checkpoint", "sandbox", ref.ID, "checkpoint_bytes", size, "receive", received, "duration", time.Since(start))
	return nil
}

// restartAfter removes a checkpoint that was not restored and starts the
// container's init again, so the sandbox is usable as after Create; it
// returns cause. The caller holds the sandbox's run lock.
func (d *Driver) restartAfter(ctx context.Context, c client.Container, ckpt string, cause error) error {
	ctx = context.WithoutCancel(ctx)
	if err := os.RemoveAll(ckpt); err != nil {
		return errors.Join(cause, fmt.Errorf("removing the checkpoint: %w", err))
	}
	if err := d.stopTask(ctx, c); err != nil {
		return errors.Join(cause, err)
	}
	if err := d.startTask(ctx, c); err != nil {
		return errors.Join(cause, fmt.Errorf("starting its init again: %w", err))
	}
	return cause
}

// checkpointLimits fills max's zero fields from the container's spec (its
// memory limit) and the driver's defaults.
func (d *Driver) checkpointLimits(spec []byte, max driver.CheckpointLimits) driver.CheckpointLimits {
	mem := d.cfg.Limits.MemoryBytes
	var s specs.Spec
	if json.Unmarshal(spec, &s) == nil && s.Linux != nil && s.Linux.Resources != nil &&
		s.Linux.Resources.Memory != nil && s.Linux.Resources.Memory.Limit != nil && *s.Linux.Resources.Memory.Limit > 0 {
		mem = *s.Linux.Resources.Memory.Limit
	}
	if max.TotalBytes <= 0 {
		max.TotalBytes = mem + checkpointOverheadBytes
	}
	if max.FileBytes <= 0 || max.FileBytes > max.TotalBytes {
		max.FileBytes = max.TotalBytes
	}
	if max.Files <= 0 {
		max.Files = checkpointMaxFiles
	}
	return max
}

// unpackCheckpoint writes the tar archive r into the new directory dir,
// within max, and returns the bytes written. Names are confined to dir by
// os.Root besides being checked; only directories and regular files are
// taken.
func unpackCheckpoint(dir string, r io.Reader, max driver.CheckpointLimits) (int64, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var total int64
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if n == 0 {
				return 0, errdefs.InvalidArgument("the checkpoint archive is empty")
			}
			return total, nil
		}
		if err != nil {
			return total, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "reading the checkpoint archive")
		}
		if n >= max.Files {
			return total, errdefs.ResourceExhausted("the checkpoint archive has more than %d entries", max.Files)
		}
		name, err := checkpointName(hdr.Name)
		if err != nil {
			return total, err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return total, fmt.Errorf("checkpoint entry %s: %w", name, err)
			}
		case tar.TypeReg:
			if hdr.Size < 0 || hdr.Size > max.FileBytes {
				return total, errdefs.ResourceExhausted("checkpoint entry %s: %d bytes, more than the %d a file may have", name, hdr.Size, max.FileBytes)
			}
			if total+hdr.Size > max.TotalBytes {
				return total, errdefs.ResourceExhausted("the checkpoint archive holds more than %d bytes", max.TotalBytes)
			}
			if err := root.MkdirAll(path.Dir(name), 0o700); err != nil {
				return total, fmt.Errorf("checkpoint entry %s: %w", name, err)
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return total, fmt.Errorf("checkpoint entry %s: %w", name, err)
			}
			// The header's size bounds the copy: tar's reader ends the
			// entry there.
			w, err := io.Copy(f, tr)
			total += w
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return total, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "checkpoint entry %s", name)
			}
		default:
			return total, errdefs.InvalidArgument("checkpoint entry %s: only directories and regular files are taken", name)
		}
	}
}

// checkpointName checks an archive entry's name: relative, without ".."
// or backslashes, not the directory itself. It returns it cleaned.
func checkpointName(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, `\`) || strings.ContainsRune(name, 0) {
		return "", errdefs.InvalidArgument("checkpoint entry %q: want a relative path", name)
	}
	for _, part := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if part == ".." {
			return "", errdefs.InvalidArgument("checkpoint entry %q: \"..\" is not allowed", name)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", errdefs.InvalidArgument("checkpoint entry %q names the image directory itself", name)
	}
	return clean, nil
}

// spawnerBuildEntry is the checkpoint archive's entry that names the
// spawner build of the sandbox it was taken of (spawnerBuild): not one of
// runsc's files, it is read and removed before the restore.
const spawnerBuildEntry = "corral-spawner-build"

// spawnerBuild names the compiled spawner build a sandbox's spec mounts
// (the directory installSpawner copied it to), or "" for none (the shell
// spawner, or no spawner).
func spawnerBuild(spec []byte) string {
	var s specs.Spec
	if json.Unmarshal(spec, &s) != nil {
		return ""
	}
	for _, m := range s.Mounts {
		if m.Destination == spawnPath {
			return filepath.Base(filepath.Dir(m.Source))
		}
	}
	return ""
}

// sameSpawner refuses a checkpoint unpacked in dir whose sandbox ran
// another spawner build than the one the restoring sandbox's spec mounts:
// runsc compares the specs but not mount sources, and a restored init
// whose binary changed under it stops serving, taking its commands'
// background processes with it. The caller then moves the workspace
// alone. An archive without the entry is from a sandbox with no compiled
// spawner.
func sameSpawner(dir string, spec []byte) error {
	p := filepath.Join(dir, spawnerBuildEntry)
	f, err := os.Open(p)
	var from []byte
	switch {
	case err == nil:
		from, err = io.ReadAll(io.LimitReader(f, 128))
		f.Close()
		if err != nil {
			return err
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if to := spawnerBuild(spec); string(from) != to {
		name := func(b string) string {
			if b == "" {
				return "none"
			}
			return b
		}
		return errdefs.FailedPrecondition("the checkpoint's init runs spawner build %s, this host's sandbox spawner build %s: its processes cannot move to this host", name(string(from)), name(to))
	}
	return nil
}
