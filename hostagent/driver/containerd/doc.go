// Package containerd is the production driver: each sandbox is a containerd
// container with one long-running init process, run by gVisor (runsc, the
// default) or by runc, through a containerd v2 daemon's client API.
//
// Closed by default (spec.go): a fresh network namespace with no interfaces
// but loopback (or Spec.NetworkNamespace: the network package egress made
// for the sandbox, whose only reachable address is its proxy's), a
// read-only root filesystem, /workspace, /mnt/session/outputs (writable),
// /mnt/session/uploads and /mnt/memory (read-only) bind-mounted from
// <StateDir>/<id>/, /tmp a sized tmpfs, user 1000:1000 with no capabilities
// and no_new_privs, cgroup limits on CPU, memory and pids (under gVisor also
// RLIMIT_NPROC, which gVisor enforces itself), and an environment of PATH
// plus Spec.Env only. With Limits.DiskBytes (the control plane sends every
// runtime profile's disk_mib) the workspace and the outputs share one
// loop-mounted ext4 image of that size (disk.go); without it both are
// unbounded. An image per sandbox rather than an XFS or ext4 project quota:
// it works on whatever file system holds the state dir, needs no quota
// mount options or project ids on the host, and a full disk is ENOSPC
// inside the sandbox only.
//
// Under gVisor the memory limit applies to the whole sandbox (the Sentry
// holds the sandbox's memory): a process that exceeds it gets the sandbox
// OOM-killed, not just itself. Attach then starts a new init over the same
// workspace.
//
// Lifecycle of one sandbox, as containerd labels record it:
//
//	Create ─► container labelled corral.state=creating ─► task started ─► corral.state=ready ─► Ref returned
//	             │ (any failure: task, container, snapshot and host dirs removed)
//	             └─ a crash here leaves a "creating" container: Reconcile removes it
//	Attach ─► container ready? ─► task running? (stopped, e.g. after a host reboot: a new task, same workspace)
//	Destroy ─► task killed, waited, deleted ─► container and snapshot deleted ─► host dirs removed
//
// gVisor runs through containerd's runc shim with the runc option
// BinaryName set to runsc (how Docker runs gVisor); Config.GVisorShim
// selects gVisor's own shim, io.containerd.runsc.v1, on hosts where it works
// (it needs CAP_SYS_RESOURCE). A stopped gVisor task is deleted without
// force: runsc refuses to kill a sandbox that is not running.
//
// Live migration (migrate.go), verified here: a checkpoint image taken of
// sandbox X under one state dir restores as a new container under another
// (another container id, another rootfs snapshot of the same image, other
// host paths behind the workspace, uploads and outputs bind mounts), with
// its background processes, their memory and /tmp as they were. runsc's
// restore compares the two specs but ignores mount sources. The workspace
// must be there first: a restore over an empty workspace fails ("failed to
// walk ... no such file or directory"), and the sandbox then runs a new init.
// An idle busybox sandbox's image is under 1 MB.
//
// Files are read and written from the host side in the workspace directory,
// confined by os.Root (package workspace), never by entering the sandbox.
// The session's mounted files are staged the same way into the uploads
// directory (root's, 0755, bind-mounted read-only; the host agent writes
// them into <StateDir>/<id>/staging and renames them in): gVisor's gofer
// shares bind mounts with the host, so a file added to a running sandbox
// shows at once.
package containerd
