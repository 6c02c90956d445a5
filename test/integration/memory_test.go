package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// A read_write memory store through `corral dev` (its gVisor host, its
// PostgreSQL) and the official SDK: the store's memory is a file in the
// sandbox, and what the agent writes there with bash is in the store
// after the call, as a version of the session.
func TestDevReadWriteMemory(t *testing.T) {
	requireGVisor(t)
	dir := dataDir(t)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--runtime", "gvisor", "--no-warm-pools")
	dev.waitListening(t)
	env := readEnv(t, dir)
	client := anthropic.NewClient(option.WithBaseURL(env["CORRAL_URL"]), option.WithAPIKey(env["CORRAL_API_KEY"]),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	st, err := client.Beta.MemoryStores.New(ctx, anthropic.BetaMemoryStoreNewParams{Name: "notes"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/todo.md", Content: anthropic.String("- one\n")}); err != nil {
		t.Fatal(err)
	}
	ag, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "memory", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	envr, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: envr.ID,
		Resources: []anthropic.BetaSessionNewParamsResourceUnion{{OfMemoryStore: &anthropic.BetaManagedAgentsMemoryStoreResourceParam{MemoryStoreID: st.ID}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	out := bashTurns(t, ctx, client, sess.ID, s, "cat /mnt/memory/notes/todo.md && echo '- two' >> /mnt/memory/notes/todo.md && echo DONE")
	if len(out) != 1 || !strings.Contains(out[0], "- one") || !strings.Contains(out[0], "DONE") {
		t.Fatalf("the bash call: %q", out)
	}
	l, err := client.Beta.MemoryStores.Memories.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryListParams{})
	if err != nil || len(l.Data) != 1 {
		t.Fatalf("memories: %+v, %v", l, err)
	}
	m, err := client.Beta.MemoryStores.Memories.Get(ctx, l.Data[0].ID, anthropic.BetaMemoryStoreMemoryGetParams{MemoryStoreID: st.ID, View: "full"})
	if err != nil || m.Content != "- one\n- two\n" {
		t.Fatalf("/todo.md after the call = %+v, %v", m, err)
	}
	vs, err := client.Beta.MemoryStores.MemoryVersions.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryVersionListParams{SessionID: anthropic.String(sess.ID)})
	if err != nil || len(vs.Data) != 1 || vs.Data[0].Operation != "modified" || vs.Data[0].CreatedBy.Type != "session_actor" {
		t.Fatalf("the session's versions: %+v, %v", vs, err)
	}
}
