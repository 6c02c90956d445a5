package sdk

import (
	"context"
	"errors"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/respjson"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/test/processhost"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// setup starts a node on a fresh database and returns an SDK client for it.
func setup(t testing.TB) anthropic.Client {
	t.Helper()
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-test"})
	startSmallHost(t, srv)
	return anthropic.NewClient(
		option.WithBaseURL("http://"+srv.HTTPAddr()),
		option.WithAPIKey(servertest.TenantKey(t, srv, tenant.Default)),
		option.WithRequestTimeout(30*time.Second),
	)
}

// startSmallHost joins a host agent that offers the node's default
// sandbox class (gvisor: a process agent claiming it) with no room for a
// sandbox: sessions of sandboxed agents are admitted, since a host offers
// their class, and a tool call that needs a sandbox ends in an error.
func startSmallHost(t testing.TB, srv *server.Server) {
	t.Helper()
	processhost.Start(t, srv, "small", func(c *agent.Config) {
		c.Runtime = "gvisor"
		c.Capacity = agent.Resources{CPUMillis: 4000, MemoryBytes: 16 << 20, DiskBytes: 8 << 30}
		c.ReconnectDelay = 0
	})
}

var fieldType = reflect.TypeFor[respjson.Field]()

// decodedCleanly walks an SDK response and fails the test where the SDK saw
// a field of the wrong type or a field it does not know: the wire and the
// SDK's types must agree exactly.
func decodedCleanly(t testing.TB, what string, v any) {
	t.Helper()
	var walk func(path string, rv reflect.Value)
	walk = func(path string, rv reflect.Value) {
		switch rv.Kind() {
		case reflect.Pointer, reflect.Interface:
			if !rv.IsNil() {
				walk(path, rv.Elem())
			}
		case reflect.Slice, reflect.Array:
			for i := range rv.Len() {
				walk(path+"[]", rv.Index(i))
			}
		case reflect.Map:
			for _, k := range rv.MapKeys() {
				walk(path+"{}", rv.MapIndex(k))
			}
		case reflect.Struct:
			rt := rv.Type()
			for i := range rt.NumField() {
				f := rt.Field(i)
				if !f.IsExported() || strings.HasPrefix(f.Name, "Of") {
					// Union variants: the SDK decodes the same JSON into
					// every variant; the test checks the one that applies.
					continue
				}
				if f.Name == "JSON" && f.Type.Kind() == reflect.Struct {
					meta := rv.Field(i)
					// Every field the SDK marks required is on the wire.
					for k := range rt.NumField() {
						pf := rt.Field(k)
						if !strings.Contains(pf.Tag.Get("api"), "required") {
							continue
						}
						if mf := meta.FieldByName(pf.Name); mf.IsValid() && mf.Type() == fieldType && mf.Interface().(respjson.Field).Raw() == "" {
							t.Errorf("%s: %s%s lacks required field %s", what, rt.Name(), path, pf.Tag.Get("json"))
						}
					}
					for j := range f.Type.NumField() {
						mf := f.Type.Field(j)
						switch {
						case mf.Type == fieldType:
							fv := meta.Field(j).Interface().(respjson.Field)
							if raw := fv.Raw(); raw != "" && raw != "null" && !fv.Valid() {
								t.Errorf("%s: %s%s.%s did not decode: %s", what, rt.Name(), path, mf.Name, raw)
							}
						case mf.Name == "ExtraFields":
							for k := range meta.Field(j).Interface().(map[string]respjson.Field) {
								t.Errorf("%s: %s%s has a field the SDK does not know: %q", what, rt.Name(), path, k)
							}
						}
					}
					continue
				}
				// Absent or null members have nothing to check inside.
				if meta := rv.FieldByName("JSON"); meta.IsValid() && meta.Kind() == reflect.Struct {
					if mf := meta.FieldByName(f.Name); mf.IsValid() && mf.Type() == fieldType {
						if raw := mf.Interface().(respjson.Field).Raw(); raw == "" || raw == "null" {
							continue
						}
					}
				}
				walk(path+"."+f.Name, rv.Field(i))
			}
		}
	}
	walk("", reflect.ValueOf(v))
}

func apiError(t *testing.T, err error, status int) *anthropic.Error {
	t.Helper()
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %v (%T), want *anthropic.Error", err, err)
	}
	if apiErr.StatusCode != status {
		t.Fatalf("status %d, want %d: %v", apiErr.StatusCode, status, err)
	}
	if apiErr.RequestID == "" {
		t.Errorf("error without a request id: %v", err)
	}
	return apiErr
}

func TestAgentsThroughTheSDK(t *testing.T) {
	client := setup(t)
	ctx := context.Background()
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:   "sdk agent",
		Model:  anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-sonnet-4-6"},
		System: anthropic.String("You help."),
		Tools: []anthropic.BetaAgentNewParamsToolUnion{
			{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{
				DefaultConfig: anthropic.BetaManagedAgentsAgentToolsetDefaultConfigParams{
					PermissionPolicy: anthropic.BetaManagedAgentsAgentToolsetDefaultConfigParamsPermissionPolicyUnion{OfAlwaysAsk: &anthropic.BetaManagedAgentsAlwaysAskPolicyParam{}},
				},
				Configs: []anthropic.BetaManagedAgentsAgentToolConfigParamsUnion{
					{OfRead: &anthropic.BetaManagedAgentsReadToolConfigParams{PermissionPolicy: anthropic.BetaManagedAgentsReadToolConfigParamsPermissionPolicyUnion{OfAlwaysAllow: &anthropic.BetaManagedAgentsAlwaysAllowPolicyParam{}}}},
					{OfWebFetch: &anthropic.BetaManagedAgentsWebFetchToolConfigParams{Enabled: anthropic.Bool(false)}},
				},
			}},
			{OfCustom: &anthropic.BetaManagedAgentsCustomToolParams{
				Name: "get_weather", Description: "Weather for a city",
				InputSchema: anthropic.BetaManagedAgentsCustomToolInputSchemaParam{
					Properties: map[string]any{"city": map[string]any{"type": "string"}},
					Required:   []string{"city"},
				},
			}},
			{OfMCPToolset: &anthropic.BetaManagedAgentsMCPToolsetParams{MCPServerName: "docs"}},
		},
		MCPServers: []anthropic.BetaManagedAgentsURLMCPServerParams{{Name: "docs", URL: "https://mcp.example.com/mcp"}},
		Metadata:   map[string]string{"owner": "sdk"},
	})
	if err != nil {
		t.Fatalf("Agents.New: %v", err)
	}
	decodedCleanly(t, "Agents.New", agent)
	if !strings.HasPrefix(agent.ID, "agent_") || agent.Version != 1 || agent.Model.ID != "claude-sonnet-4-6" || agent.Model.Speed != "standard" {
		t.Fatalf("agent = %+v", agent)
	}
	if agent.JSON.ArchivedAt.Raw() != "null" || agent.CreatedAt.IsZero() || agent.ExecutionIdentity.Type != "service_account" {
		t.Fatalf("archived_at %q, created_at %v", agent.JSON.ArchivedAt.Raw(), agent.CreatedAt)
	}
	toolset := agent.Tools[0]
	if toolset.Type != "agent_toolset_20260401" || toolset.DefaultConfig.PermissionPolicy.Type != "always_ask" || len(toolset.Configs.OfBetaManagedAgentsAgentToolConfigArray) != 8 {
		t.Fatalf("toolset = %s", toolset.RawJSON())
	}
	for _, c := range toolset.Configs.OfBetaManagedAgentsAgentToolConfigArray {
		decodedCleanly(t, "tool config "+c.Type, c.AsAny())
		switch c := c.AsAny().(type) {
		case anthropic.BetaManagedAgentsReadToolConfig:
			if c.PermissionPolicy.Type != "always_allow" || !c.Enabled {
				t.Fatalf("read = %+v", c)
			}
		case anthropic.BetaManagedAgentsWebFetchToolConfig:
			if c.Enabled || len(c.AllowedDomains) != 0 || c.PermissionPolicy.Type != "always_ask" {
				t.Fatalf("web_fetch = %s", c.RawJSON())
			}
		case anthropic.BetaManagedAgentsBashToolConfig:
			if c.PermissionPolicy.Type != "always_ask" {
				t.Fatalf("bash = %+v", c)
			}
		case nil:
			t.Fatalf("config of unknown type")
		}
	}
	if custom := agent.Tools[1]; custom.Name != "get_weather" || custom.InputSchema.Required[0] != "city" {
		t.Fatalf("custom tool = %s", custom.RawJSON())
	}

	// A new version with optimistic concurrency, then a stale one.
	v2, err := client.Beta.Agents.Update(ctx, agent.ID, anthropic.BetaAgentUpdateParams{
		Version: anthropic.Int(1), System: anthropic.String("You help briefly."),
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-opus-4-8", Effort: anthropic.BetaManagedAgentsModelConfigParamsEffortUnion{OfBetaManagedAgentsEffortHigh: &anthropic.BetaManagedAgentsEffortHighParam{}}},
	})
	if err != nil {
		t.Fatalf("Agents.Update: %v", err)
	}
	decodedCleanly(t, "Agents.Update", v2)
	if v2.Version != 2 || v2.System != "You help briefly." || v2.Model.Effort.Type != "high" {
		t.Fatalf("v2 = %+v", v2)
	}
	// What corral does not enforce it refuses (publicapi/unsupported.go):
	// Anthropic's skills (it has none), an effort other than the default,
	// an execution identity.
	_, err = client.Beta.Agents.Update(ctx, agent.ID, anthropic.BetaAgentUpdateParams{Skills: []anthropic.BetaManagedAgentsSkillParamsUnion{{OfAnthropic: &anthropic.BetaManagedAgentsAnthropicSkillParams{SkillID: "pdf"}}}})
	if e := apiError(t, err, http.StatusBadRequest); e != nil && !strings.Contains(e.Error(), "no Anthropic skills") {
		t.Errorf("anthropic skills: %v", err)
	}
	for name, p := range map[string]anthropic.BetaAgentUpdateParams{
		"effort":   {Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-opus-4-8", Effort: anthropic.BetaManagedAgentsModelConfigParamsEffortUnion{OfBetaManagedAgentsEffortXhigh: &anthropic.BetaManagedAgentsEffortXhighParam{}}}},
		"aws_role": {ExecutionIdentity: anthropic.BetaManagedAgentsExecutionIdentityParamsUnion{OfAWSRole: &anthropic.BetaManagedAgentsAWSRoleExecutionIdentityParams{RoleARN: "arn:aws:iam::1:role/r"}}},
	} {
		_, err := client.Beta.Agents.Update(ctx, agent.ID, p)
		if e := apiError(t, err, http.StatusBadRequest); e != nil && !strings.Contains(e.Error(), "not supported by this server yet") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A web tool's options, as the SDK sends them, are kept (and sent to
	// the model's provider).
	web, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "web", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-opus-4-8"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{
			Configs: []anthropic.BetaManagedAgentsAgentToolConfigParamsUnion{{OfWebFetch: &anthropic.BetaManagedAgentsWebFetchToolConfigParams{
				AllowedDomains: []string{"docs.example.com"}, MaxContentTokens: anthropic.Int(5000)}}},
		}}},
	})
	if err != nil {
		t.Fatalf("an agent with web_fetch options: %v", err)
	}
	decodedCleanly(t, "Agents.New web", web)
	if raw := web.RawJSON(); !strings.Contains(raw, `"allowed_domains":["docs.example.com"]`) || !strings.Contains(raw, `"max_content_tokens":5000`) {
		t.Fatalf("the agent's web_fetch options: %s", raw)
	}
	// The SDK retries 409s unless told not to: x-should-retry: false makes
	// this one attempt.
	attempts := 0
	count := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		attempts++
		return next(r)
	})
	_, err = client.Beta.Agents.Update(ctx, agent.ID, anthropic.BetaAgentUpdateParams{Version: anthropic.Int(1), Name: anthropic.String("late")}, count)
	apiError(t, err, http.StatusConflict)
	if attempts != 1 {
		t.Fatalf("stale update attempted %d times, want 1", attempts)
	}

	v1, err := client.Beta.Agents.Get(ctx, agent.ID, anthropic.BetaAgentGetParams{Version: anthropic.Int(1)})
	if err != nil || v1.Version != 1 || v1.System != "You help." {
		t.Fatalf("Agents.Get version 1: %+v, %v", v1, err)
	}
	decodedCleanly(t, "Agents.Get", v1)

	versions := client.Beta.Agents.Versions.ListAutoPaging(ctx, agent.ID, anthropic.BetaAgentVersionListParams{Limit: anthropic.Int(1)})
	var seen []int64
	for versions.Next() {
		decodedCleanly(t, "Versions.List", versions.Current())
		seen = append(seen, versions.Current().Version)
	}
	if err := versions.Err(); err != nil || len(seen) != 2 || seen[0] != 2 || seen[1] != 1 {
		t.Fatalf("versions %v, %v", seen, err)
	}

	for range 3 {
		if _, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "more", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-haiku-4-5"}}); err != nil {
			t.Fatal(err)
		}
	}
	all := client.Beta.Agents.ListAutoPaging(ctx, anthropic.BetaAgentListParams{Limit: anthropic.Int(2), CreatedAtGte: anthropic.Time(time.Now().Add(-time.Hour))})
	n := 0
	for all.Next() {
		decodedCleanly(t, "Agents.List", all.Current())
		n++
	}
	if err := all.Err(); err != nil || n != 5 { // the first, "web" and three more
		t.Fatalf("listed %d agents, %v", n, err)
	}

	archived, err := client.Beta.Agents.Archive(ctx, agent.ID, anthropic.BetaAgentArchiveParams{})
	if err != nil || archived.ArchivedAt.IsZero() {
		t.Fatalf("Archive: %+v, %v", archived, err)
	}
	_, err = client.Beta.Agents.Get(ctx, "agent_nope", anthropic.BetaAgentGetParams{})
	apiError(t, err, http.StatusNotFound)
	_, err = client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "m"}})
	if e := apiError(t, err, http.StatusBadRequest); !strings.Contains(e.Error(), "name") {
		t.Fatalf("bad request error %v does not name the field", e)
	}
}

func TestEnvironmentsAndSessionsThroughTheSDK(t *testing.T) {
	client := setup(t)
	ctx := context.Background()
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "plain"})
	if err != nil {
		t.Fatalf("Environments.New: %v", err)
	}
	decodedCleanly(t, "Environments.New", env)
	if !strings.HasPrefix(env.ID, "env_") || env.Config.Type != "cloud" || env.Config.Networking.Type != "limited" || len(env.Config.Networking.AllowedHosts) != 0 || env.Config.Networking.AllowPackageManagers || env.Config.Packages.Pip == nil {
		t.Fatalf("environment = %s", env.RawJSON())
	}
	attempts := 0
	count := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		attempts++
		return next(r)
	})
	_, err = client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "plain"}, count)
	apiError(t, err, http.StatusConflict)
	if attempts != 1 {
		t.Fatalf("duplicate environment attempted %d times, want 1", attempts)
	}

	// A sandbox reaches only its allowed hosts, through its host's egress
	// proxy: asking for more, or for packages without the operator's
	// mirrors (this server has none), is a 400 that says why, never
	// stored and ignored.
	for what, c := range map[string]struct {
		cfg *anthropic.BetaCloudConfigParams
		why string
	}{
		"unrestricted networking": {&anthropic.BetaCloudConfigParams{Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfUnrestricted: &anthropic.BetaUnrestrictedNetworkParam{}}}, "unrestricted networking is not granted to this tenant"},
		"package managers":        {&anthropic.BetaCloudConfigParams{Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfLimited: &anthropic.BetaLimitedNetworkParams{AllowedHosts: []string{"pypi.org"}, AllowPackageManagers: anthropic.Bool(true)}}}, "this corral has no package mirrors"},
		"packages":                {&anthropic.BetaCloudConfigParams{Packages: anthropic.BetaPackagesParams{Pip: []string{"requests"}}}, "no pip package mirror"},
	} {
		_, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "refused", Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: c.cfg}})
		if e := apiError(t, err, http.StatusBadRequest); !strings.Contains(e.Error(), c.why) {
			t.Fatalf("%s: the 400 does not say why (%q): %v", what, c.why, e)
		}
	}
	limited, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{
		Name: "limited", Description: anthropic.String("locked down"),
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfLimited: &anthropic.BetaLimitedNetworkParams{AllowPackageManagers: anthropic.Bool(false)}},
		}},
	})
	if err != nil {
		t.Fatalf("Environments.New limited: %v", err)
	}
	decodedCleanly(t, "Environments.New limited", limited)
	if n := limited.Config.Networking; n.Type != "limited" || n.AllowPackageManagers || n.AllowMCPServers || len(n.AllowedHosts) != 0 {
		t.Fatalf("networking = %s", limited.Config.Networking.RawJSON())
	}
	upd, err := client.Beta.Environments.Update(ctx, limited.ID, anthropic.BetaEnvironmentUpdateParams{Metadata: map[string]string{"tier": "1"}})
	if err != nil || upd.Metadata["tier"] != "1" {
		t.Fatalf("Environments.Update: %+v, %v", upd, err)
	}
	envs := client.Beta.Environments.ListAutoPaging(ctx, anthropic.BetaEnvironmentListParams{Limit: anthropic.Int(1)})
	n := 0
	for envs.Next() {
		decodedCleanly(t, "Environments.List", envs.Current())
		n++
	}
	if envs.Err() != nil || n != 2 {
		t.Fatalf("listed %d environments, %v", n, envs.Err())
	}
	if _, err := client.Beta.Environments.Archive(ctx, limited.ID, anthropic.BetaEnvironmentArchiveParams{}); err != nil {
		t.Fatal(err)
	}
	del, err := client.Beta.Environments.Delete(ctx, limited.ID, anthropic.BetaEnvironmentDeleteParams{})
	if err != nil || del.ID != limited.ID || del.Type != "environment_deleted" {
		t.Fatalf("Environments.Delete: %+v, %v", del, err)
	}

	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "worker", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-sonnet-4-6"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Beta.Agents.Update(ctx, agent.ID, anthropic.BetaAgentUpdateParams{System: anthropic.String("v2")}); err != nil {
		t.Fatal(err)
	}

	forms := map[string]anthropic.BetaSessionNewParamsAgentUnion{
		"id":        {OfString: anthropic.String(agent.ID)},
		"reference": {OfBetaManagedAgentsAgents: &anthropic.BetaManagedAgentsAgentParams{ID: agent.ID, Version: anthropic.Int(1)}},
		"overrides": {OfBetaManagedAgentsAgentWithOverridess: &anthropic.BetaManagedAgentsAgentWithOverridesParams{
			ID: agent.ID, System: anthropic.String("overridden"),
			Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-opus-4-8"},
			Tools: []anthropic.BetaManagedAgentsAgentWithOverridesParamsToolUnion{{OfCustom: &anthropic.BetaManagedAgentsCustomToolParams{
				Name: "ping", Description: "ping", InputSchema: anthropic.BetaManagedAgentsCustomToolInputSchemaParam{},
			}}},
		}},
	}
	var ids []string
	for name, form := range forms {
		s, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
			Agent: form, EnvironmentID: env.ID, Title: anthropic.String(name), Metadata: map[string]string{"form": name},
		})
		if err != nil {
			t.Fatalf("Sessions.New (%s): %v", name, err)
		}
		decodedCleanly(t, "Sessions.New "+name, s)
		if !strings.HasPrefix(s.ID, "sesn_") || s.Status != "idle" || s.Agent.ID != agent.ID || s.Title != name || s.JSON.ArchivedAt.Raw() != "null" {
			t.Fatalf("session (%s) = %s", name, s.RawJSON())
		}
		switch name {
		case "id":
			if s.Agent.Version != 2 || s.Agent.System != "v2" {
				t.Fatalf("id form resolved to %s", s.Agent.RawJSON())
			}
		case "reference":
			if s.Agent.Version != 1 || s.Agent.System != "" {
				t.Fatalf("reference form resolved to %s", s.Agent.RawJSON())
			}
		case "overrides":
			if s.Agent.System != "overridden" || s.Agent.Model.ID != "claude-opus-4-8" || len(s.Agent.Tools) != 1 || s.Agent.Tools[0].Name != "ping" {
				t.Fatalf("overrides resolved to %s", s.Agent.RawJSON())
			}
		}
		ids = append(ids, s.ID)
	}
	_, err = client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: "env_missing"})
	apiError(t, err, http.StatusNotFound)

	// Auto-paging over the bidirectional cursor.
	pager := client.Beta.Sessions.ListAutoPaging(ctx, anthropic.BetaSessionListParams{Limit: anthropic.Int(2), AgentID: anthropic.String(agent.ID), Statuses: []string{"idle"}})
	listed := 0
	for pager.Next() {
		decodedCleanly(t, "Sessions.List", pager.Current())
		listed++
	}
	if pager.Err() != nil || listed != 3 {
		t.Fatalf("listed %d sessions, %v", listed, pager.Err())
	}
	first, err := client.Beta.Sessions.List(ctx, anthropic.BetaSessionListParams{Limit: anthropic.Int(2), Order: anthropic.BetaSessionListParamsOrderAsc})
	if err != nil || len(first.Data) != 2 || first.NextPage == "" || first.JSON.PrevPage.Raw() != "null" {
		t.Fatalf("first page: %+v, %v", first, err)
	}
	second, err := first.GetNextPage()
	if err != nil || len(second.Data) != 1 || second.PrevPage == "" || second.NextPage != "" {
		t.Fatalf("second page: %+v, %v", second, err)
	}

	id := ids[0]
	updated, err := client.Beta.Sessions.Update(ctx, id, anthropic.BetaSessionUpdateParams{
		Title: anthropic.String("renamed"), Metadata: map[string]string{"extra": "1"},
		Agent: anthropic.BetaManagedAgentsSessionAgentUpdateParam{Tools: []anthropic.BetaManagedAgentsSessionAgentUpdateToolUnionParam{
			{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}},
		}},
	})
	if err != nil {
		t.Fatalf("Sessions.Update: %v", err)
	}
	decodedCleanly(t, "Sessions.Update", updated)
	if updated.Title != "renamed" || updated.Metadata["extra"] != "1" || len(updated.Metadata) != 2 || updated.Agent.Tools[0].Type != "agent_toolset_20260401" {
		t.Fatalf("updated = %s", updated.RawJSON())
	}
	evs, err := client.Beta.Sessions.Events.List(ctx, id, anthropic.BetaSessionEventListParams{})
	if err != nil || len(evs.Data) != 1 || evs.Data[0].Type != "session.updated" {
		t.Fatalf("events after the update: %+v, %v", evs, err)
	}
	decodedCleanly(t, "session.updated", evs.Data[0].AsAny())
	if u, ok := evs.Data[0].AsAny().(anthropic.BetaManagedAgentsSessionUpdatedEvent); !ok || u.Title != "renamed" || u.Metadata["extra"] != "1" || u.Agent.Tools[0].Type != "agent_toolset_20260401" {
		t.Fatalf("session.updated = %s", evs.Data[0].RawJSON())
	}
	got, err := client.Beta.Sessions.Get(ctx, id, anthropic.BetaSessionGetParams{})
	if err != nil || got.Title != "renamed" {
		t.Fatalf("Sessions.Get: %+v, %v", got, err)
	}
	archived, err := client.Beta.Sessions.Archive(ctx, id, anthropic.BetaSessionArchiveParams{})
	if err != nil || archived.ArchivedAt.IsZero() {
		t.Fatalf("Sessions.Archive: %+v, %v", archived, err)
	}
	deleted, err := client.Beta.Sessions.Delete(ctx, id, anthropic.BetaSessionDeleteParams{})
	if err != nil || deleted.ID != id || deleted.Type != "session_deleted" {
		t.Fatalf("Sessions.Delete: %+v, %v", deleted, err)
	}
	_, err = client.Beta.Sessions.Get(ctx, id, anthropic.BetaSessionGetParams{})
	apiError(t, err, http.StatusNotFound)
}

func TestSessionWithInitialEventsThroughTheSDK(t *testing.T) {
	client := setup(t)
	ctx := context.Background()
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "e"})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "a", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-haiku-4-5"}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent:         anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)},
		EnvironmentID: env.ID,
		InitialEvents: []anthropic.BetaSessionNewParamsInitialEventUnion{{OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{
			Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: "hello"}}},
		}}},
	})
	if err != nil {
		t.Fatalf("Sessions.New with initial_events: %v", err)
	}
	decodedCleanly(t, "Sessions.New with initial_events", s)
	page, err := client.Beta.Sessions.Events.List(ctx, s.ID, anthropic.BetaSessionEventListParams{Order: anthropic.BetaSessionEventListParamsOrderAsc})
	if err != nil || len(page.Data) == 0 {
		t.Fatalf("Events.List: %+v, %v", page, err)
	}
	first := page.Data[0]
	if first.Type != "user.message" || !strings.HasPrefix(first.ID, "sevt_") {
		t.Fatalf("first event = %s", first.RawJSON())
	}
	// An initial event the log refuses leaves no session behind.
	_, err = client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent:         anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)},
		EnvironmentID: env.ID,
		InitialEvents: []anthropic.BetaSessionNewParamsInitialEventUnion{{OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{
			Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: "a"}}, {OfImage: &anthropic.BetaManagedAgentsImageBlockParam{}}},
		}}},
	})
	apiError(t, err, http.StatusBadRequest)
	list, err := client.Beta.Sessions.List(ctx, anthropic.BetaSessionListParams{})
	if err != nil || len(list.Data) != 1 {
		t.Fatalf("sessions after a refused create: %d, %v", len(list.Data), err)
	}
}
