// Package archtest holds tests of the code base's shape: every package says
// what it is for, and dependencies point the way ../shared/STYLE.md draws them.
package archtest

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "corral.dev/corral"

type pkg struct {
	ImportPath string
	Doc        string
	Imports    []string
	Name       string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v: %s", err, errb.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages; is the test running inside the module?", len(pkgs))
	}
	return pkgs
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.Contains(p.ImportPath, "/proto/gen/") || strings.HasSuffix(p.ImportPath, "/internal/db") {
			continue // generated
		}
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("package %s has no doc comment: say what it is for in a doc.go or above its package clause", p.ImportPath)
		}
	}
}

// rule: packages under from may not import anything under any of banned.
type rule struct {
	from   string
	banned []string
	why    string
}

var rules = []rule{
	{"hostagent", []string{"controlplane"}, "the host agent talks to the control plane only over hostagent.v1"},
	{"controlplane", []string{"hostagent"}, "the control plane talks to hosts only over hostagent.v1"},
	{"controlplane/scheduler", []string{"github.com/jackc/pgx", "github.com/hashicorp/raft", "google.golang.org/grpc", "controlplane/store", "controlplane/raftfsm"}, "the scheduler is a pure function over a read-only view"},
	{"controlplane/agentloop", []string{"github.com/jackc/pgx", "github.com/hashicorp/raft", "google.golang.org/grpc", "controlplane/store", "controlplane/raftfsm"}, "the agent loop is a step function over ports"},
	{"internal", []string{"controlplane", "hostagent"}, "shared internals sit below both daemons"},
}

// importers of the generated public admin types and the sqlc package.
var onlyImportedBy = map[string][]string{
	"proto/gen/corral/admin":         {"controlplane/api", "controlplane/server", "cmd/corral", "test/"},
	"controlplane/store/internal/db": {"controlplane/store"},
}

func under(path, prefix string) bool {
	full := prefix
	if !strings.Contains(prefix, ".") {
		full = module + "/" + prefix
	}
	return path == full || strings.HasPrefix(path, full+"/") || strings.HasPrefix(path, full) && strings.HasSuffix(prefix, "/")
}

func TestDependencyDirection(t *testing.T) {
	for _, p := range listPackages(t) {
		for _, r := range rules {
			if !under(p.ImportPath, r.from) {
				continue
			}
			if r.from == "internal" && under(p.ImportPath, "internal/archtest") {
				continue
			}
			for _, imp := range p.Imports {
				for _, b := range r.banned {
					if under(imp, b) {
						t.Errorf("%s imports %s: %s", p.ImportPath, imp, r.why)
					}
				}
			}
		}
		for _, imp := range p.Imports {
			for target, allowed := range onlyImportedBy {
				if !under(imp, target) || under(p.ImportPath, target) {
					continue
				}
				ok := false
				for _, a := range allowed {
					if under(p.ImportPath, a) {
						ok = true
					}
				}
				if !ok {
					t.Errorf("%s imports %s, which only %v may import", p.ImportPath, imp, allowed)
				}
			}
		}
	}
}

func TestRulesCatchViolations(t *testing.T) {
	// The matcher itself must not be vacuous.
	if !under(module+"/controlplane/scheduler", "controlplane") || under(module+"/controlplanex", "controlplane") {
		t.Fatal("under() matches the wrong packages")
	}
	if !under("github.com/jackc/pgx/v5/pgxpool", "github.com/jackc/pgx") {
		t.Fatal("under() misses external modules")
	}
	if !under(module+"/test/integration", "test/") {
		t.Fatal("under() misses prefix rules")
	}
}
