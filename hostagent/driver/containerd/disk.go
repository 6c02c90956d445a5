package containerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"corral.dev/corral/internal/errdefs"
)

// A sandbox with Limits.DiskBytes gets one file system of its own for
// everything it can write to on the host: a sparse ext4 image of that size
// (disk.img in its host directory), loop-mounted on <root>/disk, holding
// workspace/, outputs/ and memory/, which are bind-mounted on the host
// directories the container's /workspace, /mnt/session/outputs and
// /mnt/memory come from, and memory-staging/, where the host writes a
// memory before renaming it into memory/ (on the same file system).
// Writing past the size, in any of them, fails with ENOSPC inside the
// sandbox; the host's disk is untouched. They share the one budget:
// outputs and read_write memories are files the agent wrote, as its
// workspace is, and a second image would cost a second mkfs at every
// create. memory/ is root's: only a read_write store's directory in it
// is the sandbox user's (package agent). The host-side paths stay where they
// were (hostDirs), so the spec, the claim check, the outputs export and a
// restore's mount sources do not change with the layout.
//
// Without DiskBytes both are plain directories on the host's file system,
// bounded by nothing but that file system (bind mounts carry no quota).
// Making the image costs about 0.3 s at create, which is why it is not the
// driver's default (the control plane sends every runtime profile's
// disk_mib, so a session's sandbox always has one).
//
// A sandbox made before this layout has workspace.img mounted on the
// workspace directly and an unbounded outputs directory; it is mounted
// again that way (legacyImagePath), never converted.

func diskImagePath(dirs hostDirs) string   { return filepath.Join(dirs.root, "disk.img") }
func diskMountPath(dirs hostDirs) string   { return filepath.Join(dirs.root, "disk") }
func legacyImagePath(dirs hostDirs) string { return filepath.Join(dirs.root, "workspace.img") }
func memoryStagingPath(dirs hostDirs) string {
	return filepath.Join(diskMountPath(dirs), "memory-staging")
}

// mountWorkspace makes the sandbox's disk image if it is missing and size
// is set, and mounts whatever of it is not mounted yet: the image, then
// the workspace and outputs bind mounts. It is repeatable: after a host
// reboot it mounts everything again.
func mountWorkspace(ctx context.Context, dirs hostDirs, size int64) error {
	if _, err := os.Stat(legacyImagePath(dirs)); err == nil {
		if mounted(dirs.workspace) {
			return nil
		}
		return loopMount(ctx, legacyImagePath(dirs), dirs.workspace)
	}
	img, disk := diskImagePath(dirs), diskMountPath(dirs)
	fresh := false
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if size <= 0 {
			return nil // plain directories
		}
		if err := makeImage(ctx, img, size); err != nil {
			return err
		}
		fresh = true
	} else if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	if err := os.Mkdir(disk, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("disk image: %w", err)
	}
	if !mounted(disk) {
		if err := loopMount(ctx, img, disk); err != nil {
			return err
		}
	}
	if fresh {
		if err := os.RemoveAll(filepath.Join(disk, "lost+found")); err != nil {
			return fmt.Errorf("disk image: %w", err)
		}
	}
	if err := os.Mkdir(memoryStagingPath(dirs), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("disk image: %w", err)
	}
	for _, b := range []struct {
		sub, target  string
		sandboxUsers bool // else root's, as the image's root is
	}{{"workspace", dirs.workspace, true}, {"outputs", dirs.outputs, true}, {"memory", dirs.memory, false}} {
		src := filepath.Join(disk, b.sub)
		if err := os.Mkdir(src, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("disk image: %w", err)
		}
		if b.sandboxUsers {
			if err := os.Chown(src, SandboxUID, SandboxGID); err != nil {
				return fmt.Errorf("disk image: %w", err)
			}
		}
		if mounted(b.target) {
			continue
		}
		// A bind mount keeps the loop mount's nosuid and nodev.
		if err := unix.Mount(src, b.target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", src, b.target, err)
		}
	}
	return nil
}

// makeImage creates a sparse ext4 image of size bytes at img.
func makeImage(ctx context.Context, img string, size int64) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) {
		return errdefs.FailedPrecondition("sandbox disk limits need mkfs.ext4 (Debian's e2fsprogs)")
	}
	if err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func loopMount(ctx context.Context, img, dir string) error {
	out, err := exec.CommandContext(ctx, "mount", "-o", "loop,nosuid,nodev,noatime", img, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mounting disk image %s: %v: %s", img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unmountWorkspace unmounts the memory, outputs and workspace binds and then the
// image (its loop device goes with it: mount -o loop sets autoclear),
// whichever of them are mounted. One still in use (a snapshot's export
// reading the workspace as the sandbox is removed, a runtime process not
// yet gone) is detached instead: it leaves the tree at once, and the file
// system and its loop device go when the last file in it is closed.
func unmountWorkspace(dirs hostDirs) error {
	for _, dir := range []string{dirs.memory, dirs.outputs, dirs.workspace, diskMountPath(dirs)} {
		if !mounted(dir) {
			continue
		}
		err := unix.Unmount(dir, 0)
		if errors.Is(err, syscall.EBUSY) {
			err = unix.Unmount(dir, unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
	}
	return nil
}

// mounted reports whether dir is a mount point: it sits on another device
// than its parent.
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
