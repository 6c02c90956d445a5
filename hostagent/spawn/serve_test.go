package spawn

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// server is a command server run in this process, on pipes.
type server struct {
	in   *io.PipeWriter
	pid  int
	exit chan int // serve's status

	mu      sync.Mutex
	results map[uint32]*served
	ended   chan uint32
	err     error // of the frames read
}

// served is what the server said of one command.
type served struct {
	marked         bool
	stdout, stderr bytes.Buffer
	code           int
	order          []byte // the kinds of its frames, in order
}

func startServer(t *testing.T, sock string, own bool) *server {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &server{in: inW, exit: make(chan int, 1), results: map[uint32]*served{}, ended: make(chan uint32, 64)}
	var diag bytes.Buffer
	go func() {
		s.exit <- serve(sock, ServeArgs(own, 40), inR, outW, &diag)
		outW.Close()
	}()
	r := bufio.NewReader(outR)
	kind, id, payload, err := ReadFrame(r, MaxOutputFrame)
	if err != nil || kind != FrameHello || id != 0 {
		t.Fatalf("the hello: %q %d %v (%s)", kind, id, err, diag.String())
	}
	if s.pid, err = ParseHello(payload); err != nil || s.pid != os.Getpid() {
		t.Fatalf("the hello's pid: %d %v", s.pid, err)
	}
	go func() {
		for {
			kind, id, payload, err := ReadFrame(r, MaxOutputFrame)
			s.mu.Lock()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.err = err
				}
				s.mu.Unlock()
				close(s.ended)
				return
			}
			res := s.results[id]
			if res == nil {
				res = &served{}
				s.results[id] = res
			}
			res.order = append(res.order, kind)
			switch kind {
			case FrameMark:
				_, err = Mark(payload)
				res.marked = err == nil
			case FrameStdout:
				res.stdout.Write(payload)
			case FrameStderr:
				res.stderr.Write(payload)
			case FrameExit:
				res.code, err = ExitCode(payload)
			}
			if err != nil {
				s.err = err
			}
			s.mu.Unlock()
			if kind == FrameExit {
				s.ended <- id
			}
		}
	}()
	t.Cleanup(func() {
		inW.Close()
		select {
		case code := <-s.exit:
			if code != 0 {
				t.Errorf("serve exited %d at the end of its input: %s", code, diag.String())
			}
		case <-time.After(10 * time.Second):
			t.Error("serve did not end with its input")
		}
	})
	return s
}

func (s *server) start(t *testing.T, id uint32, dir string, env []string, argv ...string) {
	t.Helper()
	payload, err := StartPayload(RelayArgs(40, false, dir, env, argv))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.in.Write(AppendFrame(nil, FrameStart, id, payload)); err != nil {
		t.Fatal(err)
	}
}

// wait waits for n commands to end and returns what the server said of
// each.
func (s *server) wait(t *testing.T, n int) map[uint32]*served {
	t.Helper()
	for range n {
		select {
		case _, ok := <-s.ended:
			if !ok {
				t.Fatalf("the server's output ended: %v", s.err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a command did not end in a minute")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.results
}

// Commands run at the same time through one server, each with its own
// output and status, its mark first and its exit last; under init (its
// socket) and as the server's own children.
func TestServeRunsCommands(t *testing.T) {
	// One init at a time in this process: each reaps every child.
	for _, own := range []bool{false, true} {
		t.Run("own="+strconv.FormatBool(own), func(t *testing.T) {
			sock := t.TempDir() + "/no-init.sock"
			if !own {
				sock = setup(t, 40)
			}
			s := startServer(t, sock, own)
			dir := t.TempDir()
			env := []string{"PATH=/usr/bin:/bin", "ONLY=this"}
			want := map[uint32]served{}
			for i := range uint32(6) {
				n := strconv.Itoa(int(i))
				s.start(t, i+1, dir, env, "sh", "-c", "sleep 0.$((RANDOM % 3)) 2>/dev/null; echo out"+n+"; echo err"+n+" >&2; exit "+n)
				want[i+1] = served{code: int(i)}
			}
			s.start(t, 10, dir, env, "env")
			s.start(t, 11, dir, env, "nonesuch")
			s.start(t, 12, dir, env, "sh", "-c", `grep processes /proc/self/limits | tr -s ' ' | cut -d' ' -f3,4; ls /proc/self/fd | wc -l`)
			s.start(t, 13, dir, env, "sh", "-c", "sleep 30 & seq 1 20000")
			got := s.wait(t, 10)
			for id, w := range want {
				n := strconv.Itoa(int(id - 1))
				g := got[id]
				if g.code != w.code || g.stdout.String() != "out"+n+"\n" || g.stderr.String() != "err"+n+"\n" {
					t.Errorf("command %d: %d %q %q", id, g.code, g.stdout.String(), g.stderr.String())
				}
			}
			for id, g := range got {
				if !bytes.HasSuffix(g.order, []byte{FrameExit}) || bytes.Count(g.order, []byte{FrameExit}) != 1 {
					t.Errorf("command %d: frames %q, want one exit, last", id, g.order)
				}
				if id != 11 && (!g.marked || g.order[0] != FrameMark) {
					t.Errorf("command %d: frames %q, want its mark first", id, g.order)
				}
			}
			if g := got[10]; g.stdout.String() != "PATH=/usr/bin:/bin\nONLY=this\n" {
				t.Errorf("the environment: %q", g.stdout.String())
			}
			if g := got[11]; g.code != 127 || g.stderr.String() != NotFound+"nonesuch\n" {
				t.Errorf("not found: %d %q", g.code, g.stderr.String())
			}
			if g := got[12]; g.code != 0 || g.stdout.String() != "40 40\n4\n" {
				t.Errorf("the limit and the descriptors: %d %q %q", g.code, g.stdout.String(), g.stderr.String())
			}
			if g := got[13]; g.code != 0 || !strings.HasSuffix(g.stdout.String(), "\n20000\n") {
				t.Errorf("a command leaving a process behind: %d, %d bytes", g.code, g.stdout.Len())
			}
		})
	}
}

// Output larger than a frame arrives whole, cut into frames.
func TestServeCutsOutputIntoFrames(t *testing.T) {
	s := startServer(t, setup(t, 40), false)
	s.start(t, 1, "/", []string{"PATH=/usr/bin:/bin"}, "head", "-c", "300000", "/dev/zero")
	got := s.wait(t, 1)[1]
	if got.code != 0 || got.stdout.Len() != 300000 || bytes.Count(got.order, []byte{FrameStdout}) < 300000/MaxOutputFrame {
		t.Errorf("got %d, %d bytes in frames %q", got.code, got.stdout.Len(), got.order)
	}
}

// What the server cannot parse ends it, with status 2; a start frame that
// does not decode is that command's failure alone.
func TestServeRefusesMalformedFrames(t *testing.T) {
	for _, tt := range []struct {
		name  string
		frame []byte
	}{
		{"unknown kind", AppendFrame(nil, 'Z', 1, nil)},
		{"too long", AppendFrame(nil, FrameStart, 1, nil)[:5]},
		{"truncated", []byte{FrameStart, 0, 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			frame := tt.frame
			if tt.name == "too long" {
				frame = append(frame, 0xff, 0xff, 0xff, 0xff)
			}
			var out, diag bytes.Buffer
			code := serve(t.TempDir()+"/sock", ServeArgs(false, 40), bytes.NewReader(frame), &out, &diag)
			if code != 2 || diag.Len() == 0 {
				t.Errorf("exit %d, %q", code, diag.String())
			}
		})
	}
	t.Run("a start frame that does not decode", func(t *testing.T) {
		var out, diag bytes.Buffer
		in := AppendFrame(nil, FrameStart, 7, []byte{0x05, 0x01})
		if code := serve(t.TempDir()+"/sock", ServeArgs(false, 40), bytes.NewReader(in), &out, &diag); code != 0 {
			t.Fatalf("exit %d: %s", code, diag.String())
		}
		r := bytes.NewReader(out.Bytes())
		var kinds []byte
		for {
			kind, id, payload, err := ReadFrame(r, MaxOutputFrame)
			if err != nil {
				break
			}
			kinds = append(kinds, kind)
			if kind == FrameExit {
				if c, _ := ExitCode(payload); id != 7 || c != 126 {
					t.Errorf("exit frame of %d: %d", id, c)
				}
			}
		}
		if string(kinds) != "HEX" {
			t.Errorf("frames %q, want hello, its stderr, its exit", kinds)
		}
	})
	for _, args := range [][]string{nil, {"2", "init", "40"}, {"1", "other", "40"}, {"1", "own", "0"}} {
		var diag bytes.Buffer
		if code := serve("/nonexistent", args, strings.NewReader(""), io.Discard, &diag); code != 2 {
			t.Errorf("serve %q: exit %d", args, code)
		}
	}
}

// A start frame's strings decode as they were encoded, and what lies about
// its lengths is refused, never read past.
func TestStartPayloadRoundTrip(t *testing.T) {
	args := RelayArgs(40, false, "/work", []string{"A=1", ""}, []string{"sh", "-c", "echo \x00?"})
	b, err := StartPayload(args)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseStrings(b)
	if err != nil || strings.Join(got, "|") != strings.Join(args, "|") {
		t.Fatalf("got %q %v", got, err)
	}
	for i := range b {
		if _, err := parseStrings(b[:i]); err == nil {
			t.Errorf("a payload cut at %d of %d parsed", i, len(b))
		}
	}
	if _, err := parseStrings([]byte{0xff, 0xff, 0xff, 0x0f}); err == nil {
		t.Error("a count past the payload parsed")
	}
}
