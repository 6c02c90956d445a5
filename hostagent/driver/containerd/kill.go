package containerd

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A timed out or cancelled command is killed with everything it started,
// found by what the sandboxed code cannot change: the time a process
// started and its parent. Process groups, sessions and the environment do
// not do (setsid and env -i leave them), and neither gVisor nor runc gives
// an exec a cgroup or pid namespace of its own (an unprivileged user
// namespace would, but only by making the command root inside it, or
// nobody). So the killer, run inside the sandbox, kills every process that
// started after the command did and whose ancestors (up to the sandbox's
// init, which adopts orphans) all did too: the command's descendants,
// including daemons that detached and were reparented to init. A process
// that an earlier command left running, and what it forks, is spared (its
// ancestry holds a process older than the command). The sandbox runs one
// session's tool calls one after another, so nothing else starts in that
// window; a command run concurrently through another execution in the same
// sandbox would be killed too. RLIMIT_NPROC (gVisor) or the pids cgroup
// (runc) bounds how many processes there can be; the killer freezes them
// before it looks (see killScript).
//
// Under gVisor the killer runs as root inside the sandbox, which gVisor
// exempts from RLIMIT_NPROC, so it starts even when a fork bomb has used
// every process the sandbox's user may have. If it still cannot start (the
// pids cgroup is full under runc), or processes are left after its last
// pass, the sandbox is restarted: its task killed and a new init started
// over the same workspace (restart), so the session goes on either way.

// killScript is the killer: $1 is how many clock ticks (1/100 s) before
// the killer the command was started; for a served command (serve.go) $2
// is the sandbox's clock at its start, as the server read it (the mark,
// no search), or empty, and $3 the server's pid, which it spares and takes
// for the commands' parent as it does init, or 0.
//
// A fork bomb churns faster than a pass over /proc can list it, and
// starves the killer of CPU, so the killer first stops every process it may
// signal but init (kill -STOP -1, one atomic call, made again on every
// pass for forks that were under way); stopped, nothing forks or runs. It
// then finds the mark: the command's own process is an exec like the
// killer (parent 0, the runtime's); of those still there, the one that
// started closest to $1 ticks ago is the command, and its start is the mark
// (were it gone, a second earlier than $1 says). It kills every process
// that started at the mark or later with no older ancestor below init, and
// goes round until two passes in a row find none. It spares init's own
// session (session id 1): init and the children it forks itself (its
// sleep, the spawner's wrappers), which a command cannot join (every exec
// starts a session of its own, and setsid or setpgid never lead back into
// another), and which would otherwise be killed whenever init forked them
// after the command started (a new sandbox's init on a busy host) and be
// forked again on every pass; then it lets the rest
// run again (kill -CONT -1) and exits 0, or 3 if processes were still found
// after its last pass. It forks nothing (builtins and redirections only),
// so it works when no process can be made.
const killScript = `ago=$1 t=$2 srv=${3:-0}
read -r line < /proc/$$/stat
set -- ${line##*) }
want=$((${20} - ago))
mark=$t best= clean=0 round=0
kill -STOP -1 2>/dev/null
while [ $round -lt 60 ]; do
  round=$((round + 1))
  kill -STOP -1 2>/dev/null
  pids=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    read -r line 2>/dev/null < "$d/stat" || continue
    set -- ${line##*) }
    eval "pp_$p=$2 st_$p=${20} s_$p=$1 sid_$p=$4"
    pids="$pids $p"
    if [ $round = 1 ] && [ -z "$mark" ] && [ "$2" = 0 ] && [ "$p" != 1 ] && [ "$p" != $$ ] && [ "$p" != "$srv" ]; then
      d=$((${20} - want)); [ $d -lt 0 ] && d=$((-d))
      if [ -z "$best" ] || [ $d -lt $best ]; then best=$d t=${20}; fi
    fi
  done
  [ -z "$t" ] && t=$((want - 100))
  kill=
  for p in $pids; do
    [ "$p" = 1 ] || [ "$p" = $$ ] || [ "$p" = "$srv" ] && continue
    eval "s=\$s_$p sid=\$sid_$p"
    [ "$s" = Z ] || [ "$sid" = 1 ] && continue
    q=$p hops=0 old=
    while [ "$q" != 0 ] && [ "$q" != 1 ] && [ "$q" != "$srv" ] && [ $hops -lt 4096 ]; do
      eval "st=\${st_$q:-} pp=\${pp_$q:-0}"
      [ -z "$st" ] && break
      [ "$st" -lt "$t" ] && { old=1; break; }
      q=$pp hops=$((hops + 1))
    done
    [ -z "$old" ] && kill="$kill $p"
  done
  for p in $pids; do unset "pp_$p" "st_$p" "s_$p" "sid_$p"; done
  if [ -z "$kill" ]; then
    clean=$((clean + 1))
    [ $clean = 2 ] && { kill -CONT -1 2>/dev/null; exit 0; }
  else
    clean=0
    kill -9 $kill 2>/dev/null
  fi
done
kill -CONT -1 2>/dev/null
exit 3`

// killTree kills what a timed out or cancelled command started at started
// (see killScript), falling back to restarting the whole task; bounded in
// time.
func (s *sandbox) killTree(ctx context.Context, task client.Task, base specs.Process, started time.Time) {
	s.killTreeMarked(ctx, task, base, started, "", 0)
}

// killTreeMarked is killTree of a served command (serve.go): mark, when
// known, is the sandbox's clock at its start, as the server read it, and
// server the server's pid, which the killer spares and takes for the
// commands' parent, as it does init.
func (s *sandbox) killTreeMarked(ctx context.Context, task client.Task, base specs.Process, started time.Time, mark string, server int) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	ago := strconv.FormatInt(time.Since(started).Milliseconds()/10, 10)
	base.Args = []string{"/bin/sh", "-c", killScript, "kill", ago, mark, strconv.Itoa(server)}
	base.Env = envList()
	base.Cwd = "/"
	if s.d.cfg.Runtime == RuntimeGVisor {
		// Root inside gVisor is the Sentry's, not the host's: it is
		// exempt from RLIMIT_NPROC and may signal the sandbox's user.
		base.User = specs.User{UID: 0, GID: 0}
		base.Capabilities = &specs.LinuxCapabilities{
			Bounding: []string{"CAP_KILL"}, Effective: []string{"CAP_KILL"}, Permitted: []string{"CAP_KILL"},
		}
	}
	err := s.runKiller(ctx, task, &base)
	if err == nil {
		return
	}
	s.d.cfg.Logger.Warn("killing a command's processes failed; restarting the sandbox", "sandbox", s.ref.ID, "err", err)
	if err := s.restart(ctx, task); err != nil {
		s.d.cfg.Logger.Error("restarting the sandbox; the next command tries again", "sandbox", s.ref.ID, "err", err)
	}
}

// runKiller runs the killer process to its end.
func (s *sandbox) runKiller(ctx context.Context, task client.Task, proc *specs.Process) error {
	id := strings.TrimPrefix(newID(), "corral-")
	p, err := task.Exec(ctx, id, proc, cio.NullIO)
	if err != nil {
		return err
	}
	defer func() { _, _ = p.Delete(context.WithoutCancel(ctx)) }()
	exited, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	select {
	case st := <-exited:
		if code := st.ExitCode(); code != 0 {
			return fmt.Errorf("the killer exited %d", code)
		}
		return st.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}
