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

// A sandbox with Limits.DiskBytes gets its workspace on a file system of its
// own: a sparse ext4 image of that size in its host directory, loop-mounted
// on the workspace directory before the container starts. Writing past it
// fails with ENOSPC inside the sandbox; the host's disk is untouched. Without
// DiskBytes the workspace is a plain directory on the host's file system,
// bounded by nothing but that file system (bind mounts carry no quota).
// Mounting costs about 0.3 s at create, which is why it is not the default.

func imagePath(dirs hostDirs) string { return filepath.Join(dirs.root, "workspace.img") }

// mountWorkspace creates the image if it is missing and mounts it, unless
// it is mounted already.
func mountWorkspace(ctx context.Context, dirs hostDirs, size int64) error {
	if mounted(dirs.workspace) {
		return nil
	}
	img := imagePath(dirs)
	fresh := false
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if size <= 0 {
			return nil // a plain directory
		}
		fresh = true
		f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("workspace image: %w", err)
		}
		err = f.Truncate(size)
		f.Close()
		if err != nil {
			return fmt.Errorf("workspace image: %w", err)
		}
		out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
			"-E", fmt.Sprintf("root_owner=%d:%d", SandboxUID, SandboxGID), img).CombinedOutput()
		if errors.Is(err, exec.ErrNotFound) {
			return errdefs.FailedPrecondition("workspace disk limits need mkfs.ext4 (Debian's e2fsprogs)")
		}
		if err != nil {
			return fmt.Errorf("mkfs.ext4 %s: %v: %s", img, err, strings.TrimSpace(string(out)))
		}
	} else if err != nil {
		return fmt.Errorf("workspace image: %w", err)
	}
	out, err := exec.CommandContext(ctx, "mount", "-o", "loop,nosuid,nodev,noatime", img, dirs.workspace).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mounting workspace image %s: %v: %s", img, err, strings.TrimSpace(string(out)))
	}
	if fresh {
		if err := os.RemoveAll(filepath.Join(dirs.workspace, "lost+found")); err != nil {
			return fmt.Errorf("workspace image: %w", err)
		}
	}
	return nil
}

// unmountWorkspace unmounts the workspace if it is a mount (the loop device
// goes with it: mount -o loop sets autoclear). A workspace still in use (a
// snapshot's export reading it as the sandbox is removed, a runtime process
// not yet gone) is detached instead: it leaves the tree at once, and the
// file system and its loop device go when the last file in it is closed.
func unmountWorkspace(dirs hostDirs) error {
	if !mounted(dirs.workspace) {
		return nil
	}
	err := unix.Unmount(dirs.workspace, 0)
	if errors.Is(err, syscall.EBUSY) {
		err = unix.Unmount(dirs.workspace, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("unmounting workspace %s: %w", dirs.workspace, err)
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
