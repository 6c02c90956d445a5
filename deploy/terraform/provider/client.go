package provider

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// Bounds on what the provider reads from the server: one JSON body, and
// the error body whose message becomes a diagnostic. A server sending
// more is refused, not buffered.
const (
	maxBodyBytes  = 8 << 20
	maxErrorBytes = 64 << 10
	// callTimeout bounds one API call.
	callTimeout = 60 * time.Second
)

// client is what every resource and data source shares: the admin API
// (gRPC, with the operator key) and the public REST API (with a tenant's
// API key). Either may be unconfigured; a resource that needs it says so
// when it is used, not when the provider is configured, so that a
// configuration using only one API needs only its settings.
type client struct {
	grpcAddr    string
	operatorKey string
	conn        *grpc.ClientConn // nil without grpc_addr

	restURL string // base URL, scheme and host:port, without a trailing /
	apiKey  string
	http    *http.Client
}

// endpoint is an address as the corral CLI takes it: host:port,
// https://host:port or http://host:port.
//   - https:// is TLS, verified against the system's roots or the CA given;
//   - http:// is plaintext, refused beyond loopback unless insecure;
//   - a bare address is TLS beyond loopback or whenever a CA is given, and
//     plaintext on loopback otherwise (corral dev).
//
// The rules are the CLI's (cmd/corral/clienttls.go), so that the settings
// in dev.env mean the same to both.
func endpoint(addr string, roots *x509.CertPool, insecureOK bool) (hostport string, cfg *tls.Config, err error) {
	scheme, hostport, ok := strings.Cut(addr, "://")
	if !ok {
		scheme, hostport = "", addr
	}
	hostport = strings.TrimSuffix(hostport, "/")
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", nil, fmt.Errorf("server address %q: want host:port, https://host:port or http://host:port", addr)
	}
	var useTLS bool
	switch scheme {
	case "https":
		useTLS = true
	case "http":
	case "":
		useTLS = roots != nil || !isLoopback(host)
	default:
		return "", nil, fmt.Errorf("server address %q: unknown scheme %s (https or http)", addr, scheme)
	}
	if !useTLS {
		if !insecureOK && !isLoopback(host) {
			return "", nil, fmt.Errorf("refusing to send credentials in plaintext to %s, which is not a loopback address: use https:// (with ca_file or ca_pem for a private CA), or set insecure = true", addr)
		}
		return hostport, nil, nil
	}
	return hostport, &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, RootCAs: roots}, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// caPool parses PEM certificates; empty input is nil (the system's roots).
func caPool(pem []byte, what string) (*x509.CertPool, error) {
	if len(pem) == 0 {
		return nil, nil
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", what)
	}
	return p, nil
}

// dialAdmin connects to the admin API at addr. grpc.NewClient connects
// lazily, so a configuration whose server does not exist yet still plans.
func dialAdmin(addr string, roots *x509.CertPool, insecureOK bool) (*grpc.ClientConn, error) {
	hostport, cfg, err := endpoint(addr, roots, insecureOK)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = &explainedTLS{TransportCredentials: credentials.NewTLS(cfg), addr: addr}
	}
	conn, err := grpc.NewClient(hostport, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("grpc_addr %s: %w", addr, err)
	}
	return conn, nil
}

// restClient is the HTTP client and base URL for the REST API at addr.
func restClient(addr string, roots *x509.CertPool, insecureOK bool) (*http.Client, string, error) {
	hostport, cfg, err := endpoint(addr, roots, insecureOK)
	if err != nil {
		return nil, "", err
	}
	base := "http://" + hostport
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // keys go to the server named, not through a proxy
	if cfg != nil {
		base = "https://" + hostport
		tr.TLSClientConfig = cfg
	}
	return &http.Client{Transport: tr, Timeout: callTimeout}, base, nil
}

// errNotConfigured is the answer while the provider's settings are not
// known (they come from resources not yet created).
var errNotConfigured = errors.New("the corral provider is not configured: its settings are not known yet (they depend on resources that do not exist before apply)")

// admin returns the admin API's clients and a context carrying the
// operator key, or an error saying what to configure.
func (c *client) admin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if c == nil {
		return nil, nil, errNotConfigured
	}
	if c.conn == nil {
		return nil, nil, errors.New("the provider has no admin API address: set grpc_addr (or $CORRAL_GRPC_ADDR)")
	}
	if c.operatorKey == "" {
		return nil, nil, errors.New("the provider has no operator key for the admin API: set operator_key (or $CORRAL_OPERATOR_KEY)")
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	return metadata.AppendToOutgoingContext(ctx, "x-api-key", c.operatorKey), cancel, nil
}

func (c *client) tenants() adminv1.TenantsServiceClient {
	return adminv1.NewTenantsServiceClient(c.conn)
}
func (c *client) hosts() adminv1.HostsServiceClient { return adminv1.NewHostsServiceClient(c.conn) }
func (c *client) cluster() adminv1.ClusterServiceClient {
	return adminv1.NewClusterServiceClient(c.conn)
}

// adminCall runs fn against the admin API and returns its error as an
// errdefs error carrying the API's message.
func adminCall[T any](ctx context.Context, c *client, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	ctx, cancel, err := c.admin(ctx)
	if err != nil {
		return zero, err
	}
	defer cancel()
	out, err := fn(ctx)
	if err != nil {
		return zero, errgrpc.FromStatus(err)
	}
	return out, nil
}

// rest sends a JSON request to the REST API and decodes a 2xx answer into
// out (when not nil). Any other answer is an errdefs error with the API's
// message; 404 is NotFound, which reads treat as "gone".
func (c *client) rest(ctx context.Context, method, path string, body, out any) error {
	if c == nil {
		return errNotConfigured
	}
	if c.http == nil {
		return errors.New("the provider has no REST API address: set url (or $CORRAL_URL)")
	}
	if c.apiKey == "" {
		return errors.New("the provider has no tenant API key for the REST API: set api_key (or $CORRAL_API_KEY)")
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.restURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("x-api-key", c.apiKey)
	req.Header.Set("accept", "application/json")
	if body != nil {
		req.Header.Set("content-type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if x := explainTLS(c.restURL, err); x != err {
			return x
		}
		return fmt.Errorf("asking %s: %w", c.restURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return restError(resp)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes+1))
	if err != nil {
		return fmt.Errorf("reading the answer of %s %s: %w", method, path, err)
	}
	if len(b) > maxBodyBytes {
		return fmt.Errorf("the answer of %s %s is larger than %d MiB", method, path, maxBodyBytes>>20)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decoding the answer of %s %s: %w", method, path, err)
	}
	return nil
}

// restError is a non-2xx answer as an errdefs error: its kind from the
// status, its message the API's error.message (bounded).
func restError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	var body struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := fmt.Sprintf("HTTP %d", resp.StatusCode)
	if json.Unmarshal(b, &body) == nil && body.Error.Message != "" {
		msg = oneLine(body.Error.Message, 1000)
	}
	kind := errdefs.Unknown
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		kind = errdefs.InvalidArgumentKind
	case http.StatusNotFound:
		kind = errdefs.NotFoundKind
	case http.StatusConflict:
		kind = errdefs.ConflictKind
	case http.StatusUnauthorized:
		kind = errdefs.UnauthenticatedKind
	case http.StatusForbidden:
		kind = errdefs.PermissionDeniedKind
	case http.StatusTooManyRequests:
		kind = errdefs.ResourceExhaustedKind
	case http.StatusServiceUnavailable:
		kind = errdefs.UnavailableKind
	}
	return &errdefs.Error{Kind: kind, Msg: msg}
}

// oneLine is s on one line, cut to n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// explainedTLS is TLS whose handshake errors say what to set; gRPC puts
// the handshake's error in the failed call's status.
type explainedTLS struct {
	credentials.TransportCredentials
	addr string
}

func (e *explainedTLS) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := e.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err != nil {
		err = explainTLS(e.addr, err)
	}
	return c, info, err
}

func (e *explainedTLS) Clone() credentials.TransportCredentials {
	return &explainedTLS{TransportCredentials: e.TransportCredentials.Clone(), addr: e.addr}
}

// explainTLS says what a failed verification of addr's certificate means
// (the CLI's words, with the provider's settings).
func explainTLS(addr string, err error) error {
	var unknown x509.UnknownAuthorityError
	var name x509.HostnameError
	var record tls.RecordHeaderError
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("verifying server %s: %w (give the CA that signed its certificate with ca_file, ca_pem or $%s)", addr, err, envTLSCA)
	case errors.As(err, &name):
		return fmt.Errorf("verifying server %s: %w (use a name or address its certificate carries)", addr, err)
	case errors.As(err, &record):
		return fmt.Errorf("server %s does not speak TLS: %w (a plaintext server on loopback: give http://%s)", addr, err, strings.TrimPrefix(addr, "https://"))
	}
	return err
}
