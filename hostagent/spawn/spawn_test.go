package spawn

import (
	"bytes"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary be the start step: init starts
// /proc/self/exe, which is the test binary here.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "start" {
		os.Exit(Start(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// setup starts an init server in this process, serving a socket in a
// temporary directory, with nproc for its commands; it returns the socket.
func setup(t *testing.T, nproc uint64) string {
	t.Helper()
	return setupWith(t, nproc, true)
}

// setupWith is setup with init starting commands traced (startTraced) or
// through the start step.
func setupWith(t *testing.T, nproc uint64, traced bool) string {
	t.Helper()
	dir := t.TempDir() + "/rendezvous"
	s := newInitServer(nproc)
	s.traced = traced
	ln, err := s.listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	stop := make(chan struct{})
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		for {
			select {
			case <-chld:
				s.reap()
			case <-stop:
				return
			}
		}
	}()
	go s.accept(ln)
	t.Cleanup(func() {
		ln.Close()
		signal.Stop(chld)
		close(stop)
		<-reaped
	})
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the rendezvous: %v, %v", fi.Mode(), err)
	}
	return socketIn(dir)
}

type result struct {
	code           int
	stdout, stderr string
}

// relayRun runs argv through the relay and init at sock.
func relayRun(t *testing.T, sock string, stdin *string, dir string, env []string, argv ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	var in *strings.Reader
	if stdin != nil {
		in = strings.NewReader(*stdin)
	}
	code := relay(sock, RelayArgs(64, stdin != nil, dir, env, argv), readerOrNil(in), &out, &errb)
	return result{code, out.String(), errb.String()}
}

func readerOrNil(r *strings.Reader) interface{ Read([]byte) (int, error) } {
	if r == nil {
		return strings.NewReader("")
	}
	return r
}

func TestRelayRunsCommandsUnderInit(t *testing.T) {
	for _, traced := range []bool{true, false} {
		t.Run("traced="+strconv.FormatBool(traced), func(t *testing.T) { testRelayRunsCommands(t, setupWith(t, 40, traced)) })
	}
}

func testRelayRunsCommands(t *testing.T, sock string) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/script", []byte("echo from a script without a shebang\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/bin:/bin", "ONLY=this"}
	input := "to the end\n"
	for _, tt := range []struct {
		name  string
		stdin *string
		argv  []string
		want  result
	}{
		{"output and status", nil, []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, result{3, "out\n", "err\n"}},
		{"exactly the environment", nil, []string{"env"}, result{0, "PATH=/usr/bin:/bin\nONLY=this\n", ""}},
		{"the directory", nil, []string{"pwd"}, result{0, dir + "\n", ""}},
		{"stdin", &input, []string{"cat"}, result{0, input, ""}},
		{"no stdin", nil, []string{"cat"}, result{0, "", ""}},
		{"a signal", nil, []string{"sh", "-c", "kill -9 $$"}, result{137, "", ""}},
		{"not found", nil, []string{"nonesuch"}, result{127, "", NotFound + "nonesuch\n"}},
		{"a script without #!", nil, []string{"./script"}, result{0, "from a script without a shebang\n", ""}},
		{"its own session and limit", nil, []string{"sh", "-c", `set -- $(cat /proc/self/stat | sed 's/.*) //'); [ "$4" = "$$" ] || [ "$4" = "$(cat /proc/self/stat | cut -d' ' -f1)" ]; echo $?; grep processes /proc/self/limits | tr -s ' ' | cut -d' ' -f3,4`}, result{0, "0\n40 40\n", ""}},
		{"no descriptor of init's or the relay's", nil, []string{"sh", "-c", "ls /proc/self/fd | wc -l"}, result{0, "4\n", ""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := relayRun(t, sock, tt.stdin, dir, env, tt.argv...)
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A background process that keeps the command's output open does not
// keep the relay: it ends with the command, with what the command wrote.
func TestRelayEndsWithTheCommand(t *testing.T) {
	sock := setup(t, 40)
	start := time.Now()
	got := relayRun(t, sock, nil, "/", []string{"PATH=/usr/bin:/bin"}, "sh", "-c", "sleep 30 & seq 1 20000")
	if got.code != 0 || !strings.HasSuffix(got.stdout, "\n20000\n") {
		t.Errorf("got %d, %d bytes ending %q", got.code, len(got.stdout), got.stdout[max(0, len(got.stdout)-20):])
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the relay waited %v for the background process", d)
	}
}

// A missing directory is the cd's failure, status 2.
func TestRelayMissingDirectory(t *testing.T) {
	// One init at a time in this process: each reaps every child.
	for _, traced := range []bool{true, false} {
		t.Run("traced="+strconv.FormatBool(traced), func(t *testing.T) {
			sock := setupWith(t, 40, traced)
			got := relayRun(t, sock, nil, "/nonexistent/dir", []string{"PATH=/usr/bin:/bin"}, "/bin/true")
			if got.code != 2 || !strings.Contains(got.stderr, "cd /nonexistent/dir") {
				t.Errorf("got %+v", got)
			}
		})
	}
}

// Init refuses what is not a request, and goes on serving.
func TestInitRefusesMalformedRequests(t *testing.T) {
	sock := setup(t, 40)
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	good, err := Request{Path: "/bin/true", Dir: "/", Argv: []string{"true"}}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for name, send := range map[string]struct {
		msg []byte
		fds []int
	}{
		"garbage":            {[]byte("GET / HTTP/1.0\r\n\r\n"), nil},
		"a lying length":     {append(append([]byte("CSQ1"), 0xff, 0xff, 0xff, 0xff), 0), nil},
		"too few fds":        {good, p[:1]},
		"too many fds":       {good, []int{p[0], p[1], p[0], p[1]}},
		"a truncated body":   {good[:len(good)-2], p[:]},
		"bytes past the end": {append(append([]byte{}, good...), 'x'), p[:]},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var oob []byte
			if send.fds != nil {
				oob = syscall.UnixRights(send.fds...)
			}
			if _, _, err := c.WriteMsgUnix(send.msg, oob, nil); err != nil {
				t.Fatal(err)
			}
			_ = c.CloseWrite()
			rep, err := ReadReply(c)
			if err != nil || rep.Kind != Failed {
				t.Errorf("reply %+v, %v; want a refusal", rep, err)
			}
		})
	}
	if got := relayRun(t, sock, nil, "/", nil, "/bin/sh", "-c", "echo still"); got != (result{0, "still\n", ""}) {
		t.Errorf("init after the malformed requests: %+v", got)
	}
}

// Without init, the relay runs the command itself, with the same limit.
func TestRelayWithoutInit(t *testing.T) {
	socketWait = 50 * time.Millisecond
	t.Cleanup(func() { socketWait = 5 * time.Second })
	got := relayRun(t, t.TempDir()+"/none.sock", nil, "/", []string{"PATH=/usr/bin:/bin"}, "sh", "-c", "grep processes /proc/self/limits | tr -s ' ' | cut -d' ' -f3; echo err >&2")
	if got != (result{0, strconv.Itoa(64) + "\n", "err\n"}) {
		t.Errorf("got %+v", got)
	}
}

func TestParseArgsRefuse(t *testing.T) {
	for _, args := range [][]string{nil, {"2", "64", "0", "/", "0", "true"}, {"1", "x", "0", "/", "0", "true"}, {"1", "64", "2", "/", "0", "true"}, {"1", "64", "0", "/", "1", "A=b"}, {"1", "64", "0", "/", "-1", "true"}} {
		if _, _, err := parseRelay(args); err == nil {
			t.Errorf("parseRelay(%q) took it", args)
		}
	}
	for _, args := range [][]string{nil, {"2", "64", "/bin/true", "/", "1", "true"}, {"1", "0", "/bin/true", "/", "1", "true"}, {"1", "64", "/bin/true", "/", "2", "true"}, {"1", "64", "/bin/true", "/", "0"}} {
		if _, _, err := parseStart(args); err == nil {
			t.Errorf("parseStart(%q) took it", args)
		}
	}
}
