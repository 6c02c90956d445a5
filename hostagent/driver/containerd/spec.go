package containerd

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"corral.dev/corral/hostagent/driver"
)

// specHook edits a finished container spec.
type specHook func(*specs.Spec)

// Paths inside the sandbox.
const (
	workspacePath = "/workspace"
	sandboxPath   = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// initScript is the sandbox's init: it sleeps, reaps what is reparented to
// it, and exits on SIGTERM.
const initScript = `trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done`

// spawns reports whether the sandboxes' commands run as children of init
// (spawn.go): pausable gVisor sandboxes only (Config.Pausable).
func (d *Driver) spawns() bool { return d.cfg.Runtime == RuntimeGVisor && d.cfg.Pausable }

// mountsSpawner reports whether new sandboxes get the compiled spawner:
// every gVisor sandbox when the host has the binary (Config.SpawnBinary).
func (d *Driver) mountsSpawner() bool { return d.cfg.Runtime == RuntimeGVisor && d.spawnSource != "" }

// initArgs is the init of the driver's sandboxes: when they are pausable
// the spawner that runs every command (spawn.go), compiled when the host
// has the binary (Config.SpawnBinary), else initScript. pids is the
// sandbox's process limit, its commands'.
func (d *Driver) initArgs(pids int64) []string {
	switch {
	case d.spawns() && d.spawnSource != "":
		return []string{spawnPath, "init", strconv.FormatInt(pids, 10)}
	case d.spawns():
		return []string{"/bin/sh", "-c", spawnInitScript}
	}
	return []string{"/bin/sh", "-c", initScript}
}

// hostDirs are a sandbox's directories on the host.
type hostDirs struct{ root, workspace, uploads, outputs, memory string }

func dirsFor(stateDir, id string) hostDirs {
	root := filepath.Join(stateDir, id)
	return hostDirs{root, filepath.Join(root, "workspace"), filepath.Join(root, "uploads"), filepath.Join(root, "outputs"), filepath.Join(root, "memory")}
}

// envList is PATH plus env, sorted, as KEY=value.
func envList(env ...map[string]string) []string {
	all := map[string]string{"PATH": sandboxPath, "HOME": workspacePath}
	for _, e := range env {
		maps.Copy(all, e)
	}
	out := make([]string, 0, len(all))
	for _, k := range slices.Sorted(maps.Keys(all)) {
		out = append(out, k+"="+all[k])
	}
	return out
}

// specOpts builds the closed-by-default spec of a sandbox.
func (d *Driver) specOpts(img oci.Image, spec driver.Spec, dirs hostDirs) []oci.SpecOpts {
	lim := withDefaults(spec.Limits, d.cfg.Limits)
	period := uint64(100000)
	quota := lim.CPUMillis * int64(period) / 1000
	mounts := []specs.Mount{
		{Type: "bind", Source: dirs.workspace, Destination: workspacePath, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		{Type: "bind", Source: dirs.uploads, Destination: driver.UploadsMount, Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		{Type: "bind", Source: dirs.outputs, Destination: driver.OutputsMount, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		// Writable: a read_write memory store's directory is the
		// sandbox user's; the rest of it is root's (package agent).
		{Type: "bind", Source: dirs.memory, Destination: driver.MemoryMount, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		{Type: "tmpfs", Source: "tmpfs", Destination: "/tmp", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", d.cfg.TmpBytes)}},
	}
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs(d.initArgs(lim.Pids)...),
		oci.WithProcessCwd(workspacePath),
		oci.WithUIDGID(SandboxUID, SandboxGID),
		withEnv(envList(spec.Env)),
		oci.WithHostname("sandbox"),
		oci.WithRootFSReadonly(),
		oci.WithNoNewPrivileges,
		oci.WithCapabilities(nil),
		oci.WithMounts(mounts),
		oci.WithMemoryLimit(uint64(lim.MemoryBytes)),
		oci.WithCPUCFS(quota, period),
		oci.WithPidsLimit(lim.Pids),
	}
	if d.mountsSpawner() {
		// The compiled spawner, outside the workspace, read-only: the
		// copy of this build (installSpawner), which a paused sandbox
		// finds again as it was however the host's binary changed since.
		// Its host path may differ between hosts: runsc's restore does
		// not compare mount sources (migrate.go). Pausable or not, the
		// sandbox's commands run through its command server (serve.go).
		opts = append(opts, oci.WithMounts([]specs.Mount{{Type: "bind", Source: d.spawnSource, Destination: spawnPath, Options: []string{"rbind", "ro", "nosuid", "nodev"}}}))
	}
	if spec.NetworkNamespace != "" {
		// The host's egress network (package egress): runsc's netstack
		// takes the namespace's one veth and its /30 route; runc's
		// processes live in it.
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: spec.NetworkNamespace}))
	}
	if d.cfg.Runtime == RuntimeRunc {
		// The sandbox's own cgroup, read-only, so tools inside can see
		// their limits (gVisor shows them in its own /proc and /sys).
		opts = append(opts, oci.WithMounts([]specs.Mount{{Type: "cgroup", Source: "cgroup", Destination: "/sys/fs/cgroup", Options: []string{"ro", "nosuid", "noexec", "nodev"}}}))
	}
	if d.cfg.Runtime == RuntimeGVisor {
		// The host's pids cgroup counts gVisor's own threads and stub
		// processes: at the bare limit a fork loop kills the whole sandbox.
		// gVisor enforces RLIMIT_NPROC itself, so the sandbox's processes
		// are bounded there and the cgroup gets headroom for the runtime.
		// (Under runc RLIMIT_NPROC would count every process of uid 1000 on
		// the host, so runc gets the cgroup limit alone.)
		// Spawning (Config.Pausable) or serving (serve.go), init, the
		// relays and the command server get spawnHeadroom processes
		// more: each command lowers its own limit to the sandbox's
		// (runLine, the spawner's prlimit), so a fork bomb stops there
		// while init and the server can still fork (a shell that cannot
		// fork exits, and with init the whole sandbox).
		nproc := lim.Pids
		if d.spawns() || d.mountsSpawner() {
			nproc += spawnHeadroom
		}
		opts = append(opts,
			withRlimit("RLIMIT_NPROC", uint64(nproc)),
			oci.WithPidsLimit(2*nproc+gvisorPidsOverhead))
	}
	if d.cfg.specHook != nil {
		hook := d.cfg.specHook
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			hook(s)
			return nil
		})
	}
	return opts
}

// gvisorPidsOverhead is the host pids the gVisor runtime itself needs
// beyond two per sandbox process (Sentry threads, gofer, systrap stubs).
const gvisorPidsOverhead = 256

// withRlimit sets one rlimit, soft and hard, on the init process (exec'd
// processes start from the same process spec).
func withRlimit(kind string, v uint64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		rl := slices.DeleteFunc(s.Process.Rlimits, func(r specs.POSIXRlimit) bool { return r.Type == kind })
		s.Process.Rlimits = append(rl, specs.POSIXRlimit{Type: kind, Hard: v, Soft: v})
		return nil
	}
}

// withEnv replaces the process environment (oci.WithEnv merges into the
// image's).
func withEnv(env []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Env = env
		return nil
	}
}
