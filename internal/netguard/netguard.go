// Package netguard keeps the control plane's outbound calls on behalf of
// tenants (MCP servers, a tenant's own model API) out of the operator's
// network: its transport's dialer refuses loopback, private and
// link-local destinations, checked on the address really dialled, after
// name resolution, so that a name pointing inside is refused too.
package netguard

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// Transport is the default transport's settings with, unless allowPrivate,
// a dialer that refuses private destinations (and no proxy, which would
// dial for it, past the check). what names the destinations in errors
// ("MCP servers").
func Transport(allowPrivate bool, what string) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if allowPrivate {
		return tr
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: func(network, address string, c syscall.RawConn) error {
		return refusePrivate(what, address)
	}}
	tr.DialContext = d.DialContext
	tr.Proxy = nil
	return tr
}

// IsPrivate reports whether a is loopback, private, link-local, multicast,
// unspecified or shared (CGNAT) address space.
func IsPrivate(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() || cgnat.Contains(a)
}

func refusePrivate(what, address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dialing %s: not an IP address", address)
	}
	if a := ap.Addr().Unmap(); IsPrivate(a) {
		return fmt.Errorf("%s at %s are not allowed: the address is loopback, private or link-local", what, a)
	}
	return nil
}

// cgnat is the shared address space (RFC 6598), private in all but name.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")
