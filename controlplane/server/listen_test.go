package server_test

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"runtime"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// TestConfigRefusesPlaintextBeyondLoopback: the public listeners serve
// plaintext on loopback only, unless TLS or --insecure-listen.
func TestConfigRefusesPlaintextBeyondLoopback(t *testing.T) {
	tests := []struct {
		name, http, grpc string
		tls, insecure    bool
		refused          string // a substring of the error; "" for none
	}{
		{name: "loopback v4", http: "127.0.0.1:0", grpc: "127.0.0.5:0"},
		{name: "loopback v6 and localhost", http: "[::1]:8080", grpc: "localhost:8090"},
		{name: "all interfaces", http: "0.0.0.0:0", grpc: "127.0.0.1:0", refused: "--http-addr (REST API) in plaintext on 0.0.0.0:0"},
		{name: "no host", http: "127.0.0.1:0", grpc: ":8090", refused: "--grpc-addr (admin gRPC API) in plaintext on :8090"},
		{name: "another name", http: "corral.internal:8080", grpc: "127.0.0.1:0", refused: "not a loopback address"},
		{name: "all interfaces v6", http: "127.0.0.1:0", grpc: "[::]:8090", refused: "--insecure-listen"},
		{name: "with TLS", http: "0.0.0.0:0", grpc: "10.1.2.3:8090", tls: true},
		{name: "insecure listen", http: "0.0.0.0:0", grpc: "[::]:0", insecure: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := server.Config{NodeID: "n", DatabaseURL: "postgres://unused", DataDir: t.TempDir(),
				HTTPAddr: tt.http, GRPCAddr: tt.grpc, InsecureListen: tt.insecure}
			if tt.tls {
				c.TLSCertFile, c.TLSKeyFile = "tls.crt", "tls.key" // read in New, not Validate
			}
			err := c.Validate()
			switch {
			case tt.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.refused != "" && (err == nil || !strings.Contains(err.Error(), tt.refused)):
				t.Fatalf("err = %v, want a refusal naming %q", err, tt.refused)
			}
		})
	}
	c := server.Config{NodeID: "n", DatabaseURL: "postgres://unused", DataDir: t.TempDir(), TLSCertFile: "tls.crt"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Fatalf("a certificate without its key: %v", err)
	}
}

// zeros is a body of left zero bytes, made as it is sent: it costs the
// sender no memory.
type zeros struct{ left int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.left <= 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > z.left {
		n = z.left
	}
	clear(p[:n])
	z.left -= n
	return int(n), nil
}

// jsonString is a body of size bytes that a JSON decoder keeps reading:
// one object with one string that never ends.
func jsonString(size int64) io.Reader {
	const open = `{"name":"`
	return io.MultiReader(strings.NewReader(open), &letters{left: size - int64(len(open))})
}

type letters struct{ left int64 }

func (l *letters) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), l.left)
	for i := range p[:n] {
		p[i] = 'a'
	}
	l.left -= n
	return int(n), nil
}

// grpcFrame is a gRPC message of n bytes whose header is sent first: the
// server sees its length before any of it.
type grpcFrame struct {
	hdr  []byte
	rest *zeros
}

func newGRPCFrame(n int64) *grpcFrame {
	hdr := make([]byte, 5)
	binary.BigEndian.PutUint32(hdr[1:], uint32(n))
	return &grpcFrame{hdr: hdr, rest: &zeros{left: n}}
}

func (f *grpcFrame) Read(p []byte) (int, error) {
	if len(f.hdr) > 0 {
		n := copy(p, f.hdr)
		f.hdr = f.hdr[n:]
		return n, nil
	}
	return f.rest.Read(p)
}

// postRaw sends a POST of a size-byte JSON body to path at addr over a connection of
// its own, as a client that does not wait for the answer would: the body is
// written while the response is read, and write errors (the server hangs
// up once it has answered) are ignored.
func postRaw(t *testing.T, addr, path, key string, size int64, declared bool) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	hdr := "POST " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n"
	if key != "" {
		hdr += "x-api-key: " + key + "\r\n"
	}
	if declared {
		hdr += fmt.Sprintf("Content-Length: %d\r\n\r\n", size)
	} else {
		hdr += "Transfer-Encoding: chunked\r\n\r\n"
	}
	go func() {
		if _, err := io.WriteString(conn, hdr); err != nil {
			return
		}
		if declared {
			_, _ = io.Copy(conn, jsonString(size))
			return
		}
		cw := httputil.NewChunkedWriter(conn)
		if _, err := io.Copy(cw, jsonString(size)); err == nil {
			cw.Close()
			_, _ = io.WriteString(conn, "\r\n")
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp, b
}

// TestOversizedBodiesRefusedBeforeAuthentication sends a 400 MB body with
// no credentials to every route family of the HTTP listener, declared and
// chunked, and a 400 MB message to the gRPC listener: each is refused
// without being read (413 in the API's error envelope, or 401 where the
// route refuses before it reads a byte; RESOURCE_EXHAUSTED from the gRPC
// message's length prefix), and the node allocates nowhere near the body's
// size.
func TestOversizedBodiesRefusedBeforeAuthentication(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	key := servertest.TenantKey(t, srv, tenant.Default)
	const size = 400 << 20

	// TotalAlloc counts every byte allocated, freed or not: a body read
	// whole would show in it, however soon it was collected.
	most := uint64(0)
	var before, after runtime.MemStats
	measure := func(name string, send func()) {
		t.Helper()
		runtime.ReadMemStats(&before)
		send()
		runtime.ReadMemStats(&after)
		grew := after.TotalAlloc - before.TotalAlloc
		if grew > 64<<20 {
			t.Errorf("%s: the node allocated %d MiB refusing a 400 MiB body", name, grew>>20)
		}
		most = max(most, grew)
	}
	for _, path := range []string{"/v1/agents", "/v1/sessions", "/v1/files", "/admin/v1/tenants", "/admin/v1/hosts:issueJoinToken", "/healthz", "/readyz", "/nowhere"} {
		for _, declared := range []bool{true, false} {
			name := fmt.Sprintf("POST %s (declared length %t)", path, declared)
			want := http.StatusRequestEntityTooLarge
			if !declared && strings.HasPrefix(path, "/v1/") || path == "/v1/files" {
				// Authentication comes before the public API reads a
				// body of unknown length, or an upload's body under its
				// cap (500 MiB).
				want = http.StatusUnauthorized
			}
			measure(name, func() {
				resp, b := postRaw(t, srv.HTTPAddr(), path, "", size, declared)
				checkRefusal(t, name, resp, b, want)
			})
		}
	}
	// With a key, the public API reads a chunked body up to its cap.
	measure("POST /v1/agents with a key (chunked)", func() {
		resp, b := postRaw(t, srv.HTTPAddr(), "/v1/agents", key, size, false)
		checkRefusal(t, "POST /v1/agents with a key (chunked)", resp, b, http.StatusRequestEntityTooLarge)
	})

	// An upload's body is read only as multipart, streamed.
	measure("POST /v1/files with a key (not multipart)", func() {
		resp, b := postRaw(t, srv.HTTPAddr(), "/v1/files", key, size, true)
		checkRefusal(t, "POST /v1/files with a key (not multipart)", resp, b, http.StatusBadRequest)
	})

	// gRPC over cleartext HTTP/2, by hand: a frame that declares 400 MB.
	measure("gRPC GetStatus", func() {
		h2 := &http.Transport{Protocols: new(http.Protocols)}
		h2.Protocols.SetUnencryptedHTTP2(true)
		req, err := http.NewRequest("POST", "http://"+srv.GRPCAddr()+"/corral.admin.v1.ClusterService/GetStatus", newGRPCFrame(size))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("TE", "trailers")
		resp, err := (&http.Client{Timeout: time.Minute, Transport: h2}).Do(req)
		if err != nil {
			t.Fatalf("gRPC: %v", err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		code := resp.Header.Get("Grpc-Status") + resp.Trailer.Get("Grpc-Status")
		if code != "8" { // RESOURCE_EXHAUSTED
			t.Errorf("gRPC: HTTP %d, grpc-status %q (%s%s), want 8", resp.StatusCode, code, resp.Header.Get("Grpc-Message"), resp.Trailer.Get("Grpc-Message"))
		}
	})
	t.Logf("the most one refusal allocated: %d MiB", most>>20)
}

func checkRefusal(t *testing.T, name string, resp *http.Response, b []byte, want int) {
	t.Helper()
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
	err := json.Unmarshal(b, &body)
	if resp.StatusCode != want || err != nil || body.Type != "error" || body.RequestID == "" ||
		(want == http.StatusRequestEntityTooLarge && body.Error.Type != "request_too_large") {
		t.Errorf("%s: %d %s, want %d in the error envelope", name, resp.StatusCode, b, want)
	}
}
