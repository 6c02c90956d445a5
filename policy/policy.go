// Package policy is data the control plane loads rather than code it runs:
// tenant roles and their permissions, default tenant quotas, sandbox runtime
// profiles, sandbox classes with the tenants that may use them, and host
// pools with the tenants bound to them. The files beside
// this one are embedded; Load parses and validates them, so a bad edit fails
// tests and start-up, not a request at run time.
package policy

import (
	"bytes"
	"cmp"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

//go:embed roles.yaml quotas.yaml runtimes.yaml placement.yaml classes.yaml prices.yaml
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
	// HostSharePercent bounds the share of any one host's allocatable
	// resources (each of CPU, memory and disk) that the tenant's sandboxes
	// may reserve, so that one tenant's sessions, idle or not, never take a
	// whole host from the others. 1 to 100; absent (0) is 100, no bound.
	HostSharePercent int `yaml:"host_share_percent"`
	// FileStorageMiB bounds the bytes the tenant keeps in the Files API
	// (uploads and sessions' outputs together). Absent (0) is
	// DefaultFileStorageMiB.
	FileStorageMiB int `yaml:"file_storage_mib"`
	// ModelTokensPerDay bounds the model tokens (input and output) the
	// tenant's sessions use per UTC day. Absent (0): no bound.
	ModelTokensPerDay int64 `yaml:"model_tokens_per_day"`
}

// DefaultFileStorageMiB is a tenant's file storage when the policy sets
// none: 10 GiB.
const DefaultFileStorageMiB = 10 << 10

// FileStorageBytes is q's file storage limit in bytes.
func (q Quota) FileStorageBytes() int64 {
	return int64(cmp.Or(q.FileStorageMiB, DefaultFileStorageMiB)) << 20
}

// Runtime is a sandbox runtime's limits (runtimes.yaml says what each
// means and who applies it).
type Runtime struct {
	Description string `yaml:"description"`
	// TrustedOnly runtimes run only the sessions of the tenants that
	// Policy.TrustedRuntimes lists for them.
	TrustedOnly bool `yaml:"trusted_only"`
	// CPUMillis and MemoryMiB are the sandbox's limits, which its cgroup
	// enforces.
	CPUMillis int `yaml:"cpu_millis"`
	MemoryMiB int `yaml:"memory_mib"`
	// CPURequestMillis and MemoryRequestMiB are what a placement reserves
	// on its host and counts against its tenant's quota: at most the
	// limits, and absent (0) they are the limits. Small requests with the
	// host's overcommit (Overcommit) let idle sandboxes, which use next to
	// nothing, share a host. Disk has no request: the workspace's image
	// really is disk_mib, so its placement reserves all of it.
	CPURequestMillis int `yaml:"cpu_request_millis"`
	MemoryRequestMiB int `yaml:"memory_request_mib"`
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
	// ArchiveReleaseAfterSeconds is how long the sandbox of an archived
	// session is kept (paused, where the runtime pauses) before it is
	// released, its placement and quota freed. 0 releases it at once;
	// absent (nil) is DefaultArchiveReleaseAfter.
	ArchiveReleaseAfterSeconds *int `yaml:"archive_release_after_seconds"`
}

// DefaultArchiveReleaseAfter is how long an archived session's sandbox is
// kept when the runtime's profile does not say: an archived session takes
// no more events, so its sandbox only holds disk (paused) meanwhile.
const DefaultArchiveReleaseAfter = time.Hour

// ArchiveReleaseAfter is how long an archived session's sandbox is kept
// before its release (archive_release_after_seconds).
func (r Runtime) ArchiveReleaseAfter() time.Duration {
	if r.ArchiveReleaseAfterSeconds == nil {
		return DefaultArchiveReleaseAfter
	}
	return time.Duration(*r.ArchiveReleaseAfterSeconds) * time.Second
}

// CPURequest is the CPU a placement reserves, in millicores.
func (r Runtime) CPURequest() int { return cmp.Or(r.CPURequestMillis, r.CPUMillis) }

// MemoryRequest is the memory a placement reserves, in MiB.
func (r Runtime) MemoryRequest() int { return cmp.Or(r.MemoryRequestMiB, r.MemoryMiB) }

// Overcommit is, per resource, how much more than a host's allocatable
// resources its sandboxes' requests may add up to: the control plane
// schedules against allocatable × ratio (controlplane/hosts, when a host
// registers) and tells the host that figure, which its own admission
// check uses. 1 is none; absent (0) is 1. Sandboxes' limits are not
// overcommitted by it: each still gets its whole limit from its cgroup, so
// with memory overcommitted the host relies on pressure eviction.
type Overcommit struct {
	CPU    float64 `yaml:"cpu"`
	Memory float64 `yaml:"memory"`
	Disk   float64 `yaml:"disk"`
}

// MaxOvercommit is the greatest ratio a policy may set.
const MaxOvercommit = 100

func (o Overcommit) validate() error {
	for _, c := range []struct {
		name  string
		ratio float64
	}{{"cpu", o.CPU}, {"memory", o.Memory}, {"disk", o.Disk}} {
		if c.ratio != 0 && (c.ratio < 1 || c.ratio > MaxOvercommit) {
			return fmt.Errorf("overcommit %s %v: a ratio is from 1 (none) to %d", c.name, c.ratio, MaxOvercommit)
		}
	}
	return nil
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
	// Overcommit is the hosts' overcommit ratios (runtimes.yaml).
	Overcommit Overcommit `yaml:"overcommit"`
	// TrustedRuntimes lists, by tenant id, the trusted_only runtimes whose
	// sandboxes the tenant's sessions may use (quotas.yaml). A tenant not
	// listed may use none.
	TrustedRuntimes map[string][]string `yaml:"trusted_runtimes"`
	// UnrestrictedNetworking lists, by tenant id, the tenants whose
	// environments may have unrestricted networking (quotas.yaml). A
	// tenant not listed may not.
	UnrestrictedNetworking []string `yaml:"unrestricted_networking"`
	// Pools are the warm pools every host of a runtime keeps
	// (runtimes.yaml).
	Pools []Pool `yaml:"pools"`
	// HostPools are the pools of hosts, by name (placement.yaml): a
	// host's pool is its pool label. TenantPlacement binds tenants, by id,
	// to pools and asks for zone spread (placement.yaml).
	HostPools map[string]HostPool `yaml:"host_pools"`
	// ModelPrices are the models' list prices, by model id (prices.yaml).
	ModelPrices     map[string]ModelPrice      `yaml:"model_prices"`
	TenantPlacement map[string]TenantPlacement `yaml:"tenant_placement"`
	// SandboxClasses are the classes of sandbox, by name, and
	// TenantClasses the classes each tenant may use, by tenant id
	// (classes.yaml). Validate fills SandboxClasses with DefaultClasses
	// when the policy defines none.
	SandboxClasses map[string]SandboxClass  `yaml:"sandbox_classes"`
	TenantClasses  map[string]TenantClasses `yaml:"tenant_classes"`
}

// MaxPoolSize bounds Pool.Max (the host agent's own bound).
const MaxPoolSize = 64

// Pool is one warm pool class: the sandboxes of a runtime and image, with
// the runtime profile's limits, that each host of the runtime creates and
// starts before a session asks. A host refills it to Min plus the claims
// of the last minute, at most Max.
type Pool struct {
	Runtime string `yaml:"runtime"`
	Image   string `yaml:"image"`
	Min     int    `yaml:"min"`
	Max     int    `yaml:"max"`
}

// PoolsOf returns the pools of a runtime, in the file's order.
func (p *Policy) PoolsOf(runtime string) []Pool {
	var out []Pool
	for _, pl := range p.Pools {
		if pl.Runtime == runtime {
			out = append(out, pl)
		}
	}
	return out
}

// TenantTrusts reports whether the tenant's policy lets its sessions use
// the runtime's sandboxes: always for a runtime that is not trusted_only.
func (p *Policy) TenantTrusts(tenantID, runtime string) bool {
	return !p.Runtimes[runtime].TrustedOnly || slices.Contains(p.TrustedRuntimes[tenantID], runtime)
}

// GrantsUnrestrictedNetworking reports whether the tenant's policy lets
// its environments have unrestricted networking: their sandboxes reach any
// public name through their host's egress proxy (still audited and
// capped, never a private address the operator did not list).
func (p *Policy) GrantsUnrestrictedNetworking(tenantID string) bool {
	return slices.Contains(p.UnrestrictedNetworking, tenantID)
}

// Load parses and validates the embedded policy.
func Load() (*Policy, error) { return load(files, "policy") }

// LoadDir parses and validates the policy in dir, which holds the same
// files as this package (operators who change roles or quotas copy them);
// placement.yaml may be absent (no host pools), and classes.yaml (one
// class per runtime profile).
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
	// A directory copied before host pools, classes or prices existed has
	// no placement.yaml, classes.yaml or prices.yaml: it defines none.
	for _, name := range []string{PlacementFile, ClassesFile, PricesFile} {
		switch b, err := fs.ReadFile(fsys, name); {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("policy: %w", err)
		default:
			// An empty file (comments only) defines nothing.
			if err := decodeStrict(b, &p); err != nil && !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("%s/%s: %w", where, name, err)
			}
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

var (
	permission = regexp.MustCompile(`^(\*|[a-z_]+):(\*|[a-z_]+)$`)
	poolName   = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
)

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
	for model, price := range p.ModelPrices {
		if err := price.validate(model); err != nil {
			return err
		}
	}
	if q.ModelTokensPerDay < 0 {
		return fmt.Errorf("default quota: model_tokens_per_day %d is negative", q.ModelTokensPerDay)
	}
	if q.FileStorageMiB < 0 {
		return fmt.Errorf("default quota: file_storage_mib %d is negative", q.FileStorageMiB)
	}
	if q.HostSharePercent < 0 || q.HostSharePercent > 100 {
		return fmt.Errorf("default quota: host_share_percent %d is not from 1 to 100", q.HostSharePercent)
	}
	if err := p.Overcommit.validate(); err != nil {
		return err
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
	for _, id := range p.UnrestrictedNetworking {
		if !strings.HasPrefix(id, "tenant_") {
			return fmt.Errorf("unrestricted_networking: %q is not a tenant id (tenant_...)", id)
		}
	}
	seenPool := map[[2]string]bool{}
	for _, pl := range p.Pools {
		switch {
		case pl.Runtime == ProcessRuntime:
			return fmt.Errorf("pools: the process runtime keeps no warm pool (its driver cannot bind a sandbox to a session after creating it)")
		case pl.Image == "":
			return fmt.Errorf("pools: the pool of runtime %s needs an image", pl.Runtime)
		case pl.Min < 0 || pl.Max < pl.Min || pl.Max > MaxPoolSize:
			return fmt.Errorf("pools: %s %s: want 0 <= min <= max <= %d, have min %d, max %d", pl.Runtime, pl.Image, MaxPoolSize, pl.Min, pl.Max)
		case seenPool[[2]string{pl.Runtime, pl.Image}]:
			return fmt.Errorf("pools: %s %s is listed twice", pl.Runtime, pl.Image)
		}
		if _, ok := p.Runtimes[pl.Runtime]; !ok {
			return fmt.Errorf("pools: runtime %q has no profile", pl.Runtime)
		}
		seenPool[[2]string{pl.Runtime, pl.Image}] = true
	}
	if err := p.validatePlacement(); err != nil {
		return err
	}
	if err := p.validateClasses(); err != nil {
		return err
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
	if r.CPURequestMillis < 0 || r.CPURequestMillis > r.CPUMillis || r.MemoryRequestMiB < 0 || r.MemoryRequestMiB > r.MemoryMiB {
		return fmt.Errorf("runtime %s: a request is from 1 to its limit (cpu_request_millis %d of cpu_millis %d, memory_request_mib %d of memory_mib %d)",
			name, r.CPURequestMillis, r.CPUMillis, r.MemoryRequestMiB, r.MemoryMiB)
	}
	if r.PauseAfterIdleSeconds < 0 {
		return fmt.Errorf("runtime %s: pause_after_idle_seconds %d is negative", name, r.PauseAfterIdleSeconds)
	}
	if r.ArchiveReleaseAfterSeconds != nil && *r.ArchiveReleaseAfterSeconds < 0 {
		return fmt.Errorf("runtime %s: archive_release_after_seconds %d is negative (0 releases at once)", name, *r.ArchiveReleaseAfterSeconds)
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
