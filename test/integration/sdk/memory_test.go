package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	"corral.dev/corral/internal/waitfor"
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

	// An access the API lacks is refused with a 400 that says why; so is
	// a store of another tenant's.
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "m", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"}})
	if err != nil {
		t.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	for access, want := range map[anthropic.BetaManagedAgentsMemoryStoreResourceParamAccess]string{"sideways": "access"} {
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

// Two sessions share a read_write memory store in gVisor sandboxes,
// through the official SDK: what the agent writes, adds and removes with
// `!tool bash` becomes the store's memories after the tool step, as
// versions written by that session (a session_actor); a write made
// against content another session changed since is detected, not lost:
// the other session's content stays at the path, this session's is kept
// beside it, the tool result says so, and the next call shows both. The
// default access is read_write, and a read_only store beside it stays
// unchangeable.
func TestReadWriteMemoryThroughTheSDK(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-memory-rw", SandboxRuntime: admission.RuntimeGVisor})
	stateDir := startGVisorHost(t, srv, "gvisor-memory-rw")
	a := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, tenant.Default)),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	st, err := a.Beta.MemoryStores.New(ctx, anthropic.BetaMemoryStoreNewParams{Name: "notes"})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/plan.md", Content: anthropic.String("step 1\n")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/old.md", Content: anthropic.String("stale\n")}); err != nil {
		t.Fatal(err)
	}
	ro, err := a.Beta.MemoryStores.New(ctx, anthropic.BetaMemoryStoreNewParams{Name: "rules"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Beta.MemoryStores.Memories.New(ctx, ro.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/r.md", Content: anthropic.String("be kind\n")}); err != nil {
		t.Fatal(err)
	}
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "memory", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "memory-rw"})
	if err != nil {
		t.Fatal(err)
	}
	newSession := func() (string, stream) {
		sess, err := a.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
			Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID,
			Resources: []anthropic.BetaSessionNewParamsResourceUnion{
				{OfMemoryStore: &anthropic.BetaManagedAgentsMemoryStoreResourceParam{MemoryStoreID: st.ID}}, // the default: read_write
				{OfMemoryStore: &anthropic.BetaManagedAgentsMemoryStoreResourceParam{MemoryStoreID: ro.ID, Access: "read_only"}},
			},
		})
		if err != nil {
			t.Fatalf("Sessions.New: %v", err)
		}
		s := a.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
		t.Cleanup(func() { s.Close() })
		return sess.ID, s
	}
	s1, st1 := newSession()
	s2, st2 := newSession()
	rs, err := a.Beta.Sessions.Resources.List(ctx, s1, anthropic.BetaSessionResourceListParams{})
	if err != nil || len(rs.Data) != 2 || rs.Data[0].Access != "read_write" || rs.Data[0].MountPath != "/mnt/memory/notes" {
		t.Fatalf("resources = %+v, %v", rs, err)
	}

	// Both sessions read the store (session 2's base of plan.md is
	// "step 1"); session 1 edits plan.md, adds a memory in a new
	// directory and removes old.md, and cannot change the read-only store.
	if out := bashTurn(t, ctx, a, s2, st2, "cat /mnt/memory/notes/plan.md"); !strings.Contains(out, "step 1") {
		t.Fatalf("session 2 reads %q", out)
	}
	out := bashTurn(t, ctx, a, s1, st1, "cat /mnt/memory/notes/plan.md && echo 'step 2' >> /mnt/memory/notes/plan.md && mkdir -p /mnt/memory/notes/ideas && echo 'try gVisor' > /mnt/memory/notes/ideas/one.md && rm /mnt/memory/notes/old.md && (echo x > /mnt/memory/rules/r.md || echo RO-REFUSED) && echo DONE")
	if !strings.Contains(out, "DONE") || !strings.Contains(out, "RO-REFUSED") || strings.Contains(out, "Memory:") {
		t.Fatalf("session 1's writes: %q", out)
	}
	memory := func(path string) (string, bool) {
		t.Helper()
		l, err := a.Beta.MemoryStores.Memories.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryListParams{})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range l.Data {
			if it.Type == "memory" && it.Path == path {
				m, err := a.Beta.MemoryStores.Memories.Get(ctx, it.ID, anthropic.BetaMemoryStoreMemoryGetParams{MemoryStoreID: st.ID, View: "full"})
				if err != nil {
					t.Fatal(err)
				}
				return m.Content, true
			}
		}
		return "", false
	}
	if c, ok := memory("/plan.md"); c != "step 1\nstep 2\n" {
		t.Fatalf("/plan.md after session 1 = %q, %v", c, ok)
	}
	if c, ok := memory("/ideas/one.md"); c != "try gVisor\n" {
		t.Fatalf("/ideas/one.md = %q, %v", c, ok)
	}
	if _, ok := memory("/old.md"); ok {
		t.Fatal("/old.md is still in the store after session 1 removed it")
	}
	vs, err := a.Beta.MemoryStores.MemoryVersions.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryVersionListParams{SessionID: anthropic.String(s1)})
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	for _, v := range vs.Data {
		if v.CreatedBy.Type != "session_actor" || v.CreatedBy.SessionID != s1 {
			t.Errorf("version %s created by %s", v.ID, v.CreatedBy.RawJSON())
		}
		ops[string(v.Operation)]++
	}
	if ops["modified"] != 1 || ops["created"] != 1 || ops["deleted"] != 1 {
		t.Fatalf("session 1's versions: %v", ops)
	}

	// Session 2 rewrites plan.md from what its call was shown (session
	// 1's content), and while its step runs the API changes plan.md too:
	// a conflict. The step waits, in the sandbox, for a file the test
	// puts in its store's directory on the host once it has seen the
	// session's write there and changed the memory.
	in, err := json.Marshal(map[string]string{"command": "echo 'step 1 and a half' > /mnt/memory/notes/plan.md && " +
		"for i in $(seq 1200); do [ -e /mnt/memory/notes/.go ] && break; sleep 0.1; done && rm /mnt/memory/notes/.go && echo DONE"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Beta.Sessions.Events.Send(ctx, s2, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{
		say("!tool bash " + strings.ReplaceAll(string(in), ";", `\u003b`) + "\n!echo"),
	}}); err != nil {
		t.Fatal(err)
	}
	var s2Notes string // session 2's store directory on the host
	waitfor.Cond(t, 2*time.Minute, "session 2's write on its host", func() bool {
		ms, _ := filepath.Glob(filepath.Join(stateDir, "*", "disk", "memory", "notes", "plan.md"))
		for _, m := range ms {
			if b, err := os.ReadFile(m); err == nil && string(b) == "step 1 and a half\n" {
				s2Notes = filepath.Dir(m)
				return true
			}
		}
		return false
	})
	if _, err := a.Beta.MemoryStores.Memories.Update(ctx, plan.ID, anthropic.BetaMemoryStoreMemoryUpdateParams{MemoryStoreID: st.ID, Content: anthropic.String("the API's plan\n")}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s2Notes, ".go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out = ""
	for _, e := range untilIdle(t, st2) {
		if e.Type == "agent.tool_result" {
			for _, c := range e.AsAgentToolResult().Content {
				out += c.Text
			}
		}
	}
	t.Logf("the conflicting step's tool result: %q", out)
	if !strings.Contains(out, "DONE") || !strings.Contains(out, "Memory:") || !strings.Contains(out, "/mnt/memory/notes/plan.md") || !strings.Contains(out, "another writer changed") {
		t.Fatalf("session 2's conflicting write: %q", out)
	}
	if c, _ := memory("/plan.md"); c != "the API's plan\n" {
		t.Fatalf("/plan.md after the conflict = %q: the API's write was lost", c)
	}
	kept := "/plan.md.conflict-" + s2
	if c, ok := memory(kept); c != "step 1 and a half\n" {
		t.Fatalf("%s = %q, %v: session 2's write was lost", kept, c, ok)
	}
	// The next call shows session 2 the store as it is: both contents,
	// and session 1's new memory.
	out = bashTurn(t, ctx, a, s2, st2, "cat /mnt/memory/notes/plan.md /mnt/memory/notes/plan.md.conflict-"+s2+" /mnt/memory/notes/ideas/one.md")
	for _, want := range []string{"the API's plan", "step 1 and a half", "try gVisor"} {
		if !strings.Contains(out, want) {
			t.Errorf("session 2 after the conflict reads %q, without %q", out, want)
		}
	}
	if strings.Contains(out, "Memory:") {
		t.Errorf("a read-only call reported memory changes: %q", out)
	}
	vs, err = a.Beta.MemoryStores.MemoryVersions.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryVersionListParams{SessionID: anthropic.String(s2)})
	if err != nil || len(vs.Data) != 1 || vs.Data[0].Operation != "created" || vs.Data[0].Path != kept {
		t.Fatalf("session 2's versions = %+v, %v", vs, err)
	}
	// An edit through the API shows in session 1's next call, and its
	// unchanged memories are not written again.
	if _, err := a.Beta.MemoryStores.Memories.Update(ctx, plan.ID, anthropic.BetaMemoryStoreMemoryUpdateParams{MemoryStoreID: st.ID, Content: anthropic.String("replanned\n")}); err != nil {
		t.Fatal(err)
	}
	if out := bashTurn(t, ctx, a, s1, st1, "cat /mnt/memory/notes/plan.md"); !strings.Contains(out, "replanned") {
		t.Fatalf("session 1 after the API's edit reads %q", out)
	}
	if vs, err := a.Beta.MemoryStores.MemoryVersions.List(ctx, st.ID, anthropic.BetaMemoryStoreMemoryVersionListParams{SessionID: anthropic.String(s1)}); err != nil || len(vs.Data) != 3 {
		t.Fatalf("session 1's versions after a read-only call: %+v, %v", vs, err)
	}

	// The file tools reach the mounts too: write and edit a memory, read
	// the read-only store, glob the store; writing the read-only store or
	// the uploads is refused.
	if out := toolTurn(t, ctx, a, s1, st1, "write", map[string]string{"file_path": "/mnt/memory/notes/by-tool.md", "content": "written by a tool\n"}); strings.Contains(out, "Memory:") || !strings.Contains(out, "Wrote") {
		t.Fatalf("write to the read_write store: %q", out)
	}
	if out := toolTurn(t, ctx, a, s1, st1, "edit", map[string]string{"file_path": "/mnt/memory/notes/by-tool.md", "old_string": "a tool", "new_string": "the edit tool"}); !strings.Contains(out, "Replaced 1") {
		t.Fatalf("edit in the read_write store: %q", out)
	}
	if c, _ := memory("/by-tool.md"); c != "written by the edit tool\n" {
		t.Fatalf("/by-tool.md = %q", c)
	}
	if out := toolTurn(t, ctx, a, s1, st1, "read", map[string]string{"file_path": "/mnt/memory/rules/r.md"}); !strings.Contains(out, "be kind") {
		t.Fatalf("read from the read_only store: %q", out)
	}
	if out := toolTurn(t, ctx, a, s1, st1, "glob", map[string]string{"pattern": "/mnt/memory/notes/**/*.md"}); !strings.Contains(out, "/mnt/memory/notes/ideas/one.md") || !strings.Contains(out, "/mnt/memory/notes/by-tool.md") {
		t.Fatalf("glob over the store: %q", out)
	}
	for _, p := range []string{"/mnt/memory/rules/r.md", "/mnt/memory/new-store/x.md", "/mnt/session/uploads/x.md"} {
		if out := toolTurn(t, ctx, a, s1, st1, "write", map[string]string{"file_path": p, "content": "x"}); !strings.Contains(out, "read-only") {
			t.Errorf("write to %s: %q", p, out)
		}
	}
	l, err := a.Beta.MemoryStores.Memories.List(ctx, ro.ID, anthropic.BetaMemoryStoreMemoryListParams{})
	if err != nil || len(l.Data) != 1 {
		t.Fatalf("the read-only store: %+v, %v", l, err)
	}
	if m, err := a.Beta.MemoryStores.Memories.Get(ctx, l.Data[0].ID, anthropic.BetaMemoryStoreMemoryGetParams{MemoryStoreID: ro.ID, View: "full"}); err != nil || m.Content != "be kind\n" {
		t.Fatalf("the read-only store's memory = %+v, %v", m, err)
	}
}

// toolTurn has the fake model call tool with input once and returns the
// tool result's text.
func toolTurn(t testing.TB, ctx context.Context, client anthropic.Client, sessionID string, s stream, tool string, input map[string]string) string {
	t.Helper()
	in, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Beta.Sessions.Events.Send(ctx, sessionID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{
		say("!tool " + tool + " " + strings.ReplaceAll(string(in), ";", `\u003b`) + "\n!echo"),
	}}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	var out strings.Builder
	for _, e := range untilIdle(t, s) {
		if e.Type == "agent.tool_result" {
			for _, c := range e.AsAgentToolResult().Content {
				out.WriteString(c.Text)
			}
		}
	}
	return out.String()
}

// BenchmarkToolTurnWithMemory: warm `!tool bash true` turns through the
// official SDK in gVisor, alternating between a session with a
// read_write memory store of 200 memories of 1 KiB (each turn syncs the
// store before the call and reads its directory back after) and one
// without, in the same run: the store's cost per tool call is the ratio.
func BenchmarkToolTurnWithMemory(b *testing.B) {
	containerdtest.Address(b)
	srv := servertest.Start(b, pgtest.New(b), server.Config{NodeID: "bench-memory", SandboxRuntime: admission.RuntimeGVisor})
	startGVisorHost(b, srv, "gvisor-bench-memory")
	a := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(b, srv, tenant.Default)),
		option.WithRequestTimeout(2*time.Minute))
	ctx := context.Background()
	st, err := a.Beta.MemoryStores.New(ctx, anthropic.BetaMemoryStoreNewParams{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	body := strings.Repeat("x", 1023) + "\n"
	for i := range 200 {
		if _, err := a.Beta.MemoryStores.Memories.New(ctx, st.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: fmt.Sprintf("/d%d/m%d.md", i%10, i), Content: anthropic.String(body)}); err != nil {
			b.Fatal(err)
		}
	}
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "bench", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	session := func(rs []anthropic.BetaSessionNewParamsResourceUnion) (string, stream) {
		sess, err := a.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
			Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID, Resources: rs})
		if err != nil {
			b.Fatal(err)
		}
		s := a.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
		b.Cleanup(func() { s.Close() })
		return sess.ID, s
	}
	withID, withS := session([]anthropic.BetaSessionNewParamsResourceUnion{{OfMemoryStore: &anthropic.BetaManagedAgentsMemoryStoreResourceParam{MemoryStoreID: st.ID}}})
	plainID, plainS := session(nil)
	turn := func(id string, s stream) time.Duration {
		t0 := time.Now()
		if out := toolTurn(b, ctx, a, id, s, "bash", map[string]string{"command": "true"}); out != "(no output)" {
			b.Fatalf("bash true: %q", out)
		}
		return time.Since(t0)
	}
	turn(withID, withS) // warm: place both sandboxes, stage the store
	turn(plainID, plainS)
	var with, plain []time.Duration
	b.ResetTimer()
	for range max(b.N, 20) {
		with = append(with, turn(withID, withS))
		plain = append(plain, turn(plainID, plainS))
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	w, p := median(with), median(plain)
	b.ReportMetric(float64(w.Microseconds())/1000, "with-store-p50-ms")
	b.ReportMetric(float64(p.Microseconds())/1000, "without-p50-ms")
	b.ReportMetric(float64(w)/float64(p), "with/without-ratio")
}
