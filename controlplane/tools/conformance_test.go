package tools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/tools"
)

// The conformance body runs every tool through a real host agent: on the
// process driver (fast, this machine's own programs) and in a gVisor
// sandbox with the Debian image.

// The output flood is a gigabyte on the process driver; in gVisor, where
// moving bytes through the sentry is slow (a gigabyte takes over a minute on
// two shared cores), 64 MiB makes the same point: cut, and the sandbox
// still answers.
func TestConformanceProcess(t *testing.T) { runConformance(t, processHost(t).Sandbox(), 1<<30) }

func TestConformanceGVisor(t *testing.T) { runConformance(t, gvisorHost(t).Sandbox(), 64<<20) }

// callIDs numbers the calls' tool_use ids: each call is a new tool use
// (the id is the host's execution id: a repeated one is not run again).
var callIDs atomic.Int64

// call runs one tool call and returns the result's text.
func call(t *testing.T, r *tools.Toolset, session, name string, input any) (string, bool) {
	t.Helper()
	raw, ok := input.(string)
	if !ok {
		b, err := json.Marshal(input)
		if err != nil {
			t.Fatal(err)
		}
		raw = string(b)
	}
	res, err := r.Run(context.Background(), session, agentloop.ToolCall{EventID: fmt.Sprintf("sevt_%d", callIDs.Add(1)), Name: name, Input: []byte(raw)})
	if err != nil {
		t.Fatalf("%s %s: %v", name, raw, err)
	}
	if len(res.Content) != 1 || res.Content[0].Type != "text" {
		t.Fatalf("%s %s: content %+v, want one text block", name, raw, res.Content)
	}
	return res.Content[0].Text, res.IsError
}

type m = map[string]any

func runConformance(t *testing.T, sb tools.Sandbox, flood int) {
	r := tools.NewToolset(func(context.Context, string) (tools.Sandbox, error) { return sb, nil }, agentloop.ExecLimits{})
	want := func(t *testing.T, name string, input any, wantErr bool, wantText ...string) string {
		t.Helper()
		text, isErr := call(t, r, t.Name(), name, input)
		if isErr != wantErr {
			t.Fatalf("%s %v: is_error %v, want %v; text:\n%s", name, input, isErr, wantErr, text)
		}
		for _, w := range wantText {
			if !strings.Contains(text, w) {
				t.Fatalf("%s %v: text %q lacks %q", name, input, text, w)
			}
		}
		return text
	}
	alive := func(t *testing.T) {
		t.Helper()
		if text := want(t, "bash", m{"command": "echo alive"}, false); text != "alive" {
			t.Fatalf("after that, echo alive = %q", text)
		}
	}

	t.Run("python", func(t *testing.T) {
		if text := want(t, "bash", m{"command": "python3 -c 'print(6*7)'"}, false); text != "42" {
			t.Fatalf("python3 printed %q, want 42", text)
		}
	})
	t.Run("write then read", func(t *testing.T) {
		want(t, "write", m{"file_path": "/workspace/out.txt", "content": "42\n"}, false, "3 bytes", "/workspace/out.txt")
		if text := want(t, "read", m{"file_path": "/workspace/out.txt"}, false); text != "     1\t42\n" {
			t.Fatalf("read = %q", text)
		}
		if text := want(t, "bash", m{"command": "cat out.txt"}, false); text != "42" {
			t.Fatalf("cat out.txt in the workspace = %q", text)
		}
	})
	t.Run("files over the limit", func(t *testing.T) {
		// A sparse 4 TiB file and a real 11 MiB one: refused from their
		// size, as tool errors, and the session goes on.
		want(t, "bash", m{"command": "truncate -s 4T huge && head -c 11534336 /dev/zero > big"}, false)
		want(t, "read", m{"file_path": "/workspace/huge"}, true, "read: /workspace/huge", "4.0 TiB", "10.0 MiB")
		want(t, "edit", m{"file_path": "/workspace/huge", "old_string": "a", "new_string": "b"}, true, "edit: /workspace/huge", "4.0 TiB")
		want(t, "read", m{"file_path": "/workspace/big"}, true, "11.0 MiB", "10.0 MiB")
		want(t, "grep", m{"pattern": "x", "path": "/workspace/huge"}, false)
		alive(t)
		want(t, "bash", m{"command": "rm -f huge big"}, false)
	})
	t.Run("bash keeps the directory", func(t *testing.T) {
		ws := want(t, "bash", m{"command": "pwd"}, false)
		want(t, "bash", m{"command": "mkdir -p d1/d2 && cd d1/d2"}, false)
		if text := want(t, "bash", m{"command": "pwd"}, false); text != ws+"/d1/d2" {
			t.Fatalf("pwd after cd = %q, want %q", text, ws+"/d1/d2")
		}
		want(t, "bash", m{"command": "cd .. && exit 3"}, false, "[exit code 3]")
		if text := want(t, "bash", m{"command": "pwd"}, false); text != ws+"/d1" {
			t.Fatalf("pwd after cd and exit = %q, want %q", text, ws+"/d1")
		}
		want(t, "bash", m{"restart": true}, false, "restarted")
		if text := want(t, "bash", m{"command": "pwd"}, false); text != ws {
			t.Fatalf("pwd after restart = %q, want %q", text, ws)
		}
		want(t, "bash", m{"command": "cd d1 && rmdir d2 2>/dev/null; cd d2 2>/dev/null || cd /tmp"}, false)
		want(t, "bash", m{"command": "cd " + ws + "/d1/d2"}, false, "[exit code")
		want(t, "bash", m{"command": "mkdir -p " + ws + "/gone && cd " + ws + "/gone"}, false)
		want(t, "bash", m{"command": "rmdir " + ws + "/gone"}, false)
		want(t, "bash", m{"command": "pwd"}, false, "is gone")
	})
	t.Run("bash output and exit", func(t *testing.T) {
		text := want(t, "bash", m{"command": "echo out; echo err >&2; exit 5"}, false)
		if text != "out\nerr\n[exit code 5]" {
			t.Fatalf("text = %q", text)
		}
		if text := want(t, "bash", m{"command": "true"}, false); text != "(no output)" {
			t.Fatalf("true = %q", text)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		want(t, "bash", m{"command": "sleep 600", "timeout_ms": 1500}, true, "timed out", "exit code 124")
		alive(t)
	})
	t.Run("output flood is cut", func(t *testing.T) {
		text := want(t, "bash", m{"command": fmt.Sprintf("head -c %d /dev/zero | tr '\\000' a; echo; echo the-end", flood)}, false, "output truncated", "bytes cut", "the-end")
		if len(text) > 3*agentloop.DefaultExecLimits.MaxOutputBytes {
			t.Fatalf("result is %d bytes, want it cut to about %d", len(text), 2*agentloop.DefaultExecLimits.MaxOutputBytes)
		}
		alive(t)
	})
	t.Run("read ranges", func(t *testing.T) {
		want(t, "write", m{"file_path": "lines.txt", "content": "one\ntwo\nthree\nfour"}, false)
		if text := want(t, "read", m{"file_path": "lines.txt", "view_range": []int{2, 3}}, false); text != "     2\ttwo\n     3\tthree\n" {
			t.Fatalf("view_range [2,3] = %q", text)
		}
		if text := want(t, "read", m{"file_path": "/workspace/lines.txt", "view_range": []int{3, -1}}, false); text != "     3\tthree\n     4\tfour\n" {
			t.Fatalf("view_range [3,-1] = %q", text)
		}
		want(t, "read", m{"file_path": "lines.txt", "view_range": []int{9, 10}}, true, "has 4 lines")
		want(t, "read", m{"file_path": "missing.txt"}, true, "/workspace/missing.txt does not exist")
	})
	t.Run("edit", func(t *testing.T) {
		want(t, "write", m{"file_path": "e.sh", "content": "#!/bin/sh\necho a\necho a\necho b\n"}, false)
		want(t, "bash", m{"command": "chmod 755 e.sh"}, false)
		want(t, "edit", m{"file_path": "e.sh", "old_string": "echo c", "new_string": "x"}, true, "not found")
		want(t, "edit", m{"file_path": "e.sh", "old_string": "echo a", "new_string": "x"}, true, "occurs 2 times", "replace_all")
		want(t, "edit", m{"file_path": "e.sh", "old_string": "echo b", "new_string": "echo c"}, false, "Replaced 1 occurrence")
		want(t, "edit", m{"file_path": "e.sh", "old_string": "echo a", "new_string": "echo z", "replace_all": true}, false, "Replaced 2 occurrences")
		if text := want(t, "bash", m{"command": "./e.sh"}, false); text != "z\nz\nc" {
			t.Fatalf("edited script printed %q (it must stay executable)", text)
		}
		want(t, "edit", m{"file_path": "nope.txt", "old_string": "a", "new_string": "b"}, true, "does not exist")
	})
	t.Run("glob", func(t *testing.T) {
		for _, f := range []string{"g/a.py", "g/sub/b.py", "g/sub/c.txt", "g/sub/deep/d.py"} {
			want(t, "write", m{"file_path": f, "content": "print('hello')\n"}, false)
		}
		text := want(t, "glob", m{"pattern": "**/*.py", "path": "/workspace/g"}, false)
		if got := lines(text); strings.Join(sorted(got), ",") != "/workspace/g/a.py,/workspace/g/sub/b.py,/workspace/g/sub/deep/d.py" {
			t.Fatalf("glob **/*.py = %q", text)
		}
		if text := want(t, "glob", m{"pattern": "g/*.py"}, false); text != "/workspace/g/a.py\n" {
			t.Fatalf("glob g/*.py = %q", text)
		}
		if text := want(t, "glob", m{"pattern": "/workspace/g/sub/*.txt"}, false); text != "/workspace/g/sub/c.txt\n" {
			t.Fatalf("glob absolute = %q", text)
		}
		want(t, "glob", m{"pattern": "*.nothing"}, false, "No files found")
		want(t, "glob", m{"pattern": "[", "path": "g"}, true, "pattern")
	})
	t.Run("grep", func(t *testing.T) {
		want(t, "write", m{"file_path": "s/one.go", "content": "package one\n// TODO fix\nfunc A() {}\n"}, false)
		want(t, "write", m{"file_path": "s/two.txt", "content": "todo later\nTODO now\n"}, false)
		if text := want(t, "grep", m{"pattern": "TODO", "path": "s"}, false); strings.Join(sorted(lines(text)), ",") != "/workspace/s/one.go,/workspace/s/two.txt" {
			t.Fatalf("grep files = %q", text)
		}
		if text := want(t, "grep", m{"pattern": "TODO", "path": "s", "glob": "*.go", "output_mode": "content"}, false); text != "/workspace/s/one.go:2:// TODO fix\n" {
			t.Fatalf("grep content = %q", text)
		}
		if text := want(t, "grep", m{"pattern": "todo", "path": "/workspace/s/two.txt", "case_insensitive": true, "output_mode": "count"}, false); text != "/workspace/s/two.txt:2\n" {
			t.Fatalf("grep count = %q", text)
		}
		want(t, "grep", m{"pattern": "(", "path": "s"}, true, "not a valid regular expression")
		want(t, "grep", m{"pattern": "x", "output_mode": "everything"}, true, "output_mode")
	})
	t.Run("paths outside the workspace", func(t *testing.T) {
		want(t, "read", m{"file_path": "/etc/passwd"}, true, "outside the workspace")
		want(t, "read", m{"file_path": "../../etc/passwd"}, true, "outside the workspace")
		want(t, "write", m{"file_path": "/tmp/x", "content": "x"}, true, "outside the workspace")
		want(t, "glob", m{"pattern": "*", "path": "/etc"}, true, "outside the workspace")
		// A symlink that leads out is refused by the host.
		want(t, "bash", m{"command": "ln -s /etc etc-link"}, false)
		want(t, "read", m{"file_path": "etc-link/passwd"}, true, "etc-link/passwd")
		want(t, "write", m{"file_path": "etc-link/corral-test", "content": "x"}, true, "etc-link/corral-test")
	})
	t.Run("bad input", func(t *testing.T) {
		want(t, "bash", `{"command": 5}`, true, "command must be of type string")
		want(t, "bash", `{}`, true, "command is required")
		want(t, "bash", `{"command": "true", "timeout_ms": -1}`, true, "timeout_ms must be positive")
		want(t, "bash", `{"command": "true", "timeout_ms": 3600000}`, true, "over the limit")
		want(t, "read", `{}`, true, "a path is required")
		want(t, "read", `{"file_path": "x", "mode": "fast"}`, true, `unknown field "mode"`)
		want(t, "read", `[1]`, true, "must be a JSON object")
		want(t, "read", `{"file_path": "x"} {}`, true, "after its JSON object")
		want(t, "read", `{"file_path": "x", "view_range": [1]}`, true, "view_range")
		want(t, "write", `{"file_path": "x"}`, true, "content is required")
		want(t, "edit", `{"file_path": "x", "old_string": "a"}`, true, "required")
		want(t, "grep", `{"pattern": "x", "head_limit": "ten"}`, true, "head_limit must be of type integer")
		want(t, "web_fetch", `{"url": "https://example.com"}`, true, "does not run in the sandbox")
		alive(t)
	})
}

func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
