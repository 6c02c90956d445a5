package drivertest

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/internal/capture"
	"corral.dev/corral/hostagent/internal/workspace"
	"corral.dev/corral/internal/errdefs"
)

// Program is a command the Fake can run, in Go. It returns the exit code and
// must return promptly when ctx is done.
type Program func(ctx context.Context, p *Proc) int

// Proc is what a Program sees.
type Proc struct {
	Args   []string
	Env    map[string]string
	Dir    string // working directory on the host, inside the workspace
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Fake is an in-process driver for unit tests. Workspaces are real
// directories under the directory given to NewFake; commands are Programs:
// echo, true, false, sleep, the suite's Script* scripts, and whatever the
// test registers with Handle. It passes the conformance suite, so code
// written against it behaves the same with a real driver.
type Fake struct {
	s    *fakeState
	name string // the provider's name; "" is "fake"
}

var _ driver.Driver = (*Fake)(nil)

type fakeState struct {
	dir string
	now func() time.Time // stamps Ref.Created

	// mu guards the fields below.
	mu        sync.Mutex
	boxes     map[string]*fakeBox // by id
	programs  map[string]Program  // by argv[0]
	scripts   map[string]Program  // sh -c scripts, by text
	nextPID   int
	lastSpecs map[string]driver.Spec // by id
}

type fakeBox struct {
	ref  driver.Ref
	spec driver.Spec
	ws   workspace.Dir
	stop chan struct{}         // closed by Destroy: ends background programs
	bg   map[int]chan struct{} // live background pids; closed on exit
	// paused is set by Pause, cleared by Resume (and by Exec); guarded
	// by fakeState.mu. Background programs of a paused box live on (a
	// fake checkpoint keeps them as they are).
	paused bool
}

// NewFake returns a Fake keeping workspaces under dir.
func NewFake(dir string) *Fake {
	s := &fakeState{dir: dir, now: time.Now, boxes: map[string]*fakeBox{}, programs: map[string]Program{}, scripts: map[string]Program{}, nextPID: 100, lastSpecs: map[string]driver.Spec{}}
	s.registerBuiltins()
	return &Fake{s: s}
}

// Reopen returns a new Fake value over the same state, as after a restart
// of the host agent (sandboxes and their processes live on).
func (f *Fake) Reopen() *Fake { return &Fake{s: f.s, name: f.name} }

// Named returns a new Fake whose provider name is name instead of "fake",
// with sandboxes of its own (workspaces under a directory named name in
// f's), on f's clock: for a host of several runtimes, each run by its own
// driver.
func (f *Fake) Named(name string) *Fake {
	g := NewFake(filepath.Join(f.s.dir, name))
	f.s.mu.Lock()
	g.s.now = f.s.now
	f.s.mu.Unlock()
	g.name = name
	return g
}

// SetClock makes Create stamp Ref.Created with now (default time.Now), for
// tests that drive the host agent's clock. Call it before any Create.
func (f *Fake) SetClock(now func() time.Time) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	f.s.now = now
}

// Handle registers a Program for commands whose argv[0] is name.
func (f *Fake) Handle(name string, p Program) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	f.s.programs[name] = p
}

// Spec returns the Spec a sandbox was created with, for assertions.
func (f *Fake) Spec(id string) (driver.Spec, bool) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	s, ok := f.s.lastSpecs[id]
	return s, ok
}

// Name is "fake", or the name given to Named.
func (f *Fake) Name() string { return cmp.Or(f.name, "fake") }

// Create makes or returns the sandbox for spec.Key.
func (f *Fake) Create(ctx context.Context, spec driver.Spec) (driver.Ref, error) {
	if spec.Key == "" {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox key is required")
	}
	if spec.NetworkNamespace != "" {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox %q: this driver has no network namespaces; it cannot give a sandbox egress", spec.Key)
	}
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	for _, b := range f.s.boxes {
		if b.ref.Key == spec.Key {
			return b.ref, nil
		}
	}
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	id := "fake-" + hex.EncodeToString(nonce[:])
	dir := filepath.Join(f.s.dir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return driver.Ref{}, fmt.Errorf("creating workspace: %w", err)
	}
	for _, sub := range []string{"uploads", "outputs", "memory"} {
		if err := os.MkdirAll(filepath.Join(dir+".session", sub), 0o755); err != nil {
			return driver.Ref{}, fmt.Errorf("creating session dirs: %w", err)
		}
	}
	ref := driver.Ref{Provider: f.Name(), Key: spec.Key, ID: id, Labels: maps.Clone(spec.Labels), Created: f.s.now()}
	f.s.boxes[id] = &fakeBox{ref: ref, spec: spec, ws: workspace.Dir{Path: dir}, stop: make(chan struct{}), bg: map[int]chan struct{}{}}
	f.s.lastSpecs[id] = spec
	return ref, nil
}

func (f *Fake) box(ref driver.Ref) (*fakeBox, error) {
	if ref.Provider != f.Name() {
		return nil, errdefs.InvalidArgument("sandbox %s belongs to provider %q, not %q", ref.ID, ref.Provider, f.Name())
	}
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	b, ok := f.s.boxes[ref.ID]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s does not exist (destroyed or never created)", ref.ID)
	}
	return b, nil
}

// Attach returns the live sandbox behind ref.
func (f *Fake) Attach(ctx context.Context, ref driver.Ref) (driver.Sandbox, error) {
	b, err := f.box(ref)
	if err != nil {
		return nil, err
	}
	return &fakeSandbox{f: f, ref: b.ref}, nil
}

// Destroy removes the sandbox, ends its processes and removes its workspace.
func (f *Fake) Destroy(ctx context.Context, ref driver.Ref) error {
	f.s.mu.Lock()
	b, ok := f.s.boxes[ref.ID]
	delete(f.s.boxes, ref.ID)
	f.s.mu.Unlock()
	if !ok {
		return nil
	}
	close(b.stop)
	if err := os.RemoveAll(b.ws.Path + ".session"); err != nil {
		return err
	}
	return os.RemoveAll(b.ws.Path)
}

// List returns every sandbox.
func (f *Fake) List(ctx context.Context) ([]driver.Ref, error) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	var refs []driver.Ref
	for _, id := range slices.Sorted(maps.Keys(f.s.boxes)) {
		ref := f.s.boxes[id].ref
		ref.Paused = f.s.boxes[id].paused
		refs = append(refs, ref)
	}
	return refs, nil
}

// Pause marks the sandbox paused.
func (f *Fake) Pause(ctx context.Context, ref driver.Ref) error {
	return f.setPaused(ref, true)
}

// Resume marks the sandbox running.
func (f *Fake) Resume(ctx context.Context, ref driver.Ref) error {
	return f.setPaused(ref, false)
}

func (f *Fake) setPaused(ref driver.Ref, paused bool) error {
	b, err := f.box(ref)
	if err != nil {
		return err
	}
	f.s.mu.Lock()
	b.paused = paused
	f.s.mu.Unlock()
	return nil
}

var _ driver.DiskMeter = (*Fake)(nil)

// DiskUsed implements driver.DiskMeter: the blocks of the workspace's
// files.
func (f *Fake) DiskUsed(ctx context.Context, ref driver.Ref) (int64, error) {
	b, err := f.box(ref)
	if err != nil {
		return 0, err
	}
	return workspace.AllocatedBytes(b.ws.Path)
}

// Paused reports whether the sandbox with id is paused, for assertions.
func (f *Fake) Paused(id string) bool {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	b := f.s.boxes[id]
	return b != nil && b.paused
}

type fakeSandbox struct {
	f   *Fake
	ref driver.Ref
}

func (s *fakeSandbox) Ref() driver.Ref { return s.ref }

var _ driver.SessionDirs = (*fakeSandbox)(nil)

// SessionDirs implements driver.SessionDirs: folders beside the
// workspace (<id>.session/).
func (s *fakeSandbox) SessionDirs() driver.Dirs {
	dir := filepath.Join(s.f.s.dir, s.ref.ID+".session")
	return driver.Dirs{Uploads: filepath.Join(dir, "uploads"), Outputs: filepath.Join(dir, "outputs"), Memory: filepath.Join(dir, "memory"), Staging: filepath.Join(dir, "staging")}
}

func (s *fakeSandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	b, err := s.f.box(s.ref)
	if err != nil {
		return driver.ExecResult{}, err
	}
	if len(req.Command) == 0 {
		return driver.ExecResult{}, errdefs.InvalidArgument("empty command")
	}
	if err := s.f.Resume(ctx, s.ref); err != nil {
		return driver.ExecResult{}, err
	}
	dir, err := workspace.Clean(req.Dir)
	if err != nil {
		return driver.ExecResult{}, err
	}
	prog, err := s.f.s.lookup(req.Command)
	if err != nil {
		return driver.ExecResult{}, err
	}
	timeout, max := req.Timeout, req.MaxOutput
	if timeout == 0 {
		timeout = driver.DefaultExecTimeout
	}
	if max == 0 {
		max = driver.DefaultMaxOutput
	}
	env := map[string]string{"PATH": "/usr/bin:/bin"}
	maps.Copy(env, b.spec.Env)
	maps.Copy(env, req.Env)
	stdout, stderr := capture.New(max, req.Stdout), capture.New(max, req.Stderr)
	stdin := req.Stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	if req.BeforeStart != nil {
		if err := req.BeforeStart(); err != nil {
			return driver.ExecResult{}, err
		}
	}
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	code := prog(runCtx, &Proc{Args: req.Command, Env: env, Dir: filepath.Join(b.ws.Path, dir), Stdin: stdin, Stdout: stdout, Stderr: stderr})
	res := driver.ExecResult{ExitCode: code, Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Truncated: stdout.Truncated() || stderr.Truncated(), Duration: time.Since(start)}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if runCtx.Err() != nil {
		res.ExitCode, res.TimedOut = driver.TimeoutExitCode, true
	}
	return res, nil
}

func (s *fakeSandbox) ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	b, err := s.f.box(s.ref)
	if err != nil {
		return nil, err
	}
	if max <= 0 {
		max = driver.DefaultMaxReadBytes
	}
	return b.ws.ReadFile(path, max)
}

func (s *fakeSandbox) OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	b, err := s.f.box(s.ref)
	if err != nil {
		return nil, 0, err
	}
	return b.ws.Open(path)
}

func (s *fakeSandbox) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	b, err := s.f.box(s.ref)
	if err != nil {
		return err
	}
	return b.ws.WriteFile(path, data, mode)
}

func (s *fakeSandbox) ListFiles(ctx context.Context, dir string) ([]driver.FileInfo, error) {
	b, err := s.f.box(s.ref)
	if err != nil {
		return nil, err
	}
	return b.ws.List(dir)
}

func (s *fakeState) lookup(argv []string) (Program, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(argv) == 3 && argv[0] == "sh" && argv[1] == "-c" {
		if p, ok := s.scripts[argv[2]]; ok {
			return p, nil
		}
		// A plain command line: words, no shell syntax.
		fields := strings.Fields(argv[2])
		if len(fields) > 0 && !strings.ContainsAny(argv[2], "|&;<>()$`\\\"'*?[#~=%") {
			if p, ok := s.programs[fields[0]]; ok {
				return func(ctx context.Context, pr *Proc) int {
					pr.Args = fields
					return p(ctx, pr)
				}, nil
			}
		}
		return nil, errdefs.InvalidArgument("the fake driver cannot run script %q; register a Program with Handle", argv[2])
	}
	if p, ok := s.programs[argv[0]]; ok {
		return p, nil
	}
	return nil, errdefs.InvalidArgument("%s: command not found in the fake driver", argv[0])
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *fakeState) registerBuiltins() {
	s.programs["true"] = func(context.Context, *Proc) int { return 0 }
	s.programs["false"] = func(context.Context, *Proc) int { return 1 }
	s.programs["echo"] = func(_ context.Context, p *Proc) int {
		fmt.Fprintln(p.Stdout, strings.Join(p.Args[1:], " "))
		return 0
	}
	s.programs["pwd"] = func(_ context.Context, p *Proc) int {
		fmt.Fprintln(p.Stdout, "/workspace"+strings.TrimPrefix(p.Dir, s.boxDir(p.Dir)))
		return 0
	}
	s.programs["sleep"] = func(ctx context.Context, p *Proc) int {
		secs, err := strconv.ParseFloat(strings.Join(p.Args[1:], ""), 64)
		if err != nil {
			fmt.Fprintln(p.Stderr, "sleep: invalid number")
			return 1
		}
		if !sleepCtx(ctx, time.Duration(secs*float64(time.Second))) {
			return 137
		}
		return 0
	}
	s.scripts[ScriptPwd] = s.programs["pwd"]
	s.scripts[ScriptStream] = func(ctx context.Context, p *Proc) int {
		fmt.Fprintln(p.Stdout, "ready")
		line, _ := bufio.NewReader(p.Stdin).ReadString('\n')
		line = strings.TrimSuffix(line, "\n")
		fmt.Fprintf(p.Stdout, "got %s\n", line)
		fmt.Fprintf(p.Stderr, "err %s\n", line)
		return 0
	}
	s.scripts[ScriptCatStdin] = func(_ context.Context, p *Proc) int {
		if _, err := io.Copy(p.Stdout, p.Stdin); err != nil {
			return 1
		}
		return 0
	}
	s.scripts[ScriptSleep] = func(ctx context.Context, p *Proc) int {
		fmt.Fprintln(p.Stdout, "started")
		if !sleepCtx(ctx, 600*time.Second) {
			return 137
		}
		return 0
	}
	s.scripts[ScriptFlood] = func(_ context.Context, p *Proc) int {
		for i := range 2000 {
			fmt.Fprintf(p.Stdout, "line %d\n", i)
		}
		return 0
	}
	s.scripts[ScriptExit3] = func(_ context.Context, p *Proc) int {
		fmt.Fprintln(p.Stdout, "bye")
		return 3
	}
	s.scripts[ScriptEnv] = func(_ context.Context, p *Proc) int {
		fmt.Fprintf(p.Stdout, "%s %s [%s]\n", p.Env["SPEC_VAR"], p.Env["REQ_VAR"], p.Env[SecretEnv])
		return 0
	}
	s.scripts[ScriptWrite] = func(_ context.Context, p *Proc) int {
		return s.fileOp(p, os.WriteFile(filepath.Join(p.Dir, "made-by-exec.txt"), []byte("from-exec\n"), 0o644))
	}
	s.scripts[ScriptCat] = func(_ context.Context, p *Proc) int {
		b, err := os.ReadFile(filepath.Join(p.Dir, "note.txt"))
		p.Stdout.Write(b)
		return s.fileOp(p, err)
	}
	s.scripts[ScriptSymlinks] = func(_ context.Context, p *Proc) int {
		for target, name := range map[string]string{"/etc": "escape", "..": "up", "/etc/hostname": "host-file"} {
			if err := os.Symlink(target, filepath.Join(p.Dir, name)); err != nil {
				return s.fileOp(p, err)
			}
		}
		return 0
	}
	s.scripts[ScriptBackground] = func(_ context.Context, p *Proc) int {
		b := s.boxOf(p.Dir)
		if b == nil {
			return 1
		}
		s.mu.Lock()
		pid := s.nextPID
		s.nextPID++
		done := make(chan struct{})
		b.bg[pid] = done
		s.mu.Unlock()
		go func() {
			defer close(done)
			select {
			case <-time.After(600 * time.Second):
			case <-b.stop:
			}
		}()
		return s.fileOp(p, os.WriteFile(filepath.Join(p.Dir, "bg.pid"), fmt.Appendf(nil, "%d\n", pid), 0o644))
	}
	s.scripts[ScriptAlive] = func(_ context.Context, p *Proc) int {
		b := s.boxOf(p.Dir)
		raw, err := os.ReadFile(filepath.Join(p.Dir, "bg.pid"))
		if b == nil || err != nil {
			return 1
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
		s.mu.Lock()
		done, ok := b.bg[pid]
		s.mu.Unlock()
		if !ok {
			return 1
		}
		select {
		case <-done:
			return 1
		default:
			return 0
		}
	}
}

func (s *fakeState) fileOp(p *Proc, err error) int {
	if err != nil {
		fmt.Fprintln(p.Stderr, err)
		return 1
	}
	return 0
}

// boxDir returns the workspace directory that contains dir.
func (s *fakeState) boxDir(dir string) string {
	rel, err := filepath.Rel(s.dir, dir)
	if err != nil {
		return dir
	}
	return filepath.Join(s.dir, strings.Split(rel, string(filepath.Separator))[0])
}

func (s *fakeState) boxOf(dir string) *fakeBox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boxes[filepath.Base(s.boxDir(dir))]
}

func (s *fakeSandbox) CreateFile(ctx context.Context, path string, mode fs.FileMode) (io.WriteCloser, error) {
	b, err := s.f.box(s.ref)
	if err != nil {
		return nil, err
	}
	return b.ws.Create(path, mode)
}
