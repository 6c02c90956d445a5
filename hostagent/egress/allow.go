package egress

import (
	"net/netip"

	"corral.dev/corral/internal/allowlist"
	"corral.dev/corral/internal/netguard"
)

// Allowlist is a sandbox's allowed names (package allowlist).
type Allowlist = allowlist.List

// MaxHosts bounds an allowlist.
const MaxHosts = allowlist.MaxHosts

// ParseAllowlist checks and compiles patterns (allowlist.ParsePlaced: a
// placement's, so [allowlist.AnyName] is every name).
func ParseAllowlist(patterns []string) (Allowlist, error) { return allowlist.ParsePlaced(patterns) }

func normalize(name string) string { return allowlist.Normalize(name) }

func validName(name string) bool { return allowlist.ValidName(name) }

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
