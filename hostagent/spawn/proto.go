package spawn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// The rendezvous inside the sandbox: /tmp is the sandbox's own tmpfs, which
// a checkpoint keeps, and with it init's listening socket.
const (
	Dir    = "/tmp/.corral"
	Socket = Dir + "/" + socketName
)

const socketName = "spawn.sock"

func socketIn(dir string) string { return dir + "/" + socketName }

// Bounds of what one side reads from the other.
const (
	// MaxRequest bounds a request's body: the command's path, directory,
	// argv and environment, each string with its length. Linux's execve
	// takes at most 2 MiB of them (a quarter of an 8 MiB stack).
	MaxRequest = 4 << 20
	// MaxStrings bounds argv and the environment, each.
	MaxStrings = 1 << 16
	// MaxReplyMessage bounds the message of a failed start.
	MaxReplyMessage = 1024
)

// Wire format, version 1, big endian: a request is "CSQ1", the body's
// length (uint32) and the body: a flags byte (flagStdin: a third descriptor,
// the command's stdin, comes with it), then the path, the directory, argc,
// argv, envc and the environment, each string its length (uvarint) and its
// bytes. The command's descriptors (stdout, stderr, then stdin) ride on the
// first bytes as SCM_RIGHTS. A reply is "CSR1", its kind (a byte), a value
// (int32) and a message (uint16 length, bytes).
var (
	requestMagic = []byte("CSQ1")
	replyMagic   = []byte("CSR1")
)

const flagStdin = 1

// Request is one command for init to start.
type Request struct {
	Path  string   // absolute, or relative to Dir: what execve gets
	Dir   string   // the working directory
	Argv  []string // argv, argv[0] included
	Env   []string // exactly the command's environment, KEY=value
	Stdin bool     // whether a stdin descriptor comes with it
}

// Fds is how many descriptors come with the request.
func (r Request) Fds() int {
	if r.Stdin {
		return 3
	}
	return 2
}

// check refuses what execve could not take.
func (r Request) check() error {
	if r.Path == "" || r.Dir == "" || len(r.Argv) == 0 {
		return errors.New("a request needs a path, a directory and an argv")
	}
	if len(r.Argv) > MaxStrings || len(r.Env) > MaxStrings {
		return fmt.Errorf("more than %d arguments or variables", MaxStrings)
	}
	for _, s := range append([]string{r.Path, r.Dir}, append(r.Argv, r.Env...)...) {
		if strings.IndexByte(s, 0) >= 0 {
			return errors.New("a string with a NUL byte")
		}
	}
	return nil
}

// Marshal encodes r, or says why it cannot be sent.
func (r Request) Marshal() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	body := []byte{0}
	if r.Stdin {
		body[0] = flagStdin
	}
	str := func(s string) {
		body = binary.AppendUvarint(body, uint64(len(s)))
		body = append(body, s...)
	}
	str(r.Path)
	str(r.Dir)
	for _, list := range [][]string{r.Argv, r.Env} {
		body = binary.AppendUvarint(body, uint64(len(list)))
		for _, s := range list {
			str(s)
		}
	}
	if len(body) > MaxRequest {
		return nil, fmt.Errorf("the command takes %d bytes, more than %d", len(body), MaxRequest)
	}
	out := append(append([]byte{}, requestMagic...), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(out[4:], uint32(len(body)))
	return append(out, body...), nil
}

// requestHeader is the length of a request before its body.
const requestHeader = 8

// bodyLen reads a request's header: the body's length, within MaxRequest.
func bodyLen(hdr []byte) (int, error) {
	if len(hdr) < requestHeader || !bytes.Equal(hdr[:4], requestMagic) {
		return 0, errors.New("not a spawn request (version 1)")
	}
	n := binary.BigEndian.Uint32(hdr[4:8])
	if n > MaxRequest {
		return 0, fmt.Errorf("a request body of %d bytes, more than %d", n, MaxRequest)
	}
	return int(n), nil
}

// ParseRequest decodes a request's body. It never panics: what does not
// parse, or breaks a bound, is an error.
func ParseRequest(body []byte) (Request, error) {
	var r Request
	if len(body) < 1 || body[0]&^flagStdin != 0 {
		return r, errors.New("a request with unknown flags")
	}
	r.Stdin = body[0]&flagStdin != 0
	rest := body[1:]
	next := func() (uint64, error) {
		v, n := binary.Uvarint(rest)
		if n <= 0 {
			return 0, errors.New("a truncated request")
		}
		rest = rest[n:]
		return v, nil
	}
	str := func() (string, error) {
		n, err := next()
		if err != nil {
			return "", err
		}
		if n > uint64(len(rest)) {
			return "", errors.New("a string past the request's end")
		}
		s := string(rest[:n])
		rest = rest[n:]
		return s, nil
	}
	list := func() ([]string, error) {
		n, err := next()
		if err != nil {
			return nil, err
		}
		// Each string takes a byte at least: a count past what is left
		// is a lie, refused before anything is allocated for it.
		if n > MaxStrings || n > uint64(len(rest)) {
			return nil, fmt.Errorf("a list of %d strings in %d bytes", n, len(rest))
		}
		out := make([]string, 0, n)
		for range n {
			s, err := str()
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	var err error
	if r.Path, err = str(); err != nil {
		return Request{}, err
	}
	if r.Dir, err = str(); err != nil {
		return Request{}, err
	}
	if r.Argv, err = list(); err != nil {
		return Request{}, err
	}
	if r.Env, err = list(); err != nil {
		return Request{}, err
	}
	if len(rest) != 0 {
		return Request{}, errors.New("bytes past the request's end")
	}
	if err := r.check(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// Reply kinds.
const (
	// Exited: the command exited; Value is its status.
	Exited byte = 1
	// Signaled: a signal ended the command; Value is its number.
	Signaled byte = 2
	// Failed: init could not start the command; Value is the errno
	// (EAGAIN: the sandbox is out of processes), Message why.
	Failed byte = 3
	// Refused: the command could not start for a reason of its own (its
	// directory, its path); Value is the status a shell would give,
	// Message what the relay says on stderr.
	Refused byte = 4
)

// Reply is init's answer: how the command ended, or why it did not start.
type Reply struct {
	Kind    byte
	Value   int32
	Message string
}

// Code is the exit status a shell would give the command: its own, or 128
// plus the signal's number.
func (r Reply) Code() int {
	if r.Kind == Signaled {
		return 128 + int(r.Value)
	}
	return int(r.Value)
}

// Marshal encodes r; a long message is cut at MaxReplyMessage.
func (r Reply) Marshal() []byte {
	msg := r.Message
	if len(msg) > MaxReplyMessage {
		msg = msg[:MaxReplyMessage]
	}
	out := append(append([]byte{}, replyMagic...), r.Kind, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(out[5:9], uint32(r.Value))
	binary.BigEndian.PutUint16(out[9:11], uint16(len(msg)))
	return append(out, msg...)
}

// ReadReply reads one reply from r, within its bounds.
func ReadReply(r io.Reader) (Reply, error) {
	var hdr [11]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Reply{}, err
	}
	if !bytes.Equal(hdr[:4], replyMagic) {
		return Reply{}, errors.New("not a spawn reply (version 1)")
	}
	rep := Reply{Kind: hdr[4], Value: int32(binary.BigEndian.Uint32(hdr[5:9]))}
	switch rep.Kind {
	case Exited, Signaled, Failed, Refused:
	default:
		return Reply{}, fmt.Errorf("a reply of unknown kind %d", rep.Kind)
	}
	n := int(binary.BigEndian.Uint16(hdr[9:11]))
	if n > MaxReplyMessage {
		return Reply{}, fmt.Errorf("a reply message of %d bytes, more than %d", n, MaxReplyMessage)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return Reply{}, err
	}
	rep.Message = string(msg)
	return rep, nil
}
