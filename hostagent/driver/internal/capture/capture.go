// Package capture keeps a bounded copy of a command's output: the first and
// the last bytes, with the middle cut and a marker in its place, while every
// byte is still passed on to an optional stream writer.
package capture

import (
	"fmt"
	"io"
	"sync"
)

// Buffer is an io.Writer that keeps at most max bytes: max/2 from the head and
// the rest from the tail. It is safe for concurrent use.
type Buffer struct {
	stream io.Writer // receives every byte; errors are ignored after the first

	// mu guards the fields below.
	mu        sync.Mutex
	max       int
	head      []byte
	tail      []byte // ring of the last max-len(head) bytes once head is full
	tailStart int    // index of the oldest byte in tail when the ring is full
	total     int64
	streamErr error
}

// New returns a Buffer keeping at most max bytes (max <= 0 keeps nothing)
// and copying everything to stream if it is not nil.
func New(max int, stream io.Writer) *Buffer {
	if max < 0 {
		max = 0
	}
	return &Buffer{max: max, stream: stream}
}

// Write keeps what fits and streams everything. It never fails: a failing
// stream writer is dropped so the command is not blocked by a gone reader.
func (b *Buffer) Write(p []byte) (int, error) {
	written := len(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stream != nil && b.streamErr == nil {
		if _, err := b.stream.Write(p); err != nil {
			b.streamErr = err
		}
	}
	b.total += int64(len(p))
	headMax := b.max / 2
	if n := headMax - len(b.head); n > 0 {
		if n > len(p) {
			n = len(p)
		}
		b.head = append(b.head, p[:n]...)
		p = p[n:]
	}
	tailMax := b.max - headMax
	if tailMax == 0 || len(p) == 0 {
		return written, nil
	}
	if len(p) >= tailMax {
		b.tail = append(b.tail[:0], p[len(p)-tailMax:]...)
		b.tailStart = 0
		return written, nil
	}
	for _, c := range p {
		if len(b.tail) < tailMax {
			b.tail = append(b.tail, c)
			continue
		}
		b.tail[b.tailStart] = c
		b.tailStart = (b.tailStart + 1) % tailMax
	}
	return written, nil
}

// Bytes returns the kept output, with a marker where the middle was cut.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := append([]byte(nil), b.head...)
	kept := int64(len(b.head) + len(b.tail))
	if cut := b.total - kept; cut > 0 {
		out = fmt.Appendf(out, "\n[... %d bytes cut ...]\n", cut)
	}
	out = append(out, b.tail[b.tailStart:]...)
	return append(out, b.tail[:b.tailStart]...)
}

// Truncated reports whether some output was cut.
func (b *Buffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total > int64(len(b.head)+len(b.tail))
}

// Total is the number of bytes written.
func (b *Buffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}
