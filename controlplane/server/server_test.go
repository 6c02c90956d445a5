package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/seal"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(floodURLEnv); url != "" { // the fairness test's flood child
		os.Exit(floodMain(url, os.Getenv(floodTurnEnv), os.Getenv(floodKeyEnv)))
	}
	os.Exit(pgtest.Main(m))
}

// setup starts a node on free loopback ports against a fresh database.
func setup(t *testing.T, db *pgtest.DB) *server.Server {
	return servertest.Start(t, db, server.Config{NodeID: "node-a"})
}

// grpcClient dials addr; key, when set, goes with every call.
func grpcClient(t *testing.T, addr string, key ...string) adminv1.ClusterServiceClient {
	t.Helper()
	return adminv1.NewClusterServiceClient(dial(t, addr, key...))
}

func dial(t *testing.T, addr string, key ...string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if len(key) > 0 {
		k := key[0]
		opts = append(opts, grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, "x-api-key", k), method, req, reply, cc, o...)
		}))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// get sends a GET with key (if any) in x-api-key.
func get(t *testing.T, url string, key ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(key) > 0 {
		req.Header.Set("x-api-key", key[0])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestGetStatusOverBothTransports(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	op := servertest.OperatorKey(t, db)

	var hdr metadata.MD
	st, err := grpcClient(t, srv.GRPCAddr(), op).GetStatus(context.Background(), &adminv1.GetStatusRequest{}, grpc.Header(&hdr))
	if err != nil {
		t.Fatalf("gRPC GetStatus: %v", err)
	}
	if st.NodeId != "node-a" || !st.DatabaseReachable || st.Version == "" || st.SchemaVersion < 1 || st.SchemaVersion != st.SchemaVersionLatest {
		t.Fatalf("gRPC status = %+v", st)
	}
	if ids := hdr.Get("request-id"); len(ids) != 1 || !strings.HasPrefix(ids[0], "req_") {
		t.Fatalf("gRPC request-id header = %v", ids)
	}

	resp, body := get(t, "http://"+srv.HTTPAddr()+"/admin/v1/cluster/status", op)
	if resp.StatusCode != 200 {
		t.Fatalf("REST status %d: %s", resp.StatusCode, body)
	}
	var rest struct {
		NodeID            string `json:"node_id"`
		DatabaseReachable bool   `json:"database_reachable"`
		Uptime            string `json:"uptime"`
		SchemaVersion     string `json:"schema_version"`
		SchemaLatest      string `json:"schema_version_latest"`
	}
	if err := json.Unmarshal(body, &rest); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	if rest.NodeID != "node-a" || !rest.DatabaseReachable || !strings.HasSuffix(rest.Uptime, "s") || rest.SchemaVersion == "0" || rest.SchemaVersion != rest.SchemaLatest {
		t.Fatalf("REST status = %s", body)
	}
	if !strings.HasPrefix(resp.Header.Get("request-id"), "req_") {
		t.Fatalf("REST request-id header = %q", resp.Header.Get("request-id"))
	}
}

func TestHealthAndReadiness(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	op := servertest.OperatorKey(t, db)
	base := "http://" + srv.HTTPAddr()
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, body := get(t, base+path); resp.StatusCode != 200 {
			t.Fatalf("%s = %d %s", path, resp.StatusCode, body)
		}
	}

	// The operator's key is known to the node (it keeps what it learnt of
	// keys while the database is away).
	if _, err := grpcClient(t, srv.GRPCAddr(), op).GetStatus(context.Background(), &adminv1.GetStatusRequest{}); err != nil {
		t.Fatal(err)
	}

	// Take the database away: the node stays alive but is no longer ready,
	// and says so on both transports.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.SuperuserURL[:strings.LastIndex(db.SuperuserURL, "/")]+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE "+db.Name+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, base+"/healthz"); resp.StatusCode != 200 {
		t.Fatalf("healthz = %d without a database; liveness must not depend on it", resp.StatusCode)
	}
	resp, body := get(t, base+"/readyz")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz = %d %s, want 503", resp.StatusCode, body)
	}
	checkEnvelope(t, resp, body, "overloaded_error")
	st, err := grpcClient(t, srv.GRPCAddr(), op).GetStatus(ctx, &adminv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.DatabaseReachable || st.DatabaseError == "" {
		t.Fatalf("status without database = %+v", st)
	}
}

func TestUnknownRoutesUseTheErrorEnvelope(t *testing.T) {
	srv := setup(t, pgtest.New(t))
	for _, path := range []string{"/nope", "/admin/v1/nope"} {
		resp, body := get(t, "http://"+srv.HTTPAddr()+path)
		if resp.StatusCode != 404 {
			t.Fatalf("%s = %d %s", path, resp.StatusCode, body)
		}
		checkEnvelope(t, resp, body, "not_found_error")
	}
}

func checkEnvelope(t *testing.T, resp *http.Response, body []byte, wantType string) {
	t.Helper()
	var env struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	if env.Type != "error" || env.Error.Type != wantType || env.Error.Message == "" {
		t.Fatalf("envelope = %s, want error.type %s", body, wantType)
	}
	if env.RequestID == "" || env.RequestID != resp.Header.Get("request-id") {
		t.Fatalf("request_id %q does not match header %q", env.RequestID, resp.Header.Get("request-id"))
	}
}

func TestStartupErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	empty, current := pgtest.NewEmpty(t), pgtest.New(t)
	sealKey := filepath.Join(t.TempDir(), "seal.key")
	if _, err := seal.Create(sealKey); err != nil {
		t.Fatal(err)
	}
	token := logging.Secret("corralnode1." + strings.Repeat("x", 43) + "." + strings.Repeat("ab", 32))
	tests := []struct {
		name string
		cfg  server.Config
		kind errdefs.Kind
		msg  string
	}{
		{"no database url", server.Config{}, errdefs.InvalidArgumentKind, "database URL is required"},
		{"unreachable", server.Config{DatabaseURL: "postgres://u:p@127.0.0.1:1/x?connect_timeout=2"}, errdefs.UnavailableKind, "connection refused"},
		{"schema behind", server.Config{DatabaseURL: empty.AppURL}, errdefs.FailedPreconditionKind, "corral migrate"},
		{"owner role", server.Config{DatabaseURL: pgtest.New(t).OwnerURL}, errdefs.FailedPreconditionKind, "owns"},
		{"unknown model", server.Config{DatabaseURL: empty.AppURL, Model: "gpt"}, errdefs.InvalidArgumentKind, `unknown model client "gpt"`},
		{"anthropic without key", server.Config{DatabaseURL: empty.AppURL, Model: "anthropic"}, errdefs.InvalidArgumentKind, "CORRAL_ANTHROPIC_API_KEY"},
		{"real model with the process runtime", server.Config{DatabaseURL: empty.AppURL, Model: "anthropic", AnthropicAPIKey: "k", SandboxRuntime: "process"},
			errdefs.FailedPreconditionKind, "--unsafe-allow-process-runtime-with-real-model"},
		{"unknown sandbox runtime", server.Config{DatabaseURL: empty.AppURL, SandboxRuntime: "kata"}, errdefs.InvalidArgumentKind, `unknown sandbox runtime "kata"`},
		{"no data dir", server.Config{DatabaseURL: current.AppURL, DataDir: "-"}, errdefs.InvalidArgumentKind, "--data-dir"},
		{"bootstrap and join", server.Config{DatabaseURL: current.AppURL, Bootstrap: true, Join: "127.0.0.1:1"}, errdefs.InvalidArgumentKind, "exclusive"},
		{"neither bootstrap nor join", server.Config{DatabaseURL: current.AppURL}, errdefs.FailedPreconditionKind, "--bootstrap"},
		{"join without the seal key", server.Config{DatabaseURL: current.AppURL, Join: "127.0.0.1:1"}, errdefs.InvalidArgumentKind, "--seal-key-file"},
		{"join without a token", server.Config{DatabaseURL: current.AppURL, Join: "127.0.0.1:1", SealKeyFile: sealKey}, errdefs.InvalidArgumentKind, "--node-join-token"},
		{"join with a bad token", server.Config{DatabaseURL: current.AppURL, Join: "127.0.0.1:1", SealKeyFile: sealKey, NodeJoinToken: "corral1.x.y"}, errdefs.InvalidArgumentKind, "node join token"},
		{"join a bad address", server.Config{DatabaseURL: current.AppURL, Join: "127.0.0.1:1", JoinTimeout: 2 * time.Second, SealKeyFile: sealKey, NodeJoinToken: token},
			errdefs.UnavailableKind, "trading the node join token at 127.0.0.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.HTTPAddr, tt.cfg.GRPCAddr, tt.cfg.HostAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
			tt.cfg.RaftAddr, tt.cfg.RaftHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
			switch tt.cfg.DataDir {
			case "":
				tt.cfg.DataDir = t.TempDir()
			case "-":
				tt.cfg.DataDir = ""
			}
			_, err := server.New(ctx, tt.cfg)
			if errdefs.KindOf(err) != tt.kind || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v (kind %v), want kind %v containing %q", err, errdefs.KindOf(err), tt.kind, tt.msg)
			}
		})
	}
}
