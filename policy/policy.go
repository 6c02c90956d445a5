// Package policy is data the control plane loads rather than code it runs:
// tenant roles and their permissions, default tenant quotas and sandbox runtime
// profiles. The files beside this one are embedded; Load parses and validates
// them, so a bad edit fails tests and start-up, not a request at run time.
package policy

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed roles.yaml quotas.yaml runtimes.yaml
var files embed.FS

// Scope says what an action touches: one tenant's data, or the fleet.
type Scope string

// The scopes.
const (
	TenantScope Scope = "tenant"
	FleetScope  Scope = "fleet"
)

// Role is a named set of permissions within one scope.
type Role struct {
	Scope       Scope    `yaml:"scope"`
	Description string   `yaml:"description"`
	Permissions []string `yaml:"permissions"`
}

// Actions lists every action by scope, each "resource:verb".
type Actions struct {
	Tenant []string `yaml:"tenant"`
	Fleet  []string `yaml:"fleet"`
}

// Quota bounds what one tenant may use at once, and how fast it may call.
type Quota struct {
	ConcurrentSessions  int `yaml:"concurrent_sessions"`
	ConcurrentSandboxes int `yaml:"concurrent_sandboxes"`
	CPUMillis           int `yaml:"cpu_millis"`
	MemoryMiB           int `yaml:"memory_mib"`
	// RequestsPerSecond and RequestBurst shape each tenant's token bucket
	// on each control-plane node.
	RequestsPerSecond int `yaml:"requests_per_second"`
	RequestBurst      int `yaml:"request_burst"`
}

// Runtime is a sandbox runtime's limits (runtimes.yaml says what each
// means and who applies it).
type Runtime struct {
	Description string `yaml:"description"`
	// TrustedOnly runtimes run only the sessions of the tenants that
	// Policy.TrustedRuntimes lists for them.
	TrustedOnly bool `yaml:"trusted_only"`
	CPUMillis   int  `yaml:"cpu_millis"`
	MemoryMiB   int  `yaml:"memory_mib"`
	// Pids and DiskMiB (the workspace's size) are zero for the process
	// runtime, which cannot enforce them.
	Pids    int `yaml:"pids"`
	DiskMiB int `yaml:"disk_mib"`
	// DefaultExecTimeoutSeconds and ExecTimeoutSeconds are a command's
	// default and greatest time limit.
	DefaultExecTimeoutSeconds int `yaml:"default_exec_timeout_seconds"`
	ExecTimeoutSeconds        int `yaml:"exec_timeout_seconds"`
	// OutputLimitBytes is the output kept per stream of a command.
	OutputLimitBytes int `yaml:"output_limit_bytes"`
	// PauseAfterIdleSeconds pauses (checkpoints) the sandbox of a session
	// idle this long, freeing its CPU and memory; its next tool call
	// resumes it. Zero never pauses. Only gvisor can pause.
	PauseAfterIdleSeconds int `yaml:"pause_after_idle_seconds"`
}

// ProcessRuntime is the development runtime: a folder on the host, which
// enforces no resource limit.
const ProcessRuntime = "process"

// Policy is everything in this directory.
type Policy struct {
	Actions      Actions            `yaml:"actions"`
	Roles        map[string]Role    `yaml:"roles"`
	DefaultQuota Quota              `yaml:"default_quota"`
	Runtimes     map[string]Runtime `yaml:"runtimes"`
	// TrustedRuntimes lists, by tenant id, the trusted_only runtimes whose
	// sandboxes the tenant's sessions may use (quotas.yaml). A tenant not
	// listed may use none.
	TrustedRuntimes map[string][]string `yaml:"trusted_runtimes"`
}

// TenantTrusts reports whether the tenant's policy lets its sessions use
// the runtime's sandboxes: always for a runtime that is not trusted_only.
func (p *Policy) TenantTrusts(tenantID, runtime string) bool {
	return !p.Runtimes[runtime].TrustedOnly || slices.Contains(p.TrustedRuntimes[tenantID], runtime)
}

// Load parses and validates the embedded policy.
func Load() (*Policy, error) { return load(files, "policy") }

// LoadDir parses and validates the policy in dir, which holds the same three
// files as this package (operators who change roles or quotas copy them).
func LoadDir(dir string) (*Policy, error) { return load(os.DirFS(dir), dir) }

func load(fsys fs.FS, where string) (*Policy, error) {
	var p Policy
	for _, name := range []string{"roles.yaml", "quotas.yaml", "runtimes.yaml"} {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("policy: %w", err)
		}
		if err := decodeStrict(b, &p); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", where, name, err)
		}
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return &p, nil
}

func decodeStrict(b []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

var permission = regexp.MustCompile(`^(\*|[a-z_]+):(\*|[a-z_]+)$`)

// Validate reports the first inconsistency.
func (p *Policy) Validate() error {
	if len(p.Roles) == 0 {
		return fmt.Errorf("no roles defined")
	}
	seen := map[string]Scope{}
	for scope, actions := range map[Scope][]string{TenantScope: p.Actions.Tenant, FleetScope: p.Actions.Fleet} {
		for _, a := range actions {
			if !permission.MatchString(a) || strings.Contains(a, "*") {
				return fmt.Errorf("action %q is not resource:verb", a)
			}
			if _, dup := seen[a]; dup {
				return fmt.Errorf("action %s is listed twice", a)
			}
			seen[a] = scope
		}
	}
	for _, name := range sortedKeys(p.Roles) {
		r := p.Roles[name]
		if r.Scope != TenantScope && r.Scope != FleetScope {
			return fmt.Errorf("role %s: scope %q is neither tenant nor fleet", name, r.Scope)
		}
		if len(r.Permissions) == 0 {
			return fmt.Errorf("role %s grants nothing", name)
		}
		for _, perm := range r.Permissions {
			if !permission.MatchString(perm) {
				return fmt.Errorf("role %s: permission %q is not resource:verb", name, perm)
			}
			if !p.matchesSome(r.Scope, perm) {
				return fmt.Errorf("role %s: permission %s names no %s action", name, perm, r.Scope)
			}
		}
	}
	q := p.DefaultQuota
	if q.ConcurrentSessions <= 0 || q.ConcurrentSandboxes <= 0 || q.CPUMillis <= 0 || q.MemoryMiB <= 0 || q.RequestsPerSecond <= 0 || q.RequestBurst <= 0 {
		return fmt.Errorf("default quota must set every limit above zero: %+v", q)
	}
	for _, name := range sortedKeys(p.Runtimes) {
		if err := p.Runtimes[name].validate(name); err != nil {
			return err
		}
	}
	for _, id := range sortedKeys(p.TrustedRuntimes) {
		if !strings.HasPrefix(id, "tenant_") {
			return fmt.Errorf("trusted_runtimes: %q is not a tenant id (tenant_...)", id)
		}
		for _, rt := range p.TrustedRuntimes[id] {
			if r, ok := p.Runtimes[rt]; !ok || !r.TrustedOnly || rt == ProcessRuntime {
				return fmt.Errorf("trusted_runtimes: tenant %s: %q is not a trusted_only runtime of runtimes.yaml (the process runtime is never granted to a tenant)", id, rt)
			}
		}
	}
	if _, ok := p.Runtimes["gvisor"]; !ok {
		return fmt.Errorf("runtime gvisor, the default for untrusted code, has no profile")
	}
	if p.Runtimes["gvisor"].TrustedOnly {
		return fmt.Errorf("runtime gvisor must accept untrusted work")
	}
	return nil
}

// validate checks one runtime profile: every limit set and consistent; the
// process runtime, which cannot apply them, sets no pids or disk limit.
func (r Runtime) validate(name string) error {
	if r.CPUMillis <= 0 || r.MemoryMiB <= 0 || r.DefaultExecTimeoutSeconds <= 0 || r.ExecTimeoutSeconds <= 0 || r.OutputLimitBytes <= 0 {
		return fmt.Errorf("runtime %s must bound cpu, memory, exec time (default and greatest) and output: %+v", name, r)
	}
	if r.PauseAfterIdleSeconds < 0 {
		return fmt.Errorf("runtime %s: pause_after_idle_seconds %d is negative", name, r.PauseAfterIdleSeconds)
	}
	if r.PauseAfterIdleSeconds > 0 && name != "gvisor" {
		return fmt.Errorf("runtime %s cannot pause sandboxes (checkpoints need gVisor): remove pause_after_idle_seconds", name)
	}
	if r.DefaultExecTimeoutSeconds > r.ExecTimeoutSeconds {
		return fmt.Errorf("runtime %s: default_exec_timeout_seconds %d is over exec_timeout_seconds %d", name, r.DefaultExecTimeoutSeconds, r.ExecTimeoutSeconds)
	}
	if name == ProcessRuntime {
		if r.Pids != 0 || r.DiskMiB != 0 {
			return fmt.Errorf("runtime process enforces no pids or disk limit: remove pids and disk_mib rather than claim them")
		}
		return nil
	}
	if r.Pids <= 0 || r.DiskMiB <= 0 {
		return fmt.Errorf("runtime %s must bound pids and workspace disk (disk_mib): %+v", name, r)
	}
	return nil
}

// matchesSome reports whether perm grants at least one action of scope.
func (p *Policy) matchesSome(scope Scope, perm string) bool {
	return slices.ContainsFunc(p.actions(scope), func(a string) bool {
		res, verb, _ := cut(a)
		return grants(perm, res, verb)
	})
}

func (p *Policy) actions(scope Scope) []string {
	if scope == FleetScope {
		return p.Actions.Fleet
	}
	return p.Actions.Tenant
}

// ScopeOf returns the scope of action resource:verb, and false for an action
// the policy does not list.
func (p *Policy) ScopeOf(resource, verb string) (Scope, bool) {
	a := resource + ":" + verb
	switch {
	case slices.Contains(p.Actions.Tenant, a):
		return TenantScope, true
	case slices.Contains(p.Actions.Fleet, a):
		return FleetScope, true
	}
	return "", false
}

// Allows reports whether role grants verb on resource: the action must be
// listed, in the role's scope, and match one of its permissions.
func (p *Policy) Allows(role, resource, verb string) bool {
	r, ok := p.Roles[role]
	if !ok {
		return false
	}
	if scope, ok := p.ScopeOf(resource, verb); !ok || scope != r.Scope {
		return false
	}
	for _, perm := range r.Permissions {
		if grants(perm, resource, verb) {
			return true
		}
	}
	return false
}

// HasRole reports whether the policy defines role, and in which scope.
func (p *Policy) HasRole(role string) (Scope, bool) {
	r, ok := p.Roles[role]
	return r.Scope, ok
}

func grants(perm, resource, verb string) bool {
	res, v, _ := cut(perm)
	return (res == "*" || res == resource) && (v == "*" || v == verb)
}

func cut(perm string) (string, string, bool) {
	for i := range len(perm) {
		if perm[i] == ':' {
			return perm[:i], perm[i+1:], true
		}
	}
	return perm, "", false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
