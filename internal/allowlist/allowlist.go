// Package allowlist is the egress allowlist's grammar, one for both sides:
// the public API checks an environment's allowed_hosts with it, and the
// host's egress proxy (hostagent/egress) matches every connection's names
// against it.
package allowlist

import (
	"fmt"
	"net/netip"
	"strings"

	"corral.dev/corral/internal/textcut"
)

// MaxHosts bounds an allowlist (the API refuses more first).
const MaxHosts = 256

// List is a sandbox's allowed destination names: exact names, and
// "*.suffix" for any name below suffix (not suffix itself: list both to
// allow both). Names compare lowercased, without a trailing dot. IP
// literals are never allowed by name: a sandbox names what it reaches.
type List struct {
	exact    map[string]bool
	suffixes []string // each with its leading dot
	// any: every valid name (Any; unrestricted networking).
	any bool
}

// AnyName is the one entry of a placement's allowlist for unrestricted
// networking: every name. It is not a pattern Parse accepts, so no
// environment's allowed_hosts can say it; the control plane puts it in a
// placement only for an environment with unrestricted networking whose
// tenant holds the grant, and the host's proxy takes it through
// ParsePlaced. The proxy's other rules hold all the same: it resolves
// names itself, dials only public addresses (or the operator's allowed
// prefixes), refuses IP literals, and keeps every cap and record.
const AnyName = "*"

// Any is the list that allows every valid name.
func Any() List { return List{any: true} }

// ParsePlaced compiles a placement's allowlist: Parse's patterns, or
// AnyName alone (Any).
func ParsePlaced(patterns []string) (List, error) {
	if len(patterns) == 1 && patterns[0] == AnyName {
		return Any(), nil
	}
	return Parse(patterns)
}

// ParseAllowlist checks and compiles patterns.
func Parse(patterns []string) (List, error) {
	if len(patterns) > MaxHosts {
		return List{}, fmt.Errorf("%d allowed hosts; at most %d", len(patterns), MaxHosts)
	}
	a := List{exact: map[string]bool{}}
	for _, p := range patterns {
		name, wild := strings.CutPrefix(p, "*.")
		name = Normalize(name)
		if !ValidName(name) {
			return List{}, fmt.Errorf("allowed host %q: not a host name or *.suffix", textcut.Prefix(p, 64))
		}
		if wild {
			a.suffixes = append(a.suffixes, "."+name)
		} else {
			a.exact[name] = true
		}
	}
	return a, nil
}

// Empty reports whether nothing is allowed.
func (a List) Empty() bool { return !a.any && len(a.exact) == 0 && len(a.suffixes) == 0 }

// Allows reports whether host (a name, not an address) is allowed.
func (a List) Allows(host string) bool {
	host = Normalize(host)
	if !ValidName(host) {
		return false
	}
	if a.any || a.exact[host] {
		return true
	}
	for _, s := range a.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// Normalize lowercases name and drops its trailing dot.
func Normalize(name string) string { return strings.TrimSuffix(strings.ToLower(name), ".") }

// ValidName reports whether name is a DNS host name (letters, digits, hyphens, underscores in
// labels of 1 to 63 bytes, at most 253 bytes) that is not an IP literal.
func ValidName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	// A name of digits and dots only is an address in some parser's eyes.
	return strings.Trim(name, "0123456789.") != ""
}
