package raftfsm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/seal"
)

// A new node's first start trades its one-time token for a certificate:
//
//	new node                                         any member
//	 │ TLS, server name corral-node-join, member's CA pinned by the token ─▶ │
//	 │ POST /v1/node/join {token, node id, CSR}                       │ sign CSR (nodes' CA, unsealed)
//	 │                                                                 │ consume token (Raft; once, unexpired,
//	 │                                                                 │   for a node id that is no member)
//	 │ ◀──────────────────────────────── node certificate + CA ─────── │
//	 │ mutual TLS from here on: POST /v1/raft/join, Raft               │
//
// The join server name's handshake needs no client certificate and reaches
// nothing but that one route.

// maxJoinBody bounds a token exchange's request.
const maxJoinBody = 64 << 10

type nodeJoinRequest struct {
	Token  string `json:"token"`
	NodeID string `json:"node_id"`
	CSR    []byte `json:"csr_der"`
}

type nodeJoinResponse struct {
	CertDER []byte `json:"certificate_der"`
	CADER   []byte `json:"ca_certificate_der"`
	// CAKey is the nodes' CA key as Raft holds it, sealed: the newcomer
	// checks that its seal key opens it before it joins Raft.
	CAKey seal.Sealed `json:"ca_key"`
}

// loadOrMakeCreds finds this node's TLS identity: in its data directory, or
// new for a bootstrap, or through the token exchange for a first join.
func (n *Node) loadOrMakeCreds(ctx context.Context, fresh bool) (*creds, error) {
	c, ok, err := loadCreds(n.cfg.DataDir, n.ring, n.cfg.ID, true)
	switch {
	case err != nil:
		return nil, err
	case ok:
		return c, nil
	case n.cfg.Bootstrap && fresh:
		return bootstrapCreds(n.cfg.DataDir, n.ring, n.cfg.ID)
	case n.cfg.Join != "" && fresh:
		if n.cfg.NodeJoinToken == "" {
			return nil, errdefs.InvalidArgument("node %s joins with a one-time node join token (--node-join-token or $CORRAL_NODE_JOIN_TOKEN; `corral admin node-token` on a member mints one)", n.cfg.ID)
		}
		return n.joinExchange(ctx)
	}
	return nil, errdefs.FailedPrecondition("%s holds Raft state but no node certificate (%s)", n.cfg.DataDir, credsDir(n.cfg.DataDir))
}

// pinError is a member that is not of the cluster the token names.
type pinError struct{ err error }

func (e *pinError) Error() string { return e.err.Error() }

// joinExchange trades the join token for this node's certificate at
// cfg.Join, retrying while the cluster has no leader, until ctx ends.
func (n *Node) joinExchange(ctx context.Context) (*creds, error) {
	tok, err := hostpki.ParseNodeJoinToken(n.cfg.NodeJoinToken.Reveal())
	if err != nil {
		return nil, err
	}
	key, csr, err := hostpki.NewNodeKeyAndCSR(n.cfg.ID)
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(nodeJoinRequest{Token: tok.Secret.Reveal(), NodeID: n.cfg.ID, CSR: csr})
	tc := hostpki.PinnedNodeClientTLS(tok.CAPin)
	verify := tc.VerifyPeerCertificate
	tc.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		if err := verify(raw, chains); err != nil {
			return &pinError{err}
		}
		return nil
	}
	client := &http.Client{Timeout: n.cfg.ApplyTimeout + 5*time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer client.CloseIdleConnections()
	for {
		var resp nodeJoinResponse
		err := postJSON(ctx, client, n.cfg.Join, "/v1/node/join", body, &resp)
		if pe := (*pinError)(nil); errors.As(err, &pe) {
			return nil, errdefs.Unauthenticated("%s is not a member of the cluster the join token names: %v", n.cfg.Join, pe.err)
		}
		if err == nil {
			return n.acceptJoin(tok, key, resp)
		}
		if !retryable(err) {
			return nil, fmt.Errorf("trading the node join token at %s: %w", n.cfg.Join, err)
		}
		if werr := pause(ctx); werr != nil {
			return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "trading the node join token at %s: %v", n.cfg.Join, werr)
		}
	}
}

// acceptJoin checks the certificate a member issued and stores it.
func (n *Node) acceptJoin(tok hostpki.NodeJoinToken, key *ecdsa.PrivateKey, resp nodeJoinResponse) (*creds, error) {
	if hostpki.Pin(resp.CADER) != tok.CAPin {
		return nil, errdefs.Unauthenticated("the member answered with a CA other than the token's")
	}
	der, err := n.ring.Open(SealNodeCAKey, resp.CAKey)
	if err != nil {
		return nil, fmt.Errorf("cannot unseal node CA: %w (every node needs the cluster's seal key file)", err)
	}
	clear(der)
	ca, err := x509.ParseCertificate(resp.CADER)
	if err != nil {
		return nil, err
	}
	cert, err := hostpki.NodeCertificate(resp.CertDER, resp.CADER, key)
	if err != nil {
		return nil, err
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: certPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("the certificate the member issued: %w", err)
	}
	if id, err := hostpki.NodeID(cert.Leaf); err != nil || id != n.cfg.ID {
		return nil, errdefs.Unauthenticated("the member issued a certificate for another node (%q)", id)
	}
	if pub, ok := cert.Leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errdefs.Unauthenticated("the member issued a certificate for another key")
	}
	if err := writeCreds(n.cfg.DataDir, n.ring, cert, resp.CADER); err != nil {
		return nil, fmt.Errorf("storing this node's certificate: %w", err)
	}
	n.log.Info("node certificate received; later starts need no join token", "creds_dir", credsDir(n.cfg.DataDir), "node_ca_pin", tok.CAPin)
	return &creds{ca: ca, cert: cert, id: n.cfg.ID}, nil
}

// nodeJoinHandler serves connections made for the join server name: the token
// exchange, and nothing else.
func (n *Node) nodeJoinHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/node/join" {
			n.writeErr(w, errNoNodeCert)
			return
		}
		var req nodeJoinRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJoinBody)).Decode(&req); err != nil {
			n.writeErr(w, errdefs.InvalidArgument("decoding the join request: %v", err))
			return
		}
		resp, err := n.admitNode(r.Context(), req)
		n.audit("join-token", "node.certificate", err, "member_id", req.NodeID, "remote_addr", r.RemoteAddr)
		if err != nil {
			n.writeErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
}

// admitNode signs a joining node's CSR once its token is consumed through
// Raft. A bad CSR is refused before the token is spent.
func (n *Node) admitNode(ctx context.Context, req nodeJoinRequest) (nodeJoinResponse, error) {
	if req.Token == "" || len(req.Token) > 128 {
		return nodeJoinResponse{}, errdefs.Unauthenticated("a node join token is required")
	}
	ca, sealed, err := n.nodeCA()
	if err != nil {
		return nodeJoinResponse{}, err
	}
	der, err := ca.SignNode(req.CSR, req.NodeID, 0)
	if err != nil {
		return nodeJoinResponse{}, err
	}
	// No idempotency key: a retried exchange finds the token used.
	p := ConsumeNodeTokenPayload{Hash: hostpki.TokenHash(logging.Secret(req.Token)), NodeID: req.NodeID, Now: n.cfg.Now()}
	if _, err := Apply(ctx, n, ConsumeNodeToken, "", p); err != nil {
		return nodeJoinResponse{}, err
	}
	return nodeJoinResponse{CertDER: der, CADER: ca.Cert.Raw, CAKey: sealed}, nil
}

// nodeCA unseals the nodes' CA from the replicated state; it returns the
// sealed key too.
func (n *Node) nodeCA() (*hostpki.CA, seal.Sealed, error) {
	var have *NodeCA
	n.fsm.Read(func(v View) {
		if c := v.NodeCA(); c != nil {
			cp := *c
			have = &cp
		}
	})
	if have == nil {
		return nil, seal.Sealed{}, errdefs.Unavailable("the cluster has no node CA yet")
	}
	der, err := n.ring.Open(SealNodeCAKey, have.Key)
	if err != nil {
		return nil, seal.Sealed{}, fmt.Errorf("cannot unseal node CA: %w", err)
	}
	defer clear(der)
	ca, err := hostpki.LoadCA(have.CertPEM, der)
	return ca, have.Key, err
}

// commitNodeCA puts a bootstrap node's CA (its key sealed) into Raft, once,
// and then forgets the copy in the data directory.
func (n *Node) commitNodeCA(ctx context.Context) error {
	path := filepath.Join(credsDir(n.cfg.DataDir), caKeyFile)
	sealed, err := readSealed(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var have bool
	n.fsm.Read(func(v View) { have = v.NodeCA() != nil })
	if !have {
		ca := NodeCA{CertPEM: hostpki.CertPEM(n.creds.ca.Raw), Key: sealed}
		if _, err := Apply(ctx, n, SetNodeCA, "node-ca/"+hostpki.Pin(n.creds.ca.Raw), ca); err != nil {
			if ctx.Err() == nil {
				n.log.Warn("committing the nodes' CA", "err", err)
			}
			return fmt.Errorf("committing the nodes' CA: %w", err)
		}
	}
	return os.Remove(path)
}

// IssueNodeToken makes a one-time node join token valid for ttl and records
// its hash through Raft.
func (n *Node) IssueNodeToken(ctx context.Context, ttl time.Duration) (hostpki.NodeJoinToken, error) {
	if ttl <= 0 {
		return hostpki.NodeJoinToken{}, errdefs.InvalidArgument("a node join token needs a positive lifetime")
	}
	tok, err := hostpki.NewNodeJoinToken(n.creds.ca)
	if err != nil {
		return hostpki.NodeJoinToken{}, err
	}
	now := n.cfg.Now()
	p := AddJoinTokenPayload{Hash: hostpki.TokenHash(tok.Secret), Expires: now.Add(ttl), Now: now}
	if _, err := Apply(ctx, n, AddNodeToken, "node-token/"+p.Hash, p); err != nil {
		return hostpki.NodeJoinToken{}, err
	}
	return tok, nil
}

// RotateSeal reseals every secret in Raft under the seal keyring's current
// (first) key, read from the file again, in one Raft command, and this
// node's own key file too. Every node must hold that key before: a node
// without it can no longer open the secrets. Other nodes reseal their own
// key file at their next start.
func (n *Node) RotateSeal(ctx context.Context) (ResealResult, error) {
	if err := n.ring.Reload(); err != nil {
		return ResealResult{}, err
	}
	var host *HostCA
	var node *NodeCA
	n.fsm.Read(func(v View) {
		if c := v.HostCA(); c != nil {
			cp := *c
			host = &cp
		}
		if c := v.NodeCA(); c != nil {
			cp := *c
			node = &cp
		}
	})
	var p ResealPayload
	if host != nil {
		s, err := n.reseal(SealHostCAKey, host.Key)
		if err != nil {
			return ResealResult{}, fmt.Errorf("cannot unseal host CA: %w", err)
		}
		p.HostCACert, p.HostCAKey = host.CertPEM, &s
	}
	if node != nil {
		s, err := n.reseal(SealNodeCAKey, node.Key)
		if err != nil {
			return ResealResult{}, fmt.Errorf("cannot unseal node CA: %w", err)
		}
		p.NodeCACert, p.NodeCAKey = node.CertPEM, &s
	}
	r, err := Apply(ctx, n, Reseal, Key("reseal"), p)
	if err != nil {
		return ResealResult{}, err
	}
	if err := writeSealedKey(filepath.Join(credsDir(n.cfg.DataDir), keyFile), n.ring, SealNodeKey,
		func() ([]byte, error) { return marshalKey(n.creds.cert.PrivateKey) }); err != nil {
		return ResealResult{}, fmt.Errorf("resealing this node's key: %w", err)
	}
	r.KeyID = n.ring.CurrentID()
	return r, nil
}

func (n *Node) reseal(purpose string, s seal.Sealed) (seal.Sealed, error) {
	der, err := n.ring.Open(purpose, s)
	if err != nil {
		return seal.Sealed{}, err
	}
	defer clear(der)
	return n.ring.Seal(purpose, der)
}

// Keyring is the node's seal keyring: the hosts' service seals the hosts'
// CA key with it.
func (n *Node) Keyring() *seal.Keyring { return n.ring }

// NodeCAPin is the hex SHA-256 of the nodes' CA certificate.
func (n *Node) NodeCAPin() string { return hostpki.Pin(n.creds.ca.Raw) }

type tokenRequest struct {
	TTLSeconds int64 `json:"ttl_seconds"`
}

type tokenResponse struct {
	Token string `json:"token"`
	CAPin string `json:"ca_pin"`
}

// operatorRoutes are the operators' commands run on a node with its own
// certificate (`corral admin node-token`, `corral admin seal rotate`).
func (n *Node) operatorRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/node/token", func(w http.ResponseWriter, r *http.Request) {
		var req tokenRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&req); err != nil {
			n.writeErr(w, errdefs.InvalidArgument("decoding the token request: %v", err))
			return
		}
		tok, err := n.IssueNodeToken(r.Context(), time.Duration(req.TTLSeconds)*time.Second)
		n.audit(n.callerOf(r.Context()), "node.issue_token", err, "ttl_seconds", req.TTLSeconds, "ca_pin", tok.CAPin)
		if err != nil {
			n.writeErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(tokenResponse{Token: tok.Reveal(), CAPin: tok.CAPin})
	})
	mux.HandleFunc("POST /v1/seal/rotate", func(w http.ResponseWriter, r *http.Request) {
		res, err := n.RotateSeal(r.Context())
		n.audit(n.callerOf(r.Context()), "seal.rotate", err, "seal_key_id", res.KeyID, "resealed", res.Resealed)
		if err != nil {
			n.writeErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
}

// AuditEvent is a trust or membership change made through a node's
// forwarding endpoint, for the cluster's audit log (Config.Audit).
type AuditEvent struct {
	Caller  string // the caller's verified node identity ("node:<id>"), or "join-token"
	Action  string // node.join, node.remove, node.certificate, node.issue_token, seal.rotate
	Target  string // the member it concerns, when one does
	Outcome string // "ok" or "error"
}

// audit records a trust or membership change: who (the caller's verified
// node identity, or "join-token"), what, and how it ended; as a log line,
// and to Config.Audit when set (the server's audit log). attrs are
// key-value pairs for the log line; "member_id" also names the target.
func (n *Node) audit(caller, action string, err error, attrs ...any) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
		attrs = append(attrs, "err", err.Error())
	}
	n.log.Info("audit", append([]any{"audit", true, "action", action, "outcome", outcome, "caller", caller}, attrs...)...)
	if n.cfg.Audit == nil {
		return
	}
	ev := AuditEvent{Caller: caller, Action: action, Outcome: outcome}
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == "member_id" {
			ev.Target, _ = attrs[i+1].(string)
		}
	}
	n.cfg.Audit(ev)
}

// Client makes the operators' node commands: it speaks to a node's
// forwarding endpoint with the certificate of a node, read from that
// node's data directory (so it runs on a node, with its seal key).
type Client struct {
	http *http.Client
	addr string
}

// NewClient reads the node credentials in dataDir, opened with ring, for
// calls to addr (a node's forwarding endpoint, --raft-http-addr).
func NewClient(dataDir string, ring *seal.Keyring, addr string) (*Client, error) {
	c, ok, err := loadCreds(dataDir, ring, "", false)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errdefs.NotFound("no node certificate in %s (--data-dir of a node)", credsDir(dataDir))
	}
	return &Client{addr: addr, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: hostpki.NodeClientTLS(c.ca, c.cert)}}}, nil
}

// IssueNodeToken asks the node for a node join token valid for ttl.
func (c *Client) IssueNodeToken(ctx context.Context, ttl time.Duration) (string, error) {
	body, _ := json.Marshal(tokenRequest{TTLSeconds: int64(ttl / time.Second)})
	var resp tokenResponse
	if err := postJSON(ctx, c.http, c.addr, "/v1/node/token", body, &resp); err != nil {
		return "", err
	}
	return resp.Token, nil
}

// RotateSeal asks the node to reseal the cluster's secrets under its seal
// keyring's first key.
func (c *Client) RotateSeal(ctx context.Context) (ResealResult, error) {
	var resp ResealResult
	err := postJSON(ctx, c.http, c.addr, "/v1/seal/rotate", []byte("{}"), &resp)
	return resp, err
}

// postJSON posts body to https://addr/path and decodes a 2xx reply into
// out; a failure is the wire error's kind, network failures Unavailable.
func postJSON(ctx context.Context, client *http.Client, addr, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return errdefs.InvalidArgument("calling %s: %v", addr, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var pe *pinError
		if errors.As(err, &pe) {
			return pe
		}
		return errdefs.Wrap(errdefs.UnavailableKind, err, "calling %s", addr)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
			return errdefs.Wrap(errdefs.UnavailableKind, err, "decoding reply from %s", addr)
		}
		return nil
	}
	var we wireError
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&we); err != nil {
		return errdefs.Unavailable("calling %s: status %d", addr, resp.StatusCode)
	}
	return &errdefs.Error{Kind: we.Kind, Msg: we.Msg}
}
