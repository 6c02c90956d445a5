package egress

import (
	"bufio"
	"errors"
	"io"
)

// maxHello bounds the TLS record the proxy reads for a ClientHello: one
// record's largest plaintext (RFC 8446 5.1).
const maxHello = 16384 + 5

// errNotTLS: the first bytes are not a TLS handshake record.
var errNotTLS = errors.New("not a TLS handshake")

// peekSNI reads, without consuming, the ClientHello at the start of r and
// returns its server name: "" when the hello carries none. A hello split
// over several records is refused (no client sends one for a server name
// alone).
func peekSNI(r *bufio.Reader) (string, error) {
	hdr, err := r.Peek(5)
	if err != nil {
		return "", err
	}
	if hdr[0] != 0x16 || hdr[1] != 3 {
		return "", errNotTLS
	}
	n := int(hdr[3])<<8 | int(hdr[4])
	if n > maxHello-5 {
		return "", errors.New("TLS record too large")
	}
	rec, err := r.Peek(5 + n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return "", err
	}
	return parseClientHello(rec[5:])
}

// parseClientHello returns the server name of a handshake message holding
// a ClientHello (RFC 8446 4.1.2, RFC 6066 3).
func parseClientHello(b []byte) (string, error) {
	bad := errors.New("malformed ClientHello")
	p := parser(b)
	typ, ok := p.u8()
	if !ok || typ != 1 {
		return "", errors.New("not a ClientHello")
	}
	body, ok := p.vec(3)
	if !ok {
		return "", errors.New("ClientHello split over records")
	}
	p = body
	if !p.skip(2+32) || !p.skipVec(1) || !p.skipVec(2) || !p.skipVec(1) {
		return "", bad
	}
	if len(p) == 0 {
		return "", nil // no extensions
	}
	exts, ok := p.vec(2)
	if !ok {
		return "", bad
	}
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return "", bad
		}
		if typ != 0 { // server_name
			continue
		}
		list, ok := data.vec(2)
		if !ok {
			return "", bad
		}
		for len(list) > 0 {
			kind, ok1 := list.u8()
			name, ok2 := list.vec(2)
			if !ok1 || !ok2 {
				return "", bad
			}
			if kind == 0 { // host_name
				return string(name), nil
			}
		}
		return "", nil
	}
	return "", nil
}

// parser reads big-endian fields off the front of a byte slice.
type parser []byte

func (p *parser) u8() (byte, bool) {
	if len(*p) < 1 {
		return 0, false
	}
	v := (*p)[0]
	*p = (*p)[1:]
	return v, true
}

func (p *parser) u16() (int, bool) {
	if len(*p) < 2 {
		return 0, false
	}
	v := int((*p)[0])<<8 | int((*p)[1])
	*p = (*p)[2:]
	return v, true
}

func (p *parser) skip(n int) bool {
	if len(*p) < n {
		return false
	}
	*p = (*p)[n:]
	return true
}

// vec reads a vector with a length prefix of size bytes.
func (p *parser) vec(size int) (parser, bool) {
	if len(*p) < size {
		return nil, false
	}
	n := 0
	for i := range size {
		n = n<<8 | int((*p)[i])
	}
	*p = (*p)[size:]
	if len(*p) < n {
		return nil, false
	}
	v := (*p)[:n]
	*p = (*p)[n:]
	return v, true
}

func (p *parser) skipVec(size int) bool { _, ok := p.vec(size); return ok }
