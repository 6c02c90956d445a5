package spawn

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, req := range []Request{
		{Path: "/bin/sh", Dir: "/workspace", Argv: []string{"sh", "-c", "echo hi"}, Env: []string{"PATH=/bin", "A="}},
		{Path: "./x", Dir: "/", Argv: []string{"x"}, Env: []string{}, Stdin: true},
		{Path: "/bin/true", Dir: "/", Argv: []string{"true", strings.Repeat("é", 70000)}, Env: []string{}},
	} {
		msg, err := req.Marshal()
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", req, err)
		}
		n, err := bodyLen(msg[:requestHeader])
		if err != nil || n != len(msg)-requestHeader {
			t.Fatalf("bodyLen = %d, %v; want %d", n, err, len(msg)-requestHeader)
		}
		got, err := ParseRequest(msg[requestHeader:])
		if err != nil || !reflect.DeepEqual(got, req) {
			t.Errorf("ParseRequest = %+v, %v; want %+v", got, err, req)
		}
	}
}

func TestMarshalRefuses(t *testing.T) {
	for name, req := range map[string]Request{
		"no argv":     {Path: "/bin/sh", Dir: "/"},
		"no path":     {Dir: "/", Argv: []string{"sh"}},
		"a NUL":       {Path: "/bin/sh", Dir: "/", Argv: []string{"sh", "a\x00b"}},
		"too large":   {Path: "/bin/sh", Dir: "/", Argv: []string{"sh", strings.Repeat("x", MaxRequest)}},
		"too many":    {Path: "/bin/sh", Dir: "/", Argv: make([]string, MaxStrings+1)},
		"a NUL (env)": {Path: "/bin/sh", Dir: "/", Argv: []string{"sh"}, Env: []string{"A=\x00"}},
	} {
		if _, err := req.Marshal(); err == nil {
			t.Errorf("%s: Marshal took it", name)
		}
	}
}

// body builds a request body by hand: flags, then the given uvarints and
// strings in order.
func body(flags byte, parts ...any) []byte {
	b := []byte{flags}
	for _, p := range parts {
		switch v := p.(type) {
		case int:
			b = binary.AppendUvarint(b, uint64(v))
		case uint64:
			b = binary.AppendUvarint(b, v)
		case string:
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

func TestParseRequestRefusesMalformed(t *testing.T) {
	good := body(0, "/bin/sh", "/", 1, "sh", 0)
	if _, err := ParseRequest(good); err != nil {
		t.Fatalf("the well-formed body: %v", err)
	}
	for name, b := range map[string][]byte{
		"empty":                 nil,
		"unknown flags":         body(2, "/bin/sh", "/", 1, "sh", 0),
		"truncated":             good[:len(good)-1],
		"trailing bytes":        append(append([]byte{}, good...), 0),
		"a string past the end": body(0, 100, "x"),
		"a count past the end":  body(0, "/bin/sh", "/", 1<<40),
		"too many strings":      append(body(0, "/bin/sh", "/", MaxStrings+1), bytes.Repeat([]byte{0}, MaxStrings+1)...),
		"no argv":               body(0, "/bin/sh", "/", 0, 0),
		"a NUL":                 body(0, "/bin/sh", "/", 1, "s\x00h", 0),
		"an overlong uvarint":   append([]byte{0}, bytes.Repeat([]byte{0xff}, 11)...),
	} {
		if r, err := ParseRequest(b); err == nil {
			t.Errorf("%s: parsed as %+v", name, r)
		}
	}
	for name, hdr := range map[string][]byte{
		"short":     []byte("CSQ1"),
		"bad magic": []byte("CSQ2\x00\x00\x00\x01"),
		"too large": binary.BigEndian.AppendUint32([]byte("CSQ1"), MaxRequest+1),
	} {
		if n, err := bodyLen(hdr); err == nil {
			t.Errorf("header %s: body of %d", name, n)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(body(0, "/bin/sh", "/", 1, "sh", 0))
	f.Add(body(1, "/bin/sh", "/w", 2, "sh", "-c", 1, "A=b"))
	f.Add([]byte{0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseRequest(b)
		if err != nil {
			return
		}
		msg, err := req.Marshal()
		if err != nil {
			t.Fatalf("a parsed request does not marshal: %+v: %v", req, err)
		}
		if again, err := ParseRequest(msg[requestHeader:]); err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, req)
		}
	})
}

func TestReplies(t *testing.T) {
	for _, rep := range []Reply{{Kind: Exited, Value: 3}, {Kind: Signaled, Value: 9}, {Kind: Failed, Value: 11, Message: "no"}, {Kind: Refused, Value: 2, Message: "corral: cd /x: no"}} {
		got, err := ReadReply(bytes.NewReader(rep.Marshal()))
		if err != nil || got != rep {
			t.Errorf("ReadReply = %+v, %v; want %+v", got, err, rep)
		}
	}
	if c := (Reply{Kind: Signaled, Value: 9}).Code(); c != 137 {
		t.Errorf("Code of SIGKILL = %d, want 137", c)
	}
	long := Reply{Kind: Failed, Message: strings.Repeat("x", 2*MaxReplyMessage)}.Marshal()
	if got, err := ReadReply(bytes.NewReader(long)); err != nil || len(got.Message) != MaxReplyMessage {
		t.Errorf("a long message: %d bytes, %v", len(got.Message), err)
	}
	for name, b := range map[string][]byte{
		"bad magic":     []byte("CSR2\x01\x00\x00\x00\x00\x00\x00"),
		"unknown kind":  []byte("CSR1\x09\x00\x00\x00\x00\x00\x00"),
		"message large": []byte("CSR1\x03\x00\x00\x00\x00\xff\xff"),
		"truncated":     []byte("CSR1\x01\x00\x00\x00\x00\x00\x05ab"),
	} {
		if rep, err := ReadReply(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: read %+v", name, rep)
		}
	}
}
