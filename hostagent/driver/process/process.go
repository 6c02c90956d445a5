// Package process is a development driver: each sandbox is a folder on the
// host and its commands are ordinary host processes, run with a clean
// environment in their own process group. It isolates nothing; New refuses
// to build it unless the operator acknowledges that with AllowUntrusted, and
// it must never run commands chosen by a real model (../../../DESIGN.md,
// "Sandboxes"). Spec.Limits and Spec.Image are ignored; commands run as the
// agent's own user.
//
// State lives under Config.Dir, one folder per sandbox:
//
//	<Dir>/<id>/meta.json    key, labels, environment
//	<Dir>/<id>/pgids        process groups started in it (killed by Destroy)
//	<Dir>/<id>/workspace/   the workspace
//	<Dir>/<id>/uploads/     the session's mounted files (../uploads from
//	                        the workspace: no /mnt/session here, and
//	                        nothing keeps the agent's user from writing)
//	<Dir>/<id>/outputs/     what the session publishes (../outputs)
//	<Dir>/<id>/memory/      the session's memory stores (../memory)
package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/internal/capture"
	"corral.dev/corral/hostagent/internal/workspace"
	"corral.dev/corral/internal/errdefs"
)

// Name is the provider name.
const Name = "process"

// DefaultPath is the PATH of sandbox processes when Spec.Env has none.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// Config configures the process driver.
type Config struct {
	// Dir holds the sandboxes' folders. Required.
	Dir string
	// AllowUntrusted acknowledges that this driver is no isolation at all.
	// Without it New fails.
	AllowUntrusted bool
}

// Driver runs sandboxes as folders and host processes.
type Driver struct{ dir string }

var _ driver.Driver = (*Driver)(nil)

type meta struct {
	Key     string            `json:"key"`
	ID      string            `json:"id"`
	Env     map[string]string `json:"env,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	Created time.Time         `json:"created"`
}

// New returns the driver, or an error of kind permission denied unless
// cfg.AllowUntrusted is set.
func New(cfg Config) (*Driver, error) {
	if !cfg.AllowUntrusted {
		return nil, errdefs.PermissionDenied("the process driver runs commands directly on the host with no isolation; it is for development only and needs an explicit unsafe override (AllowUntrusted)")
	}
	if cfg.Dir == "" {
		return nil, errdefs.InvalidArgument("process driver: Dir is required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("process driver: creating %s: %w", cfg.Dir, err)
	}
	return &Driver{dir: cfg.Dir}, nil
}

// Name is "process".
func (d *Driver) Name() string { return Name }

// lock serialises Create and Destroy across Driver values and processes.
func (d *Driver) lock() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(d.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("process driver: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("process driver: lock: %w", err)
	}
	return func() { f.Close() }, nil
}

func (d *Driver) metas() ([]meta, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("process driver: listing: %w", err)
	}
	var out []meta
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		m, err := d.load(e.Name())
		if err != nil {
			continue // half-made or being removed
		}
		out = append(out, m)
	}
	return out, nil
}

func (d *Driver) load(id string) (meta, error) {
	var m meta
	if id == "" || strings.ContainsAny(id, `/\`) || id == "." || id == ".." {
		return m, errdefs.NotFound("sandbox %q does not exist", id)
	}
	b, err := os.ReadFile(filepath.Join(d.dir, id, "meta.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return m, errdefs.NotFound("sandbox %s does not exist (destroyed or never created)", id)
	}
	if err != nil {
		return m, fmt.Errorf("reading sandbox %s: %w", id, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("reading sandbox %s: %w", id, err)
	}
	return m, nil
}

func (d *Driver) ref(m meta) driver.Ref {
	return driver.Ref{Provider: Name, Key: m.Key, ID: m.ID, Labels: m.Labels, Created: m.Created}
}

// Create makes or returns the sandbox for spec.Key.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (driver.Ref, error) {
	if spec.Key == "" {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox key is required")
	}
	if spec.NetworkNamespace != "" {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox %q: this driver has no network namespaces; it cannot give a sandbox egress", spec.Key)
	}
	unlock, err := d.lock()
	if err != nil {
		return driver.Ref{}, err
	}
	defer unlock()
	ms, err := d.metas()
	if err != nil {
		return driver.Ref{}, err
	}
	for _, m := range ms {
		if m.Key == spec.Key {
			return d.ref(m), nil
		}
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	m := meta{Key: spec.Key, ID: "proc-" + hex.EncodeToString(nonce[:]), Env: spec.Env, Labels: spec.Labels, Created: time.Now().UTC()}
	dir := filepath.Join(d.dir, m.ID)
	for _, sub := range []string{"workspace", "uploads", "outputs", "memory"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return driver.Ref{}, fmt.Errorf("creating sandbox %s: %w", m.ID, err)
		}
	}
	b, _ := json.Marshal(m)
	// meta.json appears last and atomically: a folder without it is a
	// half-made sandbox that Destroy or the next Create's scan ignores.
	tmp := filepath.Join(dir, "meta.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		os.RemoveAll(dir)
		return driver.Ref{}, fmt.Errorf("creating sandbox %s: %w", m.ID, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "meta.json")); err != nil {
		os.RemoveAll(dir)
		return driver.Ref{}, fmt.Errorf("creating sandbox %s: %w", m.ID, err)
	}
	return d.ref(m), nil
}

func checkProvider(ref driver.Ref) error {
	if ref.Provider != Name {
		return errdefs.InvalidArgument("sandbox %s belongs to provider %q, not %q", ref.ID, ref.Provider, Name)
	}
	return nil
}

// Attach returns the sandbox behind ref.
func (d *Driver) Attach(ctx context.Context, ref driver.Ref) (driver.Sandbox, error) {
	if err := checkProvider(ref); err != nil {
		return nil, err
	}
	m, err := d.load(ref.ID)
	if err != nil {
		return nil, err
	}
	return &sandbox{d: d, ref: d.ref(m)}, nil
}

// Destroy kills the sandbox's process groups and removes its folder.
func (d *Driver) Destroy(ctx context.Context, ref driver.Ref) error {
	if err := checkProvider(ref); err != nil {
		return err
	}
	if _, err := d.load(ref.ID); errdefs.IsNotFound(err) {
		return nil
	}
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	dir := filepath.Join(d.dir, ref.ID)
	// meta.json goes first, so a crash half-way leaves no sandbox behind.
	if err := os.Remove(filepath.Join(dir, "meta.json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("destroying sandbox %s: %w", ref.ID, err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "pgids"))
	for _, line := range strings.Fields(string(raw)) {
		if pgid, err := strconv.Atoi(line); err == nil && pgid > 1 {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", ref.ID, err)
	}
	return nil
}

// Pause is not supported: a folder on the host has no checkpoint.
func (d *Driver) Pause(ctx context.Context, ref driver.Ref) error {
	if err := checkProvider(ref); err != nil {
		return err
	}
	return errdefs.Unimplemented("the %s driver cannot pause sandboxes (no checkpoint of host processes)", Name)
}

// Resume is not supported (nothing is ever paused).
func (d *Driver) Resume(ctx context.Context, ref driver.Ref) error {
	if err := checkProvider(ref); err != nil {
		return err
	}
	return errdefs.Unimplemented("the %s driver cannot pause or resume sandboxes", Name)
}

// List returns every sandbox under Dir.
func (d *Driver) List(ctx context.Context) ([]driver.Ref, error) {
	ms, err := d.metas()
	if err != nil {
		return nil, err
	}
	refs := make([]driver.Ref, 0, len(ms))
	for _, m := range ms {
		refs = append(refs, d.ref(m))
	}
	return refs, nil
}

type sandbox struct {
	d   *Driver
	ref driver.Ref
}

func (s *sandbox) Ref() driver.Ref { return s.ref }

var _ driver.SessionDirs = (*sandbox)(nil)

// SessionDirs implements driver.SessionDirs: folders beside the workspace.
func (s *sandbox) SessionDirs() driver.Dirs {
	dir := filepath.Join(s.d.dir, s.ref.ID)
	return driver.Dirs{Uploads: filepath.Join(dir, "uploads"), Outputs: filepath.Join(dir, "outputs"), Memory: filepath.Join(dir, "memory"), Staging: filepath.Join(dir, "staging")}
}

func (s *sandbox) ws() workspace.Dir {
	return workspace.Dir{Path: filepath.Join(s.d.dir, s.ref.ID, "workspace")}
}

func (s *sandbox) ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	if _, err := s.d.load(s.ref.ID); err != nil {
		return nil, err
	}
	if max <= 0 {
		max = driver.DefaultMaxReadBytes
	}
	return s.ws().ReadFile(path, max)
}

func (s *sandbox) OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	if _, err := s.d.load(s.ref.ID); err != nil {
		return nil, 0, err
	}
	return s.ws().Open(path)
}

func (s *sandbox) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	if _, err := s.d.load(s.ref.ID); err != nil {
		return err
	}
	return s.ws().WriteFile(path, data, mode)
}

func (s *sandbox) ListFiles(ctx context.Context, dir string) ([]driver.FileInfo, error) {
	if _, err := s.d.load(s.ref.ID); err != nil {
		return nil, err
	}
	return s.ws().List(dir)
}

// lookPath finds file on the sandbox's PATH (not the host process's); a
// name with a slash is a path, relative to the working directory dir.
func lookPath(file, path, dir string) (string, error) {
	executable := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
	}
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if !executable(p) {
			return "", errdefs.InvalidArgument("command %q is not an executable file", file)
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(path) {
		if p := filepath.Join(d, file); executable(p) {
			return p, nil
		}
	}
	return "", errdefs.InvalidArgument("command %q not found on PATH %s", file, path)
}

func (s *sandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	m, err := s.d.load(s.ref.ID)
	if err != nil {
		return driver.ExecResult{}, err
	}
	if len(req.Command) == 0 {
		return driver.ExecResult{}, errdefs.InvalidArgument("empty command")
	}
	rel, err := workspace.Clean(req.Dir)
	if err != nil {
		return driver.ExecResult{}, err
	}
	ws := s.ws()
	root, err := os.OpenRoot(ws.Path)
	if err != nil {
		return driver.ExecResult{}, errdefs.Wrap(errdefs.NotFoundKind, err, "sandbox %s workspace", s.ref.ID)
	}
	fi, err := root.Stat(rel)
	root.Close()
	if err != nil || !fi.IsDir() {
		return driver.ExecResult{}, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "working directory %q is not a directory inside the workspace", req.Dir)
	}
	env := map[string]string{"PATH": DefaultPath, "HOME": ws.Path}
	maps.Copy(env, m.Env)
	maps.Copy(env, req.Env)
	bin, err := lookPath(req.Command[0], env["PATH"], filepath.Join(ws.Path, rel))
	if err != nil {
		return driver.ExecResult{}, err
	}
	timeout, max := req.Timeout, req.MaxOutput
	if timeout <= 0 {
		timeout = driver.DefaultExecTimeout
	}
	if max <= 0 {
		max = driver.DefaultMaxOutput
	}
	stdout, stderr := capture.New(max, req.Stdout), capture.New(max, req.Stderr)
	// The output waits until the command's process group is on disk
	// (recordPgid): whoever has seen a command's output can count on
	// Destroy finding it, even if this process dies the next moment (an
	// agent killed mid-command leaves it for the next agent's Destroy).
	recorded := make(chan struct{})
	cmd := &exec.Cmd{
		Path:        bin,
		Args:        req.Command,
		Dir:         filepath.Join(ws.Path, rel),
		Stdout:      gatedWriter{stdout, recorded},
		Stderr:      gatedWriter{stderr, recorded},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
		// A background process may keep the output pipes open: stop
		// copying shortly after the command itself exits.
		WaitDelay: time.Second,
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	var stdinW *os.File
	if req.Stdin != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return driver.ExecResult{}, fmt.Errorf("exec: stdin pipe: %w", err)
		}
		defer r.Close()
		cmd.Stdin, stdinW = r, w
	}
	if req.BeforeStart != nil {
		if err := req.BeforeStart(); err != nil {
			close(recorded)
			if stdinW != nil {
				stdinW.Close()
			}
			return driver.ExecResult{}, err
		}
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		close(recorded)
		if stdinW != nil {
			stdinW.Close()
		}
		return driver.ExecResult{}, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "starting %q", req.Command[0])
	}
	pgid := cmd.Process.Pid
	s.recordPgid(pgid)
	close(recorded)
	if stdinW != nil {
		go func() {
			_, _ = io.Copy(stdinW, req.Stdin)
			stdinW.Close()
		}()
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var timedOut bool
	var werr error
	select {
	case werr = <-waited:
	case <-timer.C:
		timedOut = true
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		werr = <-waited
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-waited
	}
	res := driver.ExecResult{
		ExitCode:  cmd.ProcessState.ExitCode(),
		Stdout:    stdout.Bytes(),
		Stderr:    stderr.Bytes(),
		Truncated: stdout.Truncated() || stderr.Truncated(),
		Duration:  time.Since(start),
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.ExitCode = 128 + int(ws.Signal())
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if timedOut {
		res.ExitCode, res.TimedOut = driver.TimeoutExitCode, true
	}
	var exitErr *exec.ExitError
	if werr != nil && !errors.As(werr, &exitErr) && !errors.Is(werr, exec.ErrWaitDelay) {
		return res, fmt.Errorf("exec %q: %w", req.Command[0], werr)
	}
	return res, nil
}

// gatedWriter passes writes to w once open is closed.
type gatedWriter struct {
	w    io.Writer
	open <-chan struct{}
}

func (g gatedWriter) Write(p []byte) (int, error) {
	<-g.open
	return g.w.Write(p)
}

func (s *sandbox) recordPgid(pgid int) {
	f, err := os.OpenFile(filepath.Join(s.d.dir, s.ref.ID, "pgids"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, pgid)
}

func (s *sandbox) CreateFile(ctx context.Context, path string, mode fs.FileMode) (io.WriteCloser, error) {
	if _, err := s.d.load(s.ref.ID); err != nil {
		return nil, err
	}
	return s.ws().Create(path, mode)
}
