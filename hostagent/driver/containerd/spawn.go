package containerd

// Commands under gVisor run as children of the sandbox's init, not as
// `runsc exec` processes, so that a checkpoint keeps them: gVisor's restore
// kills every process whose lineage began with an exec (runsc/boot/
// restore.go: "Kill all processes that have been exec'd since they cannot
// be properly restored"; the task origin is inherited by every child), so a
// background process a command left behind would not survive a pause.
//
// The exec'd process is only a relay. Two schemes do it; a sandbox keeps
// the one it was made with (spawnerOf reads it from its spec). With the
// compiled one, the relay is mostly not exec'd at all: the sandbox's
// command server (serve.go) runs the relay's steps for each command, and
// only a command with input, or one while no server runs, gets an exec
// of its own.
//
//   - The compiled spawner (Config.SpawnBinary; cmd/corral-spawn, package
//     hostagent/spawn), mounted read-only at spawnPath: init is a Go
//     program serving a unix socket under /tmp/.corral; the relay makes
//     the command's pipes inside the sandbox, hands their far ends and the
//     command (path, directory, argv, exactly the environment) to init
//     with SCM_RIGHTS, copies between them and its own streams in
//     goroutines (no host descriptor of the relay's reaches the command),
//     and exits with the status init writes back. Init forks the command
//     traced, in a session of its own, and at the stop of its execve
//     lowers its RLIMIT_NPROC, soft and hard, to the sandbox's limit
//     (prlimit) before it lets it go: one fork and one exec per command
//     besides the relay. What each side reads from the other is bounded;
//     a malformed request is refused. Init and each relay are Go
//     processes of 5 to 7 threads, which gVisor counts against
//     RLIMIT_NPROC: within spawnHeadroom, under a fork bomb too.
//   - The shell spawner (spawnInitScript, relayScript), a sandbox's made
//     before the host had the binary: the relay writes the command (a
//     shell line the driver quotes: its directory, its environment, its
//     argv) beside FIFOs named after the command under /tmp/.corral, opens
//     FIFOs for the output (and the input, when there is one), and writes
//     the command's id to init's spawn FIFO. Init starts the command in a
//     session of its own with those FIFOs as its standard streams (opened
//     blocking, so no output is written before the relay reads it), and
//     writes its exit status to the directory's rc FIFO, which the relay
//     holds open from the start and reads, and exits with.
//
// Either way the command's session is its own (setsid: killScript, which
// kills what a timed out command started, spares init's session). The
// relay's copies of the streams are what the shim sees; a background
// process that keeps the output open is cut off (the compiled relay takes
// what the pipe holds when the command ends and exits; the shell relay's
// cats are cut off after ioGrace, as before). /tmp is the sandbox's own
// tmpfs: a checkpoint keeps it, and with it init's FIFO or socket.
//
// What that costs, measured here (a Debian sandbox, 2-core VM; the
// exec-warm figures of BenchmarkResumeFromCheckpoint, one run of both
// schemes, p50 and p99): a command such as true takes 45 ms (82) with the
// compiled spawner against a raw runsc exec's 33 ms (53) in the same run;
// with the shell's 76 ms (104) against 29 ms (36); before the compiled
// one existed, 77 ms (97) against 34 ms (53). The shell scheme's
// difference is the processes it makes besides the command: the relay's
// mkfifo and two cats, init's waiter and the command's fork, setsid and
// sh (and rm after), each 3-10 ms of forking and exec'ing under gVisor.
// The compiled one's is the relay's own exec and Go start and init's fork
// of the command; a start step of its own (a third process that lowers
// the limit and execs the command) came to 68 ms (84): the traced fork
// saves it. A resume and its first command: 223 ms (315) compiled, 233 ms
// (275) shell, against raw restores of 199 and 184 ms (ratio 1.12, 1.27).
// Nothing waits on a timer: the relays poll for init's socket or FIFO
// only in a sandbox that has just started. The first command after a
// resume costs what any command does (a fresh restore adds a few ms, to a
// raw exec too).
//
// A command that is not on the PATH is reported by the relay (exit 127 and
// relayNotFound on stderr) and turned into an error, as a failed exec is.
// A compiled relay whose init could not fork the command (EAGAIN, the
// sandbox out of processes) says so (relayOutOfProcesses), and the
// sandbox is restarted as when runsc exec cannot start one. A sandbox
// whose init has no spawn FIFO (made before this scheme) runs the command
// in the relay itself; a compiled relay that finds no socket starts the
// command as its own child, through its start step.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"corral.dev/corral/hostagent/spawn"
	"corral.dev/corral/internal/errdefs"
)

// spawnPath is where a sandbox made with Config.SpawnBinary has the
// compiled spawner (cmd/corral-spawn): outside the workspace, and fixed,
// so that sandboxes of one image on two hosts have the same spec whatever
// the binary's host path (a live move compares them).
const spawnPath = "/.corral-spawn"

// spawnersDir, under the state dir, holds a copy of each build of the
// compiled spawner the driver's sandboxes were made with (installSpawner).
const spawnersDir = "spawners"

// installSpawner copies cfg.SpawnBinary to the state dir under a name its
// content gives, unless the copy is there, and returns the copy's path ("":
// no compiled spawner for this driver). A sandbox mounts the copy: a paused
// sandbox's init is the build it was checkpointed with, and a restore over
// another build's file kills it (measured: TestCompiledSpawnerReplacedWhilePaused
// fails with the host's path mounted), so each build stays in place for
// the sandboxes made with it (a few MB a build), until no container mounts
// it any more (pruneSpawners, at the next start).
func installSpawner(cfg Config) (string, error) {
	if cfg.SpawnBinary == "" || cfg.Runtime != RuntimeGVisor {
		return "", nil
	}
	if err := checkSpawner(cfg.SpawnBinary); err != nil {
		return "", err
	}
	src, err := os.Open(cfg.SpawnBinary)
	if err != nil {
		return "", errdefs.Wrap(errdefs.FailedPreconditionKind, err, "the spawner binary")
	}
	defer src.Close()
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", fmt.Errorf("reading the spawner binary %s: %w", cfg.SpawnBinary, err)
	}
	dir := filepath.Join(cfg.StateDir, spawnersDir, hex.EncodeToString(h.Sum(nil))[:32])
	dst := filepath.Join(dir, "corral-spawn")
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("installing the spawner binary: %w", err)
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("reading the spawner binary %s: %w", cfg.SpawnBinary, err)
	}
	tmp, err := os.CreateTemp(dir, ".corral-spawn-*")
	if err != nil {
		return "", fmt.Errorf("installing the spawner binary: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", fmt.Errorf("installing the spawner binary: %w", err)
	}
	return dst, nil
}

// pruneSpawners removes the copies of spawner builds (installSpawner) that
// are not this driver's and that no container in its namespace mounts: the
// sandboxes made with an older build are gone. Another driver's container
// (another state dir) that mounts a build of the same content keeps it
// here too; that errs on the side of keeping. Called as the driver starts,
// before it makes a sandbox.
func (d *Driver) pruneSpawners(ctx context.Context) (removed []string, err error) {
	if d.spawnSource == "" {
		return nil, nil
	}
	dir := filepath.Join(d.cfg.StateDir, spawnersDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing spawner builds: %w", err)
	}
	current := filepath.Base(filepath.Dir(d.spawnSource))
	if len(ents) == 1 && ents[0].Name() == current {
		return nil, nil // nothing else: no need to read every container
	}
	cs, err := d.client.ContainerService().List(d.ns(ctx))
	if err != nil {
		return nil, kindOf(err, "listing containers for the spawner builds they mount")
	}
	inUse := map[string]bool{current: true}
	for _, c := range cs {
		if c.Spec != nil {
			if b := spawnerBuild(c.Spec.GetValue()); b != "" {
				inUse[b] = true
			}
		}
	}
	for _, e := range ents {
		if inUse[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return removed, fmt.Errorf("removing spawner build %s: %w", e.Name(), err)
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

// spawner is what runs a sandbox's commands, read from its own spec (the
// init it was made with): a sandbox keeps the scheme it was made with
// whatever the host's configuration has become since.
type spawner int

const (
	noSpawner       spawner = iota // commands are runsc exec's processes
	shellSpawner                   // spawnInitScript and relayScript
	compiledSpawner                // spawnPath's init and relay
)

// spawnerOf tells a sandbox's spawner from its init's argv.
func spawnerOf(initArgs []string) spawner {
	switch {
	case len(initArgs) == 3 && initArgs[0] == "/bin/sh" && initArgs[2] == spawnInitScript:
		return shellSpawner
	case len(initArgs) == 3 && initArgs[0] == spawnPath && initArgs[1] == "init":
		return compiledSpawner
	}
	return noSpawner
}

// compiledRelayArgs is the argv of the compiled relay (package spawn)
// that runs command under init, in dir, with exactly env; nproc is the
// limit it gives the command should it run it itself.
func compiledRelayArgs(stdin bool, dir string, env, command []string, nproc int64) []string {
	return append([]string{spawnPath, "relay"}, spawn.RelayArgs(nproc, stdin, dir, env, command)...)
}

// relayNoDir reports whether a relay's result says the command's
// directory is not there (the spawner's cd failure: status 2, that line
// alone on stderr), and what it says.
func relayNoDir(code int, stderr []byte) (string, bool) {
	msg := string(bytes.TrimSpace(stderr))
	if code != 2 || !strings.HasPrefix(msg, "corral: cd "+workspacePath) || strings.Contains(msg, "\n") {
		return "", false
	}
	return strings.TrimPrefix(msg, "corral: "), true
}

// relayOutOfProcesses reports whether a relay's result says init could
// not fork the command, the sandbox having as many processes as it may.
func relayOutOfProcesses(code int, stderr []byte) (string, bool) {
	msg := string(bytes.TrimSpace(stderr))
	if code != 126 || !strings.HasPrefix(msg, spawn.OutOfProcesses) || strings.Contains(msg, "\n") {
		return "", false
	}
	return msg, true
}

// spawnInitScript is the gVisor sandbox's init: it serves the spawn FIFO,
// reaps what ends (jobs runs the shell's non-blocking wait), and exits on
// SIGTERM. Without a FIFO it falls back to sleeping and reaping. It holds
// the FIFO open for reading and writing, once: a relay's open then never
// waits for init, nor init's for a relay. Opened afresh for each batch of
// commands, the open for reading was interrupted by every SIGCHLD and made
// again, and under the orphans of a fork bomb (reparented to init, each
// ending with a SIGCHLD) it never stayed long enough for a relay's open to
// meet it: the next command waited out its timeout. Commands do not inherit
// the FIFO.
const spawnInitScript = `trap 'exit 0' TERM
d=/tmp/.corral
if mkdir -m 700 "$d" && mkfifo -m 600 "$d/spawn" && exec 3<>"$d/spawn"; then
  while :; do
    read -r id <&3 || continue
    case $id in ''|*[!0-9a-f]*) continue ;; esac
    w=$d/$id
    (exec 3<&-; i=/dev/null; [ -p "$w.in" ] && i=$w.in
     setsid sh "$w.run" <"$i" >"$w.out" 2>"$w.err"; echo $? 1<>"$w.rc"; rm -f "$w".*) &
    jobs >/dev/null
  done
fi
while :; do sleep 3600 & wait $!; done`

// relayNotFound starts the relay's message for a command not on the PATH,
// the shell relay's and the compiled one's.
const relayNotFound = spawn.NotFound

// relayScript is the exec'd relay: $1 the command's id, $2 "1" when there
// is standard input, $3 the command line to run (runLine), $4 the
// command's argv[0], $5 "1" when the sandbox's init is the spawner. Where
// init cannot take the command (no spawn FIFO, or no process left to fork
// under a fork bomb) the relay runs it itself, and ends with the command
// line's status if that returns (a cd that failed) rather than go on into
// the spawn protocol, which would have init run it again. A spawner's FIFO may not be
// made yet when the first command comes right after the sandbox started
// (init makes it with two processes of its own, slow on a busy host): the
// relay waits for it, at most 5 s, rather than run the command itself,
// which a pause would then kill.
// Every process it starts costs milliseconds under gVisor: one mkfifo
// makes all the command's FIFOs, and init removes them after.
const relayScript = `d=/tmp/.corral; id=$1; in=$2; run=$3
n=0; while [ "$5" = 1 ] && [ ! -p "$d/spawn" ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
command -v -- "$4" >/dev/null 2>&1 || { printf '%s%s\n' '` + relayNotFound + `' "$4" >&2; exit 127; }
w=$d/$id; f="$w.out $w.err $w.rc"; [ "$in" = 1 ] && f="$f $w.in"
{ [ -p "$d/spawn" ] && mkfifo -m 600 $f; } 2>/dev/null || { eval "$run"; exit; }
exec 3<>"$w.rc" 4<&0
printf '%s\n' "$run" >"$w.run"
cat "$w.out" & cat "$w.err" >&2 &
[ "$in" = 1 ] && cat <&4 >"$w.in" &
echo "$id" >"$d/spawn"
read -r rc <&3
exit "$rc"`

// spawnHeadroom is how many processes more than the sandbox's limit init
// and the relays may have (RLIMIT_NPROC counts every process of the
// sandbox's user): a command's own limit is the sandbox's.
const spawnHeadroom = 16

// relayArgs is the argv of the exec'd relay that runs the command under
// init, in dir, with exactly env and at most nproc processes.
func relayArgs(id string, stdin bool, dir string, env, command []string, nproc int64, spawner bool) []string {
	in, sp := "0", "0"
	if stdin {
		in = "1"
	}
	if spawner {
		sp = "1"
	}
	return []string{"/bin/sh", "-c", relayScript, "corral-relay", id, in, runLine(dir, env, command, nproc), command[0], sp}
}

// runLine is the shell command line that lowers RLIMIT_NPROC to nproc
// (busybox sh says -u, dash -p), then runs command in dir with env. The
// environment it starts from is the sandbox's (init's, or the relay's),
// which env only adds to; of what the shell sets itself, OLDPWD (set by
// cd) is removed, PWD and SHLVL stay, as with any sh -c.
func runLine(dir string, env, command []string, nproc int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{ ulimit -u %d || ulimit -p %d; } 2>/dev/null; cd -- ", nproc, nproc)
	b.WriteString(shellQuote(dir))
	b.WriteString(" && unset OLDPWD && export")
	for _, kv := range env {
		b.WriteByte(' ')
		b.WriteString(shellQuote(kv))
	}
	b.WriteString(" && exec")
	for _, a := range command {
		b.WriteByte(' ')
		b.WriteString(shellQuote(a))
	}
	return b.String()
}

// shellQuote quotes s for sh: in single quotes, each single quote in s
// closed, escaped with a backslash and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// relayMissing reports whether a relay's result says its command was not
// found, and the message.
func relayMissing(code int, stderr []byte) (string, bool) {
	msg := string(bytes.TrimSpace(stderr))
	if code != 127 || !strings.HasPrefix(msg, relayNotFound) || strings.Contains(msg, "\n") {
		return "", false
	}
	return fmt.Sprintf("%s: not found on the sandbox's PATH", strings.TrimPrefix(msg, relayNotFound)), true
}
