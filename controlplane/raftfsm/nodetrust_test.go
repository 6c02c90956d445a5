package raftfsm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/seal"
	"corral.dev/corral/internal/waitfor"
)

// startErr starts cfg expecting a refusal of kind and text, and checks the
// refused first start left no Raft state behind.
func startErr(t *testing.T, cfg Config, kind errdefs.Kind, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err == nil {
		n.Shutdown()
		t.Fatalf("%s started, want a refusal (%s)", cfg.ID, text)
	}
	if errdefs.KindOf(err) != kind || !strings.Contains(err.Error(), text) {
		t.Fatalf("starting %s: %v (kind %v), want kind %v containing %q", cfg.ID, err, errdefs.KindOf(err), kind, text)
	}
	if Initialized(cfg.DataDir) {
		t.Fatalf("the refused start of %s left Raft state behind", cfg.ID)
	}
}

func TestNodeJoinToken(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts raft nodes on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var skew atomic.Int64 // added to the members' clock
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }

	cfg1 := testConfig("n1", t.TempDir())
	cfg1.Bootstrap, cfg1.Now = true, clock
	n1 := startNode(t, cfg1)
	leaderOf(t, n1)
	if _, err := os.Stat(filepath.Join(cfg1.DataDir, genSealKeyFile)); err != nil {
		t.Fatalf("a bootstrap node without a seal key file generates one in its data dir: %v", err)
	}
	issue := func(ttl time.Duration) logging.Secret {
		t.Helper()
		tok, err := n1.IssueNodeToken(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if tok.CAPin != n1.NodeCAPin() {
			t.Fatalf("token pins %s, the nodes' CA is %s", tok.CAPin, n1.NodeCAPin())
		}
		return logging.Secret(tok.Reveal())
	}
	joiner := func(id string, tok logging.Secret) Config {
		cfg := testConfig(id, t.TempDir())
		cfg.Join, cfg.NodeJoinToken, cfg.Seal, cfg.Now = n1.HTTPAddr(), tok, n1.Keyring(), clock
		return cfg
	}

	tok := issue(time.Minute)
	cfg2 := joiner("n2", tok)
	n2 := startNode(t, cfg2)

	// The token worked once.
	startErr(t, joiner("n3", tok), errdefs.UnauthenticatedKind, "node join token already used")
	// No token, a host's token, an unknown secret, a wrong pin.
	startErr(t, joiner("n3", ""), errdefs.InvalidArgumentKind, "one-time node join token")
	hostTok, err := hostpki.NewJoinToken(mustCA(t))
	if err != nil {
		t.Fatal(err)
	}
	startErr(t, joiner("n3", logging.Secret(hostTok.Reveal())), errdefs.InvalidArgumentKind, "node join token: want corralnode1")
	parsed, _ := hostpki.ParseNodeJoinToken(issue(time.Minute).Reveal())
	forged := hostpki.NodeJoinToken{Secret: "not-the-secret", CAPin: parsed.CAPin}
	startErr(t, joiner("n3", logging.Secret(forged.Reveal())), errdefs.UnauthenticatedKind, "node join token unknown")
	otherPin := hostpki.NodeJoinToken{Secret: parsed.Secret, CAPin: strings.Repeat("0", 64)}
	startErr(t, joiner("n3", logging.Secret(otherPin.Reveal())), errdefs.UnauthenticatedKind, "not a member of the cluster the join token names")
	// A member's id is not for the taking, even with a good token.
	startErr(t, joiner("n2", logging.Secret(parsed.Reveal())), errdefs.AlreadyExistsKind, `node "n2" is a member already`)
	// Expired: the members' clock moves past the token's lifetime.
	late := issue(time.Minute)
	skew.Store(int64(2 * time.Minute))
	startErr(t, joiner("n3", late), errdefs.UnauthenticatedKind, "node join token expired")
	skew.Store(0)

	n3 := startNode(t, joiner("n3", issue(time.Minute)))
	leader := leaderOf(t, n1, n2, n3)
	if servers, err := leader.Members(); err != nil || len(servers) != 3 {
		t.Fatalf("members %v %v", servers, err)
	}

	// A joined node restarts without a token, from its certificate.
	if err := n2.Shutdown(); err != nil {
		t.Fatal(err)
	}
	cfg2.RaftAddr, cfg2.HTTPAddr, cfg2.Join, cfg2.NodeJoinToken = n2.RaftAddr(), n2.HTTPAddr(), "", ""
	n2 = startNode(t, cfg2)
	leaderOf(t, n1, n2, n3)
	registerHosts(t, ctx, n2, 1) // writes forwarded by the restarted node
	waitfor.Cond(t, 20*time.Second, "n2 to catch up", func() bool { return n2.AppliedIndex() >= n1.AppliedIndex() })
}

func mustCA(t *testing.T) *hostpki.CA {
	t.Helper()
	ca, err := hostpki.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// keyLine is the first key of a seal key file.
func keyLine(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	t.Fatalf("%s holds no key", path)
	return ""
}

func TestSealRotation(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts raft nodes on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	keyFile := filepath.Join(t.TempDir(), "seal.key")
	oldID, err := seal.Create(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg1 := testConfig("n1", t.TempDir())
	cfg1.Bootstrap, cfg1.SealKeyFile = true, keyFile
	n1 := startNode(t, cfg1)
	leaderOf(t, n1)
	cfg2 := testConfig("n2", t.TempDir())
	joinVia(t, n1, &cfg2)
	cfg2.Seal, cfg2.SealKeyFile = nil, keyFile
	n2 := startNode(t, cfg2)
	leaderOf(t, n1, n2)

	// A hosts' CA, sealed as the hosts' service seals it.
	hostCA := mustCA(t)
	der, err := hostCA.MarshalKey()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := n1.Keyring().Seal(SealHostCAKey, der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(ctx, n1, SetHostCA, "", HostCA{CertPEM: hostpki.CertPEM(hostCA.Cert.Raw), Key: sealed}); err != nil {
		t.Fatal(err)
	}
	keyIDs := func(n *Node) (host, node string) {
		n.Read(func(v View) {
			if v.HostCA() != nil && v.NodeCA() != nil {
				host, node = v.HostCA().Key.KeyID, v.NodeCA().Key.KeyID
			}
		})
		return host, node
	}
	waitfor.Cond(t, 20*time.Second, "n2 to apply the hosts' CA", func() bool { h, _ := keyIDs(n2); return h != "" })
	if h, nd := keyIDs(n2); h != oldID || nd != oldID {
		t.Fatalf("secrets sealed under %s and %s, want %s", h, nd, oldID)
	}

	// The operator puts a new key first in the file (every node reads the
	// same file here, as after copying it), then rotates through a follower.
	newID, err := seal.AddKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	res, err := n2.RotateSeal(ctx)
	if err != nil || res.Resealed != 2 || res.KeyID != newID {
		t.Fatalf("rotate: %+v %v, want 2 secrets under %s", res, err, newID)
	}
	for _, n := range []*Node{n1, n2} {
		waitfor.Cond(t, 20*time.Second, n.ID()+" to apply the reseal", func() bool {
			h, nd := keyIDs(n)
			return h == newID && nd == newID
		})
	}

	// n1 reseals its own key at its next start, while the old key is still
	// in the file; after that the old key can go.
	for _, n := range []*Node{n1, n2} {
		if err := n.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	cfg1.RaftAddr, cfg1.HTTPAddr, cfg1.Bootstrap = n1.RaftAddr(), n1.HTTPAddr(), false
	cfg2.RaftAddr, cfg2.HTTPAddr, cfg2.Join = n2.RaftAddr(), n2.HTTPAddr(), ""
	n1 = startNode(t, cfg1)
	if err := n1.Shutdown(); err != nil {
		t.Fatal(err)
	}
	line := keyLine(t, keyFile)
	if err := os.WriteFile(keyFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n1, n2 = startNode(t, cfg1), startNode(t, cfg2)
	leaderOf(t, n1, n2)
	for _, n := range []*Node{n1, n2} {
		if _, _, err := n.nodeCA(); err != nil {
			t.Fatalf("%s opening the nodes' CA under the new key only: %v", n.ID(), err)
		}
	}
	// A node that joins meanwhile needs the new key.
	cfg3 := testConfig("n3", t.TempDir())
	joinVia(t, n1, &cfg3)
	wrongFile := filepath.Join(t.TempDir(), "wrong.key")
	if _, err := seal.Create(wrongFile); err != nil {
		t.Fatal(err)
	}
	cfg3.Seal, cfg3.SealKeyFile = nil, wrongFile
	startErr(t, cfg3, errdefs.FailedPreconditionKind, "cannot unseal node CA: wrong seal key")

	// A member restarted with the wrong key fails clearly.
	if err := n2.Shutdown(); err != nil {
		t.Fatal(err)
	}
	cfg2.SealKeyFile = wrongFile
	ctx2, cancel2 := context.WithTimeout(ctx, 20*time.Second)
	defer cancel2()
	if n, err := Start(ctx2, cfg2); err == nil || !strings.Contains(err.Error(), "wrong seal key") {
		if n != nil {
			n.Shutdown()
		}
		t.Fatalf("a restart with the wrong seal key: %v, want wrong seal key", err)
	}
}
