package publicapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errhttp"
	"corral.dev/corral/internal/seal"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testAPI is a running public API over a fresh database.
type testAPI struct {
	t     testing.TB
	url   string
	store *store.Store
	db    *pgtest.DB
	// blobDir is the blob store's directory (files' content).
	blobDir string
}

// The Files API's limits in these tests: a file of at most 64 KiB, and
// 160 KiB of files per tenant.
const (
	testFileMax   = 64 << 10
	testFileQuota = 160 << 10
)

// sql runs a statement as the superuser, around the API (to put a session
// in a state only the agent loop can).
func (a *testAPI) sql(stmt string, args ...any) {
	a.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, a.db.SuperuserURL)
	if err != nil {
		a.t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, stmt, args...); err != nil {
		a.t.Fatalf("%s: %v", stmt, err)
	}
}

// setup serves the public API as corral does (behind api.NewHandler) on a
// fresh database, as an admin of the default tenant or of the tenant a
// request names in the X-Test-Tenant header; tenant_b exists besides the
// default tenant. Authentication is tested in package server.
func setup(t testing.TB, events EventAppender) *testAPI {
	t.Helper()
	return setupServer(t, events, false)
}

// setupWithEvents is setup with the events routes mounted, and
// initial_events appended through them: client events are checked as
// corral checks them.
func setupWithEvents(t testing.TB) *testAPI {
	t.Helper()
	return setupServer(t, nil, true)
}

func setupServer(t testing.TB, events EventAppender, eventRoutes bool) *testAPI {
	t.Helper()
	db := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, db.AppURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	su, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	if _, err := su.Exec(ctx, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`); err != nil {
		t.Fatal(err)
	}
	v1 := http.NewServeMux()
	if eventRoutes {
		eh := &EventsHandler{Store: st, Guard: testGuard(t), WriteError: api.WriteError}
		eh.Register(v1)
		events = eh
	}
	keyFile := filepath.Join(t.TempDir(), "seal.key")
	if _, err := seal.Create(keyFile); err != nil {
		t.Fatal(err)
	}
	ring, err := seal.Load(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	blobDir := t.TempDir()
	blobs, err := blob.NewDir(blobDir)
	if err != nil {
		t.Fatal(err)
	}
	New(Options{Store: st, Events: events, Guard: testGuard(t), Keyring: ring, Blobs: blobs, FileMaxBytes: testFileMax,
		FileQuota: func(context.Context) (int64, error) { return testFileQuota, nil }, Logger: slog.New(slog.DiscardHandler)}).Register(v1)
	withTestTenant := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := tenant.Default
		if h := r.Header.Get("X-Test-Tenant"); h != "" {
			id = tenant.ID(h)
		}
		p := auth.Principal{Subject: "test", Tenant: id, Roles: []string{"admin"}}
		if env := r.Header.Get("X-Test-Environment"); env != "" {
			// An environment key of env, as auth makes it.
			p.EnvironmentID, p.Roles = env, nil
		}
		r = r.WithContext(auth.With(r.Context(), p))
		v1.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(api.NewHandler(api.HandlerOptions{
		Gateway:             http.NotFoundHandler(),
		PublicAPI:           withTestTenant,
		PublicAPIBodyLimit:  MaxBodyBytes,
		FileUploadBodyLimit: testFileMax + FileUploadOverhead,
		Ready:               st.Ping,
		Logger:              slog.New(slog.DiscardHandler),
	}))
	t.Cleanup(srv.Close)
	return &testAPI{t: t, url: srv.URL, store: st, db: db, blobDir: blobDir}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
	return m
}

// errMsg returns the error envelope's message, checking its shape.
func (r reply) errMsg(t testing.TB) string {
	t.Helper()
	var e api.ErrorBody
	if err := json.Unmarshal(r.body, &e); err != nil || e.Type != "error" || e.Error.Type == "" || !strings.HasPrefix(e.RequestID, "req_") {
		t.Fatalf("not an error envelope (%v): %s", err, r.body)
	}
	if r.header.Get("request-id") != e.RequestID {
		t.Fatalf("request-id header %q != body %q", r.header.Get("request-id"), e.RequestID)
	}
	return e.Error.Message
}

// do sends a request; body may be a string (sent as is) or a value to encode.
func (a *testAPI) do(method, path string, body any, hdr ...string) reply {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	req, err := http.NewRequest(method, a.url+path+sep+"beta=true", rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Add("anthropic-beta", "managed-agents-2026-04-01")
	req.Header.Add("anthropic-beta", "files-api-2025-04-14,skills-2025-10-02")
	req.Header.Set("anthropic-version", "2023-06-01")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// ok sends a request that must succeed and returns the decoded body.
func (a *testAPI) ok(method, path string, body any, hdr ...string) map[string]any {
	a.t.Helper()
	r := a.do(method, path, body, hdr...)
	if r.status != http.StatusOK {
		a.t.Fatalf("%s %s: status %d: %s", method, path, r.status, r.body)
	}
	return r.json(a.t)
}

// fail sends a request that must fail with status and returns the message.
func (a *testAPI) fail(status int, method, path string, body any, hdr ...string) string {
	a.t.Helper()
	r := a.do(method, path, body, hdr...)
	if r.status != status {
		a.t.Fatalf("%s %s: status %d, want %d: %s", method, path, r.status, status, r.body)
	}
	msg := r.errMsg(a.t)
	if k := errhttp.APIErrorType(&errdefs.Error{Kind: kindFor(status)}); !strings.Contains(string(r.body), `"type":"`+k+`"`) {
		a.t.Fatalf("status %d body lacks error type %s: %s", status, k, r.body)
	}
	return msg
}

func kindFor(status int) errdefs.Kind {
	switch status {
	case 400:
		return errdefs.InvalidArgumentKind
	case 404:
		return errdefs.NotFoundKind
	case 409:
		return errdefs.ConflictKind
	case 413:
		return errdefs.TooLargeKind
	case 429:
		return errdefs.ResourceExhaustedKind
	}
	return errdefs.Unknown
}
