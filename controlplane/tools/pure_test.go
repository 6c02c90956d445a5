package tools

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/internal/errdefs"
)

func TestRelPath(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{"/workspace/out.txt", "out.txt", ""},
		{"/workspace", ".", ""},
		{"/workspace/", ".", ""},
		{"/workspace/a/../b", "b", ""},
		{"out.txt", "out.txt", ""},
		{"./a/b/", "a/b", ""},
		{".", ".", ""},
		{"", "", "a path is required"},
		{"/etc/passwd", "", "outside the workspace"},
		{"/workspacex/a", "", "outside the workspace"},
		{"/workspace/../etc", "", "outside the workspace"},
		{"../x", "", "outside the workspace"},
		{"a/../../x", "", "outside the workspace"},
		{"..", "", "outside the workspace"},
		{"a\x00b", "", "NUL"},
	} {
		got, err := relPath(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("relPath(%q) = %q, %v; want error with %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("relPath(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestPrepareBashAndSplitCwd(t *testing.T) {
	c := prepareBash("echo hi", "/work/it's", "", time.Second)
	if argv := c.argv("bash"); len(argv) != 3 || argv[0] != "bash" || argv[1] != "-c" || argv[2] != c.script {
		t.Fatalf("argv = %q", argv)
	}
	script := c.script
	if !strings.Contains(script, `cd '/work/it'\''s'`) || !strings.HasSuffix(script, "echo hi\n") || !strings.Contains(script, c.marker) {
		t.Fatalf("script = %q", script)
	}
	if d := prepareBash("true", "", "", time.Second); strings.Contains(d.script, "cd ") || d.marker == c.marker {
		t.Fatalf("no cwd: script %q, marker reused: %v", d.script, d.marker == c.marker)
	}
	// With an execution id the marker is the id's: a runner that attaches
	// to the command after a failover finds it; another id gets another.
	a1, a2 := prepareBash("true", "", "s/e1", time.Second), prepareBash("true", "/elsewhere", "s/e1", time.Second)
	if b := prepareBash("true", "", "s/e2", time.Second); a1.marker != a2.marker || a1.marker == b.marker {
		t.Fatalf("markers for one id: %q %q, another id: %q", a1.marker, a2.marker, b.marker)
	}

	for _, tc := range []struct {
		out, wantOut, wantDir string
	}{
		{"hello\n\n" + c.marker + "/a/b\n", "hello\n", "/a/b"},
		{"\n" + c.marker + "/\n", "", "/"},
		{"no marker\n", "no marker\n", ""},
		{"x\n" + c.marker + "/early\ny\n\n" + c.marker + "/late\n", "x\n" + c.marker + "/early\ny\n", "/late"},
		{"cut\n[... 5 bytes cut ...]\n\n" + c.marker + "/d", "cut\n[... 5 bytes cut ...]\n", "/d"},
	} {
		out, dir := splitCwd([]byte(tc.out), c.marker)
		if string(out) != tc.wantOut || dir != tc.wantDir {
			t.Errorf("splitCwd(%q) = %q, %q; want %q, %q", tc.out, out, dir, tc.wantOut, tc.wantDir)
		}
	}
}

func TestFormatBash(t *testing.T) {
	for _, c := range []struct {
		name    string
		res     ExecResult
		stdout  string
		want    string
		wantErr bool
	}{
		{"plain", ExecResult{}, "42\n", "42", false},
		{"empty", ExecResult{}, "", "(no output)", false},
		{"stderr", ExecResult{Stderr: []byte("warn\n")}, "out", "out\nwarn", false},
		{"exit", ExecResult{ExitCode: 2}, "", "[exit code 2]", false},
		{"timeout", ExecResult{ExitCode: 124, TimedOut: true}, "partial\n", "partial\n[command timed out after 1s and was killed (exit code 124)]", true},
		{"lost", ExecResult{ExitCode: -1, Lost: "the host agent restarted while this command ran"}, "", "[the command's result is lost: the host agent restarted while this command ran]", true},
		{"truncated", ExecResult{Truncated: true}, "a\n[... 9 bytes cut ...]\nb\n", "a\n[... 9 bytes cut ...]\nb\n[output truncated: only the first and last bytes of each stream are kept, up to 30000 per stream]", false},
	} {
		got, isErr := formatBash(c.res, []byte(c.stdout), time.Second, agentloop.DefaultExecLimits.MaxOutputBytes)
		if got != c.want || isErr != c.wantErr {
			t.Errorf("%s: formatBash = %q, %v; want %q, %v", c.name, got, isErr, c.want, c.wantErr)
		}
	}
}

func TestBashTimeout(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		ms   *int64
		want time.Duration
		err  bool
	}{
		{nil, agentloop.DefaultExecLimits.DefaultTimeout, false},
		{n(1500), 1500 * time.Millisecond, false},
		{n(600000), agentloop.DefaultExecLimits.MaxTimeout, false},
		{n(600001), 0, true},
		{n(0), 0, true},
		{n(-5), 0, true},
	} {
		got, err := bashTimeout(c.ms, agentloop.DefaultExecLimits)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("bashTimeout(%v) = %v, %v", c.ms, got, err)
		}
	}
	// A profile's limits (a 3 s exec timeout) replace the defaults.
	prof := agentloop.ExecLimits{DefaultTimeout: 3 * time.Second, MaxTimeout: 3 * time.Second, MaxOutputBytes: 1024}
	if got, err := bashTimeout(nil, prof); err != nil || got != 3*time.Second {
		t.Errorf("default under a 3 s profile: %v, %v", got, err)
	}
	if _, err := bashTimeout(n(3001), prof); err == nil || !strings.Contains(err.Error(), "limit of 3000") {
		t.Errorf("3001 ms under a 3 s profile: %v", err)
	}
}

func TestApplyEdit(t *testing.T) {
	for _, c := range []struct {
		name, content, old, new string
		all                     bool
		want                    string
		n                       int
		err                     string
	}{
		{"unique", "a b c", "b", "B", false, "a B c", 1, ""},
		{"multiline", "x\n  y\nz", "\n  y\n", "\ny\n", false, "x\ny\nz", 1, ""},
		{"ambiguous", "a a", "a", "b", false, "", 0, "occurs 2 times"},
		{"replace all", "a a a", "a", "b", true, "b b b", 3, ""},
		{"all of one", "a", "a", "b", true, "b", 1, ""},
		{"missing", "abc", "x", "y", false, "", 0, "not found"},
		{"whitespace matters", "a  b", "a b", "c", false, "", 0, "not found"},
		{"empty old", "abc", "", "y", false, "", 0, "empty"},
		{"same", "abc", "b", "b", false, "", 0, "the same"},
		{"delete", "abc", "b", "", false, "ac", 1, ""},
	} {
		got, n, err := applyEdit(c.content, c.old, c.new, c.all)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err = %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want || n != c.n {
			t.Errorf("%s: applyEdit = %q, %d, %v; want %q, %d", c.name, got, n, err, c.want, c.n)
		}
	}
}

func TestReadFormatting(t *testing.T) {
	if got := numberLines("a\nb\r\nc", 1, 3); got != "     1\ta\n     2\tb\n     3\tc\n" {
		t.Errorf("numberLines = %q", got)
	}
	if got := numberLines("a\nb\n", 2, 9); got != "     2\tb\n" {
		t.Errorf("numberLines past the end = %q", got)
	}
	long := strings.Repeat("é", ReadMaxLineBytes)
	if got := numberLines(long, 1, 1); !strings.HasSuffix(got, " [line cut]\n") || len(got) > ReadMaxLineBytes+20 {
		t.Errorf("long line: %d bytes, suffix %q", len(got), got[len(got)-15:])
	}
	for _, c := range []struct {
		content string
		n       int
	}{{"", 0}, {"a", 1}, {"a\n", 1}, {"a\nb", 2}, {"\n\n", 2}} {
		if got := countLines(c.content); got != c.n {
			t.Errorf("countLines(%q) = %d, want %d", c.content, got, c.n)
		}
	}
	for _, c := range []struct {
		vr          []int
		n           int
		first, last int
		err         bool
	}{
		{nil, 10, 1, 10, false},
		{nil, 5000, 1, ReadMaxLines, false},
		{[]int{2, 4}, 10, 2, 4, false},
		{[]int{2, -1}, 10, 2, 10, false},
		{[]int{8, 20}, 10, 8, 10, false},
		{[]int{1, -1}, 0, 1, 0, false},
		{[]int{11, 12}, 10, 0, 0, true},
		{[]int{0, 3}, 10, 0, 0, true},
		{[]int{4, 2}, 10, 0, 0, true},
		{[]int{1}, 10, 0, 0, true},
	} {
		first, last, err := viewWindow(c.vr, c.n)
		if (err != nil) != c.err || (!c.err && (first != c.first || last != c.last)) {
			t.Errorf("viewWindow(%v, %d) = %d, %d, %v", c.vr, c.n, first, last, err)
		}
	}
}

func TestMatchGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"*.py", "a.py", true},
		{"*.py", "d/a.py", false},
		{"**/*.py", "a.py", true},
		{"**/*.py", "d/e/a.py", true},
		{"d/**", "d/e/a.py", true},
		{"d/**/a.py", "d/a.py", true},
		{"d/**/a.py", "x/a.py", false},
		{"?.go", "ab.go", false},
		{"[ab].go", "b.go", true},
	} {
		got, err := matchGlob(c.pattern, c.name)
		if err != nil || got != c.want {
			t.Errorf("matchGlob(%q, %q) = %v, %v", c.pattern, c.name, got, err)
		}
	}
	if _, err := matchGlob("[", "x"); err == nil {
		t.Error("a bad pattern must be an error")
	}
}

// TestSchemasMatchInputs: the schemas the model sees and the structs the
// runner decodes into name the same properties, and every required one is
// checked.
func TestSchemasMatchInputs(t *testing.T) {
	inputs := map[string]any{
		"bash": bashInput{}, "read": readInput{}, "write": writeInput{},
		"edit": editInput{}, "glob": globInput{}, "grep": grepInput{},
	}
	seen := 0
	for _, tool := range agentloop.BuiltinTools {
		in, ok := inputs[tool.Name]
		if !ok {
			continue
		}
		seen++
		var schema struct {
			Properties           map[string]json.RawMessage `json:"properties"`
			Required             []string                   `json:"required"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
		}
		if err := json.Unmarshal(tool.InputSchema, &schema); err != nil {
			t.Fatalf("%s schema: %v", tool.Name, err)
		}
		var props []string
		for p := range schema.Properties {
			props = append(props, p)
		}
		var fields []string
		rt := reflect.TypeOf(in)
		for i := range rt.NumField() {
			fields = append(fields, strings.Split(rt.Field(i).Tag.Get("json"), ",")[0])
		}
		slices.Sort(props)
		slices.Sort(fields)
		if !slices.Equal(props, fields) {
			t.Errorf("%s: schema properties %v, decoded fields %v", tool.Name, props, fields)
		}
		if schema.AdditionalProperties == nil || *schema.AdditionalProperties {
			t.Errorf("%s: the schema must say additionalProperties: false, as the decoder refuses unknown fields", tool.Name)
		}
		// A call with every required property but one is refused before
		// the sandbox is asked.
		for _, req := range schema.Required {
			call := map[string]any{}
			for _, other := range schema.Required {
				if other != req {
					call[other] = "x"
				}
			}
			raw, _ := json.Marshal(call)
			r := NewToolset(func(ctxArg context.Context, _ string) (Sandbox, error) {
				t.Fatalf("%s without %s reached the sandbox", tool.Name, req)
				return nil, nil
			}, agentloop.ExecLimits{})
			res, err := r.Run(context.Background(), "s", agentloop.ToolCall{Name: tool.Name, Input: raw})
			if err != nil || !res.IsError {
				t.Errorf("%s without %s: %+v, %v; want an is_error result", tool.Name, req, res, err)
			}
		}
	}
	if seen != len(inputs) {
		t.Errorf("%d of %d sandbox tools have schemas in agentloop.BuiltinTools", seen, len(inputs))
	}
}

func TestSandboxErrorsEndTheTurn(t *testing.T) {
	lost := errdefs.NotFound("sandbox sess-1 is gone")
	r := NewToolset(func(context.Context, string) (Sandbox, error) { return nil, lost }, agentloop.ExecLimits{})
	for _, c := range []struct{ name, input string }{
		{"bash", `{"command":"true"}`},
		{"read", `{"file_path":"a"}`},
		{"write", `{"file_path":"a","content":""}`},
		{"edit", `{"file_path":"a","old_string":"x","new_string":"y"}`},
		{"glob", `{"pattern":"*"}`},
		{"grep", `{"pattern":"x"}`},
	} {
		res, err := r.Run(context.Background(), "sess-1", agentloop.ToolCall{Name: c.name, Input: []byte(c.input)})
		if !errors.Is(err, lost) || !strings.Contains(err.Error(), "the session's sandbox") {
			t.Errorf("%s: %+v, %v; want the sandbox error, not a tool result", c.name, res, err)
		}
	}
}

// shellOnly is a sandbox whose image has sh but no bash: it runs nothing,
// and answers every sh script with its marker and a fixed directory.
type shellOnly struct {
	Sandbox
	shells []string
}

var markerRE = regexp.MustCompile(`__corral_cwd_[0-9a-f]+__`)

func (s *shellOnly) Exec(_ context.Context, req ExecRequest) (ExecResult, error) {
	s.shells = append(s.shells, req.Command[0])
	if req.Command[0] != "sh" {
		return ExecResult{}, errdefs.InvalidArgument("command %q not found", req.Command[0])
	}
	return ExecResult{Stdout: []byte("ran\n\n" + markerRE.FindString(req.Command[2]) + "/somewhere\n")}, nil
}

func TestBashFallsBackToSh(t *testing.T) {
	sb := &shellOnly{}
	r := NewToolset(func(context.Context, string) (Sandbox, error) { return sb, nil }, agentloop.ExecLimits{})
	for range 2 {
		res, err := r.Run(context.Background(), "s", agentloop.ToolCall{Name: "bash", Input: []byte(`{"command":"true"}`)})
		if err != nil || res.IsError || res.Content[0].Text != "ran" {
			t.Fatalf("bash on an image without bash: %+v, %v", res, err)
		}
	}
	if strings.Join(sb.shells, " ") != "bash sh sh" {
		t.Errorf("shells tried: %v, want bash once, then sh", sb.shells)
	}
	if r.cwd("s") != "/somewhere" {
		t.Errorf("cwd %q", r.cwd("s"))
	}
	r.Forget("s")
	if r.cwd("s") != "" || r.shell("s") != "bash" {
		t.Errorf("after Forget: cwd %q, shell %s", r.cwd("s"), r.shell("s"))
	}
}

func TestReplacedSandbox(t *testing.T) {
	sb := &shellOnly{}
	next := Sandbox(sb)
	r := NewToolset(func(context.Context, string) (Sandbox, error) { return next, nil }, agentloop.ExecLimits{})
	bash := agentloop.ToolCall{Name: "bash", Input: []byte(`{"command":"true"}`)}
	if _, err := r.Run(context.Background(), "s", bash); err != nil || r.cwd("s") != "/somewhere" {
		t.Fatalf("first call: %v, cwd %q", err, r.cwd("s"))
	}
	next = Replaced{Sandbox: sb, Notice: "The session's sandbox was lost; files written before are gone."}
	res, err := r.Run(context.Background(), "s", agentloop.ToolCall{Name: "read", Input: []byte(`{"file_path":"../x"}`)})
	if err != nil || !res.IsError || strings.Contains(res.Content[0].Text, "lost") {
		t.Fatalf("a call that never reaches the sandbox carries no notice: %+v, %v", res, err)
	}
	sb.shells = nil
	res, err = r.Run(context.Background(), "s", bash)
	if err != nil || res.Content[0].Text != "The session's sandbox was lost; files written before are gone.\n\nran" {
		t.Fatalf("first call on the new sandbox: %+v, %v", res, err)
	}
	if strings.Join(sb.shells, " ") != "bash sh" {
		t.Errorf("shells %v: the new sandbox's shell must be probed again", sb.shells)
	}
}
