package drivertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// Harness is one driver under test.
type Harness struct {
	// Driver is the driver under test, over fresh state.
	Driver driver.Driver
	// Reopen returns a new Driver value over the same state, as the host
	// agent builds it after a restart.
	Reopen func(t *testing.T) driver.Driver
	// Image is put in every Spec the suite creates.
	Image string
	// Pauses says the driver supports Pause and Resume: the suite then
	// requires them to keep processes and files; otherwise it requires
	// both to answer with kind unimplemented.
	Pauses bool
}

// Factory builds a Harness for one subtest. It registers its own cleanup.
type Factory func(t *testing.T) Harness

// Run runs the conformance suite against the driver factory builds.
func Run(t *testing.T, factory Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"Name", testName},
		{"CreateIsIdempotent", testCreateIdempotent},
		{"AttachAfterRestart", testAttachAfterRestart},
		{"ExecStreams", testExecStreams},
		{"ExecExitCodeEnvDir", testExecExitCodeEnvDir},
		{"ExecCancel", testExecCancel},
		{"ExecTimeout", testExecTimeout},
		{"ExecBoundedOutput", testExecBoundedOutput},
		{"ExecMissingCommand", testExecMissingCommand},
		{"ExecBeforeStart", testExecBeforeStart},
		{"ExecConcurrent", testExecConcurrent},
		{"Files", testFiles},
		{"FileEscapesRefused", testFileEscapes},
		{"Destroy", testDestroy},
		{"PauseResume", testPauseResume},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, factory(t))
		})
	}
}

const opTimeout = 2 * time.Minute

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox whose key is unique to the test and destroys it at
// cleanup.
func create(t *testing.T, h Harness, key string) (driver.Ref, driver.Sandbox) {
	t.Helper()
	ctx := ctxFor(t)
	spec := driver.Spec{Key: uniqueKey(t, key), Image: h.Image, Env: map[string]string{"SPEC_VAR": "from-spec"}, Labels: map[string]string{"suite-key": key}}
	ref, err := h.Driver.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create(%q): %v", spec.Key, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := h.Driver.Destroy(ctx, ref); err != nil {
			t.Errorf("cleanup: Destroy(%s): %v", ref.ID, err)
		}
	})
	sb, err := h.Driver.Attach(ctx, ref)
	if err != nil {
		t.Fatalf("Attach(%s): %v", ref.ID, err)
	}
	return ref, sb
}

func uniqueKey(t *testing.T, key string) string {
	return fmt.Sprintf("%s/%s/%d", t.Name(), key, time.Now().UnixNano())
}

func exec(t *testing.T, sb driver.Sandbox, req driver.ExecRequest) driver.ExecResult {
	t.Helper()
	res, err := sb.Exec(ctxFor(t), req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Command, err)
	}
	return res
}

func wantKind(t *testing.T, what string, err error, kinds ...errdefs.Kind) {
	t.Helper()
	if err == nil {
		t.Errorf("%s succeeded, want an error of kind %v", what, kinds)
		return
	}
	k := errdefs.KindOf(err)
	for _, want := range kinds {
		if k == want {
			return
		}
	}
	t.Errorf("%s: %v (kind %v), want kind %v", what, err, k, kinds)
}

func testName(t *testing.T, h Harness) {
	name := h.Driver.Name()
	if name == "" {
		t.Fatal("Name() is empty")
	}
	if again := h.Reopen(t).Name(); again != name {
		t.Errorf("Name() after reopening = %q, want %q", again, name)
	}
	ref, _ := create(t, h, "a")
	if ref.Provider != name {
		t.Errorf("Ref.Provider = %q, want %q", ref.Provider, name)
	}
}

func testCreateIdempotent(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	ref, _ := create(t, h, "a")
	again, err := h.Driver.Create(ctx, driver.Spec{Key: ref.Key, Image: h.Image})
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if again.ID != ref.ID {
		t.Errorf("second Create returned sandbox %s, want %s", again.ID, ref.ID)
	}
	fromNew, err := h.Reopen(t).Create(ctx, driver.Spec{Key: ref.Key, Image: h.Image})
	if err != nil {
		t.Fatalf("Create through a reopened driver: %v", err)
	}
	if fromNew.ID != ref.ID {
		t.Errorf("Create through a reopened driver returned %s, want %s", fromNew.ID, ref.ID)
	}
	before := time.Now()
	other, _ := create(t, h, "b")
	after := time.Now()
	if other.ID == ref.ID {
		t.Errorf("two keys share sandbox %s", ref.ID)
	}
	refs, err := h.Driver.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	found := map[string]bool{}
	for _, r := range refs {
		found[r.ID] = true
		if r.Provider != h.Driver.Name() {
			t.Errorf("List returned %+v with another provider", r)
		}
		if r.ID == ref.ID && (r.Key != ref.Key || r.Labels["suite-key"] != "a") {
			t.Errorf("List returned %+v, want key %q and the Spec's labels", r, ref.Key)
		}
		// Creation times, by the host's clock (a second of slack for its
		// granularity).
		if r.ID == other.ID && (r.Created.Before(before.Add(-time.Second)) || r.Created.After(after.Add(time.Second))) {
			t.Errorf("List says %s was created at %v, want between %v and %v", r.ID, r.Created, before, after)
		}
	}
	if ref.Labels["suite-key"] != "a" {
		t.Errorf("Create returned %+v without the Spec's labels", ref)
	}
	if !found[ref.ID] || !found[other.ID] {
		t.Errorf("List = %+v, want %s and %s among them", refs, ref.ID, other.ID)
	}
	_, err = h.Driver.Create(ctx, driver.Spec{Image: h.Image})
	wantKind(t, "Create without a key", err, errdefs.InvalidArgumentKind)
}

func testAttachAfterRestart(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	ref, sb := create(t, h, "a")
	if err := sb.WriteFile(ctx, "keep/me.txt", []byte("still here"), 0o644); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptBackground)}); res.ExitCode != 0 {
		t.Fatalf("starting a background process: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	// The agent persists the Ref and reads it back after the restart.
	persisted, err := json.Marshal(ref)
	if err != nil {
		t.Fatal(err)
	}
	var loaded driver.Ref
	if err := json.Unmarshal(persisted, &loaded); err != nil {
		t.Fatal(err)
	}
	d2 := h.Reopen(t)
	sb2, err := d2.Attach(ctx, loaded)
	if err != nil {
		t.Fatalf("Attach after restart: %v", err)
	}
	if got := sb2.Ref(); got.ID != ref.ID || got.Key != ref.Key {
		t.Errorf("attached Ref = %+v, want %+v", got, ref)
	}
	b, err := sb2.ReadFile(ctx, "keep/me.txt", 0)
	if err != nil || string(b) != "still here" {
		t.Errorf("workspace file after restart = %q, %v", b, err)
	}
	if res := exec(t, sb2, driver.ExecRequest{Command: sh(ScriptAlive)}); res.ExitCode != 0 {
		t.Errorf("background process gone after restart: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
}

// signalWriter collects output and closes seen once it contains want.
type signalWriter struct {
	want string
	seen chan struct{}

	mu   sync.Mutex // guards buf and done
	buf  bytes.Buffer
	done bool
}

func newSignalWriter(want string) *signalWriter {
	return &signalWriter{want: want, seen: make(chan struct{})}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && w.want != "" && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func testExecStreams(t *testing.T, h Harness) {
	_, sb := create(t, h, "a")
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	stdout, stderr := newSignalWriter("ready\n"), newSignalWriter("err hello")
	type outcome struct {
		res driver.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := sb.Exec(context.Background(), driver.ExecRequest{
			Command: sh(ScriptStream), Stdin: stdinR, Stdout: stdout, Stderr: stderr, Timeout: time.Minute,
		})
		done <- outcome{res, err}
	}()
	// The command waits for our line, so "ready" can only have arrived
	// while it was running.
	select {
	case <-stdout.seen:
	case o := <-done:
		t.Fatalf("Exec ended before streaming: %+v, %v", o.res, o.err)
	case <-time.After(opTimeout):
		t.Fatalf("no streamed output; stdout so far %q", stdout.String())
	}
	if _, err := io.WriteString(stdinW, "hello\n"); err != nil {
		t.Fatalf("writing stdin: %v", err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("Exec: %v", o.err)
	}
	if got, want := stdout.String(), "ready\ngot hello\n"; got != want {
		t.Errorf("streamed stdout = %q, want %q", got, want)
	}
	if got, want := stderr.String(), "err hello\n"; got != want {
		t.Errorf("streamed stderr = %q, want %q", got, want)
	}
	if string(o.res.Stdout) != "ready\ngot hello\n" || string(o.res.Stderr) != "err hello\n" {
		t.Errorf("result output = %q / %q", o.res.Stdout, o.res.Stderr)
	}
	if o.res.ExitCode != 0 || o.res.TimedOut || o.res.Truncated {
		t.Errorf("result = %+v, want a clean exit", o.res)
	}
	// The end of Stdin reaches the command.
	res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptCatStdin), Stdin: strings.NewReader("to the end\n"), Timeout: time.Minute})
	if string(res.Stdout) != "to the end\n" || res.ExitCode != 0 || res.TimedOut {
		t.Errorf("cat of a finite stdin: %+v", res)
	}
}

func testExecExitCodeEnvDir(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	_, sb := create(t, h, "a")
	res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptExit3)})
	if res.ExitCode != 3 || string(res.Stdout) != "bye\n" {
		t.Errorf("exit 3: got %+v", res)
	}
	t.Setenv(SecretEnv, "leaked-from-host")
	res = exec(t, sb, driver.ExecRequest{Command: sh(ScriptEnv), Env: map[string]string{"REQ_VAR": "from-req"}})
	if got, want := string(res.Stdout), "from-spec from-req []\n"; got != want {
		t.Errorf("environment: got %q, want %q", got, want)
	}
	if err := sb.WriteFile(ctx, "sub/dir/.keep", nil, 0o644); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	res = exec(t, sb, driver.ExecRequest{Command: sh(ScriptPwd), Dir: "sub/dir"})
	if got := strings.TrimSpace(string(res.Stdout)); !strings.HasSuffix(got, "/sub/dir") {
		t.Errorf("pwd with Dir sub/dir = %q", got)
	}
	_, err := sb.Exec(ctx, driver.ExecRequest{Command: sh(ScriptPwd), Dir: "../.."})
	wantKind(t, "Exec with Dir ../..", err, errdefs.InvalidArgumentKind, errdefs.PermissionDeniedKind)
	_, err = sb.Exec(ctx, driver.ExecRequest{})
	wantKind(t, "Exec without a command", err, errdefs.InvalidArgumentKind)
}

// BeforeStart runs once, before the command (which has not written its
// file yet); when it fails, the command never runs and Exec says why.
func testExecBeforeStart(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	_, sb := create(t, h, "a")
	calls := 0
	res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptWrite), BeforeStart: func() error {
		calls++
		if _, err := sb.ReadFile(ctx, "made-by-exec.txt", 1<<10); err == nil {
			t.Error("BeforeStart ran after the command had written its file")
		}
		return nil
	}})
	if calls != 1 || res.ExitCode != 0 {
		t.Fatalf("BeforeStart called %d times (want 1); the command: %+v", calls, res)
	}
	if err := sb.WriteFile(ctx, "made-by-exec.txt", []byte("before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused := errdefs.Unavailable("the start could not be recorded")
	_, err := sb.Exec(ctx, driver.ExecRequest{Command: sh(ScriptWrite), BeforeStart: func() error { return refused }})
	if !errors.Is(err, refused) {
		t.Errorf("Exec after a failed BeforeStart: %v, want its error", err)
	}
	if b, err := sb.ReadFile(ctx, "made-by-exec.txt", 1<<10); err != nil || string(b) != "before\n" {
		t.Errorf("after a failed BeforeStart the file holds %q (%v): the command ran", b, err)
	}
}

func testExecCancel(t *testing.T, h Harness) {
	_, sb := create(t, h, "a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout := newSignalWriter("started")
	go func() {
		select {
		case <-stdout.seen:
			cancel()
		case <-time.After(opTimeout):
		}
	}()
	start := time.Now()
	_, err := sb.Exec(ctx, driver.ExecRequest{Command: sh(ScriptSleep), Stdout: stdout, Timeout: 5 * time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec after cancel = %v, want context.Canceled (stdout %q)", err, stdout.String())
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("Exec returned %v after start, want promptly after cancel", d)
	}
	// The sandbox still works.
	if res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptPwd)}); res.ExitCode != 0 {
		t.Errorf("exec after a cancelled one: %+v", res)
	}
}

func testExecTimeout(t *testing.T, h Harness) {
	_, sb := create(t, h, "a")
	start := time.Now()
	res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptSleep), Timeout: 2 * time.Second})
	if res.ExitCode != driver.TimeoutExitCode || !res.TimedOut {
		t.Errorf("timed out command: exit %d TimedOut %v, want %d true", res.ExitCode, res.TimedOut, driver.TimeoutExitCode)
	}
	if string(res.Stdout) != "started\n" {
		t.Errorf("output before the timeout = %q, want it kept", res.Stdout)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("a 2s timeout returned after %v", d)
	}
	if res.Duration < 2*time.Second {
		t.Errorf("Duration = %v, want at least the 2s timeout", res.Duration)
	}
}

func testExecBoundedOutput(t *testing.T, h Harness) {
	_, sb := create(t, h, "a")
	stream := newSignalWriter("")
	res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptFlood), Stdout: stream, MaxOutput: 1000})
	if res.ExitCode != 0 || !res.Truncated {
		t.Errorf("flood: exit %d Truncated %v, want 0 true", res.ExitCode, res.Truncated)
	}
	out := string(res.Stdout)
	if !strings.HasPrefix(out, "line 0\nline 1\n") || !strings.HasSuffix(out, "line 1998\nline 1999\n") {
		t.Errorf("kept output lacks head or tail: %q", out)
	}
	if len(out) > 1100 {
		t.Errorf("kept %d bytes with MaxOutput 1000", len(out))
	}
	if stream.String() != floodOutput() {
		t.Errorf("stream writer got %d bytes, want all %d", len(stream.String()), len(floodOutput()))
	}
	small := exec(t, sb, driver.ExecRequest{Command: sh(ScriptPwd), MaxOutput: 1000})
	if small.Truncated {
		t.Errorf("short output flagged truncated: %+v", small)
	}
}

// floodOutput is what ScriptFlood prints.
func floodOutput() string {
	var all strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&all, "line %d\n", i)
	}
	return all.String()
}

func testExecMissingCommand(t *testing.T, h Harness) {
	_, sb := create(t, h, "a")
	res, err := sb.Exec(ctxFor(t), driver.ExecRequest{Command: []string{"corral-no-such-command"}})
	if err == nil {
		t.Errorf("Exec of a missing command = %+v, want an error", res)
	}
}

func testExecConcurrent(t *testing.T, h Harness) {
	_, sb := create(t, h, "a")
	ctx := ctxFor(t)
	scripts := []string{ScriptExit3, ScriptFlood, ScriptPwd, ScriptExit3, ScriptFlood, ScriptPwd}
	results := make([]driver.ExecResult, len(scripts))
	errs := make([]error, len(scripts))
	var wg sync.WaitGroup
	for i, s := range scripts {
		wg.Go(func() {
			results[i], errs[i] = sb.Exec(ctx, driver.ExecRequest{Command: sh(s)})
		})
	}
	wg.Wait()
	for i, s := range scripts {
		res, err := results[i], errs[i]
		switch {
		case err != nil:
			t.Errorf("concurrent Exec(%q): %v", s, err)
		case s == ScriptExit3 && (res.ExitCode != 3 || string(res.Stdout) != "bye\n"):
			t.Errorf("concurrent exit 3: %+v", res)
		case s == ScriptFlood && (res.ExitCode != 0 || string(res.Stdout) != floodOutput() || res.Truncated):
			t.Errorf("concurrent flood: exit %d, %d bytes, truncated %v", res.ExitCode, len(res.Stdout), res.Truncated)
		case s == ScriptPwd && !strings.HasSuffix(strings.TrimSpace(string(res.Stdout)), "workspace"):
			t.Errorf("concurrent pwd: %q", res.Stdout)
		}
	}
}

func testFiles(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	_, sb := create(t, h, "a")
	if err := sb.WriteFile(ctx, "note.txt", []byte("hello\n"), 0o640); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if err := sb.WriteFile(ctx, "a/b/c.txt", []byte("deep"), 0o644); err != nil {
		t.Fatalf("WriteFile with new parents: %v", err)
	}
	if b, err := sb.ReadFile(ctx, "a/b/c.txt", 0); err != nil || string(b) != "deep" {
		t.Errorf("ReadFile = %q, %v", b, err)
	}
	if res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptCat)}); string(res.Stdout) != "hello\n" {
		t.Errorf("the sandbox sees %q, want the written file", res.Stdout)
	}
	if res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptWrite)}); res.ExitCode != 0 {
		t.Fatalf("writing from the sandbox: %+v", res)
	}
	if b, err := sb.ReadFile(ctx, "made-by-exec.txt", 0); err != nil || string(b) != "from-exec\n" {
		t.Errorf("file written by exec = %q, %v", b, err)
	}
	if err := sb.WriteFile(ctx, "note.txt", []byte("replaced"), 0o644); err != nil {
		t.Fatalf("replacing: %v", err)
	}
	if b, _ := sb.ReadFile(ctx, "note.txt", 0); string(b) != "replaced" {
		t.Errorf("replaced file = %q", b)
	}
	list, err := sb.ListFiles(ctx, "")
	if err != nil {
		t.Fatalf("ListFiles: %v", err)
	}
	got := map[string]driver.FileInfo{}
	for _, fi := range list {
		got[fi.Path] = fi
	}
	if fi, ok := got["note.txt"]; !ok || fi.Size != int64(len("replaced")) || fi.Mode.IsDir() {
		t.Errorf("ListFiles(\"\") note.txt = %+v (found %v)", fi, ok)
	}
	if fi, ok := got["a"]; !ok || !fi.Mode.IsDir() {
		t.Errorf("ListFiles(\"\") a = %+v (found %v), want a directory", fi, ok)
	}
	sub, err := sb.ListFiles(ctx, "a/b")
	if err != nil || len(sub) != 1 || sub[0].Path != "a/b/c.txt" || sub[0].Size != 4 {
		t.Errorf("ListFiles(a/b) = %+v, %v", sub, err)
	}
	_, err = sb.ReadFile(ctx, "missing.txt", 0)
	wantKind(t, "ReadFile of a missing file", err, errdefs.NotFoundKind)
}

func testFileEscapes(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	_, sb := create(t, h, "a")
	if res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptSymlinks)}); res.ExitCode != 0 {
		t.Fatalf("creating symlinks: %+v", res)
	}
	refused := []errdefs.Kind{errdefs.InvalidArgumentKind, errdefs.PermissionDeniedKind}
	for _, p := range []string{"../x", "a/../../x", "/etc/hostname", "escape/hostname", "escape/passwd", "up/x", "host-file"} {
		_, err := sb.ReadFile(ctx, p, 0)
		wantKind(t, fmt.Sprintf("ReadFile(%q)", p), err, refused...)
	}
	const probe = "corral-drivertest-probe"
	for _, p := range []string{"../" + probe, "/tmp/" + probe, "escape/" + probe, "up/" + probe, "host-file"} {
		err := sb.WriteFile(ctx, p, []byte("x"), 0o644)
		wantKind(t, fmt.Sprintf("WriteFile(%q)", p), err, refused...)
	}
	for _, p := range []string{"..", "escape", "up"} {
		_, err := sb.ListFiles(ctx, p)
		wantKind(t, fmt.Sprintf("ListFiles(%q)", p), err, refused...)
	}
	if _, err := os.Stat("/etc/" + probe); err == nil {
		t.Errorf("/etc/%s exists on the host", probe)
	}
}

func testDestroy(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	ref, sb := create(t, h, "a")
	if err := sb.WriteFile(ctx, "f.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.Driver.Destroy(ctx, ref); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := h.Driver.Destroy(ctx, ref); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	_, err := h.Driver.Attach(ctx, ref)
	wantKind(t, "Attach to a destroyed sandbox", err, errdefs.NotFoundKind)
	_, err = h.Reopen(t).Attach(ctx, ref)
	wantKind(t, "Attach to a destroyed sandbox after a restart", err, errdefs.NotFoundKind)
	_, err = sb.Exec(ctx, driver.ExecRequest{Command: sh(ScriptPwd)})
	wantKind(t, "Exec in a destroyed sandbox", err, errdefs.NotFoundKind)
	_, err = sb.ReadFile(ctx, "f.txt", 0)
	wantKind(t, "ReadFile in a destroyed sandbox", err, errdefs.NotFoundKind)
	err = sb.WriteFile(ctx, "g.txt", []byte("x"), 0o644)
	wantKind(t, "WriteFile in a destroyed sandbox", err, errdefs.NotFoundKind)
	_, err = sb.ListFiles(ctx, "")
	wantKind(t, "ListFiles in a destroyed sandbox", err, errdefs.NotFoundKind)
	refs, err := h.Driver.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, r := range refs {
		if r.ID == ref.ID {
			t.Errorf("List still has destroyed sandbox %s", ref.ID)
		}
	}
	// Using the old reference never brought it back.
	_, err = h.Driver.Attach(ctx, ref)
	wantKind(t, "Attach after using the destroyed sandbox", err, errdefs.NotFoundKind)
	// The key is free again: a new sandbox, not the old one.
	fresh, err := h.Driver.Create(ctx, driver.Spec{Key: ref.Key, Image: h.Image})
	if err != nil {
		t.Fatalf("Create after Destroy: %v", err)
	}
	t.Cleanup(func() { _ = h.Driver.Destroy(context.Background(), fresh) })
	if fresh.ID == ref.ID {
		t.Errorf("Create after Destroy reused id %s", ref.ID)
	}
	sb2, err := h.Driver.Attach(ctx, fresh)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	_, err = sb2.ReadFile(ctx, "f.txt", 0)
	wantKind(t, "ReadFile of the old sandbox's file in the new one", err, errdefs.NotFoundKind)
	_, err = h.Driver.Attach(ctx, ref)
	wantKind(t, "Attach to the old reference after the key was reused", err, errdefs.NotFoundKind)
	// Never created at all.
	err = h.Driver.Destroy(ctx, driver.Ref{Provider: h.Driver.Name(), Key: "never", ID: "corral-never-created"})
	if err != nil {
		t.Errorf("Destroy of an unknown sandbox: %v", err)
	}
	_, err = h.Driver.Attach(ctx, driver.Ref{Provider: h.Driver.Name(), Key: "never", ID: "corral-never-created"})
	wantKind(t, "Attach to an unknown sandbox", err, errdefs.NotFoundKind)
	_, err = h.Driver.Attach(ctx, driver.Ref{Provider: "some-other-driver", Key: "k", ID: "x"})
	wantKind(t, "Attach to another provider's Ref", err, errdefs.InvalidArgumentKind)
}

func testPauseResume(t *testing.T, h Harness) {
	ctx := ctxFor(t)
	ref, sb := create(t, h, "a")
	if !h.Pauses {
		wantKind(t, "Pause on a driver that does not pause", h.Driver.Pause(ctx, ref), errdefs.UnimplementedKind)
		wantKind(t, "Resume on a driver that does not pause", h.Driver.Resume(ctx, ref), errdefs.UnimplementedKind)
		return
	}
	if err := sb.WriteFile(ctx, "keep/me.txt", []byte("still here"), 0o644); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if res := exec(t, sb, driver.ExecRequest{Command: sh(ScriptBackground)}); res.ExitCode != 0 {
		t.Fatalf("starting a background process: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	if err := h.Driver.Resume(ctx, ref); err != nil {
		t.Errorf("Resume of a running sandbox: %v", err)
	}
	if err := h.Driver.Pause(ctx, ref); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := h.Driver.Pause(ctx, ref); err != nil {
		t.Errorf("second Pause: %v", err)
	}
	// What a paused sandbox holds of the host's disk, where the driver
	// measures it: something, and more once its workspace holds more.
	meter, measures := h.Driver.(driver.DiskMeter)
	var held int64
	if measures {
		var err error
		if held, err = meter.DiskUsed(ctx, ref); err != nil || held <= 0 {
			t.Errorf("DiskUsed of a paused sandbox = %d, %v; want some bytes", held, err)
		}
	}
	refs, err := h.Driver.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	found := false
	for _, r := range refs {
		if r.ID == ref.ID {
			found = true
			if !r.Paused {
				t.Errorf("List: paused sandbox %s has Paused unset", r.ID)
			}
		}
	}
	if !found {
		t.Errorf("List lost paused sandbox %s", ref.ID)
	}
	// While paused: files work, and a restarted agent attaches without
	// resuming it.
	if b, err := sb.ReadFile(ctx, "keep/me.txt", 0); err != nil || string(b) != "still here" {
		t.Errorf("ReadFile while paused = %q, %v", b, err)
	}
	sb2, err := h.Reopen(t).Attach(ctx, ref)
	if err != nil {
		t.Fatalf("Attach to a paused sandbox after a restart: %v", err)
	}
	if err := h.Driver.Resume(ctx, ref); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := h.Driver.Resume(ctx, ref); err != nil {
		t.Errorf("second Resume: %v", err)
	}
	const grown = 8 << 20
	if measures {
		big := make([]byte, grown)
		_, _ = rand.Read(big)
		if err := sb2.WriteFile(ctx, "big.bin", big, 0o644); err != nil {
			t.Fatalf("WriteFile of %d bytes: %v", grown, err)
		}
	}
	if res := exec(t, sb2, driver.ExecRequest{Command: sh(ScriptAlive)}); res.ExitCode != 0 {
		t.Errorf("background process gone after pause and resume: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	if b, err := sb2.ReadFile(ctx, "keep/me.txt", 0); err != nil || string(b) != "still here" {
		t.Errorf("ReadFile after resume = %q, %v", b, err)
	}
	// Exec resumes a paused sandbox by itself.
	if err := h.Driver.Pause(ctx, ref); err != nil {
		t.Fatalf("Pause again: %v", err)
	}
	if measures {
		// Half the file's size: the checkpoint beside it is not the same
		// size at every pause.
		now, err := meter.DiskUsed(ctx, ref)
		if err != nil || now < held+grown/2 {
			t.Errorf("DiskUsed after an %d-byte file was written = %d, %v; it was %d", grown, now, err, held)
		}
		t.Logf("a paused sandbox holds %d bytes of the host's disk, %d with an %d-byte file more", held, now, grown)
	}
	if res := exec(t, sb2, driver.ExecRequest{Command: sh(ScriptAlive)}); res.ExitCode != 0 {
		t.Errorf("Exec in a paused sandbox: background process gone: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	// A paused sandbox is destroyed like any other.
	if err := h.Driver.Pause(ctx, ref); err != nil {
		t.Fatalf("Pause before Destroy: %v", err)
	}
	if err := h.Driver.Destroy(ctx, ref); err != nil {
		t.Fatalf("Destroy of a paused sandbox: %v", err)
	}
	wantKind(t, "Pause of a destroyed sandbox", h.Driver.Pause(ctx, ref), errdefs.NotFoundKind)
	if measures {
		_, err := meter.DiskUsed(ctx, ref)
		wantKind(t, "DiskUsed of a destroyed sandbox", err, errdefs.NotFoundKind)
	}
	wantKind(t, "Resume of a destroyed sandbox", h.Driver.Resume(ctx, ref), errdefs.NotFoundKind)
}
