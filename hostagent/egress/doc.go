// Package egress is the host's egress for sandboxes whose environment has
// limited networking with allowed hosts: a network per sandbox whose only
// way out is a proxy the host agent runs, which carries a connection only
// to an allowed name and records every attempt. A sandbox without allowed
// hosts gets none of this: a fresh namespace with loopback only.
//
// The network (netns.go) is two namespaces and a veth pair between them:
//
//	sandbox netns (runsc joins it)        proxy netns (nothing else in it)
//	  eth0 10.87.0.2/30  ───── veth ─────  eth0 10.87.0.1/30
//	  routes: the /30 only                   listener 10.87.0.1:3128, made by
//	  HTTP(S)_PROXY=http://10.87.0.1:3128    the host agent, served in its process
//	                                              │
//	                                              ▼ dials from the agent's own
//	                                                namespace, after its checks
//
// The sandbox reaches exactly one address, the proxy's: it has no route
// beyond the /30, and the proxy's namespace has no other interface, no
// other listener and no forwarding, so neither the host's services nor
// other sandboxes are reachable and no firewall rule is needed. Every
// sandbox uses the same addresses (each pair is alone in its namespaces).
// gVisor's netstack takes the sandbox namespace's one interface and route.
// The proxy is explicit (the proxy variables), not transparent: a client
// that ignores them reaches nothing.
//
// The proxy (proxy.go) reads a bounded request head and allows:
//
//   - CONNECT host:port when host is on the allowlist and the tunnel opens
//     with a TLS ClientHello whose server name is that host (sni.go); any
//     other protocol inside CONNECT is refused;
//   - a plain http:// request whose URL host is on the allowlist and whose
//     Host header, if any, names the same host:port; one request per
//     connection (sent with Connection: close), so a second one cannot
//     name another host.
//
// It resolves names itself and dials only an address that is public or in
// the operator's AllowCIDRs: loopback, private, link-local (metadata,
// 169.254.169.254 included), CGNAT and multicast are refused after
// resolution, so a name that resolves inside (DNS rebinding) is refused
// too. IP literals are refused whatever the allowlist: a sandbox names what
// it reaches. Per sandbox it caps concurrent connections, bytes over the
// sandbox's life and bandwidth (Config).
//
// Credentials (inject.go, ca.go): a sandbox's proxy may hold credentials
// (SetCredentials), each a placeholder, a secret and the hosts it is for.
// A CONNECT to such a host (allowed as above, its ClientHello naming it)
// is not tunnelled: the proxy answers the sandbox's TLS with a leaf for
// that name from the host agent's CA, opens its own TLS to the upstream
// (verified against Config.UpstreamRoots), reads one HTTP/1.1 request
// (head bounded), replaces each placeholder in its header values with the
// secret, and carries it and its response (Connection: close; bodies
// untouched):
//
//	sandbox ── TLS (leaf from CA) ──▶ proxy ── TLS (verified) ──▶ upstream
//	         Authorization: Bearer     │       Authorization: Bearer
//	         corral-placeholder-…      │       <secret>
//	                                   └ audit: Record.Injected
//
// A plain http:// request to such a host gets the same substitution. Any
// other host's traffic is tunnelled as before, so a placeholder sent there
// stays one. The secrets and the CA's key live in the agent's memory only.
//
// An allowlist of allowlist.AnyName alone (unrestricted networking, which
// the control plane places only for a tenant its policy grants it) allows
// every name; everything else above holds all the same: the proxy
// resolves names itself, refuses IP literals and the addresses above, and
// keeps every cap and record.
//
// Every connection, carried or refused, becomes a Record (id, tenant,
// session, host, port, address dialled, bytes each way, verdict and why,
// times) in the host's bounded Audit queue; the host agent ships it in
// heartbeats and holds it until the control plane acknowledges one that
// carried it (Pending, Ack), and the control plane stores it once per id,
// under the tenant of the session's placement on that host. A full queue
// drops new records and counts them.
//
// HostsResolver is a test hook: tests name their upstreams with it. No
// flag of the host agent sets it.
package egress
