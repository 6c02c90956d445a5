package spawn

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// OutOfProcesses starts the message of a relay whose init could not fork
// the command (EAGAIN: the sandbox has as many processes as it may); the
// relay exits 126.
const OutOfProcesses = "corral: the sandbox is out of processes: "

// relayVersion is the version of the relay's arguments.
const relayVersion = "1"

// How long a relay waits for init's socket, made as init starts: the
// first command may come right after the sandbox did, on a busy host. A
// variable for tests.
var socketWait = 5 * time.Second

// maxDrain bounds what a relay copies of a stream once the command has
// ended: what it wrote is in the pipe (at most the pipe's capacity); a
// background process still writing is cut off.
const maxDrain = 1 << 20

// defaultPath is the PATH of a command whose environment has none, as a
// shell's.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// RelayArgs is what follows `corral-spawn relay` for a command: argv run
// in dir with exactly env, at most nproc processes (only for a relay that
// runs it itself, init not answering: init gives every command the
// sandbox's limit), with stdin or /dev/null.
func RelayArgs(nproc int64, stdin bool, dir string, env, argv []string) []string {
	in := "0"
	if stdin {
		in = "1"
	}
	args := make([]string, 0, 5+len(env)+len(argv))
	args = append(args, relayVersion, strconv.FormatInt(nproc, 10), in, dir, strconv.Itoa(len(env)))
	args = append(args, env...)
	return append(args, argv...)
}

func parseRelay(args []string) (uint64, Request, error) {
	if len(args) < 5 || args[0] != relayVersion {
		return 0, Request{}, errors.New("relay: want version " + relayVersion + ", nproc, stdin, dir, envc, env and argv")
	}
	nproc, err := strconv.ParseUint(args[1], 10, 64)
	if err != nil || nproc == 0 {
		return 0, Request{}, fmt.Errorf("relay: nproc %q", args[1])
	}
	envc, err := strconv.Atoi(args[4])
	rest := args[5:]
	if err != nil || envc < 0 || envc >= len(rest) || (args[2] != "0" && args[2] != "1") {
		return 0, Request{}, fmt.Errorf("relay: stdin %q, envc %q of %d arguments", args[2], args[4], len(rest))
	}
	return nproc, Request{Dir: args[3], Env: rest[:envc], Argv: rest[envc:], Stdin: args[2] == "1"}, nil
}

// Relay hands the command args describe (RelayArgs) to init, copies its
// output to stdout and stderr and stdin to it, and returns its exit
// status. The command never gets the relay's own descriptors.
func Relay(args []string, stdin, stdout, stderr *os.File) int {
	runtime.GOMAXPROCS(1)
	return relay(Socket, args, stdin, stdout, stderr)
}

// relay is Relay through the socket sock.
func relay(sock string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(args, underInit(sock), stdin, stdout, stderr)
}

// starter starts req with the far ends of p as its streams, at most nproc
// processes where it sets the limit itself, and returns what waits for
// how it ended.
type starter func(nproc uint64, req Request, p *pipes) (func() (Reply, error), error)

// underInit hands each command to init at sock; where init does not take
// it (its socket is not there), the command starts as the caller's own
// child, through the start step.
func underInit(sock string) starter {
	return func(nproc uint64, req Request, p *pipes) (func() (Reply, error), error) {
		wait, err := hand(sock, req, p)
		if errors.Is(err, errNoInit) {
			wait, err = startHere(nproc, req, p)
		}
		return wait, err
	}
}

// run runs the command args describe (RelayArgs) through start, copies
// its output to stdout and stderr and stdin to it, and returns its exit
// status, as a shell would give it.
func run(args []string, start starter, stdin io.Reader, stdout, stderr io.Writer) int {
	nproc, req, err := parseRelay(args)
	if err != nil {
		fmt.Fprintln(stderr, "corral:", err)
		return 126
	}
	path, ok := lookPath(req.Argv[0], req.Dir, req.Env)
	if !ok {
		fmt.Fprintf(stderr, "%s%s\n", NotFound, req.Argv[0])
		return 127
	}
	req.Path = path
	p, err := newPipes(req.Stdin)
	if err != nil {
		fmt.Fprintln(stderr, "corral: the command's pipes:", err)
		return 126
	}
	wait, err := start(nproc, req, p)
	p.closeFar()
	if err != nil {
		p.closeNear()
		return report(stderr, err)
	}
	copies := p.copy(stdin, stdout, stderr)
	rep, err := wait()
	copies.finish()
	if err != nil {
		return report(stderr, err)
	}
	switch rep.Kind {
	case Failed:
		return report(stderr, replyError(rep))
	case Refused:
		fmt.Fprintln(stderr, rep.Message)
	}
	return rep.Code()
}

// report writes why the command did not run, and returns the status.
func report(stderr io.Writer, err error) int {
	if errors.Is(err, syscall.EAGAIN) {
		fmt.Fprintf(stderr, "%s%v\n", OutOfProcesses, err)
	} else {
		fmt.Fprintln(stderr, "corral:", err)
	}
	return 126
}

type replyError Reply

func (e replyError) Error() string { return "init: " + e.Message }
func (e replyError) Unwrap() error { return syscall.Errno(e.Value) }

// lookPath finds name as a shell would run it: a name with a slash as it
// is (relative to dir), else in the directories of env's PATH.
func lookPath(name, dir string, env []string) (string, bool) {
	executable := func(p string) bool {
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
	}
	if name == "" {
		return "", false
	}
	if strings.Contains(name, "/") {
		return name, executable(name)
	}
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if p := d + "/" + name; executable(p) {
			return p, true
		}
	}
	return "", false
}

// pipes are the command's streams: the near ends the relay copies, the
// far ends the command gets (blocking, as a shell's redirections).
type pipes struct {
	near []*os.File // stdout's and stderr's read ends, stdin's write end
	far  []int      // stdout's and stderr's write ends, stdin's read end
}

func newPipes(stdin bool) (*pipes, error) {
	p := &pipes{}
	n := 2
	if stdin {
		n = 3
	}
	for i := range n {
		var fds [2]int
		if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
			p.closeFar()
			p.closeNear()
			return nil, err
		}
		near, far := fds[0], fds[1]
		if i == 2 {
			near, far = fds[1], fds[0]
		}
		// The relay's ends go through Go's poller.
		if err := syscall.SetNonblock(near, true); err != nil {
			syscall.Close(near)
			syscall.Close(far)
			p.closeFar()
			p.closeNear()
			return nil, err
		}
		p.near = append(p.near, os.NewFile(uintptr(near), "corral-pipe"))
		p.far = append(p.far, far)
	}
	return p, nil
}

func (p *pipes) closeFar() {
	closeAll(p.far)
	p.far = nil
}

func (p *pipes) closeNear() {
	for _, f := range p.near {
		f.Close()
	}
}

// hand sends req with the far ends to init, and returns what waits for
// init's reply.
func hand(sock string, req Request, p *pipes) (func() (Reply, error), error) {
	msg, err := req.Marshal()
	if err != nil {
		return nil, err
	}
	c, err := dial(sock)
	if err != nil {
		return nil, err
	}
	// The descriptors ride on the first bytes; the rest follows.
	first := msg[:min(len(msg), 32<<10)]
	n, _, err := c.WriteMsgUnix(first, syscall.UnixRights(p.far...), nil)
	if err == nil && n < len(msg) {
		// Only what is left: init may have answered and closed the
		// connection already (a command refused, or done), and even an
		// empty write then fails with EPIPE.
		_, err = c.Write(msg[n:])
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("handing the command to init: %w", err)
	}
	return func() (Reply, error) {
		defer c.Close()
		rep, err := ReadReply(c)
		if err != nil {
			return Reply{}, fmt.Errorf("init did not say how the command ended: %w", err)
		}
		return rep, nil
	}, nil
}

// errNoInit says init's socket was not there to take the command.
var errNoInit = errors.New("the sandbox's init does not take commands")

// dial connects to init, waiting at most socketWait for its socket.
func dial(sock string) (*net.UnixConn, error) {
	addr := &net.UnixAddr{Name: sock, Net: "unix"}
	deadline := time.Now().Add(socketWait)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		c, err := net.DialUnix("unix", nil, addr)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: %v", errNoInit, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %v", errNoInit, err)
		}
		// Nothing in the sandbox signals that init made its socket: a
		// bounded poll, met only right after the sandbox started.
		time.Sleep(wait)
	}
}

// startHere starts the start step of req as the relay's own child, for a
// sandbox whose init does not answer: the command runs (as an exec's
// child, a restore would kill it).
func startHere(nproc uint64, req Request, p *pipes) (func() (Reply, error), error) {
	in := -1
	if req.Stdin {
		in = p.far[2]
	} else {
		null, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		defer syscall.Close(null)
		in = null
	}
	pid, err := syscall.ForkExec(self, startArgs(nproc, req), &syscall.ProcAttr{
		Env:   startEnv,
		Files: []uintptr{uintptr(in), uintptr(p.far[0]), uintptr(p.far[1])},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return nil, fmt.Errorf("starting the command: %w", err)
	}
	return func() (Reply, error) {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return Reply{}, err
			}
			break
		}
		if ws.Signaled() {
			return Reply{Kind: Signaled, Value: int32(ws.Signal())}, nil
		}
		return Reply{Kind: Exited, Value: int32(ws.ExitStatus())}, nil
	}, nil
}

// copies are the goroutines copying the command's streams.
type copies struct {
	outs []*os.File
	wg   sync.WaitGroup
}

// copy starts copying the near ends: stdout's and stderr's to the relay's
// own, the relay's stdin to the command's.
func (p *pipes) copy(stdin io.Reader, stdout, stderr io.Writer) *copies {
	c := &copies{outs: p.near[:2]}
	for i, dst := range []io.Writer{stdout, stderr} {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			copyOut(dst, p.near[i])
		}()
	}
	if len(p.near) == 3 {
		// Not waited for: the relay ends with the command, whatever is
		// left of its input.
		go func() {
			_, _ = io.Copy(p.near[2], stdin)
			p.near[2].Close()
		}()
	}
	return c
}

// finish, once the command has ended, copies what it left in the pipes
// and stops: a process it left running that holds them is not waited for.
func (c *copies) finish() {
	for _, f := range c.outs {
		_ = f.SetReadDeadline(time.Now())
	}
	c.wg.Wait()
}

// copyOut copies src to dst until src ends, or its read deadline passes
// (finish), when it copies what src holds still and returns. A dst that
// fails is written no more, and src read on, so the command never blocks
// on its output.
func copyOut(dst io.Writer, src *os.File) {
	buf := make([]byte, 32<<10)
	write := func(b []byte) {
		if dst != nil {
			if _, err := dst.Write(b); err != nil {
				dst = nil
			}
		}
	}
	for {
		n, err := src.Read(buf)
		write(buf[:n])
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drain(src, buf, write)
		}
		return
	}
}

// drain copies what src holds, without waiting for more, at most maxDrain
// bytes.
func drain(src *os.File, buf []byte, write func([]byte)) {
	rc, err := src.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		for total := 0; total < maxDrain; {
			n, err := unix.Read(int(fd), buf)
			if n <= 0 || err != nil {
				return
			}
			write(buf[:n])
			total += n
		}
	})
}
