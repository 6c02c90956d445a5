package spawn

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of init's service.
const (
	// requestTimeout bounds how long init waits for a request once a
	// relay has connected (a relay sends it at once).
	requestTimeout = 30 * time.Second
	// maxReading bounds the requests init reads at a time, so a process
	// in the sandbox that opens connections and sends nothing holds at
	// most that many buffers.
	maxReading = 16
)

// startEnv is the start step's own environment (the command's travels in
// its arguments; init starts one only when not traced, in tests): as few threads as the Go runtime can do with, none made
// for a collector, since each counts against RLIMIT_NPROC under gVisor.
var startEnv = []string{"GOMAXPROCS=1", "GOGC=off"}

// self is what init starts for the start step: this binary.
const self = "/proc/self/exe"

// Init is the sandbox's init; args are the sandbox's process limit, which
// every command gets (init and the relays have more: the driver's
// spawnHeadroom). It makes its rendezvous under Dir, serves it, reaps every
// child and exits 0 on SIGTERM. Where it cannot serve (the socket cannot
// be made), it goes on reaping, and relays run their commands themselves.
func Init(args []string) int {
	runtime.GOMAXPROCS(1)
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "corral-spawn init: want the sandbox's process limit")
		return 2
	}
	nproc, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil || nproc == 0 {
		fmt.Fprintf(os.Stderr, "corral-spawn init: process limit %q\n", args[0])
		return 2
	}
	s := newInitServer(nproc)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	// Signals whose default would end init, and with it the sandbox; a
	// handler, unlike SIG_IGN, is not inherited by the commands.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE)
	ln, err := s.listen(Dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-spawn init: not serving commands:", err)
	} else {
		go s.accept(ln)
	}
	for {
		select {
		case <-chld:
			s.reap()
		case <-term:
			return 0
		}
	}
}

func newInitServer(nproc uint64) *initServer {
	// Whatever init was given besides its streams never reaches a
	// command (startTraced has no step of its own to close it in).
	_ = unix.CloseRange(3, ^uint(0)>>32, unix.CLOSE_RANGE_CLOEXEC)
	return &initServer{nproc: nproc, traced: true, waiters: map[int]chan Reply{}, reading: make(chan struct{}, maxReading)}
}

type initServer struct {
	nproc   uint64
	traced  bool // startTraced, not the start step
	devNull *os.File
	reading chan struct{} // a slot per request being read

	// mu guards waiters, and is held across each start's fork and each
	// pass of the reaper, so that no child is reaped before its waiter
	// is in the map.
	mu      sync.Mutex
	waiters map[int]chan Reply // by pid: the commands (or their start steps)
}

// listen makes dir (mode 0700) and the socket in it.
func (s *initServer) listen(dir string) (*net.UnixListener, error) {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	sock := socketIn(dir)
	_ = os.Remove(sock) // an earlier init's, in a /tmp that outlived it
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	s.devNull = null
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

func (s *initServer) accept(ln *net.UnixListener) {
	for wait := time.Millisecond; ; {
		c, err := ln.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: nothing signals their return,
			// so init retries, backing off to a second.
			time.Sleep(wait)
			wait = min(2*wait, time.Second)
			continue
		}
		wait = time.Millisecond
		go s.serve(c)
	}
}

// serve starts one relay's command and answers with how it ended.
func (s *initServer) serve(c *net.UnixConn) {
	defer c.Close()
	s.reading <- struct{}{}
	_ = c.SetReadDeadline(time.Now().Add(requestTimeout))
	req, fds, err := readRequest(c)
	<-s.reading
	if err != nil {
		_, _ = c.Write(Reply{Kind: Failed, Value: int32(syscall.EINVAL), Message: "a malformed request: " + err.Error()}.Marshal())
		return
	}
	done, err := s.start(req, fds)
	closeAll(fds)
	var failure *startFailure
	if errors.As(err, &failure) {
		_, _ = c.Write(Reply{Kind: Refused, Value: int32(failure.code), Message: failure.msg}.Marshal())
		return
	}
	if err != nil {
		errno := syscall.EIO
		errors.As(err, &errno)
		_, _ = c.Write(Reply{Kind: Failed, Value: int32(errno), Message: err.Error()}.Marshal())
		return
	}
	_, _ = c.Write((<-done).Marshal())
}

// start starts req (startTraced, or through the start step) with fds
// (stdout, stderr and maybe stdin) as its streams, in a session of its
// own; done receives how it ended.
func (s *initServer) start(req Request, fds []int) (<-chan Reply, error) {
	in := s.devNull.Fd()
	if req.Stdin {
		in = uintptr(fds[2])
	}
	// A command's streams block, as a shell's redirections do.
	for _, fd := range fds {
		if err := syscall.SetNonblock(fd, false); err != nil {
			return nil, fmt.Errorf("the command's streams: %w", err)
		}
	}
	files := []uintptr{in, uintptr(fds[0]), uintptr(fds[1])}
	if !s.traced {
		attr := &syscall.ProcAttr{Env: startEnv, Files: files, Sys: &syscall.SysProcAttr{Setsid: true}}
		s.mu.Lock()
		defer s.mu.Unlock()
		pid, err := syscall.ForkExec(self, startArgs(s.nproc, req), attr)
		if err != nil {
			return nil, fmt.Errorf("starting the command: %w", err)
		}
		return s.wait(pid), nil
	}
	return s.startTraced(req, files)
}

// wait registers a waiter for the child pid. The caller holds mu.
func (s *initServer) wait(pid int) chan Reply {
	done := make(chan Reply, 1)
	s.waiters[pid] = done
	return done
}

// startTraced starts the command itself, with no start step: its fork
// asks to be traced (PTRACE_TRACEME), so that it stops at its execve,
// before the command's first instruction; init lowers its RLIMIT_NPROC
// then (prlimit) and lets it go (PTRACE_DETACH). Go cannot set an rlimit
// between its fork and its exec; this costs two system calls where the
// start step costs a process (a Go runtime's start, ~10 ms under gVisor).
// Ptrace requests come from the thread that forked: the goroutine is
// locked to it until the detach.
func (s *initServer) startTraced(req Request, files []uintptr) (<-chan Reply, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	attr := &syscall.ProcAttr{Dir: req.Dir, Env: req.Env, Files: files, Sys: &syscall.SysProcAttr{Setsid: true, Ptrace: true}}
	// mu held from the fork to the detach: the reaper must not take the
	// child's stop, nor its exit.
	s.mu.Lock()
	defer s.mu.Unlock()
	argv := req.Argv
	pid, err := syscall.ForkExec(req.Path, argv, attr)
	if errors.Is(err, syscall.ENOEXEC) {
		// What a shell does with an executable that is no binary and
		// has no #! line: runs it as a script.
		pid, err = syscall.ForkExec("/bin/sh", append([]string{"sh", req.Path}, argv[1:]...), attr)
	}
	if err != nil {
		return nil, startError(req, err)
	}
	done := s.wait(pid)
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, syscall.WALL, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("starting the command: waiting for its exec: %w", err)
	case ws.Exited() || ws.Signaled():
		delete(s.waiters, pid)
		done <- replyOf(ws)
		return done, nil
	}
	lim := unix.Rlimit{Cur: s.nproc, Max: s.nproc}
	if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, &lim, nil); err != nil {
		// Never let it run with init's limit.
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = syscall.PtraceDetach(pid)
		return nil, fmt.Errorf("starting the command: lowering its RLIMIT_NPROC: %w", err)
	}
	if err := syscall.PtraceDetach(pid); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("starting the command: letting it go: %w", err)
	}
	return done, nil
}

// startError is why a command's fork and exec failed, as the start step
// would say it: its directory, its path, or the errno.
func startError(req Request, err error) error {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EACCES) {
		if fi, serr := os.Stat(req.Dir); serr != nil || !fi.IsDir() {
			return &startFailure{code: 2, msg: fmt.Sprintf("corral: cd %s: %v", req.Dir, err)}
		}
	}
	if errors.Is(err, syscall.ENOENT) {
		return &startFailure{code: 127, msg: NotFound + req.Argv[0]}
	}
	if errors.Is(err, syscall.EAGAIN) {
		return fmt.Errorf("starting the command: %w", err)
	}
	return &startFailure{code: 126, msg: fmt.Sprintf("corral: %s: %v", req.Argv[0], err)}
}

// startFailure is a command that could not start for a reason of its own
// (its directory, its path): the relay says msg and exits code, as the
// start step would.
type startFailure struct {
	code int
	msg  string
}

func (f *startFailure) Error() string { return f.msg }

// replyOf is how a child ended.
func replyOf(ws syscall.WaitStatus) Reply {
	switch {
	case ws.Exited():
		return Reply{Kind: Exited, Value: int32(ws.ExitStatus())}
	case ws.Signaled():
		return Reply{Kind: Signaled, Value: int32(ws.Signal())}
	}
	return Reply{Kind: Exited, Value: 126}
}

// reap collects every child that has ended, the commands' and the
// orphans', and tells the commands' waiters. It holds mu for one child at
// a time, not for the pass: under a fork bomb left running, orphans end
// as fast as they are made and a pass may not end for many seconds, while
// a command's start, which holds mu from its fork to its detach, waits
// for it. (Go's mutex hands itself to a goroutine that has waited a
// millisecond, so the start gets in between two children.)
func (s *initServer) reap() {
	for s.reapOne() {
	}
}

// reapOne collects one child that has ended, if any, and reports whether
// it did.
func (s *initServer) reapOne() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
	for errors.Is(err, syscall.EINTR) {
		pid, err = syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
	}
	if err != nil || pid <= 0 {
		return false
	}
	done, ok := s.waiters[pid]
	if !ok || !ws.Exited() && !ws.Signaled() {
		return true // an orphan, or a stop: only a traced child's, which start handles
	}
	delete(s.waiters, pid)
	done <- replyOf(ws)
	return true
}

// readRequest reads one request and the descriptors that come with it
// (close-on-exec), which it closes if the request is refused.
func readRequest(c *net.UnixConn) (Request, []int, error) {
	first := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(3*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(first, oob)
	fds := rights(oob[:oobn])
	fail := func(err error) (Request, []int, error) {
		closeAll(fds)
		return Request{}, nil, err
	}
	if err != nil {
		return fail(err)
	}
	if flags&syscall.MSG_CTRUNC != 0 {
		return fail(errors.New("more descriptors than a command has"))
	}
	if n < requestHeader {
		more := make([]byte, requestHeader-n)
		if _, err := io.ReadFull(c, more); err != nil {
			return fail(err)
		}
		first = append(first[:n], more...)
		n = requestHeader
	}
	size, err := bodyLen(first[:requestHeader])
	if err != nil {
		return fail(err)
	}
	if n-requestHeader > size {
		return fail(errors.New("bytes past the request's end"))
	}
	body := make([]byte, size)
	got := copy(body, first[requestHeader:n])
	if _, err := io.ReadFull(c, body[got:]); err != nil {
		return fail(fmt.Errorf("reading the request: %w", err))
	}
	req, err := ParseRequest(body)
	if err != nil {
		return fail(err)
	}
	if len(fds) != req.Fds() {
		return fail(fmt.Errorf("%d descriptors with a request for %d", len(fds), req.Fds()))
	}
	return req, fds, nil
}

// rights is the descriptors in a control message.
func rights(oob []byte) []int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var all []int
	for i := range msgs {
		if fds, err := syscall.ParseUnixRights(&msgs[i]); err == nil {
			all = append(all, fds...)
		}
	}
	return all
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}
