package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
)

// TestHostileToolInputs: through `corral dev` with gVisor, one session's
// model does what a hostile tenant would: reads a 4 TiB sparse file and a
// 1 GiB one, runs a fork bomb past its timeout, escapes the timeout with
// env -i setsid, leaves a fork bomb running, and names a path with a NUL
// byte. Each call gets a tool error or a timeout result (never a
// session.error), the next call in the same session works, nothing the
// command started outlives its timeout, and the process (control plane
// and host agent in one) never grows past a generous bound.
func TestHostileToolInputs(t *testing.T) {
	requireGVisor(t)
	dir := dataDir(t)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--runtime", "gvisor")
	dev.waitListening(t)
	env := readEnv(t, dir)
	c := api{base: env["CORRAL_URL"], key: env["CORRAL_API_KEY"]}
	agent := c.must(t, "POST", "/v1/agents?beta=true", map[string]any{"name": "hostile", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	envr := c.must(t, "POST", "/v1/environments?beta=true", map[string]any{"name": "hostile"})
	session := c.must(t, "POST", "/v1/sessions?beta=true", map[string]any{"agent": agent["id"], "environment_id": envr["id"]})["id"].(string)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := json.Marshal(allEvents(t, c, session))
			t.Logf("the session's events: %s", b)
			t.Logf("corral dev's log:\n%s", dev.stderr.String())
		}
	})

	// call plays one tool call (a `!tool NAME JSON` line) as a turn and
	// returns its result's text and is_error, failing on a session.error.
	results := 0
	call := func(t *testing.T, line string) (string, bool) {
		t.Helper()
		msg := map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": line}}},
		}}
		waitfor.State(t, time.Minute, "the message to be accepted", func() (bool, string) {
			code, out := c.do(t, "POST", "/v1/sessions/"+session+"/events?beta=true", msg)
			if code != http.StatusOK && code != http.StatusTooManyRequests {
				t.Fatalf("sending %s: %d %v", line, code, out)
			}
			return code == http.StatusOK, fmt.Sprint(code, out)
		})
		// The turn has ended when its tool result is in the log with a
		// session.status_idle after it: read from the log alone, one
		// request a poll, which keeps the polls under the tenant's request
		// rate (a status read besides, as before, could be the previous
		// turn's idle: the runner makes the session running only when it
		// takes the message up).
		var evs []map[string]any
		waitfor.Cond(t, 3*time.Minute, "the turn of "+line+" to end", func() bool {
			evs = allEvents(t, c, session)
			n := 0
			for _, e := range evs {
				switch e["type"] {
				case "agent.tool_result":
					n++
				case "session.status_idle":
					if n > results {
						return true
					}
				}
			}
			return false
		})
		results++
		var last map[string]any
		for _, e := range evs {
			switch e["type"] {
			case "session.error":
				t.Fatalf("session.error after %s: %v", line, e["error"])
			case "agent.tool_result":
				last = e
			}
		}
		var text strings.Builder
		for _, b := range last["content"].([]any) {
			text.WriteString(fmt.Sprint(b.(map[string]any)["text"]))
		}
		isErr, _ := last["is_error"].(bool)
		return text.String(), isErr
	}
	bash := func(t *testing.T, command string, timeoutMS int) (string, bool) {
		t.Helper()
		in := map[string]any{"command": command}
		if timeoutMS > 0 {
			in["timeout_ms"] = timeoutMS
		}
		b, _ := json.Marshal(in)
		return call(t, "!tool bash "+string(b))
	}
	// alive checks that a call works; its output may say that a fork
	// bomb left running was killed first to make room for it.
	alive := func(t *testing.T) {
		t.Helper()
		text, isErr := bash(t, "echo alive", 0)
		if first, rest, _ := strings.Cut(text, "\n"); isErr || first != "alive" || rest != "" && !strings.Contains(rest, "out of processes") {
			t.Fatalf("the next call: %q (is_error %v), want alive", text, isErr)
		}
	}
	// ps lists the sandbox's processes without forking more than one.
	ps := func(t *testing.T) string {
		t.Helper()
		text, _ := bash(t, `for d in /proc/[0-9]*
do tr '\0' ' ' < $d/cmdline 2>/dev/null
echo
done`, 0)
		return text
	}

	if text, isErr := bash(t, "truncate -s 4T /workspace/huge && truncate -s 1G /workspace/big && echo made", 0); isErr || text != "made" {
		t.Fatalf("making the files: %q", text)
	}
	t.Run("read 4 TiB", func(t *testing.T) {
		text, isErr := call(t, `!tool read {"file_path":"/workspace/huge"}`)
		if !isErr || !strings.Contains(text, "4.0 TiB") || !strings.Contains(text, "10.0 MiB") {
			t.Errorf("read of a 4 TiB file: %q (is_error %v), want a tool error naming its size and the limit", text, isErr)
		}
		alive(t)
	})
	t.Run("read and edit 1 GiB", func(t *testing.T) {
		text, isErr := call(t, `!tool read {"file_path":"/workspace/big"}`)
		if !isErr || !strings.Contains(text, "1.0 GiB") {
			t.Errorf("read of a 1 GiB file: %q (is_error %v)", text, isErr)
		}
		text, isErr = call(t, `!tool edit {"file_path":"/workspace/big","old_string":"a","new_string":"b"}`)
		if !isErr || !strings.Contains(text, "1.0 GiB") {
			t.Errorf("edit of a 1 GiB file: %q (is_error %v)", text, isErr)
		}
		alive(t)
	})
	t.Run("fork bomb past its timeout", func(t *testing.T) {
		text, isErr := bash(t, "(b(){ b | b & }; b) &\nexec sleep 600", 3000) // one fork, before the bomb exists
		// The command times out; or, on a loaded machine, the bomb stops
		// the sandbox's init first (gVisor's, seen in CI beside a CPU
		// hog), and the host restarts the sandbox and says so. Either way
		// the bomb ends with its command and the session goes on (below).
		switch {
		case isErr && strings.Contains(text, "timed out"):
		case strings.Contains(text, "the sandbox stopped while this command ran (it was restarted for the next one)"):
			t.Logf("the fork bomb stopped the sandbox before its timeout: %q", text)
		default:
			t.Errorf("fork bomb: %q (is_error %v), want a timeout or the sandbox's restart", text, isErr)
		}
		if got := ps(t); strings.Contains(got, "sleep 600") || strings.Count(got, "\n") > 10 {
			t.Errorf("after the timeout the bomb still runs:\n%s", got)
		}
		alive(t)
	})
	t.Run("setsid escape", func(t *testing.T) {
		text, isErr := bash(t, "env -i setsid sh -c 'sleep 1001' >/dev/null 2>&1 &\nsleep 602", 2000)
		if !isErr || !strings.Contains(text, "timed out") {
			t.Errorf("setsid escape: %q (is_error %v), want a timeout", text, isErr)
		}
		if got := ps(t); strings.Contains(got, "sleep 1001") || strings.Contains(got, "sleep 602") {
			t.Errorf("after the timeout the escaped child still runs:\n%s", got)
		}
		alive(t)
	})
	t.Run("fork bomb that returns at once", func(t *testing.T) {
		bash(t, "b(){ b | b & }\nb", 5000)
		// Every later call works: one that finds the sandbox out of
		// processes kills them first, and says so.
		for range 3 {
			alive(t)
		}
	})
	t.Run("NUL in a path", func(t *testing.T) {
		text, isErr := call(t, `!tool read {"file_path":"/workspace/a\u0000/../x"}`)
		if !isErr || !strings.Contains(text, "NUL") {
			t.Errorf("a NUL in a path: %q (is_error %v), want a tool error naming it", text, isErr)
		}
		alive(t)
	})
	t.Run("no internal words", func(t *testing.T) {
		for _, e := range allEvents(t, c, session) {
			// What the tenant reads, not the events' random ids (an id
			// once spelled "GRPC").
			ids := map[string]any{}
			for k, v := range e {
				if k == "id" || strings.HasSuffix(k, "_id") {
					ids[k] = v
					delete(e, k)
				}
			}
			b, _ := json.Marshal(e)
			for _, w := range []string{"OCI runtime", "urpc", "grpc", "rpc error", "trying to send message"} {
				if strings.Contains(strings.ToLower(string(b)), strings.ToLower(w)) {
					t.Errorf("an event carries internal text %q: %s (ids %v)", w, b, ids)
				}
			}
		}
	})
	// Peak resident memory of corral dev (control plane and host agent):
	// reading the 4 TiB file used to kill it, the 1 GiB one to grow it by
	// 2 GiB.
	if peak := peakRSS(t, dev.cmd.Process.Pid); peak > 1<<30 {
		t.Errorf("corral dev's peak resident memory is %d MiB, want under 1 GiB", peak>>20)
	} else {
		t.Logf("corral dev's peak resident memory: %d MiB", peak>>20)
	}
}

// peakRSS is a process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

// allEvents is a session's log in one request (up to 1000 events), so that
// polling stays under the tenant's request rate; nil if the request was
// refused (rate limited), which the caller's poll tries again.
func allEvents(t *testing.T, c api, sessionID string) []map[string]any {
	t.Helper()
	code, out := c.do(t, "GET", "/v1/sessions/"+sessionID+"/events?beta=true&limit=1000", nil)
	if code != http.StatusOK {
		return nil
	}
	data, _ := out["data"].([]any)
	evs := make([]map[string]any, 0, len(data))
	for _, d := range data {
		evs = append(evs, d.(map[string]any))
	}
	return evs
}
