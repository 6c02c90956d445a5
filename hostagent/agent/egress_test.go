package agent_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/allowlist"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// fetch is run in the sandbox: HTTPS through the proxy to one name.
const fetch = `
import ssl, sys, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], context=ssl._create_unverified_context(), timeout=15)
    print("OK " + r.read().decode())
except Exception as e:
    print("ERR " + str(e))
`

// TestEgressThroughTheAgent: an ensure with allowed hosts gets a gVisor
// sandbox that reaches exactly those through the host's proxy, before and
// after the agent restarts; the heartbeats carry each attempt's audit
// record; a destroy removes the network.
func TestEgressThroughTheAgent(t *testing.T) {
	e := setup(t)
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
	e.wrap = func(driver.Driver) driver.Driver { return d }
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream") }))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	e.egress = agent.EgressConfig{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:   egress.HostsResolver{"allowed.test": {upAddr.Addr()}, "other.test": {upAddr.Addr()}},
	}
	r := e.start()
	ctx := t.Context()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1", Image: "localhost/corral/debian:bookworm-2", Tenant: "ten_1", AllowedHosts: []string{"allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	get := func(host string) string {
		t.Helper()
		out, res, err := execStream(t, c, "s1", "python3", "-c", fetch, fmt.Sprintf("https://%s:%d/", host, upAddr.Port()))
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v %+v", err, res)
		}
		return strings.TrimSpace(out)
	}
	if got := get("allowed.test"); got != "OK upstream" {
		t.Errorf("allowed host: %q", got)
	}
	if got := get("other.test"); !strings.Contains(got, "403") {
		t.Errorf("other host: %q", got)
	}
	// The records go out with the heartbeats. The proxy audits a
	// connection as it closes, which can be after the command returned:
	// once both are audited, the next heartbeat carries what the earlier
	// ones did not.
	waitAudited(t, r.a, 2)
	e.heartbeat(r)
	recs := e.ctl.Hosts()[hostID].Egress
	if len(recs) < 2 {
		t.Fatalf("egress records after both connections were audited: %v", recs)
	}
	byHost := map[string]*pb.EgressRecord{}
	for _, rec := range recs {
		byHost[rec.Host] = rec
	}
	if a := byHost["allowed.test"]; a == nil || !a.Allowed || a.Tenant != "ten_1" || a.SessionId != "s1" || a.BytesDown == 0 || a.StartedAt == nil {
		t.Errorf("allowed record: %v", a)
	}
	if o := byHost["other.test"]; o == nil || o.Allowed || o.Reason != "host not allowed" {
		t.Errorf("denied record: %v", o)
	}

	// After a restart the sandbox is still in its network, and the new
	// agent's proxy serves it.
	r.stop()
	e.start()
	c = e.sandboxClient()
	if got := get("allowed.test"); got != "OK upstream" {
		t.Errorf("allowed host after a restart: %q", got)
	}

	if err := e.ctl.Destroy(ctx, hostID, "s1"); err != nil {
		t.Fatal(err)
	}
	for _, p := range func() []string { s, p := egress.Namespaces("s1"); return []string{s, p} }() {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("namespace %s after destroy: %v", p, err)
		}
	}
}

// TestEgressRecordsHeldUntilAcked: with a control plane that acknowledges
// heartbeats, an egress record stays with the host until a heartbeat that
// carried it is acknowledged: an unacknowledged heartbeat, and one lost
// with its stream, lose nothing, the next ones carry the same record (same
// id); once acknowledged it is sent no more.
func TestEgressRecordsHeldUntilAcked(t *testing.T) {
	e := setup(t)
	e.ctl.SetEgressAcks(true)
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
	e.wrap = func(driver.Driver) driver.Driver { return d }
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream") }))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	e.egress = agent.EgressConfig{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:   egress.HostsResolver{"allowed.test": {upAddr.Addr()}},
	}
	r := e.start()
	ctx := t.Context()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1", Image: "localhost/corral/debian:bookworm-2", Tenant: "ten_1", AllowedHosts: []string{"allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	// The sandbox goes with the driver's sweep; its namespaces here.
	t.Cleanup(func() { egress.Remove(context.Background(), "s1") })
	out, res, err := execStream(t, e.sandboxClient(), "s1", "python3", "-c", fetch, fmt.Sprintf("https://allowed.test:%d/", upAddr.Port()))
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(out) != "OK upstream" {
		t.Fatalf("exec: %q %v %+v", out, err, res)
	}
	// The proxy audits the connection as it closes, which can be after
	// the command returned: once it has, the next heartbeat carries it.
	waitAudited(t, r.a, 1)
	first := e.heartbeat(r)
	if len(first.Egress) == 0 {
		t.Fatalf("heartbeat %d, after the connection was audited, carries no egress record", first.Seq)
	}
	id := first.Egress[0].Id
	if id == "" || first.Seq == 0 {
		t.Fatalf("record id %q in heartbeat %d", id, first.Seq)
	}
	carries := func(hb *pb.Heartbeat) bool {
		for _, rec := range hb.Egress {
			if rec.Id == id {
				return true
			}
		}
		return false
	}
	// Not acknowledged: the next heartbeat carries it again.
	if hb := e.heartbeat(r); !carries(hb) || hb.Seq <= first.Seq {
		t.Fatalf("heartbeat %d after an unacknowledged one (%d): %v", hb.Seq, first.Seq, hb.Egress)
	}

	// The stream breaks (the heartbeats sent on it are never
	// acknowledged); the first heartbeat on the next carries the record.
	e.srv.Stop()
	e.wait("disconnect", func(h hostctl.Host) bool { return !h.Connected })
	l, err := net.Listen("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := e.ctl.Serve(l)
	t.Cleanup(srv.Stop)
	before := e.ctl.Hosts()[hostID].Heartbeats
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	back := make(chan error, 1)
	go func() {
		back <- e.ctl.Wait(wctx, func(hs map[string]hostctl.Host) bool { return hs[hostID].Connected && hs[hostID].Heartbeats > before })
	}()
	for done := false; !done; {
		select {
		case e.reconnect <- e.clock.Now():
		case err := <-back:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		}
	}
	again := e.ctl.Hosts()[hostID].Last
	if !carries(again) {
		t.Fatalf("first heartbeat on the new stream: %v", again.Egress)
	}

	// Acknowledged: it goes no more. The ack crosses the heartbeats sent
	// after it (any number of them, on a loaded machine), so the test
	// waits until the agent has applied it; from then on no heartbeat
	// carries the record.
	if err := e.ctl.AckHeartbeat(ctx, hostID, again.Seq); err != nil {
		t.Fatal(err)
	}
	waitAcked(t, r.a, again.Seq)
	if hb := e.heartbeat(r); carries(hb) {
		t.Fatalf("heartbeat %d, after the ack of heartbeat %d, still carries the record", hb.Seq, again.Seq)
	}
}

// waitAudited waits until a's proxies have audited n connections, on the
// audit's signal.
func waitAudited(t *testing.T, a *agent.Agent, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		got, added := a.EgressAudited()
		if got >= n {
			return
		}
		select {
		case <-added:
		case <-ctx.Done():
			t.Fatalf("%d egress connections audited, want %d: %v", got, n, ctx.Err())
		}
	}
}

// waitAcked waits until a has applied the ack of heartbeat seq (or of a
// later one).
func waitAcked(t *testing.T, a *agent.Agent, seq uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		got, next := a.EgressAcked()
		if got >= seq {
			return
		}
		select {
		case <-next:
		case <-ctx.Done():
			t.Fatalf("the agent applied acks up to heartbeat %d, want %d: %v", got, seq, ctx.Err())
		}
	}
}

// TestUnrestrictedEgressThroughTheAgent: an ensure whose allowlist is
// unrestricted networking's ([allowlist.AnyName], as the control plane
// sends it for a tenant with the grant) gets a gVisor sandbox that
// reaches a name no allowlist lists, through the host's proxy, while a
// name resolving to a private address, the metadata address and an IP
// literal are still refused; every attempt is audited.
func TestUnrestrictedEgressThroughTheAgent(t *testing.T) {
	e := setup(t)
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
	e.wrap = func(driver.Driver) driver.Driver { return d }
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream") }))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	e.egress = agent.EgressConfig{
		// The upstream is on loopback, which the operator lists; the
		// private name's address is not listed.
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver: egress.HostsResolver{
			"unlisted.test": {upAddr.Addr()},
			"private.test":  {netip.MustParseAddr("10.1.2.3")},
			"metadata.test": {netip.MustParseAddr("169.254.169.254")},
		},
	}
	r := e.start()
	ctx := t.Context()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1", Image: "localhost/corral/debian:bookworm-2", Tenant: "ten_1", AllowedHosts: []string{allowlist.AnyName}}); err != nil {
		t.Fatal(err)
	}
	// The sandbox goes with the driver's sweep; its namespaces here.
	t.Cleanup(func() { egress.Remove(context.Background(), "s1") })
	c := e.sandboxClient()
	get := func(url string) string {
		t.Helper()
		out, res, err := execStream(t, c, "s1", "python3", "-c", fetch, url)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v %+v", err, res)
		}
		return strings.TrimSpace(out)
	}
	if got := get(fmt.Sprintf("https://unlisted.test:%d/", upAddr.Port())); got != "OK upstream" {
		t.Errorf("a name in no allowlist: %q", got)
	}
	for _, url := range []string{
		fmt.Sprintf("https://private.test:%d/", upAddr.Port()),
		"https://metadata.test/",
		fmt.Sprintf("https://%s/", upAddr), // an IP literal
	} {
		if got := get(url); !strings.Contains(got, "403") {
			t.Errorf("%s: %q, want the proxy's 403", url, got)
		}
	}
	// As in TestEgressThroughTheAgent: once the proxy has audited the
	// four, the next heartbeat carries the rest.
	waitAudited(t, r.a, 4)
	e.heartbeat(r)
	byHost := map[string]*pb.EgressRecord{}
	for _, rec := range e.ctl.Hosts()[hostID].Egress {
		byHost[rec.Host] = rec
	}
	if a := byHost["unlisted.test"]; a == nil || !a.Allowed || a.BytesDown == 0 {
		t.Errorf("allowed record: %v", a)
	}
	for _, h := range []string{"private.test", "metadata.test"} {
		if rec := byHost[h]; rec == nil || rec.Allowed || !strings.Contains(rec.Reason, "refused address") {
			t.Errorf("%s record: %v", h, rec)
		}
	}
	if rec := byHost["127.0.0.1"]; rec == nil || rec.Allowed || !strings.Contains(rec.Reason, "IP addresses are refused") {
		t.Errorf("IP literal record: %v", rec)
	}
}
