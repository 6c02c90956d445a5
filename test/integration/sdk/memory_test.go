package sdk

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// Memory stores through the official SDK (Beta.MemoryStores): a store and
// its memories, listed in path order with a prefix, a depth and pages; a
// stale content_sha256 precondition on update or delete is a 409 and
// changes nothing; every write is a version naming its API key; a
// redacted version keeps its record without its content; an archived
// store takes no writes; another tenant sees nothing.
func TestMemoryStoresThroughTheSDK(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-memory"})
	client := func(id tenant.ID) anthropic.Client {
		return anthropic.NewClient(
			option.WithBaseURL("http://"+srv.HTTPAddr()),
			option.WithAPIKey(servertest.TenantKey(t, srv, id)),
			option.WithRequestTimeout(30*time.Second),
		)
	}
	a, b := client(tenant.Default), client("tenant_b")
	ctx := context.Background()

	st, err := a.Beta.MemoryStores.New(ctx, anthropic.BetaMemoryStoreNewParams{Name: "project notes",
		Description: anthropic.String("what the agent learned"), Metadata: map[string]string{"team": "x"}})
	if err != nil {
		t.Fatalf("MemoryStores.New: %v", err)
	}
	decodedCleanly(t, "MemoryStores.New", st)
	if !strings.HasPrefix(st.ID, "memstore_") || st.Name != "project notes" || st.Description != "what the agent learned" ||
		st.Metadata["team"] != "x" || st.JSON.ArchivedAt.Raw() != "null" {
		t.Fatalf("store = %s", st.RawJSON())
	}
	up, err := a.Beta.MemoryStores.Update(ctx, st.ID, anthropic.BetaMemoryStoreUpdateParams{Name: anthropic.String("notes")})
	if err != nil || up.Name != "notes" || up.Description != "what the agent learned" {
		t.Fatalf("MemoryStores.Update = %+v, %v", up, err)
	}

	m, err := a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/projects/foo/notes.md", Content: anthropic.String("use tabs")})
	if err != nil {
		t.Fatalf("Memories.New: %v", err)
	}
	decodedCleanly(t, "Memories.New", m)
	if !strings.HasPrefix(m.ID, "mem_") || m.ContentSha256 != store.ContentSHA256("use tabs") || m.ContentSizeBytes != 8 ||
		m.JSON.Content.Raw() != "null" || !strings.HasPrefix(m.MemoryVersionID, "memver_") {
		t.Fatalf("memory = %s", m.RawJSON()) // create answers view=basic
	}
	for _, p := range []string{"/projects/bar.md", "/projects/foo/todo.md", "/readme.md"} {
		if _, err := a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: p, Content: anthropic.String(p)}); err != nil {
			t.Fatal(err)
		}
	}
	// Refusals: a second memory at a path (409), a path with "..", no
	// leading "/" or over the bound (400), content over 100 kB (413).
	_, err = a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/readme.md", Content: anthropic.String("x")})
	apiError(t, err, 409)
	for _, p := range []string{"/a/../b.md", "a.md", "/" + strings.Repeat("x", 1025), "/a//b.md", "/a\x01b"} {
		_, err = a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: p, Content: anthropic.String("x")})
		apiError(t, err, 400)
	}
	_, err = a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/big.md", Content: anthropic.String(strings.Repeat("x", 102_401))})
	apiError(t, err, 413)

	// Listing: in path order, in pages; a prefix; a depth that rolls up.
	var paths []string
	pager := a.Beta.MemoryStores.Memories.ListAutoPaging(ctx, st.ID, anthropic.BetaMemoryStoreMemoryListParams{Limit: anthropic.Int(1)})
	for pager.Next() {
		paths = append(paths, pager.Current().Path)
	}
	if err := pager.Err(); err != nil || strings.Join(paths, " ") != "/projects/bar.md /projects/foo/notes.md /projects/foo/todo.md /readme.md" {
		t.Fatalf("paged = %v, %v", paths, err)
	}
	l, err := a.Beta.MemoryStores.Memories.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryListParams{PathPrefix: anthropic.String("/projects/"), Depth: anthropic.Int(1)})
	if err != nil || len(l.Data) != 2 || l.Data[0].Type != "memory" || l.Data[0].Path != "/projects/bar.md" ||
		l.Data[1].Type != "memory_prefix" || l.Data[1].Path != "/projects/foo/" {
		t.Fatalf("depth 1 under /projects/ = %+v, %v", l, err)
	}
	decodedCleanly(t, "Memories.List", l)

	got, err := a.Beta.MemoryStores.Memories.Get(ctx, m.ID, anthropic.BetaMemoryStoreMemoryGetParams{MemoryStoreID: st.ID})
	if err != nil || got.Content != "use tabs" {
		t.Fatalf("Memories.Get = %+v, %v", got, err)
	}
	decodedCleanly(t, "Memories.Get", got)

	// A stale precondition: 409, nothing changed; the current one applies.
	stale := store.ContentSHA256("something else")
	_, err = a.Beta.MemoryStores.Memories.Update(ctx, m.ID, anthropic.BetaMemoryStoreMemoryUpdateParams{MemoryStoreID: st.ID,
		Content: anthropic.String("use spaces"), Precondition: anthropic.BetaManagedAgentsPreconditionParam{ContentSha256: anthropic.String(stale)}})
	if e := apiError(t, err, 409); !strings.Contains(e.Error(), "precondition") {
		t.Fatalf("stale update: %v", e)
	}
	if got, _ := a.Beta.MemoryStores.Memories.Get(ctx, m.ID, anthropic.BetaMemoryStoreMemoryGetParams{MemoryStoreID: st.ID}); got.Content != "use tabs" {
		t.Fatalf("after a refused update: %q", got.Content)
	}
	m2, err := a.Beta.MemoryStores.Memories.Update(ctx, m.ID, anthropic.BetaMemoryStoreMemoryUpdateParams{MemoryStoreID: st.ID,
		Content: anthropic.String("use spaces"), Precondition: anthropic.BetaManagedAgentsPreconditionParam{ContentSha256: anthropic.String(m.ContentSha256)}})
	if err != nil || m2.ContentSha256 != store.ContentSHA256("use spaces") || m2.MemoryVersionID == m.MemoryVersionID {
		t.Fatalf("Memories.Update = %+v, %v", m2, err)
	}
	_, err = a.Beta.MemoryStores.Memories.Delete(ctx, m.ID, anthropic.BetaMemoryStoreMemoryDeleteParams{MemoryStoreID: st.ID, ExpectedContentSha256: anthropic.String(m.ContentSha256)})
	apiError(t, err, 409)

	// Versions: newest first, each naming its author (this API key).
	vs, err := a.Beta.MemoryStores.MemoryVersions.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryVersionListParams{MemoryID: anthropic.String(m.ID)})
	if err != nil || len(vs.Data) != 2 || vs.Data[0].Operation != "modified" || vs.Data[1].Operation != "created" ||
		vs.Data[0].CreatedBy.Type != "api_actor" || vs.Data[0].CreatedBy.APIKeyID == "" || vs.Data[0].JSON.Content.Raw() != "null" {
		t.Fatalf("versions = %+v, %v", vs, err)
	}
	decodedCleanly(t, "MemoryVersions.List", vs)
	first, err := a.Beta.MemoryStores.MemoryVersions.Get(ctx, m.MemoryVersionID, anthropic.BetaMemoryStoreMemoryVersionGetParams{MemoryStoreID: st.ID})
	if err != nil || first.Content != "use tabs" || first.Path != "/projects/foo/notes.md" {
		t.Fatalf("first version = %+v, %v", first, err)
	}
	// Redaction: the current version refuses; an older one loses its
	// content and path and keeps its record.
	_, err = a.Beta.MemoryStores.MemoryVersions.Redact(ctx, m2.MemoryVersionID, anthropic.BetaMemoryStoreMemoryVersionRedactParams{MemoryStoreID: st.ID})
	apiError(t, err, 409)
	red, err := a.Beta.MemoryStores.MemoryVersions.Redact(ctx, m.MemoryVersionID, anthropic.BetaMemoryStoreMemoryVersionRedactParams{MemoryStoreID: st.ID})
	if err != nil || red.JSON.Content.Raw() != "null" || red.JSON.Path.Raw() != "null" || red.JSON.ContentSha256.Raw() != "null" ||
		red.RedactedAt.IsZero() || red.RedactedBy.Type != "api_actor" || red.Operation != "created" {
		t.Fatalf("redacted = %s, %v", red.RawJSON(), err)
	}
	decodedCleanly(t, "MemoryVersions.Redact", red)

	// A delete with the current sha256 applies and leaves a deleted
	// version.
	if _, err := a.Beta.MemoryStores.Memories.Delete(ctx, m.ID, anthropic.BetaMemoryStoreMemoryDeleteParams{MemoryStoreID: st.ID, ExpectedContentSha256: anthropic.String(m2.ContentSha256)}); err != nil {
		t.Fatal(err)
	}
	_, err = a.Beta.MemoryStores.Memories.Get(ctx, m.ID, anthropic.BetaMemoryStoreMemoryGetParams{MemoryStoreID: st.ID})
	apiError(t, err, 404)
	if d, err := a.Beta.MemoryStores.MemoryVersions.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryVersionListParams{Operation: "deleted"}); err != nil || len(d.Data) != 1 || d.Data[0].MemoryID != m.ID {
		t.Fatalf("deleted versions = %+v, %v", d, err)
	}

	// Tenant B sees none of it.
	if l, err := b.Beta.MemoryStores.List(ctx, anthropic.BetaMemoryStoreListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("B lists %+v, %v", l, err)
	}
	_, err = b.Beta.MemoryStores.Memories.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryListParams{})
	apiError(t, err, 404)

	// read_write is refused with a 400 that says why (writes are not
	// committed back yet); so is a store of another tenant's.
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "m", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"}})
	if err != nil {
		t.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	for access, want := range map[anthropic.BetaManagedAgentsMemoryStoreResourceParamAccess]string{"read_write": "read_write", "": "read_write", "sideways": "access"} {
		_, err = a.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID,
			Resources: []anthropic.BetaSessionNewParamsResourceUnion{{OfMemoryStore: &anthropic.BetaManagedAgentsMemoryStoreResourceParam{MemoryStoreID: st.ID, Access: access}}}})
		if e := apiError(t, err, 400); !strings.Contains(e.Error(), want) {
			t.Fatalf("access %q: %v", access, e)
		}
	}
	bEnv, err := b.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	bAg, err := b.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "b", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(bAg.ID)}, EnvironmentID: bEnv.ID,
		Resources: []anthropic.BetaSessionNewParamsResourceUnion{{OfMemoryStore: &anthropic.BetaManagedAgentsMemoryStoreResourceParam{MemoryStoreID: st.ID, Access: "read_only"}}}})
	if e := apiError(t, err, 400); !strings.Contains(e.Error(), "no memory store") {
		t.Fatalf("B mounts A's store: %v", e)
	}

	// Archived: readable, not writable (409); deleted: gone.
	if ar, err := a.Beta.MemoryStores.Archive(ctx, st.ID, anthropic.BetaMemoryStoreArchiveParams{}); err != nil || ar.ArchivedAt.IsZero() {
		t.Fatalf("Archive = %+v, %v", ar, err)
	}
	_, err = a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/late.md", Content: anthropic.String("x")})
	apiError(t, err, 409)
	if l, err := a.Beta.MemoryStores.List(ctx, anthropic.BetaMemoryStoreListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("the default listing shows an archived store: %+v, %v", l, err)
	}
	if l, err := a.Beta.MemoryStores.List(ctx, anthropic.BetaMemoryStoreListParams{IncludeArchived: anthropic.Bool(true)}); err != nil || len(l.Data) != 1 {
		t.Fatalf("include_archived: %+v, %v", l, err)
	}
	if d, err := a.Beta.MemoryStores.Delete(ctx, st.ID, anthropic.BetaMemoryStoreDeleteParams{}); err != nil || d.ID != st.ID || d.Type != "memory_store_deleted" {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	_, err = a.Beta.MemoryStores.Get(ctx, st.ID, anthropic.BetaMemoryStoreGetParams{})
	apiError(t, err, 404)
}

// A read_only memory store in a gVisor sandbox, through the official SDK:
// its memories are files at /mnt/memory/<name>/, the agent reads them
// with `!tool bash`, cannot write, add or remove one, and a memory changed
// through the API shows at the next tool call. The resource is listed
// with its name and mount path, and cannot be added or removed after.
func TestReadOnlyMemoryMountThroughTheSDK(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-memory-mount", SandboxRuntime: admission.RuntimeGVisor})
	startGVisorHost(t, srv, "gvisor-memory")
	a := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, tenant.Default)),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	st, err := a.Beta.MemoryStores.New(ctx, anthropic.BetaMemoryStoreNewParams{Name: "team notes", Description: anthropic.String("conventions")})
	if err != nil {
		t.Fatal(err)
	}
	m, err := a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/style/code.md", Content: anthropic.String("use tabs\n")})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "memory", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := a.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID,
		Resources: []anthropic.BetaSessionNewParamsResourceUnion{{OfMemoryStore: &anthropic.BetaManagedAgentsMemoryStoreResourceParam{
			MemoryStoreID: st.ID, Access: "read_only", Instructions: anthropic.String("follow these")}}},
	})
	if err != nil {
		t.Fatalf("Sessions.New: %v", err)
	}
	rs, err := a.Beta.Sessions.Resources.List(ctx, sess.ID, anthropic.BetaSessionResourceListParams{})
	if err != nil || len(rs.Data) != 1 {
		t.Fatalf("resources = %+v, %v", rs, err)
	}
	r := rs.Data[0]
	if r.Type != "memory_store" || r.MemoryStoreID != st.ID || r.Access != "read_only" || r.MountPath != "/mnt/memory/team_notes" || r.Name != "team notes" || r.Instructions != "follow these" {
		t.Fatalf("resource = %s", r.RawJSON())
	}
	decodedCleanly(t, "Resources.List", rs)
	_, err = a.Beta.Sessions.Resources.Delete(ctx, r.ID, anthropic.BetaSessionResourceDeleteParams{SessionID: sess.ID})
	apiError(t, err, 400)

	s := a.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	out := bashTurn(t, ctx, a, sess.ID, s, "cat /mnt/memory/team_notes/style/code.md")
	if !strings.Contains(out, "use tabs") {
		t.Fatalf("reading the memory: %q", out)
	}
	out = bashTurn(t, ctx, a, sess.ID, s, "echo x > /mnt/memory/team_notes/style/code.md || echo WRITE-REFUSED; touch /mnt/memory/team_notes/new.md || echo ADD-REFUSED; rm -f /mnt/memory/team_notes/style/code.md || echo RM-REFUSED; cat /mnt/memory/team_notes/style/code.md")
	for _, want := range []string{"WRITE-REFUSED", "ADD-REFUSED", "RM-REFUSED", "use tabs"} {
		if !strings.Contains(out, want) {
			t.Errorf("writing the read-only mount: %q lacks %s", out, want)
		}
	}
	if _, err := a.Beta.MemoryStores.Memories.Update(ctx, m.ID, anthropic.BetaMemoryStoreMemoryUpdateParams{MemoryStoreID: st.ID, Content: anthropic.String("use spaces\n")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/later.md", Content: anthropic.String("added later\n")}); err != nil {
		t.Fatal(err)
	}
	out = bashTurn(t, ctx, a, sess.ID, s, "cat /mnt/memory/team_notes/style/code.md /mnt/memory/team_notes/later.md")
	if !strings.Contains(out, "use spaces") || !strings.Contains(out, "added later") || strings.Contains(out, "use tabs") {
		t.Fatalf("after the API's changes: %q", out)
	}
	vs, err := a.Beta.MemoryStores.MemoryVersions.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryVersionListParams{SessionID: anthropic.String(sess.ID)})
	if err != nil || len(vs.Data) != 0 {
		t.Fatalf("a read-only session wrote versions: %+v, %v", vs, err)
	}
}
