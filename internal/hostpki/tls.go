package hostpki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"corral.dev/corral/internal/errdefs"
)

// LeaderMetadataKey is the gRPC trailer in which a control-plane node that
// does not lead refuses a host's Connect and names the leader's HostService
// address, when it knows it.
const LeaderMetadataKey = "corral-leader"

func pool(ca *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca)
	return p
}

// ServerTLS is the config of a server whose clients must present a
// certificate from ca. When clientName is not empty, the client certificate
// must also carry that name (the host agent accepts only the control plane).
// With optionalClient the handshake also admits clients without a
// certificate (the control plane's Join); handlers then check PeerName.
func ServerTLS(ca *x509.Certificate, cert tls.Certificate, clientName string, optionalClient bool) *tls.Config {
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool(ca),
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	if optionalClient {
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	if clientName != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 {
				if optionalClient {
					return nil
				}
				return errors.New("no verified client certificate")
			}
			if got := cs.VerifiedChains[0][0].Subject.CommonName; got != clientName {
				return fmt.Errorf("client certificate is for %q, want %q", got, clientName)
			}
			return nil
		}
	}
	return cfg
}

// ClientTLS is the config of a client that presents cert (if not nil) and
// trusts only servers named serverName with a certificate from ca.
func ClientTLS(ca *x509.Certificate, cert *tls.Certificate, serverName string) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    pool(ca),
		ServerName: serverName,
	}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// PinnedClientTLS is the config a host uses to Join: it has no CA yet, so it
// accepts the control plane only if the chain the server sends contains a CA
// whose pin matches the join token's, and that CA signed the leaf for
// ControlPlaneName.
func PinnedClientTLS(caPin string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by the pin check below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := verifyPinned(raw, caPin, ControlPlaneName, "the control plane's CA")
			return err
		},
	}
}

// verifyPinned checks a peer's chain against a join token's CA pin: the
// chain must hold a CA whose pin is caPin, and that CA must have signed
// the leaf for dnsName as a server. It returns the leaf; what names the
// CA (for the error) is whose.
func verifyPinned(raw [][]byte, caPin, dnsName, whose string) (*x509.Certificate, error) {
	if len(raw) == 0 {
		return nil, errors.New("the peer sent no certificate")
	}
	var ca *x509.Certificate
	for _, der := range raw[1:] {
		if Pin(der) == caPin {
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return nil, err
			}
			ca = c
		}
	}
	if ca == nil {
		return nil, fmt.Errorf("%s does not match the join token's pin", whose)
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return nil, err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(ca), DNSName: dnsName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, err
	}
	return leaf, nil
}

// PeerName returns the name in the verified client certificate of a gRPC
// call, or an error of kind unauthenticated.
func PeerName(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", errdefs.Unauthenticated("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", errdefs.Unauthenticated("a client certificate from the control plane's CA is required")
	}
	return info.State.VerifiedChains[0][0].Subject.CommonName, nil
}
