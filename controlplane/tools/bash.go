package tools

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/internal/errdefs"
)

type bashInput struct {
	Command   *string `json:"command"`
	Restart   bool    `json:"restart"`
	TimeoutMS *int64  `json:"timeout_ms"`
}

// bashCall is a command made ready to run: the shell script and the
// marker its shell prints its final directory after.
type bashCall struct {
	script  string
	marker  string
	timeout time.Duration
}

// argv runs the script under shell (bash, or sh in images without it).
func (c bashCall) argv(shell string) []string { return []string{shell, "-c", c.script} }

// prepareBash builds the script for command, to start in cwd ("" is the
// workspace). An EXIT trap prints the final directory after a marker: one
// derived from the execution id, so that a runner that attaches to the
// command after a failover finds it in the output, or a fresh one.
//
// The directory is printed relative to the workspace (where every command's
// shell starts) when it lies beneath it: a sandbox moved to another host by
// a drain keeps its workspace's contents but not necessarily its absolute
// path (the process runtime's workspace is a host directory), and the next
// command must start in the same place within it.
//
// The script reads directories from $PWD, not $(pwd): a command
// substitution forks a subshell, and a fork is dear under gVisor (two of
// them made a bash call of `true` cost about 1.5x a raw exec of it; about
// 1.1x without). Both bash and sh keep $PWD current across cd and check it
// at startup; only a command that sets PWD itself, or removes its own
// directory, makes the trap fall back to pwd (shell_test.go).
func prepareBash(command, cwd, executionID string, timeout time.Duration) bashCall {
	var nonce [8]byte
	if executionID != "" {
		sum := sha256.Sum256([]byte("corral bash marker\x00" + executionID))
		copy(nonce[:], sum[:])
	} else {
		_, _ = rand.Read(nonce[:])
	}
	marker := "__corral_cwd_" + hex.EncodeToString(nonce[:]) + "__"
	var script strings.Builder
	script.WriteString("__corral_ws=$PWD\n")
	fmt.Fprintf(&script, "trap '__corral_d=$PWD; [ \"$__corral_d\" -ef . ] || __corral_d=$(pwd); case \"$__corral_d\" in \"$__corral_ws\") __corral_d=. ;; \"$__corral_ws\"/*) __corral_d=${__corral_d#\"$__corral_ws\"/} ;; esac; printf \"\\n%s%%s\\n\" \"$__corral_d\"' EXIT\n", marker)
	if cwd != "" && cwd != "." {
		fmt.Fprintf(&script, "cd %s 2>/dev/null || printf 'corral: the directory %%s is gone; starting in %%s\\n' %s \"$PWD\" >&2\n", shellQuote(cwd), shellQuote(cwd))
	}
	script.WriteString(command)
	script.WriteString("\n")
	return bashCall{script: script.String(), marker: marker, timeout: timeout}
}

// splitCwd removes the marker line from stdout and returns the directory
// it named ("" when the shell did not get to print it: killed, exec'd).
func splitCwd(stdout []byte, marker string) ([]byte, string) {
	i := bytes.LastIndex(stdout, []byte("\n"+marker))
	if i < 0 {
		return stdout, ""
	}
	rest := stdout[i+1+len(marker):]
	dir, _, _ := bytes.Cut(rest, []byte("\n"))
	return stdout[:i], string(dir)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// bashTimeout checks timeout_ms against l (with its defaults filled).
func bashTimeout(ms *int64, l agentloop.ExecLimits) (time.Duration, error) {
	if ms == nil {
		return l.DefaultTimeout, nil
	}
	if *ms <= 0 {
		return 0, fmt.Errorf("timeout_ms must be positive, got %d", *ms)
	}
	if *ms > l.MaxTimeout.Milliseconds() {
		return 0, fmt.Errorf("timeout_ms %d is over the limit of %d", *ms, l.MaxTimeout.Milliseconds())
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

// formatBash is the tool result text of a finished command.
func formatBash(res ExecResult, stdout []byte, timeout time.Duration, maxOutput int) (string, bool) {
	if res.Lost != "" {
		return "[the command's result is lost: " + res.Lost + "]", true
	}
	var b strings.Builder
	b.Write(stdout)
	if len(res.Stderr) > 0 {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
		b.Write(res.Stderr)
	}
	text := strings.TrimRight(b.String(), "\n")
	var notes []string
	if res.Truncated {
		notes = append(notes, fmt.Sprintf("[output truncated: only the first and last bytes of each stream are kept, up to %d per stream]", maxOutput))
	}
	if res.TimedOut {
		notes = append(notes, fmt.Sprintf("[command timed out after %s and was killed (exit code %d)]", timeout, res.ExitCode))
	} else if res.ExitCode != 0 {
		notes = append(notes, fmt.Sprintf("[exit code %d]", res.ExitCode))
	}
	for _, n := range notes {
		if text != "" {
			text += "\n"
		}
		text += n
	}
	if text == "" {
		text = "(no output)"
	}
	return text, res.TimedOut
}

// runBash is the bash tool. executionID names the command on the host, so
// that it runs once however often the call is made.
func (r *Toolset) runBash(ctx context.Context, sessionID, executionID string, sb *lazySandbox, in bashInput) (string, bool, error) {
	if in.Restart {
		r.setCwd(sessionID, "")
		if in.Command == nil {
			return "The shell was restarted: the next command starts in " + Workspace + ".", false, nil
		}
	}
	if in.Command == nil || strings.TrimSpace(*in.Command) == "" {
		return "", false, inputError("bash: command is required (or restart: true)")
	}
	timeout, err := bashTimeout(in.TimeoutMS, r.limits)
	if err != nil {
		return "", false, inputError("bash: %v", err)
	}
	// The sandbox first: a replaced one resets the directory and shell.
	if _, err := sb.get(ctx); err != nil {
		return "", false, err
	}
	call := prepareBash(*in.Command, r.cwd(sessionID), executionID, timeout)
	shell := r.shell(sessionID)
	res, err := sb.Exec(ctx, ExecRequest{Command: call.argv(shell), Timeout: timeout, MaxOutput: r.limits.MaxOutputBytes, ExecutionID: executionID})
	if shell == "bash" && errdefs.IsInvalidArgument(err) {
		// The image has no bash (it could not be started): sh from now on,
		// under an id of its own (the host keeps the failed start).
		r.setNoBash(sessionID)
		shID := ""
		if executionID != "" {
			shID = executionID + "/sh"
		}
		res, err = sb.Exec(ctx, ExecRequest{Command: call.argv("sh"), Timeout: timeout, MaxOutput: r.limits.MaxOutputBytes, ExecutionID: shID})
	}
	if errdefs.IsInvalidArgument(err) && !isSandboxErr(err) {
		// The shell could not be started: the host's words name the
		// runtime's wrapper, which are not the model's business.
		return "bash: the command could not start (the sandbox has neither bash nor sh?)", true, nil
	}
	if err != nil {
		return hostError("bash", err)
	}
	stdout, dir := splitCwd(res.Stdout, call.marker)
	if dir != "" {
		r.setCwd(sessionID, dir)
	}
	text, isErr := formatBash(res, stdout, timeout, r.limits.MaxOutputBytes)
	return text, isErr, nil
}
