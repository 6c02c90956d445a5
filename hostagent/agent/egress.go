package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// EgressConfig is the host's egress policy (package egress): what every
// sandbox ensured with allowed hosts gets besides its allowlist.
type EgressConfig struct {
	// AllowCIDRs are private, loopback or link-local prefixes the proxies
	// may dial after all (--egress-allow-cidr: an internal mirror).
	AllowCIDRs []netip.Prefix
	// Per sandbox: concurrent connections, bytes over its life, bytes per
	// second (zero: the egress package's defaults).
	MaxConns       int
	MaxBytes       int64
	BytesPerSecond int
	// UpstreamRoots verify the upstreams the proxies terminate TLS toward
	// (the hosts of the sandboxes' environment_variable credentials): the
	// host's system roots plus --egress-upstream-ca (nil: the system
	// roots alone).
	UpstreamRoots *x509.CertPool
	// Resolver replaces the host's resolver: a test hook
	// (egress.HostsResolver); no flag sets it.
	Resolver egress.Resolver
}

// maxEgressPerHeartbeat bounds the records one heartbeat carries.
const maxEgressPerHeartbeat = 512

// maxUnacked bounds the heartbeats remembered while their acks are due.
// Forgetting the oldest loses nothing: its records are the oldest held,
// so every later heartbeat carried them too, and that one's ack covers
// them.
const maxUnacked = 64

// networks are the sandboxes' egress networks, by key, and the audit
// queue their proxies fill.
type networks struct {
	audit *egress.Audit
	// ca mints the certificates of the proxies' credential injection; it
	// is made at agent start and kept in memory only. bundle is its PEM
	// bundle (with the host's roots), staged into sandboxes that hold
	// credentials.
	ca     *egress.CA
	bundle []byte

	// mu guards byKey.
	mu    sync.Mutex
	byKey map[string]*egress.Network

	// sentMu guards seq, sent, acked and ackedCh.
	sentMu sync.Mutex
	// seq is the last heartbeat's number.
	seq uint64
	// sent are the heartbeats that carried egress and await their ack,
	// oldest first.
	sent []sentEgress
	// acked is the highest seq an ack named; ackedCh is closed and
	// replaced at every ack. Tests wait on them (export_test.go): an ack
	// crosses the heartbeats sent after it, so no heartbeat tells when
	// the agent applied it.
	acked   uint64
	ackedCh chan struct{}
}

// sentEgress is a heartbeat that carried egress: Ack(mark) once the
// control plane acknowledges seq.
type sentEgress struct {
	seq  uint64
	mark egress.Mark
}

func newNetworks() (*networks, error) {
	ca, err := egress.NewCA()
	if err != nil {
		return nil, fmt.Errorf("making the egress CA: %w", err)
	}
	return &networks{audit: egress.NewAudit(0), ca: ca, bundle: ca.Bundle(), byKey: map[string]*egress.Network{}, ackedCh: make(chan struct{})}, nil
}

// openNetwork makes (fresh) or reopens (after the agent restarted: the
// namespaces are there, the proxy is not) key's egress network.
func (a *Agent) openNetwork(ctx context.Context, key, tenant string, hosts []string, fresh bool) (*egress.Network, error) {
	allow, err := egress.ParseAllowlist(hosts)
	if err != nil {
		return nil, errdefs.InvalidArgument("ensure %s: %v", key, err)
	}
	cfg := a.egressConfig(tenant, key, allow)
	var n *egress.Network
	if fresh {
		n, err = egress.Setup(ctx, key, cfg)
	} else {
		n, err = egress.Reopen(key, cfg)
	}
	if err != nil {
		return nil, err
	}
	a.nets.mu.Lock()
	old := a.nets.byKey[key]
	a.nets.byKey[key] = n
	a.nets.mu.Unlock()
	if old != nil {
		old.Proxy().Close()
	}
	return n, nil
}

// closeNetwork stops key's proxy and removes its namespaces (after its
// sandbox is gone).
func (a *Agent) closeNetwork(ctx context.Context, key string) {
	a.nets.mu.Lock()
	n := a.nets.byKey[key]
	delete(a.nets.byKey, key)
	a.nets.mu.Unlock()
	var err error
	if n != nil {
		err = n.Close(ctx)
	} else {
		err = egress.Remove(ctx, key)
	}
	if err != nil {
		a.log.Warn("removing an egress network failed", "session_id", key, "err", err)
	}
}

// removeStrayNetwork removes the egress namespaces of a key the agent
// holds no sandbox and no network for (a sandbox it reaped or a leftover
// of a crash); a key it holds keeps them.
func (a *Agent) removeStrayNetwork(ctx context.Context, key string) {
	a.mu.Lock()
	b := a.boxes[key]
	a.mu.Unlock()
	a.nets.mu.Lock()
	n := a.nets.byKey[key]
	a.nets.mu.Unlock()
	if b != nil || n != nil {
		return
	}
	if err := egress.Remove(ctx, key); err != nil {
		a.log.Warn("removing a stray egress network failed", "session_id", key, "err", err)
	}
}

// closeNetworks stops every proxy (the agent is closing); the namespaces
// stay for the sandboxes, which outlive the agent.
func (a *Agent) closeNetworks() {
	a.nets.mu.Lock()
	defer a.nets.mu.Unlock()
	for k, n := range a.nets.byKey {
		n.Proxy().Close()
		delete(a.nets.byKey, k)
	}
}

// withEgress puts spec's sandbox in network n: its namespace, and the
// proxy variables added to its environment.
func withEgress(env map[string]string, n *egress.Network) map[string]string {
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, n.Env())
	return out
}

// egressRecords numbers a heartbeat and takes the egress it carries.
// With acks (the control plane acknowledges heartbeats) it carries the
// oldest records still held, which stay held until an ack covers them: a
// heartbeat lost with its stream loses nothing, the next one carries the
// same records again. Without (an older control plane) the records are
// drained as they are sent.
func (a *Agent) egressRecords(acks bool) (seq uint64, out []*pb.EgressRecord, dropped int64) {
	n := a.nets
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	n.seq++
	var recs []egress.Record
	if acks {
		var m egress.Mark
		recs, dropped, m = n.audit.Pending(maxEgressPerHeartbeat)
		if len(recs) > 0 || dropped > 0 {
			if len(n.sent) == maxUnacked {
				n.sent = append(n.sent[:0], n.sent[1:]...)
			}
			n.sent = append(n.sent, sentEgress{seq: n.seq, mark: m})
		}
	} else {
		recs, dropped = n.audit.Drain(maxEgressPerHeartbeat)
	}
	out = make([]*pb.EgressRecord, 0, len(recs))
	for _, r := range recs {
		out = append(out, &pb.EgressRecord{
			Id: r.ID, Tenant: r.Tenant, SessionId: r.Session, Host: r.Host, Port: int32(r.Port), Address: r.Address,
			Allowed: r.Allowed, Reason: r.Reason, BytesUp: r.BytesUp, BytesDown: r.BytesDown,
			StartedAt: timestamppb.New(r.Start), EndedAt: timestamppb.New(r.End), CredentialInjected: r.Injected,
		})
	}
	return n.seq, out, dropped
}

// ackEgress forgets the egress of the heartbeats up to seq: the control
// plane has stored it (HeartbeatAck).
func (a *Agent) ackEgress(seq uint64) {
	n := a.nets
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	n.acked = max(n.acked, seq)
	close(n.ackedCh)
	n.ackedCh = make(chan struct{})
	i := 0
	for i < len(n.sent) && n.sent[i].seq <= seq {
		i++
	}
	if i == 0 {
		return
	}
	n.audit.Ack(n.sent[i-1].mark)
	n.sent = append(n.sent[:0], n.sent[i:]...)
}

// caBundlePath is where a sandbox holding credentials finds the egress
// CA's bundle, relative to its uploads (the control plane reserves the
// directory: no file resource mounts there).
const caBundlePath = ".corral/ca-bundle.pem"

// SyncEgressSecrets gives the sandbox's proxy the session's credentials,
// kept in memory with the proxy only, after staging the CA bundle the
// sandbox needs to trust the proxy's certificates.
func (s *sandboxServer) SyncEgressSecrets(ctx context.Context, req *pb.SyncEgressSecretsRequest) (*pb.SyncEgressSecretsResponse, error) {
	if len(req.Secrets) > egress.MaxCredentials {
		return nil, errdefs.InvalidArgument("at most %d egress secrets (got %d)", egress.MaxCredentials, len(req.Secrets))
	}
	creds := make([]egress.Credential, 0, len(req.Secrets))
	for i, sec := range req.Secrets {
		hosts, err := egress.ParseAllowlist(sec.AllowedHosts)
		if err != nil {
			return nil, errdefs.InvalidArgument("egress secret %d: allowed_hosts: %v", i, err)
		}
		c := egress.Credential{Placeholder: sec.Placeholder, Value: logging.Secret(sec.Value), Hosts: hosts}
		if err := egress.CheckCredential(c); err != nil {
			return nil, errdefs.InvalidArgument("egress secret %d: %v", i, err)
		}
		creds = append(creds, c)
	}
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return nil, err
	}
	defer done()
	s.a.nets.mu.Lock()
	n := s.a.nets.byKey[req.Key]
	s.a.nets.mu.Unlock()
	if n == nil {
		if len(creds) == 0 {
			return &pb.SyncEgressSecretsResponse{}, nil
		}
		return nil, errdefs.FailedPrecondition("sandbox %s has no egress network (its environment allows no hosts), so no credential can be injected", req.Key)
	}
	if len(creds) == 0 {
		return &pb.SyncEgressSecretsResponse{}, n.Proxy().SetCredentials(nil)
	}
	dirs, err := sessionDirs(sb)
	if err != nil {
		return nil, err
	}
	if err := s.a.stageBundle(req.Key, dirs); err != nil {
		return nil, fmt.Errorf("staging the egress CA bundle of %s: %w", req.Key, err)
	}
	if err := n.Proxy().SetCredentials(creds); err != nil {
		return nil, errdefs.InvalidArgument("%v", err)
	}
	return &pb.SyncEgressSecretsResponse{CaBundlePath: caBundlePath}, nil
}

// stageBundle writes the CA bundle into key's uploads (read-only in the
// sandbox, root's, 0444), unless it holds this agent's bundle already.
func (a *Agent) stageBundle(key string, dirs driver.Dirs) error {
	defer a.uploads.lock(key)()
	dst := filepath.Join(dirs.Uploads, filepath.FromSlash(caBundlePath))
	if b, err := os.ReadFile(dst); err == nil && bytes.Equal(b, a.nets.bundle) {
		return nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := ensureStaging(dirs); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dirs.Staging, "ca-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	_, err = tmp.Write(a.nets.bundle)
	if err == nil {
		err = tmp.Chmod(0o444)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(dirs.Uploads)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(filepath.Dir(caBundlePath), 0o755); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
