package archtest

import (
	"fmt"
	"slices"
	"strings"
)

// A rule forbids the packages under from to depend on any package under
// banned: through any chain of imports in their build graph (tests left
// out), or, when direct is set, by importing it themselves in any file,
// tests included. Patterns name a tree (the package and everything below it),
// relative to the module unless their first element has a dot; "" is the
// whole module.
//
// except exempts packages under from, each with the reason beside it. A rule
// that applies to no package, a ban that names no package in the graph and an
// exemption that exempts nothing are errors too: after a rename they would
// make the rule pass by checking nothing.
//
// A rule with only is an allowlist instead: the packages under from may
// depend on the standard library and the trees only names, on nothing
// else.
type rule struct {
	from   string
	banned []string
	only   []string
	direct bool
	why    string
	except map[string]string
}

// What a pure package (a function over ports or a read-only view) must never
// reach, however indirectly. A new pure package is one more line in rules
// using it.
var impure = []string{
	"github.com/jackc/pgx", "github.com/hashicorp/raft", "google.golang.org/grpc",
	"controlplane/store", "controlplane/raftfsm",
}

// The rules, transitive unless marked direct. Transitive rules see the build
// graph without tests: test files may wire both sides (controlplane/hosts'
// tests start host agents).
var rules = []rule{
	{from: "hostagent", banned: []string{"controlplane"},
		why: "the host agent talks to the control plane only over hostagent.v1"},
	{from: "controlplane", banned: []string{"hostagent"},
		why: "the control plane talks to hosts only over hostagent.v1"},
	{from: "controlplane/scheduler", banned: impure,
		why: "the scheduler is a pure function over a read-only view"},
	{from: "controlplane/agentloop", banned: impure,
		why: "the agent loop is a step function over ports"},
	{from: "controlplane/fleet/admission", banned: impure,
		why: "the fleet's admission rules are pure; the fleet applies them"},
	{from: "controlplane/tools", banned: impure,
		why: "the built-in tools run over a Sandbox port; the fleet is the host protocol's only client"},
	{from: "controlplane/api/console", banned: append([]string{"controlplane/auth", "controlplane/api/publicapi"}, impure...),
		why: "the console is static files (its page calls the APIs as any client does, with the user's credential) and the OAuth client of its sign-in, which reaches authentication only through its SignIn port (package api adapts auth)"},
	{from: "internal", banned: []string{"controlplane", "hostagent"},
		why: "shared internals sit below both daemons"},
	{from: "internal/errdefs", banned: []string{"google.golang.org/grpc"},
		why: "errdefs is transport-free; the gRPC mapping is an adapter",
		except: map[string]string{
			"internal/errdefs/errgrpc": "the gRPC adapter itself",
		}},
	{from: "", banned: []string{"proto/gen/corral/admin"}, direct: true,
		why: "the generated admin types are the admin API's wire contract, not a model for the rest of the tree",
		except: map[string]string{
			"controlplane/api":          "the transport that serves the admin API",
			"controlplane/server":       "registers the admin services and the gateway on a node",
			"cmd/corral":                "the CLI is an admin API client",
			"deploy/terraform/provider": "the Terraform provider is an admin API client",
			"test":                      "end-to-end tests drive the admin API",
		}},
	{from: "hostagent/spawn", only: []string{"golang.org/x/sys/unix", "hostagent/spawn"},
		why: "the spawner is mounted into every pausable sandbox: a small static binary, the standard library and x/sys/unix only"},
	{from: "cmd/corral-spawn", only: []string{"golang.org/x/sys/unix", "hostagent/spawn"},
		why: "the spawner is mounted into every pausable sandbox: a small static binary, the standard library and x/sys/unix only"},
	{from: "", banned: []string{"controlplane/store/internal/db"}, direct: true,
		why: "the sqlc package is the store's implementation; everyone else goes through store's tenant-scoped repositories",
		except: map[string]string{
			"controlplane/store": "the store owns its sqlc package",
		}},
}

// pkg is what the rules need of one package in `go list -deps -json`.
type pkg struct {
	ImportPath                string
	Doc                       string
	Standard                  bool     // in the standard library
	Imports                   []string // direct, without tests
	TestImports, XTestImports []string
	Deps                      []string // transitive, without tests
	DepOnly                   bool     // not in the module; listed only as a dependency
}

// under reports whether the package path lies in the tree pattern names.
func under(path, pattern string) bool {
	full := module
	if first, _, _ := strings.Cut(pattern, "/"); strings.Contains(first, ".") {
		full = pattern
	} else if pattern != "" {
		full = module + "/" + pattern
	}
	return path == full || strings.HasPrefix(path, full+"/")
}

// check returns one message per package that breaks a rule, plus one per
// rule, ban or exemption that checks nothing. graph holds every package in
// the build graph; the rules apply to those in the module.
func check(graph []pkg, rules []rule) []string {
	byPath := make(map[string]pkg, len(graph))
	for _, p := range graph {
		byPath[p.ImportPath] = p
	}
	var msgs []string
	for _, r := range rules {
		applied := false
		exempted := map[string]bool{}
		for _, p := range graph {
			if p.DepOnly || !under(p.ImportPath, r.from) {
				continue
			}
			applied = true
			deps := p.Deps
			if r.direct {
				deps = slices.Concat(p.Imports, p.TestImports, p.XTestImports)
			}
			bad := slices.DeleteFunc(slices.Clone(deps), func(d string) bool {
				return d == p.ImportPath || !r.bans(byPath, d) // an external test imports its package
			})
			slices.Sort(bad)
			bad = slices.Compact(bad)
			if len(bad) == 0 {
				continue
			}
			if e, ok := exemption(p.ImportPath, r.except); ok {
				exempted[e] = true
				continue
			}
			target, via := bad[0], []string(nil)
			if path := chain(byPath, p.ImportPath, func(d string) bool { return r.bans(byPath, d) }); !r.direct && path != nil {
				target, via = path[len(path)-1], path[1:len(path)-1]
			}
			msg := fmt.Sprintf("%s imports %s", p.ImportPath, target)
			if len(via) > 0 {
				msg = fmt.Sprintf("%s reaches %s through %s", p.ImportPath, target, strings.Join(via, " → "))
			}
			if len(bad) > 1 {
				msg += fmt.Sprintf(" (and %d more banned packages)", len(bad)-1)
			}
			msgs = append(msgs, msg+": "+r.why)
		}
		if !applied {
			msgs = append(msgs, fmt.Sprintf("rule for %q applies to no package in the module: renamed, or not written yet?", r.from))
		}
		for _, b := range append(slices.Clone(r.banned), r.only...) {
			if !slices.ContainsFunc(graph, func(p pkg) bool { return under(p.ImportPath, b) }) {
				msgs = append(msgs, fmt.Sprintf("rule for %q bans %q, which names no package in the build graph: a typo, or renamed?", r.from, b))
			}
		}
		for e := range r.except {
			if !exempted[e] {
				msgs = append(msgs, fmt.Sprintf("rule for %q exempts %q, which breaks no rule: drop the exemption", r.from, e))
			}
		}
	}
	slices.Sort(msgs)
	return msgs
}

// bans reports whether the rule forbids a dependency on the package path.
func (r rule) bans(byPath map[string]pkg, path string) bool {
	if r.only != nil {
		return !byPath[path].Standard && !underAny(path, r.only)
	}
	return underAny(path, r.banned)
}

func underAny(path string, patterns []string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return under(path, p) })
}

// exemption returns the pattern in except that covers path, if any.
func exemption(path string, except map[string]string) (string, bool) {
	for e := range except {
		if under(path, e) {
			return e, true
		}
	}
	return "", false
}

// chain returns a shortest import path from the package from to a banned
// package, both ends included, for the message that explains a transitive
// violation; nil if the graph holds none.
func chain(byPath map[string]pkg, from string, banned func(string) bool) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != from && banned(cur) {
			var path []string
			for p := cur; p != ""; p = prev[p] {
				path = append(path, p)
			}
			slices.Reverse(path)
			return path
		}
		for _, imp := range byPath[cur].Imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return nil
}
