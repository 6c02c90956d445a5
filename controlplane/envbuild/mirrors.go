package envbuild

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"corral.dev/corral/internal/errdefs"
)

// The package managers of the Managed Agents API's packages object, in its
// order.
var Managers = []string{"apt", "cargo", "gem", "go", "npm", "pip"}

// Mirror is where one package manager's packages come from: a URL the
// build sandbox's egress proxy allows, and for apt the rest of a
// sources.list entry.
type Mirror struct {
	Manager string
	// Spec is the flag's value after "manager=": for apt a sources.list
	// entry without its leading "deb" ("[trusted=yes] http://mirror/ ./",
	// "http://deb.example/debian bookworm main"), for the others the
	// index's URL.
	Spec string
	// URL is the mirror's address, Host its host name (what the egress
	// allowlist names).
	URL  string
	Host string
}

// Mirrors are the operator's mirrors by manager. A manager without one
// takes no packages.
type Mirrors map[string]Mirror

// ParseMirrors parses --package-mirror values, each "manager=spec".
func ParseMirrors(values []string) (Mirrors, error) {
	out := Mirrors{}
	for _, v := range values {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		manager, spec, ok := strings.Cut(v, "=")
		if !ok {
			return nil, fmt.Errorf("--package-mirror %q: want manager=URL (managers: %s)", v, strings.Join(Managers, ", "))
		}
		m, err := parseMirror(strings.TrimSpace(manager), strings.TrimSpace(spec))
		if err != nil {
			return nil, fmt.Errorf("--package-mirror %q: %w", v, err)
		}
		if _, dup := out[m.Manager]; dup {
			return nil, fmt.Errorf("--package-mirror: %s is given twice", m.Manager)
		}
		out[m.Manager] = m
	}
	return out, nil
}

func parseMirror(manager, spec string) (Mirror, error) {
	if !slices.Contains(Managers, manager) {
		return Mirror{}, fmt.Errorf("unknown package manager %q (managers: %s)", manager, strings.Join(Managers, ", "))
	}
	if spec == "" || len(spec) > 1024 || strings.ContainsAny(spec, "\n\r\x00") {
		return Mirror{}, fmt.Errorf("the %s mirror must be one line of at most 1024 bytes", manager)
	}
	raw := spec
	if manager == "apt" {
		// [options] URL [suite [component...]]: the URL is the first
		// field after the options.
		rest := spec
		if strings.HasPrefix(rest, "[") {
			end := strings.Index(rest, "]")
			if end < 0 {
				return Mirror{}, fmt.Errorf("the apt mirror's options have no closing ]")
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return Mirror{}, fmt.Errorf("the apt mirror names no URL")
		}
		raw = fields[0]
		if len(fields) == 1 {
			spec += " ./" // a flat repository
		}
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return Mirror{}, fmt.Errorf("the %s mirror's URL %q must be http:// or https:// with a host and no user", manager, raw)
	}
	return Mirror{Manager: manager, Spec: spec, URL: raw, Host: strings.ToLower(u.Hostname())}, nil
}

// Hosts are the mirrors' host names, sorted, once each: what a build
// sandbox may reach, and what allow_package_managers adds to a session's
// allowlist.
func (m Mirrors) Hosts() []string {
	var out []string
	for _, mi := range m {
		out = append(out, mi.Host)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Configured lists the managers that have a mirror, in Managers' order.
func (m Mirrors) Configured() []string {
	var out []string
	for _, name := range Managers {
		if _, ok := m[name]; ok {
			out = append(out, name)
		}
	}
	return out
}

// errNoMirror refuses packages of a manager without a mirror.
func errNoMirror(manager string, m Mirrors) error {
	have := "none"
	if c := m.Configured(); len(c) > 0 {
		have = strings.Join(c, ", ")
	}
	return errdefs.InvalidArgument("config.packages.%s: this corral has no %s package mirror (the operator's --package-mirror %s=URL); sandboxes get packages only from the operator's mirrors (configured: %s)", manager, manager, manager, have)
}
