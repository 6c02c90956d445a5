package sdk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
)

// startGVisorHost joins a host agent over the containerd gVisor driver
// to srv and waits until it is connected.
// startGVisorHost starts a host agent with gVisor sandboxes and returns
// its driver's state directory (the sandboxes' host directories).
func startGVisorHost(t testing.TB, srv *server.Server, id string) string {
	t.Helper()
	stateDir := t.TempDir()
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: stateDir})
	ctx, cancel := context.WithCancel(context.Background())
	tok, err := srv.Hosts().IssueToken(ctx, time.Hour)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	a, err := agent.New(ctx, agent.Config{
		HostID: id, ControlPlane: srv.HostAddr(), JoinToken: logging.Secret(tok.Reveal()), StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: containerd.RuntimeGVisor,
		Capacity: agent.Resources{CPUMillis: 64000, MemoryBytes: 256 << 30, DiskBytes: 1 << 40},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the driver's sweep
	waitfor.Cond(t, 30*time.Second, "host "+id+" to connect", func() bool { return srv.Hosts().Connected(id) })
	return stateDir
}

// bashTimed is bashTurn that also says how long the call took to its
// result (staging included) and from its result to the idle (the outputs'
// publish included).
func bashTimed(t *testing.T, ctx context.Context, client anthropic.Client, sessionID string, s stream, command string) (out string, toResult, toIdle time.Duration) {
	t.Helper()
	in, err := json.Marshal(map[string]string{"command": command})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := client.Beta.Sessions.Events.Send(ctx, sessionID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{
		say("!tool bash " + strings.ReplaceAll(string(in), ";", `\u003b`) + "\n!echo"),
	}}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	var b strings.Builder
	var result time.Time
	for s.Next() {
		e := s.Current()
		switch e.Type {
		case "agent.tool_result":
			result = time.Now()
			for _, c := range e.AsAgentToolResult().Content {
				b.WriteString(c.Text)
			}
		case "session.status_idle":
			if result.IsZero() {
				t.Fatalf("idle without a tool result for %q", command)
			}
			return b.String(), result.Sub(start), time.Since(result)
		}
	}
	t.Fatalf("the stream ended: %v", s.Err())
	return "", 0, 0
}

// bashTurn runs one bash tool call in the session through the fake model
// and returns its result's text. The fake model splits calls at ";", so
// the command spells it \u003b.
func bashTurn(t *testing.T, ctx context.Context, client anthropic.Client, sessionID string, s stream, command string) string {
	t.Helper()
	in, err := json.Marshal(map[string]string{"command": command})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Beta.Sessions.Events.Send(ctx, sessionID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{
		say("!tool bash " + strings.ReplaceAll(string(in), ";", `\u003b`) + "\n!echo"),
	}}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	var out strings.Builder
	n := 0
	evs := untilIdle(t, s)
	for _, e := range evs {
		if e.Type == "agent.tool_result" {
			n++
			for _, c := range e.AsAgentToolResult().Content {
				out.WriteString(c.Text)
			}
		}
	}
	if n != 1 {
		var errs []string
		for _, e := range evs {
			if e.Type == "session.error" {
				errs = append(errs, e.RawJSON())
			}
		}
		t.Fatalf("%d tool results for %q, want 1 (events %s; errors %v)", n, command, typesOf(evs), errs)
	}
	return out.String()
}

// apiStatus is the status of an SDK error (0 for none).
func apiStatus(err error) (int, string) {
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode, apiErr.Error()
	}
	return 0, fmt.Sprint(err)
}

// Issue 17's first test, through the official Go SDK against a node with
// a gVisor host: a CSV uploads and is mounted as the session's resource;
// bash in the sandbox reads it at its mount path byte for byte, cannot
// write, remove or add to the uploads, and writes a result under
// /mnt/session/outputs; after the idle the result is listed by scope_id
// and downloads byte for byte (a symbolic link beside it is not
// published). A resource added while the session lives shows at the next
// tool call, and deleting it removes it. Publishing again keeps unchanged
// outputs and replaces changed ones. Another tenant sees none of it.
func TestSessionResourcesAndOutputsThroughTheSDK(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-resources", SandboxRuntime: admission.RuntimeGVisor, FileMaxBytes: fileLimit})
	startGVisorHost(t, srv, "gvisor-resources")
	client := func(id tenant.ID) anthropic.Client {
		return anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, id)),
			option.WithRequestTimeout(2*time.Minute))
	}
	a, b := client(tenant.Default), client("tenant_b")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	var csv bytes.Buffer
	csv.WriteString("id,name,score\n")
	for i := 0; csv.Len() < 300<<10; i++ {
		fmt.Fprintf(&csv, "%d,user-%d,%d\n", i, i*7919%10007, i%100)
	}
	sum := sha256.Sum256(csv.Bytes())
	f, err := a.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(csv.Bytes()), "scores.csv", "text/csv")})
	if err != nil {
		t.Fatalf("Files.Upload: %v", err)
	}
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "resources", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "resources"})
	if err != nil {
		t.Fatal(err)
	}
	newSession := func(rs ...anthropic.BetaSessionNewParamsResourceUnion) (*anthropic.BetaManagedAgentsSession, error) {
		return a.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
			Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID, Resources: rs,
		})
	}

	// Refused: a repository (no egress yet), a mount path outside the
	// uploads or with "..", a file that does not exist, another tenant's.
	for _, tc := range []struct {
		name string
		r    anthropic.BetaSessionNewParamsResourceUnion
		want string
	}{
		{"github_repository", anthropic.BetaSessionNewParamsResourceUnion{OfGitHubRepository: &anthropic.BetaManagedAgentsGitHubRepositoryResourceParams{URL: "https://github.com/octocat/hello-world"}}, "egress"},
		{"outside uploads", anthropic.BetaSessionNewParamsResourceUnion{OfFile: &anthropic.BetaManagedAgentsFileResourceParams{FileID: f.ID, MountPath: anthropic.String("/workspace/scores.csv")}}, "not beneath /mnt/session/uploads"},
		{"dot dot", anthropic.BetaSessionNewParamsResourceUnion{OfFile: &anthropic.BetaManagedAgentsFileResourceParams{FileID: f.ID, MountPath: anthropic.String("/mnt/session/uploads/../outputs/x")}}, "must be clean"},
		{"no such file", anthropic.BetaSessionNewParamsResourceUnion{OfFile: &anthropic.BetaManagedAgentsFileResourceParams{FileID: "file_missing"}}, "no file file_missing"},
	} {
		if _, err := newSession(tc.r); err == nil {
			t.Errorf("%s: the session was created", tc.name)
		} else if st, msg := apiStatus(err); st != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %d %s; want 400 with %q", tc.name, st, msg, tc.want)
		}
	}
	if _, err := b.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID,
	}); err == nil {
		t.Error("tenant B started a session of tenant A's agent")
	}

	const mount = "/mnt/session/uploads/data/scores.csv"
	sess, err := newSession(anthropic.BetaSessionNewParamsResourceUnion{OfFile: &anthropic.BetaManagedAgentsFileResourceParams{FileID: f.ID, MountPath: anthropic.String(mount)}})
	if err != nil {
		t.Fatalf("Sessions.New with a file resource: %v", err)
	}
	decodedCleanly(t, "Sessions.New", sess)
	if len(sess.Resources) != 1 || sess.Resources[0].Type != "file" || sess.Resources[0].FileID != f.ID || sess.Resources[0].MountPath != mount ||
		!strings.HasPrefix(sess.Resources[0].ID, "sesrsc_") {
		t.Fatalf("the session's resources: %s", sess.JSON.Resources.Raw())
	}
	s := a.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	bash := func(command string) string {
		t.Helper()
		return bashTurn(t, ctx, a, sess.ID, s, command)
	}

	start := time.Now()
	out := bash("sha256sum " + mount + " && head -1 " + mount + " && id -u")
	t.Logf("first turn (a cold gVisor sandbox, the CSV staged) in %v", time.Since(start))
	if !strings.Contains(out, hex.EncodeToString(sum[:])) || !strings.Contains(out, "id,name,score") || !strings.Contains(out, "1000") {
		t.Fatalf("reading the mounted CSV: %q; want its sha256 %x", out, sum)
	}
	// Read-only: the sandbox's user can neither write, remove, rename nor
	// add (a read-only bind mount of a root-owned directory, files 0444).
	out = bash(`(echo x >> ` + mount + ` && echo WROTE) || echo REFUSED-write
(rm -f ` + mount + ` && test ! -e ` + mount + ` && echo REMOVED) || echo REFUSED-rm
(mv ` + mount + ` /mnt/session/uploads/moved && echo MOVED) || echo REFUSED-mv
(touch /mnt/session/uploads/new && echo ADDED) || echo REFUSED-add
(chmod 666 ` + mount + ` && echo CHMODDED) || echo REFUSED-chmod
stat -c '%U %a' ` + mount + ` && sha256sum ` + mount)
	t.Logf("changing the mounted file from inside the sandbox:\n%s", out)
	for _, want := range []string{"REFUSED-write", "REFUSED-rm", "REFUSED-mv", "REFUSED-add", "REFUSED-chmod", "root 444", hex.EncodeToString(sum[:])} {
		if !strings.Contains(out, want) {
			t.Errorf("trying to change the mounted file: %q lacks %q", out, want)
		}
	}

	// Outputs: a result, one in a subdirectory, and a symbolic link that
	// must not be followed.
	result := []byte(strings.Join(strings.SplitN(csv.String(), "\n", 4)[:3], "\n") + "\n")
	bash("mkdir -p /mnt/session/outputs/sub && head -3 " + mount + " > /mnt/session/outputs/result.csv && echo nested > /mnt/session/outputs/sub/n.txt && ln -s /etc/passwd /mnt/session/outputs/passwd")
	outputs := func() map[string]anthropic.BetaFileMetadata {
		t.Helper()
		got := map[string]anthropic.BetaFileMetadata{}
		for it := a.Beta.Files.ListAutoPaging(ctx, anthropic.BetaFileListParams{ScopeID: anthropic.String(sess.ID), Limit: anthropic.Int(1)}); it.Next(); {
			decodedCleanly(t, "Files.List", it.Current())
			got[it.Current().Filename] = it.Current()
		}
		return got
	}
	download := func(id string) []byte {
		t.Helper()
		resp, err := a.Beta.Files.Download(ctx, id, anthropic.BetaFileDownloadParams{})
		if err != nil {
			t.Fatalf("Files.Download %s: %v", id, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	got := outputs()
	if len(got) != 2 {
		t.Fatalf("outputs after the idle: %v; want result.csv and sub/n.txt (no symbolic link)", got)
	}
	r := got["result.csv"]
	if r.Scope.ID != sess.ID || r.Scope.Type != "session" || r.SizeBytes != int64(len(result)) || !r.Downloadable || r.MimeType != "text/csv; charset=utf-8" && r.MimeType != "text/csv" {
		t.Errorf("result.csv: %s", r.RawJSON())
	}
	if body := download(r.ID); !bytes.Equal(body, result) {
		t.Errorf("result.csv downloads as %q, want %q", body, result)
	}
	if body := download(got["sub/n.txt"].ID); string(body) != "nested\n" {
		t.Errorf("sub/n.txt downloads as %q", body)
	}

	// A resource added to the running session shows at the next call;
	// the list and get name it; deleting it removes it.
	f2, err := a.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(strings.NewReader("second file\n"), "second.txt", "text/plain")})
	if err != nil {
		t.Fatal(err)
	}
	added, err := a.Beta.Sessions.Resources.Add(ctx, sess.ID, anthropic.BetaSessionResourceAddParams{
		BetaManagedAgentsFileResourceParams: anthropic.BetaManagedAgentsFileResourceParams{FileID: f2.ID},
	})
	if err != nil {
		t.Fatalf("Resources.Add: %v", err)
	}
	decodedCleanly(t, "Resources.Add", added)
	if added.MountPath != "/mnt/session/uploads/"+f2.ID || added.FileID != f2.ID || added.Type != "file" {
		t.Fatalf("added %s", added.RawJSON())
	}
	if out := bash("cat " + added.MountPath); strings.TrimSpace(out) != "second file" {
		t.Fatalf("the added resource at the next call: %q", out)
	}
	var listed []string
	for it := a.Beta.Sessions.Resources.ListAutoPaging(ctx, sess.ID, anthropic.BetaSessionResourceListParams{Limit: anthropic.Int(1)}); it.Next(); {
		decodedCleanly(t, "Resources.List", it.Current())
		listed = append(listed, it.Current().ID)
	}
	if len(listed) != 2 || listed[0] != sess.Resources[0].ID || listed[1] != added.ID {
		t.Fatalf("Resources.List: %v", listed)
	}
	one, err := a.Beta.Sessions.Resources.Get(ctx, added.ID, anthropic.BetaSessionResourceGetParams{SessionID: sess.ID})
	if err != nil || one.FileID != f2.ID {
		t.Fatalf("Resources.Get: %v %+v", err, one)
	}
	if _, err := b.Beta.Sessions.Resources.Get(ctx, added.ID, anthropic.BetaSessionResourceGetParams{SessionID: sess.ID}); err == nil {
		t.Error("tenant B read tenant A's session resource")
	} else if st, _ := apiStatus(err); st != http.StatusNotFound {
		t.Errorf("tenant B reading a resource of tenant A: %v, want 404", err)
	}
	del, err := a.Beta.Sessions.Resources.Delete(ctx, added.ID, anthropic.BetaSessionResourceDeleteParams{SessionID: sess.ID})
	if err != nil || del.ID != added.ID || del.Type != "session_resource_deleted" {
		t.Fatalf("Resources.Delete: %v %+v", err, del)
	}
	if out := bash("ls /mnt/session/uploads && (test -e " + added.MountPath + " && echo STILL) || echo GONE"); !strings.Contains(out, "GONE") || !strings.Contains(out, "data") {
		t.Fatalf("after the delete: %q", out)
	}

	// Published again at each idle: unchanged outputs keep their file,
	// a changed one is replaced by a new file.
	again := outputs()
	if len(again) != 2 || again["result.csv"].ID != r.ID || again["sub/n.txt"].ID != got["sub/n.txt"].ID {
		t.Fatalf("unchanged outputs published again: %v, want the same files", again)
	}
	bash("echo changed > /mnt/session/outputs/sub/n.txt")
	changed := outputs()
	if len(changed) != 2 || changed["result.csv"].ID != r.ID || changed["sub/n.txt"].ID == got["sub/n.txt"].ID {
		t.Fatalf("after a change: %v", changed)
	}
	if body := download(changed["sub/n.txt"].ID); string(body) != "changed\n" {
		t.Errorf("the changed output downloads as %q", body)
	}
	if _, err := a.Beta.Files.GetMetadata(ctx, got["sub/n.txt"].ID, anthropic.BetaFileGetMetadataParams{}); err == nil {
		t.Error("the replaced output is still there")
	}

	// Tenant B lists none of it.
	page, err := b.Beta.Files.List(ctx, anthropic.BetaFileListParams{ScopeID: anthropic.String(sess.ID)})
	if err != nil || len(page.Data) != 0 {
		t.Errorf("tenant B's listing of tenant A's session outputs: %v, %d files", err, len(page.Data))
	}
}

// pattern is size bytes of a deterministic, incompressible-looking
// stream, made as it is read.
type pattern struct {
	left int64
	x    uint64
}

func (p *pattern) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(b)), p.left))
	for i := range n {
		p.x = p.x*6364136223846793005 + 1442695040888963407
		b[i] = byte(p.x >> 56)
	}
	p.left -= int64(n)
	return n, nil
}

// heapPeak samples the heap in use until stop is called, and returns its
// peak above the heap at the start.
func heapPeak() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	done, out := make(chan struct{}), make(chan uint64)
	go func() {
		t := time.NewTicker(20 * time.Millisecond) // sampling, not waiting
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				out <- peak - base
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-out }
}

// A 64 MiB file mounted into a running gVisor session and a 64 MiB output
// published from it stream through the control plane and the host agent
// (both in this process) in chunks: the heap never holds the file (its peak
// stays under half of it, with the collector at 10%: the whole process's
// heap is sampled, and on a busy machine the rest of it, the node's and
// the host's own work, has been seen to add 17 MiB), and the bytes
// come out as they went in. Logs the throughput of staging and publishing.
func TestLargeResourceAndOutputStream(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	const size = 64 << 20
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-large", SandboxRuntime: admission.RuntimeGVisor, FileMaxBytes: 2 * size})
	startGVisorHost(t, srv, "gvisor-large")
	a := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, tenant.Default)),
		option.WithRequestTimeout(5*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	h := sha256.New()
	_, _ = io.Copy(h, &pattern{left: size})
	sum := hex.EncodeToString(h.Sum(nil))
	f, err := a.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(&pattern{left: size}, "big.bin", "application/octet-stream")})
	if err != nil {
		t.Fatalf("Files.Upload: %v", err)
	}
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "large", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "large"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := a.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := a.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	if out := bashTurn(t, ctx, a, sess.ID, s, "echo warm"); !strings.Contains(out, "warm") {
		t.Fatalf("first turn: %q", out)
	}
	_, baseline, _ := bashTimed(t, ctx, a, sess.ID, s, "true")
	if _, err := a.Beta.Sessions.Resources.Add(ctx, sess.ID, anthropic.BetaSessionResourceAddParams{
		BetaManagedAgentsFileResourceParams: anthropic.BetaManagedAgentsFileResourceParams{FileID: f.ID, MountPath: anthropic.String("/mnt/session/uploads/big.bin")},
	}); err != nil {
		t.Fatal(err)
	}

	old := debug.SetGCPercent(10)
	defer debug.SetGCPercent(old)
	stop := heapPeak()
	// Staged before this call.
	out, staged, _ := bashTimed(t, ctx, a, sess.ID, s, "test -f /mnt/session/uploads/big.bin && echo there")
	if !strings.Contains(out, "there") {
		t.Fatalf("the added file: %q", out)
	}
	out, hashed, _ := bashTimed(t, ctx, a, sess.ID, s, "sha256sum /mnt/session/uploads/big.bin")
	if !strings.Contains(out, sum) {
		t.Fatalf("the mounted file hashes as %q, want %s", out, sum)
	}
	_, copied, published := bashTimed(t, ctx, a, sess.ID, s, "cp /mnt/session/uploads/big.bin /mnt/session/outputs/big.bin")
	peak := stop()
	_, _, idle := bashTimed(t, ctx, a, sess.ID, s, "true") // unchanged: hashed on the host, not sent
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	t.Logf("64 MiB: a tool call %v; with the file staged first %v (staging %.0f MiB/s); sha256sum in the sandbox %v; cp to the outputs %v; "+
		"result to idle with the publish %v (%.0f MiB/s), with it unchanged %v; heap peak +%d MiB",
		ms(baseline), ms(staged), 64/(staged-baseline).Seconds(), ms(hashed), ms(copied), ms(published), 64/published.Seconds(), ms(idle), peak>>20)
	if peak > size/2 {
		t.Errorf("the heap grew by %d MiB while 64 MiB went through: a file was held whole", peak>>20)
	}

	page, err := a.Beta.Files.List(ctx, anthropic.BetaFileListParams{ScopeID: anthropic.String(sess.ID)})
	if err != nil || len(page.Data) != 1 || page.Data[0].SizeBytes != size {
		t.Fatalf("outputs: %+v, %v", page, err)
	}
	resp, err := a.Beta.Files.Download(ctx, page.Data[0].ID, anthropic.BetaFileDownloadParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h.Reset()
	if n, err := io.Copy(h, resp.Body); err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != sum {
		t.Fatalf("the output downloads as %d bytes (%v), sha256 %x; want %s", n, err, h.Sum(nil), sum)
	}
}

// The flow of the SDK's agents-with-files example, call for call as it
// makes them (its code is not copied here): an environment, an agent with
// the built-in toolset enabled and always allowed, a CSV uploaded from an
// *os.File (the filename comes from it), a session naming the agent by id
// and version with the file mounted at the relative path "data.csv", a
// message, the stream to the idle. The example sends before it streams;
// against the fake model, which answers at once, the stream opens first
// here. The fake model's script then reads the file at its resolved mount
// and writes an output, which is published.
func TestAgentsWithFilesExampleFlow(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-example", SandboxRuntime: admission.RuntimeGVisor})
	startGVisorHost(t, srv, "gvisor-example")
	client := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, tenant.Default)),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	environment, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "files-example-environment"})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "files-example-agent",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: anthropic.BetaManagedAgentsModelClaudeSonnet5},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{
			DefaultConfig: anthropic.BetaManagedAgentsAgentToolsetDefaultConfigParams{
				Enabled:          anthropic.Bool(true),
				PermissionPolicy: anthropic.BetaManagedAgentsAgentToolsetDefaultConfigParamsPermissionPolicyUnion{OfAlwaysAllow: &anthropic.BetaManagedAgentsAlwaysAllowPolicyParam{}},
			},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	const data = "city,population\nParis,2102650\nLyon,522250\n"
	path := filepath.Join(t.TempDir(), "data.csv")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	csvFile, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer csvFile.Close()
	file, err := client.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: csvFile})
	if err != nil {
		t.Fatalf("Files.Upload: %v", err)
	}
	if file.Filename != "data.csv" {
		t.Errorf("uploaded as %q", file.Filename)
	}
	session, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		EnvironmentID: environment.ID,
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfBetaManagedAgentsAgents: &anthropic.BetaManagedAgentsAgentParams{
			ID: agent.ID, Version: anthropic.Int(agent.Version),
		}},
		Resources: []anthropic.BetaSessionNewParamsResourceUnion{{OfFile: &anthropic.BetaManagedAgentsFileResourceParams{
			FileID: file.ID, MountPath: anthropic.String("data.csv"),
		}}},
	})
	if err != nil {
		t.Fatalf("Sessions.New with the example's resource: %v", err)
	}
	if len(session.Resources) != 1 || session.Resources[0].MountPath != "/mnt/session/uploads/data.csv" {
		t.Fatalf("the example's resource: %s", session.JSON.Resources.Raw())
	}
	stream := client.Beta.Sessions.Events.StreamEvents(ctx, session.ID, anthropic.BetaSessionEventStreamParams{})
	defer stream.Close()
	if _, err := client.Beta.Sessions.Events.Send(ctx, session.ID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{
		say("Read /uploads/data.csv and tell me the column names."),
	}}); err != nil {
		t.Fatal(err)
	}
	untilIdle(t, stream)

	out := bashTurn(t, ctx, client, session.ID, stream, "head -1 /mnt/session/uploads/data.csv | tr , '\\n' > /mnt/session/outputs/columns.txt && cat /mnt/session/outputs/columns.txt")
	if strings.TrimSpace(out) != "city\npopulation" {
		t.Fatalf("the columns: %q", out)
	}
	page, err := client.Beta.Files.List(ctx, anthropic.BetaFileListParams{ScopeID: anthropic.String(session.ID)})
	if err != nil || len(page.Data) != 1 || page.Data[0].Filename != "columns.txt" {
		t.Fatalf("outputs: %+v, %v", page, err)
	}
	resp, err := client.Beta.Files.Download(ctx, page.Data[0].ID, anthropic.BetaFileDownloadParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); string(b) != "city\npopulation\n" {
		t.Fatalf("columns.txt downloads as %q", b)
	}
}
