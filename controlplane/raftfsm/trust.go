package raftfsm

import (
	"bytes"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/seal"
)

// The nodes' trust commands: the CA that signs node certificates, the
// one-time tokens new nodes join with, and resealing every sealed secret
// under the current seal key.
const (
	CmdSetNodeCA        CommandType = "set_node_ca"        // NodeCA: the first one set wins
	CmdAddNodeToken     CommandType = "add_node_token"     // AddJoinTokenPayload
	CmdConsumeNodeToken CommandType = "consume_node_token" // ConsumeNodeTokenPayload
	CmdReseal           CommandType = "reseal"             // ResealPayload
)

// The typed trust commands.
var (
	SetNodeCA        = Cmd[NodeCA, NodeCA]{CmdSetNodeCA}
	AddNodeToken     = Cmd[AddJoinTokenPayload, struct{}]{CmdAddNodeToken}
	ConsumeNodeToken = Cmd[ConsumeNodeTokenPayload, struct{}]{CmdConsumeNodeToken}
	Reseal           = Cmd[ResealPayload, ResealResult]{CmdReseal}
)

// The purposes secrets are sealed as (seal's additional data): an envelope
// opens only as what it was sealed as.
const (
	SealHostCAKey = "host-ca-key"
	SealNodeCAKey = "node-ca-key"
	SealNodeKey   = "node-key" // a node's own key, in its data directory
)

// NodeCA is the control-plane nodes' certificate authority: its
// certificate, PEM, and its key sealed. Any node signs a joining node's
// certificate with it. It is not the hosts' CA: a host certificate never
// verifies as a node's.
type NodeCA struct {
	CertPEM []byte      `json:"cert_pem"`
	Key     seal.Sealed `json:"key"`
}

// ConsumeNodeTokenPayload uses a node join token for a node. A token works
// once, before it expires (against Now, the proposer's clock), and only for
// a node id that is not a member: a token holder cannot take a member's
// identity.
type ConsumeNodeTokenPayload struct {
	Hash   string    `json:"hash"`
	NodeID string    `json:"node_id"`
	Now    time.Time `json:"now"`
}

// ResealPayload replaces sealed keys by the same keys sealed under another
// seal key. Each applies only to the CA whose certificate it names, so a
// reseal computed against a CA since replaced changes nothing.
type ResealPayload struct {
	HostCACert []byte       `json:"host_ca_cert,omitempty"`
	HostCAKey  *seal.Sealed `json:"host_ca_key,omitempty"`
	NodeCACert []byte       `json:"node_ca_cert,omitempty"`
	NodeCAKey  *seal.Sealed `json:"node_ca_key,omitempty"`
}

// ResealResult counts the secrets a reseal replaced.
type ResealResult struct {
	Resealed int    `json:"resealed"`
	KeyID    string `json:"key_id,omitempty"` // the seal key now in use; set by Node.RotateSeal
}

func applySetNodeCA(f *FSM, _ uint64, ca NodeCA) (NodeCA, error) {
	if f.s.NodeCA != nil {
		return *f.s.NodeCA, nil
	}
	if len(ca.CertPEM) == 0 || ca.Key.IsZero() {
		return NodeCA{}, errdefs.InvalidArgument("node CA needs a certificate and a sealed key")
	}
	f.s.NodeCA = &ca
	return ca, nil
}

func applyAddNodeToken(f *FSM, _ uint64, p AddJoinTokenPayload) (struct{}, error) {
	return struct{}{}, addToken(f.s.NodeTokens, p)
}

func applyConsumeNodeToken(f *FSM, _ uint64, p ConsumeNodeTokenPayload) (struct{}, error) {
	t, ok := f.s.NodeTokens[p.Hash]
	_, member := f.s.Members[p.NodeID]
	switch {
	case p.NodeID == "":
		return struct{}{}, errdefs.InvalidArgument("joining needs a node id")
	case !ok:
		return struct{}{}, errdefs.Unauthenticated("node join token unknown")
	case t.UsedBy != "":
		return struct{}{}, errdefs.Unauthenticated("node join token already used")
	case !p.Now.Before(t.Expires):
		return struct{}{}, errdefs.Unauthenticated("node join token expired")
	case member:
		return struct{}{}, errdefs.AlreadyExists("node %q is a member already; a node keeps its certificate in its data dir", p.NodeID)
	}
	t.UsedBy = p.NodeID
	f.s.NodeTokens[p.Hash] = t
	return struct{}{}, nil
}

func applyReseal(f *FSM, _ uint64, p ResealPayload) (ResealResult, error) {
	var r ResealResult
	if p.HostCAKey != nil && f.s.HostCA != nil && bytes.Equal(p.HostCACert, f.s.HostCA.CertPEM) {
		ca := *f.s.HostCA
		ca.Key = *p.HostCAKey
		f.s.HostCA = &ca
		r.Resealed++
	}
	if p.NodeCAKey != nil && f.s.NodeCA != nil && bytes.Equal(p.NodeCACert, f.s.NodeCA.CertPEM) {
		ca := *f.s.NodeCA
		ca.Key = *p.NodeCAKey
		f.s.NodeCA = &ca
		r.Resealed++
	}
	return r, nil
}

// NodeCA returns the nodes' CA, or nil before one is set.
func (v View) NodeCA() *NodeCA { return v.f.s.NodeCA }

// NodeToken returns a node join token's state by the hex SHA-256 of its
// secret.
func (v View) NodeToken(hash string) (JoinTokenState, bool) {
	t, ok := v.f.s.NodeTokens[hash]
	return t, ok
}
