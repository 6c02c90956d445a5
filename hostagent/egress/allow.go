package egress

import (
	"fmt"
	"net/netip"
	"strings"

	"corral.dev/corral/internal/netguard"
	"corral.dev/corral/internal/textcut"
)

// MaxHosts bounds an allowlist (the API refuses more first).
const MaxHosts = 256

// Allowlist is a sandbox's allowed destination names: exact names, and
// "*.suffix" for any name below suffix (not suffix itself: list both to
// allow both). Names compare lowercased, without a trailing dot. IP
// literals are never allowed by name: a sandbox names what it reaches.
type Allowlist struct {
	exact    map[string]bool
	suffixes []string // each with its leading dot
}

// ParseAllowlist checks and compiles patterns.
func ParseAllowlist(patterns []string) (Allowlist, error) {
	if len(patterns) > MaxHosts {
		return Allowlist{}, fmt.Errorf("%d allowed hosts; at most %d", len(patterns), MaxHosts)
	}
	a := Allowlist{exact: map[string]bool{}}
	for _, p := range patterns {
		name, wild := strings.CutPrefix(p, "*.")
		name = normalize(name)
		if !validName(name) {
			return Allowlist{}, fmt.Errorf("allowed host %q: not a host name or *.suffix", textcut.Prefix(p, 64))
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
func (a Allowlist) Empty() bool { return len(a.exact) == 0 && len(a.suffixes) == 0 }

// Allows reports whether host (a name, not an address) is allowed.
func (a Allowlist) Allows(host string) bool {
	host = normalize(host)
	if !validName(host) {
		return false
	}
	if a.exact[host] {
		return true
	}
	for _, s := range a.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

func normalize(name string) string { return strings.TrimSuffix(strings.ToLower(name), ".") }

// validName is a DNS host name (letters, digits, hyphens, underscores in
// labels of 1 to 63 bytes, at most 253 bytes) that is not an IP literal.
func validName(name string) bool {
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

// addressAllowed reports whether the proxy may dial a: a public address,
// or one inside the operator's allowed prefixes. Metadata
// (169.254.169.254), link-local, loopback and private space are refused
// unless listed.
func addressAllowed(a netip.Addr, allowed []netip.Prefix) bool {
	a = a.Unmap()
	for _, p := range allowed {
		if p.Contains(a) {
			return true
		}
	}
	return !netguard.IsPrivate(a)
}
