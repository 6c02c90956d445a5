package policy

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// ClassesFile is the optional policy file of sandbox classes and of which
// classes each tenant may use. A policy directory without it has one class
// per runtime profile, named after the runtime (DefaultClasses).
const ClassesFile = "classes.yaml"

// ClassMetadataKey is the environment metadata key that picks the sandbox
// class of the environment's sessions. The Managed Agents API carries
// metadata as it is, so choosing a class changes no wire shape.
const ClassMetadataKey = "corral.sandbox_class"

// The network modes a sandbox can have: none, or limited (the hosts its
// environment allows, through its host's egress proxy).
const (
	NetworkNone    = "none"
	NetworkLimited = "limited"
)

// SandboxClass is one class of sandbox (classes.yaml): a runtime profile
// with an image, and with some of its limits replaced.
type SandboxClass struct {
	Description string `yaml:"description"`
	// Runtime is a profile of runtimes.yaml; its provider (of the same
	// name) is what a host must offer to take the class's sandboxes.
	Runtime string `yaml:"runtime"`
	// Image is what the sandboxes run; empty: the node's default image.
	Image string `yaml:"image"`
	// The runtime profile's requests and limits, replaced where not zero.
	CPUMillis        int `yaml:"cpu_millis"`
	MemoryMiB        int `yaml:"memory_mib"`
	CPURequestMillis int `yaml:"cpu_request_millis"`
	MemoryRequestMiB int `yaml:"memory_request_mib"`
	Pids             int `yaml:"pids"`
	DiskMiB          int `yaml:"disk_mib"`
	// NetworkModes the class allows; empty: NetworkNone.
	NetworkModes []string `yaml:"network_modes"`
}

// Provider is the provider a host must offer for the class: its runtime's.
func (c SandboxClass) Provider() string { return c.Runtime }

// AllowsNetwork reports whether the class allows network mode m.
func (c SandboxClass) AllowsNetwork(m string) bool {
	if len(c.NetworkModes) == 0 {
		return m == NetworkNone
	}
	return slices.Contains(c.NetworkModes, m)
}

// TenantClasses is one tenant's classes (tenant_classes).
type TenantClasses struct {
	// Classes the tenant may use.
	Classes []string `yaml:"classes"`
	// Default is its sessions' class when their environment names none:
	// one of Classes; empty: the node's default if listed, else the first.
	Default string `yaml:"default"`
}

// DefaultClasses is one class per runtime profile, named after it, with
// nothing replaced: what a policy without sandbox_classes has.
func DefaultClasses(runtimes map[string]Runtime) map[string]SandboxClass {
	out := make(map[string]SandboxClass, len(runtimes))
	for name, rt := range runtimes {
		out[name] = SandboxClass{Description: rt.Description, Runtime: name}
	}
	return out
}

// ClassProfile is the runtime profile of class name with the class's
// replacements applied, and false for an unknown class.
func (p *Policy) ClassProfile(name string) (SandboxClass, Runtime, bool) {
	c, ok := p.SandboxClasses[name]
	if !ok {
		return SandboxClass{}, Runtime{}, false
	}
	rt, ok := p.Runtimes[c.Runtime]
	if !ok {
		return SandboxClass{}, Runtime{}, false
	}
	return c, c.apply(rt), true
}

func (c SandboxClass) apply(rt Runtime) Runtime {
	rt.CPUMillis = cmp.Or(c.CPUMillis, rt.CPUMillis)
	rt.MemoryMiB = cmp.Or(c.MemoryMiB, rt.MemoryMiB)
	rt.CPURequestMillis = cmp.Or(c.CPURequestMillis, rt.CPURequestMillis)
	rt.MemoryRequestMiB = cmp.Or(c.MemoryRequestMiB, rt.MemoryRequestMiB)
	rt.Pids = cmp.Or(c.Pids, rt.Pids)
	rt.DiskMiB = cmp.Or(c.DiskMiB, rt.DiskMiB)
	return rt
}

// TenantMayUseClass reports whether the tenant's sessions may use class
// name, on a node whose default class is nodeDefault: a class of its
// tenant_classes, or, for a tenant not listed, a class whose runtime is
// not trusted_only, one whose trusted_only runtime its trusted_runtimes
// grant, or a process class that is the node's default.
func (p *Policy) TenantMayUseClass(tenantID, name, nodeDefault string) bool {
	c, ok := p.SandboxClasses[name]
	if !ok {
		return false
	}
	if tc, ok := p.TenantClasses[tenantID]; ok {
		return slices.Contains(tc.Classes, name)
	}
	if c.Runtime == ProcessRuntime {
		return name == nodeDefault
	}
	return p.TenantTrusts(tenantID, c.Runtime)
}

// TenantDefaultClass is the class of the tenant's sessions whose
// environment names none, on a node whose default class is nodeDefault.
func (p *Policy) TenantDefaultClass(tenantID, nodeDefault string) string {
	tc, ok := p.TenantClasses[tenantID]
	switch {
	case !ok:
		return nodeDefault
	case tc.Default != "":
		return tc.Default
	case slices.Contains(tc.Classes, nodeDefault):
		return nodeDefault
	}
	return tc.Classes[0] // validated: not empty
}

// validateClasses checks the classes and the tenants' lists of them. It
// runs after the runtimes and trusted_runtimes are checked.
func (p *Policy) validateClasses() error {
	if len(p.SandboxClasses) == 0 {
		p.SandboxClasses = DefaultClasses(p.Runtimes)
	}
	for _, name := range sortedKeys(p.SandboxClasses) {
		c := p.SandboxClasses[name]
		rt, ok := p.Runtimes[c.Runtime]
		switch {
		case !poolName.MatchString(name):
			return fmt.Errorf("sandbox_classes: %q is not a class name (lower case letters, digits, - and _, at most 63)", name)
		case c.Runtime == "":
			return fmt.Errorf("sandbox_classes: class %s names no runtime", name)
		case !ok:
			return fmt.Errorf("sandbox_classes: class %s: runtime %q has no profile in runtimes.yaml", name, c.Runtime)
		case c.Runtime == ProcessRuntime && c.Image != "":
			return fmt.Errorf("sandbox_classes: class %s: the process runtime runs no image; remove image", name)
		case len(c.Image) > 512:
			return fmt.Errorf("sandbox_classes: class %s: image is over 512 bytes", name)
		case c.CPUMillis < 0 || c.MemoryMiB < 0 || c.CPURequestMillis < 0 || c.MemoryRequestMiB < 0 || c.Pids < 0 || c.DiskMiB < 0:
			return fmt.Errorf("sandbox_classes: class %s: a limit or request is negative", name)
		}
		for _, m := range c.NetworkModes {
			switch m {
			case NetworkNone, NetworkLimited:
			case "unrestricted":
				return fmt.Errorf("sandbox_classes: class %s: network mode unrestricted is not offered (sandboxes reach only what their environment allows); allow none or limited", name)
			default:
				return fmt.Errorf("sandbox_classes: class %s: unknown network mode %q (want none or limited)", name, m)
			}
		}
		if err := c.apply(rt).validate(c.Runtime); err != nil {
			return fmt.Errorf("sandbox_classes: class %s: %w", name, err)
		}
	}
	for _, id := range sortedKeys(p.TenantClasses) {
		tc := p.TenantClasses[id]
		if !strings.HasPrefix(id, "tenant_") {
			return fmt.Errorf("tenant_classes: %q is not a tenant id (tenant_...)", id)
		}
		if len(tc.Classes) == 0 {
			return fmt.Errorf("tenant_classes: tenant %s lists no class", id)
		}
		seen := map[string]bool{}
		for _, name := range tc.Classes {
			c, ok := p.SandboxClasses[name]
			switch {
			case !ok:
				return fmt.Errorf("tenant_classes: tenant %s: class %q is not in sandbox_classes", id, name)
			case seen[name]:
				return fmt.Errorf("tenant_classes: tenant %s: class %s is listed twice", id, name)
			case c.Runtime != ProcessRuntime && !p.TenantTrusts(id, c.Runtime):
				return fmt.Errorf("tenant_classes: tenant %s: class %s runs the trusted_only runtime %s, which the tenant's trusted_runtimes (quotas.yaml) do not grant", id, name, c.Runtime)
			}
			seen[name] = true
		}
		if tc.Default != "" && !seen[tc.Default] {
			return fmt.Errorf("tenant_classes: tenant %s: default %q is not one of its classes", id, tc.Default)
		}
	}
	return nil
}
