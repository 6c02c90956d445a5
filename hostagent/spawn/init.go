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
// its arguments): as few threads as the Go runtime can do with, none made
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
	return &initServer{nproc: nproc, waiters: map[int]chan Reply{}, reading: make(chan struct{}, maxReading)}
}

type initServer struct {
	nproc   uint64
	devNull *os.File
	reading chan struct{} // a slot per request being read

	// mu guards waiters, and is held across each start's fork and each
	// pass of the reaper, so that no child is reaped before its waiter
	// is in the map.
	mu      sync.Mutex
	waiters map[int]chan Reply // by pid: the start steps
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
	if err != nil {
		errno := syscall.EIO
		errors.As(err, &errno)
		_, _ = c.Write(Reply{Kind: Failed, Value: int32(errno), Message: err.Error()}.Marshal())
		return
	}
	_, _ = c.Write((<-done).Marshal())
}

// start forks the start step of req with fds (stdout, stderr and maybe
// stdin) as its streams, in a session of its own; done receives how it
// ended.
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
	attr := &syscall.ProcAttr{
		Env:   startEnv,
		Files: []uintptr{in, uintptr(fds[0]), uintptr(fds[1])},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, err := syscall.ForkExec(self, startArgs(s.nproc, req), attr)
	if err != nil {
		return nil, fmt.Errorf("starting the command: %w", err)
	}
	done := make(chan Reply, 1)
	s.waiters[pid] = done
	return done, nil
}

// reap collects every child that has ended, the start steps' and the
// orphans', and tells the start steps' waiters.
func (s *initServer) reap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		done, ok := s.waiters[pid]
		if !ok {
			continue
		}
		delete(s.waiters, pid)
		switch {
		case ws.Exited():
			done <- Reply{Kind: Exited, Value: int32(ws.ExitStatus())}
		case ws.Signaled():
			done <- Reply{Kind: Signaled, Value: int32(ws.Signal())}
		default:
			done <- Reply{Kind: Exited, Value: 126}
		}
	}
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
