// Package policy is data the control plane loads rather than code it runs:
// tenant roles and their permissions, default tenant quotas and sandbox runtime
// profiles. The files beside this one are embedded; Load parses and validates
// them, so a bad edit fails tests and start-up, not a request at run time.
package policy

import (
	"bytes"
	"embed"
	"fmt"
	"regexp"
	"sort"

	"gopkg.in/yaml.v3"
)

//go:embed roles.yaml quotas.yaml runtimes.yaml
var files embed.FS

// Role is a named set of permissions.
type Role struct {
	Description string   `yaml:"description"`
	Permissions []string `yaml:"permissions"`
}

// Quota bounds what one tenant may use at once.
type Quota struct {
	ConcurrentSandboxes int `yaml:"concurrent_sandboxes"`
	CPUMillis           int `yaml:"cpu_millis"`
	MemoryMiB           int `yaml:"memory_mib"`
	SessionsPerMinute   int `yaml:"sessions_per_minute"`
}

// Runtime is a sandbox runtime's default limits.
type Runtime struct {
	Description        string `yaml:"description"`
	TrustedOnly        bool   `yaml:"trusted_only"`
	CPUMillis          int    `yaml:"cpu_millis"`
	MemoryMiB          int    `yaml:"memory_mib"`
	Pids               int    `yaml:"pids"`
	ExecTimeoutSeconds int    `yaml:"exec_timeout_seconds"`
	OutputLimitBytes   int    `yaml:"output_limit_bytes"`
}

// Policy is everything in this directory.
type Policy struct {
	Roles        map[string]Role    `yaml:"roles"`
	DefaultQuota Quota              `yaml:"default_quota"`
	Runtimes     map[string]Runtime `yaml:"runtimes"`
}

// Load parses and validates the embedded policy.
func Load() (*Policy, error) {
	var p Policy
	for _, name := range []string{"roles.yaml", "quotas.yaml", "runtimes.yaml"} {
		b, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		if err := decodeStrict(b, &p); err != nil {
			return nil, fmt.Errorf("policy/%s: %w", name, err)
		}
	}
	if err := p.Validate(); err != nil {
		return nil, err
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
	for _, name := range sortedKeys(p.Roles) {
		r := p.Roles[name]
		if len(r.Permissions) == 0 {
			return fmt.Errorf("role %s grants nothing", name)
		}
		for _, perm := range r.Permissions {
			if !permission.MatchString(perm) {
				return fmt.Errorf("role %s: permission %q is not resource:verb", name, perm)
			}
		}
	}
	q := p.DefaultQuota
	if q.ConcurrentSandboxes <= 0 || q.CPUMillis <= 0 || q.MemoryMiB <= 0 || q.SessionsPerMinute <= 0 {
		return fmt.Errorf("default quota must set every limit above zero: %+v", q)
	}
	for _, name := range sortedKeys(p.Runtimes) {
		r := p.Runtimes[name]
		if r.CPUMillis <= 0 || r.MemoryMiB <= 0 || r.Pids <= 0 || r.ExecTimeoutSeconds <= 0 || r.OutputLimitBytes <= 0 {
			return fmt.Errorf("runtime %s must bound cpu, memory, pids, exec time and output: %+v", name, r)
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

// Allows reports whether role grants verb on resource.
func (p *Policy) Allows(role, resource, verb string) bool {
	r, ok := p.Roles[role]
	if !ok {
		return false
	}
	for _, perm := range r.Permissions {
		res, v, _ := cut(perm)
		if (res == "*" || res == resource) && (v == "*" || v == verb) {
			return true
		}
	}
	return false
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
