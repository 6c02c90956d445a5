package spawn

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The command server (`corral-spawn serve`): one process the driver execs
// into a sandbox once and keeps, which runs each command the driver sends
// it as a relay would, so that a command costs no `runsc exec` of its own
// (~20 ms under gVisor here: the runtime's process, its control call, the
// shim's bookkeeping). The driver writes frames to its stdin, it writes
// frames to its stdout; every command is a relay's (RelayArgs), with pipes
// made inside the sandbox, so no host descriptor of the server's reaches a
// command. In mode "init" (a pausable sandbox) the server hands each
// command to init, as the relay does, and what it leaves running survives
// a checkpoint; in mode "own" it starts each command itself, traced, as
// init would (startTraced): the command is the server's child.
//
// The server holds host descriptors (its streams), so it must not live into
// a checkpoint: the driver ends it first (it exits at the end of its
// input). A restore would kill it anyway, as an exec's lineage.
//
// Wire format, big endian: a frame is its kind (a byte), a command's id
// (uint32) and its payload's length (uint32), then the payload. The server
// says hello first (id 0: serveMagic and its pid, uint32); the driver
// sends start frames (the command's relay arguments, each a uvarint length
// and its bytes); the server answers each with a mark (the sandbox clock in
// ticks just before the command started, uint64: what the driver's killer
// needs to tell the command's processes from older ones), its output
// (stdout and stderr frames, at most MaxOutputFrame bytes each) and last
// its exit status (int32).

// serveVersion is the version of serve's arguments.
const serveVersion = "1"

// serveMagic starts the hello: the wire's version.
var serveMagic = []byte("CSF1")

// Frame kinds.
const (
	FrameHello  byte = 'H'
	FrameStart  byte = 'S'
	FrameMark   byte = 'M'
	FrameStdout byte = 'O'
	FrameStderr byte = 'E'
	FrameExit   byte = 'X'
)

// Bounds of the frames.
const (
	// FrameHeader is a frame's length before its payload.
	FrameHeader = 9
	// MaxOutputFrame bounds an output frame's payload.
	MaxOutputFrame = 32 << 10
	// MaxStartFrame bounds a start frame's payload: a request's bound
	// and the strings' lengths.
	MaxStartFrame = MaxRequest + 2*MaxStrings*binary.MaxVarintLen32
	// maxServing bounds the commands a server runs at a time.
	maxServing = 256
)

// ServeArgs is what follows `corral-spawn serve`: own says whether the
// server starts commands itself (a sandbox without init's spawner), nproc
// the limit each command gets when it does.
func ServeArgs(own bool, nproc int64) []string {
	mode := "init"
	if own {
		mode = "own"
	}
	return []string{serveVersion, mode, strconv.FormatInt(nproc, 10)}
}

// Serve is the command server on its standard streams; it returns at the
// end of its input.
func Serve(args []string, in io.Reader, out io.Writer) int {
	runtime.GOMAXPROCS(1)
	return serve(Socket, args, in, out, os.Stderr)
}

// serve is Serve handing commands to init at sock in mode init.
func serve(sock string, args []string, in io.Reader, out, diag io.Writer) int {
	if len(args) != 3 || args[0] != serveVersion || args[1] != "init" && args[1] != "own" {
		fmt.Fprintln(diag, "corral-spawn serve: want version "+serveVersion+", init or own, and nproc")
		return 2
	}
	nproc, err := strconv.ParseUint(args[2], 10, 64)
	if err != nil || nproc == 0 {
		fmt.Fprintf(diag, "corral-spawn serve: nproc %q\n", args[2])
		return 2
	}
	start := underInit(sock)
	if args[1] == "own" {
		own, stop, err := startOwn(nproc)
		if err != nil {
			fmt.Fprintln(diag, "corral-spawn serve:", err)
			return 2
		}
		defer stop()
		start = own
	}
	w := &frameWriter{w: out}
	hello := binary.BigEndian.AppendUint32(append([]byte{}, serveMagic...), uint32(os.Getpid()))
	if err := w.write(FrameHello, 0, hello); err != nil {
		return 0
	}
	r := bufio.NewReaderSize(in, 64<<10)
	serving := make(chan struct{}, maxServing)
	for {
		kind, id, body, err := ReadFrame(r, MaxStartFrame)
		if errors.Is(err, io.EOF) {
			return 0
		}
		if err != nil || kind != FrameStart {
			fmt.Fprintf(diag, "corral-spawn serve: a frame of kind %q: %v\n", kind, err)
			return 2
		}
		cmd, err := parseStrings(body)
		if err != nil {
			fmt.Fprintln(w.stream(FrameStderr, id), "corral:", err)
			_ = w.write(FrameExit, id, exitPayload(126))
			continue
		}
		select {
		case serving <- struct{}{}:
		default:
			fmt.Fprintf(w.stream(FrameStderr, id), "corral: more than %d commands at a time\n", maxServing)
			_ = w.write(FrameExit, id, exitPayload(126))
			continue
		}
		go func() {
			defer func() { <-serving }()
			marked := func(nproc uint64, req Request, p *pipes) (func() (Reply, error), error) {
				if ticks, err := uptimeTicks(); err == nil {
					_ = w.write(FrameMark, id, binary.BigEndian.AppendUint64(nil, ticks))
				}
				return start(nproc, req, p)
			}
			// No input reaches a served command: the driver runs one
			// with input through a relay of its own.
			code := run(cmd, marked, strings.NewReader(""), w.stream(FrameStdout, id), w.stream(FrameStderr, id))
			_ = w.write(FrameExit, id, exitPayload(code))
		}()
	}
}

// startOwn is the starter of a server without init: an init server of its
// own that starts commands traced and reaps them, until stop.
func startOwn(nproc uint64) (_ starter, stop func(), _ error) {
	s := newInitServer(nproc)
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, nil, err
	}
	s.devNull = null
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	quit, reaped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reaped)
		for {
			select {
			case <-chld:
				s.reap()
			case <-quit:
				return
			}
		}
	}()
	stop = func() {
		signal.Stop(chld)
		close(quit)
		<-reaped
		null.Close()
	}
	return func(_ uint64, req Request, p *pipes) (func() (Reply, error), error) {
		done, err := s.start(req, p.far)
		var failure *startFailure
		if errors.As(err, &failure) {
			rep := Reply{Kind: Refused, Value: int32(failure.code), Message: failure.msg}
			return func() (Reply, error) { return rep, nil }, nil
		}
		if err != nil {
			return nil, err
		}
		return func() (Reply, error) { return <-done, nil }, nil
	}, stop, nil
}

// uptimeTicks is the sandbox's clock as /proc/<pid>/stat counts a
// process's start: clock ticks (1/100 s) since boot, from /proc/uptime.
func uptimeTicks() (uint64, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	up, _, _ := strings.Cut(string(b), " ")
	secs, frac, _ := strings.Cut(up, ".")
	s, err := strconv.ParseUint(secs, 10, 64)
	if err != nil {
		return 0, err
	}
	frac = (frac + "00")[:2]
	f, err := strconv.ParseUint(frac, 10, 64)
	if err != nil {
		return 0, err
	}
	return s*100 + f, nil
}

func exitPayload(code int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(int32(code))) }

// frameWriter writes whole frames, one at a time.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *frameWriter) write(kind byte, id uint32, payload []byte) error {
	b := AppendFrame(make([]byte, 0, FrameHeader+len(payload)), kind, id, payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := w.w.Write(b)
	return err
}

// stream is a writer of id's frames of kind, cut at MaxOutputFrame.
func (w *frameWriter) stream(kind byte, id uint32) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		for rest := p; len(rest) > 0; {
			n := min(len(rest), MaxOutputFrame)
			if err := w.write(kind, id, rest[:n]); err != nil {
				return len(p) - len(rest), err
			}
			rest = rest[n:]
		}
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// AppendFrame appends one frame to b.
func AppendFrame(b []byte, kind byte, id uint32, payload []byte) []byte {
	b = append(b, kind)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// ReadFrame reads one frame whose payload is at most max bytes; io.EOF
// only at a frame's boundary.
func ReadFrame(r io.Reader, max int) (kind byte, id uint32, payload []byte, err error) {
	var hdr [FrameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = errors.New("a truncated frame")
		}
		return 0, 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[5:])
	if uint64(n) > uint64(max) {
		return 0, 0, nil, fmt.Errorf("a frame of %d bytes, more than %d", n, max)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, 0, nil, fmt.Errorf("a truncated frame: %w", err)
	}
	return hdr[0], binary.BigEndian.Uint32(hdr[1:5]), payload, nil
}

// ParseHello reads the server's hello: its pid.
func ParseHello(payload []byte) (int, error) {
	if len(payload) != len(serveMagic)+4 || !bytes.Equal(payload[:len(serveMagic)], serveMagic) {
		return 0, errors.New("not a command server's hello (version 1)")
	}
	return int(binary.BigEndian.Uint32(payload[len(serveMagic):])), nil
}

// StartPayload encodes a command's relay arguments for a start frame.
func StartPayload(args []string) ([]byte, error) {
	var b []byte
	b = binary.AppendUvarint(b, uint64(len(args)))
	for _, a := range args {
		b = binary.AppendUvarint(b, uint64(len(a)))
		b = append(b, a...)
	}
	if len(b) > MaxStartFrame {
		return nil, fmt.Errorf("the command takes %d bytes, more than %d", len(b), MaxStartFrame)
	}
	return b, nil
}

// parseStrings decodes StartPayload's encoding, within its bounds.
func parseStrings(b []byte) ([]string, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > 2*MaxStrings+5 || n > uint64(len(b)) {
		return nil, errors.New("a malformed start frame")
	}
	b = b[k:]
	out := make([]string, 0, n)
	for range n {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, errors.New("a malformed start frame")
		}
		out = append(out, string(b[k:k+int(l)]))
		b = b[k+int(l):]
	}
	if len(b) != 0 {
		return nil, errors.New("bytes past the start frame's end")
	}
	return out, nil
}

// ExitCode reads an exit frame's payload.
func ExitCode(payload []byte) (int, error) {
	if len(payload) != 4 {
		return 0, errors.New("a malformed exit frame")
	}
	return int(int32(binary.BigEndian.Uint32(payload))), nil
}

// Mark reads a mark frame's payload.
func Mark(payload []byte) (uint64, error) {
	if len(payload) != 8 {
		return 0, errors.New("a malformed mark frame")
	}
	return binary.BigEndian.Uint64(payload), nil
}
