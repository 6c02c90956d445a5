// Package pglocal runs a private PostgreSQL cluster from the machine's own
// binaries: `corral dev` keeps its data in one, and the test helper starts one
// per `go test` process.
//
// The cluster listens on 127.0.0.1 only, with password authentication. It
// holds three roles: the bootstrap superuser, an owner role that owns the
// corral database and runs migrations, and an application role that owns
// nothing, so row-level security applies to every query the control plane
// makes. Their passwords are generated at init and kept beside the cluster in a
// file only the invoking user can read.
//
// PostgreSQL refuses to run as root. When corral runs as root the server runs
// as the `postgres` user (Options.RunAs), and the cluster directory is handed
// to that user.
//
//	Init (once) ── initdb ── write credentials ── start ── create roles and database
//	Start ──────── postgres -D dir (child process, own process group) ── wait ready
//	Stop ───────── SIGINT (fast shutdown) ── wait ── SIGQUIT after a timeout
package pglocal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/internal/freeport"
)

// Role names created in every cluster.
const (
	OwnerRole = "corral_owner"
	AppRole   = "corral_app"
	Database  = "corral"
)

// DefaultBinDirs are searched, in order, for initdb and postgres.
var DefaultBinDirs = []string{
	"/usr/lib/postgresql/17/bin",
	"/usr/lib/postgresql/16/bin",
	"/usr/lib/postgresql/15/bin",
}

// Options configure a cluster.
type Options struct {
	// Dir holds the cluster: pgdata/, credentials.json and the server log.
	Dir string
	// BinDir holds initdb and postgres; empty searches PATH then DefaultBinDirs.
	BinDir string
	// Port to listen on at 127.0.0.1; 0 picks a free one at each start.
	Port int
	// RunAs is the OS user the server runs as when corral runs as root.
	// Default "postgres".
	RunAs string
	// StartTimeout bounds how long Start waits for readiness. Default 60s.
	StartTimeout time.Duration
	// Settings are extra server settings (-c name=value).
	Settings map[string]string
	Logger   *slog.Logger
}

// Credentials are the generated role passwords.
type Credentials struct {
	Superuser         string `json:"superuser"`
	SuperuserPassword string `json:"superuser_password"`
	OwnerPassword     string `json:"owner_password"`
	AppPassword       string `json:"app_password"`
}

// Cluster is a running server.
type Cluster struct {
	opts  Options
	creds Credentials
	port  int

	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// Start initializes the cluster if Dir holds none, starts the server and waits
// until it accepts connections. The caller must call Stop.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("pglocal: no directory given")
	}
	if opts.RunAs == "" {
		opts.RunAs = "postgres"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	bin, err := findBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	opts.BinDir = bin
	cred, err := runAs(opts.RunAs)
	if err != nil {
		return nil, err
	}

	c := &Cluster{opts: opts}
	fresh := false
	if _, err := os.Stat(filepath.Join(c.dataDir(), "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := c.initdb(ctx, cred); err != nil {
			return nil, err
		}
		fresh = true
	} else if err != nil {
		return nil, fmt.Errorf("checking cluster at %s: %w", c.dataDir(), err)
	}
	if err := c.loadCredentials(); err != nil {
		return nil, err
	}
	if err := c.start(ctx, cred); err != nil {
		return nil, err
	}
	if fresh {
		if err := c.bootstrap(ctx); err != nil {
			c.Stop(context.Background())
			return nil, fmt.Errorf("creating roles: %w", err)
		}
	}
	return c, nil
}

func (c *Cluster) dataDir() string   { return filepath.Join(c.opts.Dir, "pgdata") }
func (c *Cluster) credsPath() string { return filepath.Join(c.opts.Dir, "credentials.json") }
func (c *Cluster) logPath() string   { return filepath.Join(c.opts.Dir, "postgres.log") }

// Port is the TCP port the server listens on at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Credentials returns the role passwords.
func (c *Cluster) Credentials() Credentials { return c.creds }

// URL returns a connection URL for one of the cluster's roles: the superuser
// name, OwnerRole or AppRole.
func (c *Cluster) URL(role, database string) string {
	pw := c.creds.AppPassword
	switch role {
	case OwnerRole:
		pw = c.creds.OwnerPassword
	case c.creds.Superuser:
		pw = c.creds.SuperuserPassword
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(role, pw),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// SuperuserURL connects to database as the bootstrap superuser.
func (c *Cluster) SuperuserURL(database string) string { return c.URL(c.creds.Superuser, database) }

// Exited is closed when the server process ends, for whatever reason.
func (c *Cluster) Exited() <-chan struct{} { return c.exited }

// Restart stops the server as Stop does, calls between (if not nil) while
// it is down, and starts it again on the same port: what an operator's
// `pg_ctl restart -m fast` does, for tests of the clients' recovery. Call
// it from one goroutine; not after Stop.
func (c *Cluster) Restart(ctx context.Context, between func()) error {
	if err := c.stop(ctx); err != nil {
		return err
	}
	if between != nil {
		between()
	}
	cred, err := runAs(c.opts.RunAs)
	if err != nil {
		return err
	}
	port := c.opts.Port
	c.opts.Port = c.port // the clients' URLs name it
	defer func() { c.opts.Port = port }()
	return c.start(ctx, cred)
}

// Stop shuts the server down (fast shutdown: sessions are disconnected, data
// is flushed) and waits for it to exit. It is safe to call more than once.
func (c *Cluster) Stop(ctx context.Context) error {
	var err error
	c.stopOnce.Do(func() { err = c.stop(ctx) })
	return err
}

func (c *Cluster) stop(ctx context.Context) error {
	if c.cmd == nil || c.cmd.Process == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
		return nil
	case <-ctx.Done():
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		<-c.exited
		return ctx.Err()
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		<-c.exited
		return errors.New("postgres did not stop within 30s; sent SIGQUIT")
	}
}

func (c *Cluster) initdb(ctx context.Context, cred *syscall.Credential) error {
	c.opts.Logger.Info("initializing postgres cluster", "dir", c.dataDir())
	if err := os.MkdirAll(c.opts.Dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", c.opts.Dir, err)
	}
	superuser := "postgres"
	if cred == nil {
		if u, err := user.Current(); err == nil {
			superuser = u.Username
		}
	}
	creds := Credentials{
		Superuser:         superuser,
		SuperuserPassword: randomSecret(),
		OwnerPassword:     randomSecret(),
		AppPassword:       randomSecret(),
	}
	// initdb reads the superuser password from a file; the server user must
	// be able to read it, and it is removed right after.
	pwFile := filepath.Join(c.opts.Dir, ".initdb-pw")
	if err := os.WriteFile(pwFile, []byte(creds.SuperuserPassword+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwFile)
	if err := os.Mkdir(c.dataDir(), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if cred != nil {
		for _, p := range []string{pwFile, c.dataDir()} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("handing %s to the postgres user: %w", p, err)
			}
		}
		if err := checkTraversable(c.opts.Dir, cred); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.opts.BinDir, "initdb"),
		"-D", c.dataDir(), "-U", superuser, "--pwfile", pwFile,
		"--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
		"-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb failed: %w: %s", err, lastLines(string(out), 5))
	}
	b, _ := json.MarshalIndent(creds, "", "  ")
	if err := os.WriteFile(c.credsPath(), b, 0o600); err != nil {
		return fmt.Errorf("writing credentials: %w", err)
	}
	return nil
}

func (c *Cluster) loadCredentials() error {
	b, err := os.ReadFile(c.credsPath())
	if err != nil {
		return fmt.Errorf("reading cluster credentials (%s): %w", c.credsPath(), err)
	}
	if err := json.Unmarshal(b, &c.creds); err != nil {
		return fmt.Errorf("parsing %s: %w", c.credsPath(), err)
	}
	return nil
}

func (c *Cluster) start(ctx context.Context, cred *syscall.Credential) error {
	port := c.opts.Port
	if port == 0 {
		p, err := freePort()
		if err != nil {
			return err
		}
		port = p
	}
	c.port = port
	// A postmaster.pid left by a crashed server is handled by postgres
	// itself; one left by a live server makes it refuse, which we report.
	logf, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening postgres log: %w", err)
	}
	args := []string{
		"-D", c.dataDir(),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "fsync=on",
	}
	for k, v := range c.opts.Settings {
		args = append(args, "-c", k+"="+v)
	}
	cmd := exec.Command(filepath.Join(c.opts.BinDir, "postgres"), args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		Setpgid:    true, // a ^C at the terminal reaches corral, which stops postgres in order
		// If corral dies without stopping it, the server gets a fast shutdown
		// rather than lingering.
		Pdeathsig: syscall.SIGINT,
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting postgres: %w", err)
	}
	c.cmd = cmd
	c.exited = make(chan struct{})
	go func() {
		c.waitErr = cmd.Wait()
		logf.Close()
		close(c.exited)
	}()

	deadline := time.Now().Add(c.opts.StartTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, c.SuperuserURL("postgres"))
		cancel()
		if err == nil {
			conn.Close(ctx)
			c.opts.Logger.Debug("postgres ready", "port", port, "pid", cmd.Process.Pid)
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("postgres exited during start-up: %s", lastLines(readTail(c.logPath()), 3))
		case <-ctx.Done():
			c.Stop(context.Background())
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.Stop(context.Background())
			return fmt.Errorf("postgres not ready after %s: %v", c.opts.StartTimeout, err)
		}
	}
}

// bootstrap creates the owner and application roles and the corral database.
func (c *Cluster) bootstrap(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.SuperuserURL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	stmts := []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD %s`, OwnerRole, quoteLiteral(c.creds.OwnerPassword)),
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD %s`, AppRole, quoteLiteral(c.creds.AppPassword)),
		fmt.Sprintf(`CREATE DATABASE %s OWNER %s`, Database, OwnerRole),
		fmt.Sprintf(`REVOKE ALL ON DATABASE %s FROM PUBLIC`, Database),
		fmt.Sprintf(`GRANT CONNECT ON DATABASE %s TO %s`, Database, AppRole),
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(s, " PASSWORD", 2)[0], err)
		}
	}
	return nil
}

func findBinDir(dir string) (string, error) {
	has := func(d string) bool {
		_, err1 := os.Stat(filepath.Join(d, "initdb"))
		_, err2 := os.Stat(filepath.Join(d, "postgres"))
		return err1 == nil && err2 == nil
	}
	if dir != "" {
		if !has(dir) {
			return "", fmt.Errorf("no initdb and postgres in %s", dir)
		}
		return dir, nil
	}
	for _, d := range DefaultBinDirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if d := filepath.Dir(p); has(d) {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries not found (looked in " +
		strings.Join(DefaultBinDirs, ", ") + " and PATH); install the postgresql package")
}

// runAs returns the credential to run the server with: nil when corral is not
// root, the named user's otherwise.
func runAs(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root and user %q was not found: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Reachable reports why the server user could not reach dir, or nil. When
// corral does not run as root the server runs as the same user, and dir is
// always reachable.
func Reachable(dir, runAsUser string) error {
	if runAsUser == "" {
		runAsUser = "postgres"
	}
	cred, err := runAs(runAsUser)
	if err != nil || cred == nil {
		return err
	}
	return checkTraversable(dir, cred)
}

// checkTraversable fails early, with a readable message, when the server user
// cannot reach dir (a data dir under /root, say).
func checkTraversable(dir string, cred *syscall.Credential) error {
	cmd := exec.Command("/bin/test", "-x", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the postgres user (uid %d) cannot reach %s; choose a data dir outside private home directories", cred.Uid, dir)
	}
	return nil
}

func freePort() (int, error) {
	p, err := freeport.Port("127.0.0.1")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	return p, nil
}

func randomSecret() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func readTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
