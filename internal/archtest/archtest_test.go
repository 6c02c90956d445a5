// Package archtest holds tests of the code base's shape: every package says
// what it is for, and dependencies point the way ../shared/STYLE.md draws them.
package archtest

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "corral.dev/corral"

// listGraph returns every package in the module's build graph: the module's
// own packages and, marked DepOnly, everything they depend on.
func listGraph(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Doc,Standard,Imports,TestImports,XTestImports,Deps,DepOnly", module+"/...")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v: %s", err, errb.String())
	}
	var graph []pkg
	own := 0
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if !p.DepOnly {
			own++
		}
		graph = append(graph, p)
	}
	if own < 10 {
		t.Fatalf("go list found only %d packages; is the test running inside the module?", own)
	}
	return graph
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listGraph(t) {
		if p.DepOnly || strings.Contains(p.ImportPath, "/proto/gen/") || strings.HasSuffix(p.ImportPath, "/internal/db") {
			continue // not ours, or generated
		}
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("package %s has no doc comment: say what it is for in a doc.go or above its package clause", p.ImportPath)
		}
	}
}

func TestDependencyDirection(t *testing.T) {
	graph := listGraph(t)
	// The graph must carry transitive dependencies, or every transitive rule
	// passes by checking nothing: a node reaches PostgreSQL and Raft.
	i := slices.IndexFunc(graph, func(p pkg) bool { return p.ImportPath == module+"/controlplane/server" })
	if i < 0 {
		t.Fatal("go list did not list controlplane/server")
	}
	for _, want := range []string{"github.com/jackc/pgx", "github.com/hashicorp/raft"} {
		if !slices.ContainsFunc(graph[i].Deps, func(d string) bool { return under(d, want) }) {
			t.Fatalf("go list gave controlplane/server no dependency on %s: without Deps the transitive rules check nothing", want)
		}
	}
	for _, msg := range check(graph, rules) {
		t.Error(msg)
	}
}

func TestUnder(t *testing.T) {
	tests := []struct {
		path, pattern string
		want          bool
	}{
		{module + "/controlplane/scheduler", "controlplane", true},
		{module + "/controlplane", "controlplane", true},
		{module + "/controlplanex", "controlplane", false},
		{module + "/internal/errdefs/errgrpc", "internal/errdefs", true},
		{"github.com/jackc/pgx/v5/pgxpool", "github.com/jackc/pgx", true},
		{"github.com/jackc/pgxlisten", "github.com/jackc/pgx", false},
		{module + "/github.com/jackc/pgx", "github.com/jackc/pgx", false},
		{module + "/test/integration", "test", true},
		{module + "/cmd/corral", "", true},
		{"google.golang.org/grpc", "", false},
	}
	for _, tt := range tests {
		if got := under(tt.path, tt.pattern); got != tt.want {
			t.Errorf("under(%q, %q) = %v, want %v", tt.path, tt.pattern, got, tt.want)
		}
	}
}

// TestRulesCatchViolations runs the rule engine on a small synthetic graph
// with known violations, so a matcher or engine that checks nothing fails
// here rather than passing TestDependencyDirection.
func TestRulesCatchViolations(t *testing.T) {
	m := func(path string) string { return module + "/" + path }
	graph := []pkg{
		// The scheduler reaches gRPC only through errdefs: a transitive violation.
		{ImportPath: m("controlplane/scheduler"), Imports: []string{m("internal/errdefs")},
			Deps: []string{m("internal/errdefs"), "google.golang.org/grpc/codes", "google.golang.org/grpc/status"}},
		{ImportPath: m("internal/errdefs"), Imports: []string{"google.golang.org/grpc/status"},
			Deps: []string{"google.golang.org/grpc/codes", "google.golang.org/grpc/status"}},
		{ImportPath: m("internal/errdefs/errgrpc"), Imports: []string{"google.golang.org/grpc/codes"},
			Deps: []string{"google.golang.org/grpc/codes"}},
		// tools imports the admin types in a test file: a direct violation.
		{ImportPath: m("controlplane/tools"), XTestImports: []string{m("controlplane/tools"), m("proto/gen/corral/admin/v1")}},
		{ImportPath: m("controlplane/api"), Imports: []string{m("proto/gen/corral/admin/v1")}},
		{ImportPath: m("proto/gen/corral/admin/v1")},
		{ImportPath: "google.golang.org/grpc/status", Imports: []string{"google.golang.org/grpc/codes"},
			Deps: []string{"google.golang.org/grpc/codes"}, DepOnly: true},
		{ImportPath: "google.golang.org/grpc/codes", DepOnly: true},
		// The spawner reaches gRPC through errdefs: outside its allowlist.
		{ImportPath: m("cmd/corral-spawn"), Imports: []string{"os", m("internal/errdefs")},
			Deps: []string{"os", m("internal/errdefs"), "google.golang.org/grpc/codes", "google.golang.org/grpc/status"}},
		{ImportPath: "os", Standard: true, DepOnly: true},
	}
	tests := []struct {
		name  string
		rules []rule
		want  []string
	}{{
		name:  "transitive",
		rules: []rule{{from: "controlplane/scheduler", banned: []string{"google.golang.org/grpc"}, why: "pure"}},
		want: []string{m("controlplane/scheduler") + " reaches google.golang.org/grpc/status through " + m("internal/errdefs") +
			" (and 1 more banned packages): pure"},
	}, {
		name:  "a direct rule does not see through errdefs",
		rules: []rule{{from: "controlplane/scheduler", banned: []string{"google.golang.org/grpc"}, direct: true, why: "pure"}},
	}, {
		name: "exemption",
		rules: []rule{{from: "internal/errdefs", banned: []string{"google.golang.org/grpc"}, why: "transport-free",
			except: map[string]string{"internal/errdefs/errgrpc": "the adapter"}}},
		want: []string{m("internal/errdefs") + " imports google.golang.org/grpc/status (and 1 more banned packages): transport-free"},
	}, {
		name: "only importers, tests included",
		rules: []rule{{from: "", banned: []string{"proto/gen/corral/admin"}, direct: true, why: "wire contract",
			except: map[string]string{"controlplane/api": "serves it"}}},
		want: []string{m("controlplane/tools") + " imports " + m("proto/gen/corral/admin/v1") + ": wire contract"},
	}, {
		name:  "an allowlist: the standard library and what it names",
		rules: []rule{{from: "cmd/corral-spawn", only: []string{"golang.org/x/sys/unix", "cmd/corral-spawn", "google.golang.org/grpc/codes"}, why: "small"}},
		want: []string{m("cmd/corral-spawn") + " imports " + m("internal/errdefs") + " (and 1 more banned packages): small",
			`rule for "cmd/corral-spawn" bans "golang.org/x/sys/unix", which names no package in the build graph: a typo, or renamed?`},
	}, {
		name: "rules that check nothing",
		rules: []rule{
			{from: "controlplane/fleet", banned: []string{"google.golang.org/grpc"}},
			{from: "controlplane/api", banned: []string{"github.com/jackc/pgx"}},
			{from: "controlplane", banned: []string{"hostagent"}, except: map[string]string{"controlplane/api": "stale"}},
		},
		want: []string{
			`rule for "controlplane" bans "hostagent", which names no package in the build graph: a typo, or renamed?`,
			`rule for "controlplane" exempts "controlplane/api", which breaks no rule: drop the exemption`,
			`rule for "controlplane/api" bans "github.com/jackc/pgx", which names no package in the build graph: a typo, or renamed?`,
			`rule for "controlplane/fleet" applies to no package in the module: renamed, or not written yet?`,
		},
	}}
	for _, tt := range tests {
		if got := check(graph, tt.rules); !slices.Equal(got, tt.want) {
			t.Errorf("%s: check gave\n\t%s\nwant\n\t%s", tt.name, strings.Join(got, "\n\t"), strings.Join(tt.want, "\n\t"))
		}
	}
}
