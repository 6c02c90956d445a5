package envbuild

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

func TestParseMirrors(t *testing.T) {
	m, err := ParseMirrors([]string{"apt=[trusted=yes] http://Mirror.Test:8080/ ", "pip=https://pypi.test/simple/", " npm=http://npm.test/"})
	if err != nil {
		t.Fatal(err)
	}
	if got := m["apt"]; got.Spec != "[trusted=yes] http://Mirror.Test:8080/ ./" || got.Host != "mirror.test" || got.URL != "http://Mirror.Test:8080/" {
		t.Errorf("apt: %+v", got)
	}
	if got := m["pip"]; got.Spec != "https://pypi.test/simple/" || got.Host != "pypi.test" {
		t.Errorf("pip: %+v", got)
	}
	if h := m.Hosts(); !slices.Equal(h, []string{"mirror.test", "npm.test", "pypi.test"}) {
		t.Errorf("hosts %v", h)
	}
	if c := m.Configured(); !slices.Equal(c, []string{"apt", "npm", "pip"}) {
		t.Errorf("configured %v", c)
	}
	if m, err := ParseMirrors([]string{"apt=http://deb.test/debian bookworm main"}); err != nil || m["apt"].Spec != "http://deb.test/debian bookworm main" {
		t.Errorf("a suite and components are kept: %+v %v", m, err)
	}
	for _, bad := range []string{
		"apt", "brew=http://x/", "pip=", "pip=ftp://x/", "pip=http:///path", "pip=http://user:pw@x/",
		"apt=[trusted=yes http://x/", "apt=[trusted=yes]", "pip=http://x/\nother",
	} {
		if _, err := ParseMirrors([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := ParseMirrors([]string{"pip=http://a/", "pip=http://b/"}); err == nil {
		t.Error("a manager given twice was accepted")
	}
}

func TestValidate(t *testing.T) {
	m, _ := ParseMirrors([]string{"apt=http://deb.test/", "pip=http://pypi.test/simple/", "npm=http://npm.test/", "go=http://proxy.test/", "cargo=http://crates.test/", "gem=http://gems.test/"})
	good := Packages{
		Apt:   []string{"curl", "libc6:amd64", "python3=3.11.2-1", "g++"},
		Pip:   []string{"requests", "requests[socks]>=2.0,<3", "Django==4.2"},
		Npm:   []string{"left-pad", "@types/node@^20", "typescript@5.4.5"},
		Go:    []string{"golang.org/x/tools/cmd/stringer@latest"},
		Cargo: []string{"ripgrep", "serde@1.0"},
		Gem:   []string{"rake", "rails:7.1"},
	}
	if err := Validate(good, m); err != nil {
		t.Fatal(err)
	}
	bad := []Packages{
		{Apt: []string{"-o APT::x=1"}}, {Apt: []string{"curl; rm -rf /"}}, {Apt: []string{"./local.deb"}},
		{Pip: []string{"--index-url=http://evil/"}}, {Pip: []string{"git+https://evil/x"}}, {Pip: []string{"x @ https://evil/x.whl"}}, {Pip: []string{"../x"}},
		{Npm: []string{"git+https://evil/x"}}, {Npm: []string{"./dir"}}, {Npm: []string{"--registry=http://evil"}},
		{Go: []string{"example.com/x"}}, {Go: []string{"-ldflags=x@1"}},
		{Cargo: []string{"--git=x"}}, {Gem: []string{"--source=x"}},
	}
	for _, p := range bad {
		if err := Validate(p, m); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
			t.Errorf("%+v: %v", p, err)
		}
	}
	noNpm, _ := ParseMirrors([]string{"pip=http://pypi.test/simple/"})
	err := Validate(Packages{Npm: []string{"left-pad"}}, noNpm)
	if errdefs.KindOf(err) != errdefs.InvalidArgumentKind || !strings.Contains(err.Error(), "no npm package mirror") || !strings.Contains(err.Error(), "configured: pip") {
		t.Errorf("a manager without a mirror: %v", err)
	}
}

func TestKey(t *testing.T) {
	m, _ := ParseMirrors([]string{"apt=http://deb.test/", "pip=http://pypi.test/simple/"})
	p := Packages{Apt: []string{"curl"}}
	k := Key("ten_a", "img:1", p, m)
	if len(k) != 64 || k != Key("ten_a", "img:1", p, m) {
		t.Fatalf("key %q is not stable", k)
	}
	// A mirror the packages do not use leaves the key as it is; one they
	// use, the tenant, the base image and the lists each change it.
	m2, _ := ParseMirrors([]string{"apt=http://deb.test/", "pip=http://other.test/simple/"})
	if Key("ten_a", "img:1", p, m2) != k {
		t.Error("an unused mirror changed the key")
	}
	m3, _ := ParseMirrors([]string{"apt=http://other.test/"})
	for name, other := range map[string]string{
		"mirror": Key("ten_a", "img:1", p, m3),
		"tenant": Key("ten_b", "img:1", p, m),
		"base":   Key("ten_a", "img:2", p, m),
		"list":   Key("ten_a", "img:1", Packages{Apt: []string{"curl", "git"}}, m),
		"moved":  Key("ten_a", "img:1", Packages{Pip: []string{"curl"}}, m),
	} {
		if other == k {
			t.Errorf("another %s gave the same key", name)
		}
	}
}

func TestPlan(t *testing.T) {
	m, _ := ParseMirrors([]string{"apt=[trusted=yes] http://deb.test/", "pip=http://pypi.test/simple/", "npm=http://npm.test/"})
	steps := Plan(Packages{Pip: []string{"requests"}, Apt: []string{"curl", "git"}, Npm: []string{"left-pad"}}, m)
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
		// Every step's script is valid shell, and each package is one
		// argument after it.
		if s.Command[0] != "sh" || s.Command[1] != "-c" {
			t.Fatalf("step %s: %q", s.Name, s.Command)
		}
		if out, err := exec.Command("sh", "-n", "-c", s.Command[2]).CombinedOutput(); err != nil {
			t.Errorf("step %s's script: %v %s", s.Name, err, out)
		}
	}
	if !slices.Equal(names, []string{"apt", "npm", "pip"}) {
		t.Fatalf("steps %v", names)
	}
	apt := steps[0]
	if got := string(apt.Files[aptSources]); got != "deb [trusted=yes] http://deb.test/ ./\n" {
		t.Errorf("apt sources %q", got)
	}
	if !slices.Equal(apt.Command[len(apt.Command)-2:], []string{"curl", "git"}) {
		t.Errorf("apt command %q", apt.Command)
	}
	if out, err := exec.Command("sh", "-n", "-c", aptScript).CombinedOutput(); err != nil {
		t.Errorf("apt script: %v %s", err, out)
	}
	pip := steps[2].Command
	if i := slices.Index(pip, "--index-url"); i < 0 || pip[i+1] != "http://pypi.test/simple/" || pip[len(pip)-1] != "requests" {
		t.Errorf("pip command %q", pip)
	}
}

// TestNeedTool runs the tool check: a missing tool fails the step with
// exit 127 and says which; a present one runs the command with its
// arguments as given.
func TestNeedTool(t *testing.T) {
	out, err := exec.Command("sh", withTool("corral-no-such-tool", "npm", "true")[1:]...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 127 || !strings.Contains(string(out), "corral-no-such-tool is not in the environment's base image, and packages.npm need it") {
		t.Errorf("missing tool: %v %s", err, out)
	}
	out, err = exec.Command("sh", withTool("printf", "apt", "printf", "%s|", "a b", "$(c)")[1:]...).CombinedOutput()
	if err != nil || string(out) != "a b|$(c)|" {
		t.Errorf("present tool: %v %q", err, out)
	}
}
