package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/seal"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// argValue is the value of flag in args (the last one given).
func argValue(args []string, flag string) string {
	v := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			v = args[i+1]
		}
	}
	return v
}

// joinHost makes the cluster issue a host certificate, as a new host's
// agent does: a join token from `corral hosts token`, then Join over TLS
// pinned by the token. It returns the host's certificate and key.
func joinHost(t *testing.T, via *serverNode, hostID string) tls.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, corralBin, "hosts", "token", "--server", via.grpcAddr).Output()
	if err != nil {
		t.Fatalf("corral hosts token: %v", err)
	}
	tok, err := hostpki.ParseJoinToken(string(out))
	if err != nil {
		t.Fatal(err)
	}
	key, csr, err := hostpki.NewKeyAndCSR(hostID)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(via.hostAddr, grpc.WithTransportCredentials(credentials.NewTLS(hostpki.PinnedClientTLS(tok.CAPin))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pb.NewHostServiceClient(conn).Join(ctx, &pb.JoinRequest{Token: tok.Secret.Reveal(), HostId: hostID, CsrDer: csr})
	if err != nil {
		t.Fatalf("joining host %s: %v", hostID, err)
	}
	leaf, err := x509.ParseCertificate(resp.CertificateDer)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{resp.CertificateDer}, PrivateKey: key, Leaf: leaf}
}

// clusterState is what the attacks must not change: each node's applied
// index, members and leader.
func clusterState(t *testing.T, nodes []*serverNode) string {
	t.Helper()
	var b strings.Builder
	for _, n := range nodes {
		st, err := n.status(context.Background())
		if err != nil {
			t.Fatalf("status of %s: %v", n.id, err)
		}
		fmt.Fprintf(&b, "%s: applied %d, leader %s, members", n.id, st.GetAppliedIndex(), st.GetLeaderId())
		for _, m := range st.GetMembers() {
			fmt.Fprintf(&b, " %s@%s", m.GetNodeId(), m.GetRaftAddr())
		}
		b.WriteString("\n")
	}
	return b.String()
}

// dialStream is a Raft stream layer that dials with an attacker's TLS
// config (nil: plain TCP); it accepts nothing.
type dialStream struct {
	net.Listener
	tls *tls.Config
}

func (s *dialStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(addr))
	}
	return tls.DialWithDialer(d, "tcp", string(addr), s.tls)
}

// raftAttacks sends the Raft RPCs that would apply a command, add a voter
// and remove one (AppendEntries with a command or a configuration; a
// RequestVote with a higher term) to target with tc; each must fail.
func raftAttacks(t *testing.T, target string, tc *tls.Config, victim string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	trans := raft.NewNetworkTransport(&dialStream{Listener: ln, tls: tc}, 1, 5*time.Second, io.Discard)
	defer trans.Close()
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte(ln.Addr().String())}
	cmd, _ := json.Marshal(raftfsm.Command{Type: raftfsm.CmdSetQuota, Payload: json.RawMessage(`{"tenant":"tenant_victim","quota":{}}`)})
	join := raft.EncodeConfiguration(raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "intruder", Address: raft.ServerAddress(ln.Addr().String())}}})
	remove := raft.EncodeConfiguration(raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(victim), Address: raft.ServerAddress(target)}}})
	for name, entry := range map[string]*raft.Log{
		"apply":  {Index: 1 << 40, Term: 1 << 30, Type: raft.LogCommand, Data: cmd},
		"join":   {Index: 1 << 40, Term: 1 << 30, Type: raft.LogConfiguration, Data: join},
		"remove": {Index: 1 << 40, Term: 1 << 30, Type: raft.LogConfiguration, Data: remove},
	} {
		var resp raft.AppendEntriesResponse
		err := trans.AppendEntries("victim", raft.ServerAddress(target), &raft.AppendEntriesRequest{
			RPCHeader: hdr, Term: 1 << 30, PrevLogEntry: 0, PrevLogTerm: 0, Entries: []*raft.Log{entry}, LeaderCommitIndex: 1 << 40,
		}, &resp)
		if err == nil {
			t.Errorf("raft %s at %s was answered (success %v), want the connection refused", name, target, resp.Success)
		} else {
			t.Logf("raft %s at %s: %v", name, target, err)
		}
	}
	var vote raft.RequestVoteResponse
	if err := trans.RequestVote("victim", raft.ServerAddress(target), &raft.RequestVoteRequest{RPCHeader: hdr, Term: 1 << 30, LastLogIndex: 1 << 40, LastLogTerm: 1 << 30}, &vote); err == nil {
		t.Errorf("raft vote request at %s was answered (granted %v)", target, vote.Granted)
	} else {
		t.Logf("raft vote at %s: %v", target, err)
	}
}

// forwardAttacks posts apply, join and remove to a node's forwarding
// endpoint with client; each must fail before a handler acts.
func forwardAttacks(t *testing.T, scheme, addr string, client *http.Client, victim string) {
	t.Helper()
	cmd, _ := json.Marshal(raftfsm.Command{Type: raftfsm.CmdSetQuota, IdempotencyKey: "attack",
		Payload: json.RawMessage(`{"tenant":"tenant_victim","quota":{"sandboxes":0}}`)})
	for path, body := range map[string][]byte{
		"/v1/raft/apply":  cmd,
		"/v1/raft/join":   []byte(`{"id":"intruder","raft_addr":"127.0.0.1:1","http_addr":"127.0.0.1:2"}`),
		"/v1/raft/remove": []byte(fmt.Sprintf(`{"id":%q}`, victim)),
		"/v1/node/token":  []byte(`{"ttl_seconds":3600}`),
		"/v1/seal/rotate": []byte(`{}`),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, scheme+"://"+addr+path, bytes.NewReader(body))
		resp, err := client.Do(req)
		cancel()
		if err != nil {
			t.Logf("POST %s at %s: %v", path, addr, err)
			continue // refused in the handshake
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		t.Logf("POST %s at %s: %d %s", path, addr, resp.StatusCode, bytes.TrimSpace(b))
		if resp.StatusCode/100 == 2 {
			t.Errorf("POST %s at %s: %d %s, want refused", path, addr, resp.StatusCode, b)
		}
		if strings.Contains(string(b), "PRIVATE KEY") || strings.Contains(string(b), "corralnode1") {
			t.Errorf("POST %s at %s leaked a secret: %s", path, addr, b)
		}
	}
}

func TestClusterRefusesUnauthenticatedPeers(t *testing.T) {
	db := pgtest.New(t)
	nodes := startCluster(t, db)
	hostCert := joinHost(t, nodes[1], "host-a")
	sameApplied(t, nodes...)
	before := clusterState(t, nodes)
	membershipAudited(t, db, "n2", "n3")

	otherCA, err := hostpki.NewCA("another cluster's nodes CA")
	if err != nil {
		t.Fatal(err)
	}
	otherNode, err := otherCA.IssueNode("n1") // a node's name, another CA
	if err != nil {
		t.Fatal(err)
	}
	tlsWith := func(cert *tls.Certificate, serverName string) *tls.Config {
		c := &tls.Config{InsecureSkipVerify: true, ServerName: serverName, MinVersion: tls.VersionTLS12}
		if cert != nil {
			// Sent whatever CAs the server names (a client would otherwise
			// keep a certificate the server did not ask for).
			c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		return c
	}
	attackers := []struct {
		name   string
		scheme string
		tls    *tls.Config
	}{
		{"plain", "http", nil},
		{"TLS without a client certificate", "https", tlsWith(nil, hostpki.NodeServerName)},
		{"a node certificate from another CA", "https", tlsWith(&otherNode, hostpki.NodeServerName)},
		{"a host certificate from this cluster", "https", tlsWith(&hostCert, hostpki.NodeServerName)},
		// The join server name completes a handshake without a certificate,
		// and reaches the token exchange only.
		{"the join server name without a certificate", "https", tlsWith(nil, hostpki.NodeJoinServerName)},
		{"the join server name with a host certificate", "https", tlsWith(&hostCert, hostpki.NodeJoinServerName)},
	}
	for _, a := range attackers {
		t.Run(a.name, func(t *testing.T) {
			for i, n := range nodes {
				victim := nodes[(i+1)%len(nodes)].id
				raftAttacks(t, argValue(n.args, "--raft-addr"), a.tls, victim)
				client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: a.tls}}
				forwardAttacks(t, a.scheme, n.raftHTTP, client, victim)
				client.CloseIdleConnections()
			}
		})
	}

	// Nothing changed: the same applied index, leader and members everywhere.
	if after := clusterState(t, nodes); after != before {
		t.Fatalf("the cluster changed under the attacks:\nbefore:\n%safter:\n%s", before, after)
	}
	// And it still works for its own: a write through a follower, and an
	// operator's command with a node's own certificate.
	registerTestHosts(t, context.Background(), nodes[2], 1)
	ring, err := seal.Load(testSealKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := raftfsm.NewClient(nodes[0].dir, ring, nodes[1].raftHTTP)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if tok, err := c.IssueNodeToken(ctx, time.Minute); err != nil || !strings.HasPrefix(tok, "corralnode1.") {
		t.Fatalf("a node token through a node's certificate: %q %v", tok, err)
	}
}

// keyForms are the encodings of a private key that must not appear in any
// file: its DER (raw, base64 as JSON encodes bytes, hex) and its scalar.
func keyForms(t *testing.T, der []byte) map[string][]byte {
	t.Helper()
	key, err := x509.ParseECPrivateKey(der)
	if err != nil {
		t.Fatal(err)
	}
	d := key.D.FillBytes(make([]byte, 32))
	return map[string][]byte{
		"DER": der, "base64 DER": []byte(base64.StdEncoding.EncodeToString(der)), "hex DER": []byte(hex.EncodeToString(der)),
		"scalar": d, "base64 scalar": []byte(base64.StdEncoding.EncodeToString(d)), "hex scalar": []byte(hex.EncodeToString(d)),
	}
}

// latestSnapshotState reads the newest snapshot's FSM state in a node's
// data dir, if any.
func latestSnapshotState(dir string) (state map[string]json.RawMessage, name string) {
	ents, _ := os.ReadDir(filepath.Join(dir, "snapshots"))
	for i := len(ents) - 1; i >= 0; i-- {
		b, err := os.ReadFile(filepath.Join(dir, "snapshots", ents[i].Name(), "state.bin"))
		if err != nil {
			continue
		}
		if json.Unmarshal(b, &state) == nil {
			return state, ents[i].Name()
		}
	}
	return nil, ""
}

func TestRaftStateHoldsNoPlainSecrets(t *testing.T) {
	db := pgtest.New(t)
	// A snapshot after every write: the secrets reach them.
	nodes := startCluster(t, db, "--raft-snapshot-threshold", "1", "--raft-snapshot-interval", "100ms")
	joinHost(t, nodes[0], "host-a")
	joinHost(t, nodes[2], "host-b")
	registerTestHosts(t, context.Background(), nodes[1], 3) // more writes after the CA
	sameApplied(t, nodes...)

	// Every node's newest snapshot holds both CAs, their keys sealed.
	ring, err := seal.Load(testSealKey)
	if err != nil {
		t.Fatal(err)
	}
	var hostKey, nodeKey []byte
	var hostSealed []byte // as JSON carries it: the scan below must find it
	for _, n := range nodes {
		waitfor.State(t, 60*time.Second, n.id+" to snapshot the CAs and hosts", func() (bool, string) {
			st, name := latestSnapshotState(n.dir)
			var hosts map[string]json.RawMessage
			_ = json.Unmarshal(st["hosts"], &hosts)
			return st["host_ca"] != nil && st["node_ca"] != nil && len(hosts) == 3, "snapshot " + name
		})
		st, _ := latestSnapshotState(n.dir)
		var host, node struct {
			Key seal.Sealed `json:"key"`
		}
		if err := json.Unmarshal(st["host_ca"], &host); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(st["node_ca"], &node); err != nil {
			t.Fatal(err)
		}
		hostSealed = []byte(base64.StdEncoding.EncodeToString(host.Key.Data))
		if hostKey, err = ring.Open(raftfsm.SealHostCAKey, host.Key); err != nil {
			t.Fatalf("the seal key does not open %s's hosts' CA key: %v", n.id, err)
		}
		if nodeKey, err = ring.Open(raftfsm.SealNodeCAKey, node.Key); err != nil {
			t.Fatalf("the seal key does not open %s's nodes' CA key: %v", n.id, err)
		}
	}
	forms := map[string][]byte{}
	for k, v := range keyForms(t, hostKey) {
		forms["hosts' CA key "+k] = v
	}
	for k, v := range keyForms(t, nodeKey) {
		forms["nodes' CA key "+k] = v
	}
	forms["a PEM private key"] = []byte("PRIVATE KEY")

	// Stop the nodes so their stores are complete on disk, then read every
	// file of every data dir: Raft log, stable store, snapshots, the node's
	// own credentials.
	for _, n := range nodes {
		n.kill()
	}
	files := 0
	for _, n := range nodes {
		sawSealed := false
		err := filepath.WalkDir(n.dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files++
			sawSealed = sawSealed || bytes.Contains(b, hostSealed)
			for what, form := range forms {
				if bytes.Contains(b, form) {
					t.Errorf("%s holds %s", path, what)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !sawSealed {
			t.Errorf("no file of %s holds the sealed hosts' CA key: the scan missed where it lives", n.id)
		}
	}
	if files < 3*4 {
		t.Fatalf("read only %d files under the data dirs", files)
	}
	// The nodes' own keys are sealed too: the seal key opens them.
	for _, n := range nodes {
		b, err := os.ReadFile(filepath.Join(n.dir, "node", "key.sealed"))
		if err != nil {
			t.Fatal(err)
		}
		var s seal.Sealed
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		der, err := ring.Open(raftfsm.SealNodeKey, s)
		if err != nil {
			t.Fatalf("%s's sealed key: %v", n.id, err)
		}
		if _, err := x509.ParseECPrivateKey(der); err != nil {
			t.Fatal(err)
		}
	}
}

// membershipAudited waits until the cluster's audit log holds a successful
// join, and the certificate it began with, for each of the members named:
// membership changes are audited in the store, not only logged.
func membershipAudited(t *testing.T, db *pgtest.DB, members ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, m := range members {
		for _, action := range []string{"node.certificate", "node.join"} {
			waitfor.State(t, 30*time.Second, fmt.Sprintf("the audit log to record %s of %s", action, m), func() (bool, string) {
				var n int
				err := conn.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE tenant_id IS NULL AND action = $1 AND resource = $2 AND outcome = 'ok' AND principal <> ''`,
					action, "cluster/members/"+m).Scan(&n)
				if err != nil {
					t.Fatal(err)
				}
				return n > 0, fmt.Sprintf("%d records", n)
			})
		}
	}
}
