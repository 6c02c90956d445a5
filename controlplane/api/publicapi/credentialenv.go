package publicapi

// environment_variable credentials: a secret the session's sandbox holds
// only as a placeholder in the variable secret_name; the host's egress
// proxy substitutes it in the header values of requests to
// networking.allowed_hosts (the only injection location corral enforces).

import (
	"encoding/json"
	"strings"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// Bounds of an environment_variable credential, as the Managed Agents API
// has them.
const (
	maxSecretName      = 128
	maxCredentialHosts = 16
)

// envVariable is an environment_variable auth object in a request.
// SecretValue is the secret: it goes to the store and nowhere else.
type envVariable struct {
	Type              *string         `json:"type"`
	SecretName        json.RawMessage `json:"secret_name"`
	SecretValue       *string         `json:"secret_value"`
	Networking        json.RawMessage `json:"networking"`
	InjectionLocation json.RawMessage `json:"injection_location"`
}

// envAuth is an environment_variable auth object as responses carry it.
type envAuth struct {
	Type              string            `json:"type"`
	SecretName        string            `json:"secret_name"`
	Networking        limitedNetworking `json:"networking"`
	InjectionLocation injectionLocation `json:"injection_location"`
}

type limitedNetworking struct {
	Type         string   `json:"type"`
	AllowedHosts []string `json:"allowed_hosts"`
}

type injectionLocation struct {
	Body   bool `json:"body"`
	Header bool `json:"header"`
}

func envOut(c store.Credential) envAuth {
	hosts := c.AllowedHosts
	if hosts == nil {
		hosts = []string{}
	}
	return envAuth{Type: c.AuthType, SecretName: c.SecretName, Networking: limitedNetworking{Type: "limited", AllowedHosts: hosts},
		InjectionLocation: injectionLocation{Header: true}}
}

// reservedVariables are the variables a credential may not set: the
// sandbox's own (the proxy's, the CA bundle's, the shell's basics), which
// a placeholder would break.
var reservedVariables = []string{
	"PATH", "HOME", "USER", "SHELL", "PWD", "HOSTNAME", "TERM", "LANG",
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO",
}

// secretName checks an environment variable's name: a letter or
// underscore, then letters, digits and underscores; not one the sandbox
// relies on.
func secretName(raw json.RawMessage) (string, error) {
	const path = "auth.secret_name"
	if !present(raw) || isNull(raw) {
		return "", errdefs.InvalidArgument("%s is required", path)
	}
	name, err := stringField(raw, path)
	if err != nil {
		return "", err
	}
	if err := checkLen(name, path, 1, maxSecretName); err != nil {
		return "", err
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return "", errdefs.InvalidArgument("%s: %q is not an environment variable name (a letter or _, then letters, digits and _)", path, textcut.Prefix(name, 64))
		}
	}
	up := strings.ToUpper(name)
	for _, r := range reservedVariables {
		if up == r {
			return "", errdefs.InvalidArgument("%s: %s is set by the sandbox itself; name the variable otherwise", path, name)
		}
	}
	if strings.HasPrefix(up, "LD_") {
		return "", errdefs.InvalidArgument("%s: LD_ variables steer the dynamic linker; name the variable otherwise", path)
	}
	return name, nil
}

// credentialNetworking reads networking: limited, with 1 to 16 allowed
// hosts, checked as an environment's allowed_hosts are.
func credentialNetworking(raw json.RawMessage) ([]string, error) {
	const path = "auth.networking"
	if !present(raw) || isNull(raw) {
		return nil, errdefs.InvalidArgument("%s is required", path)
	}
	var n struct {
		Type         *string   `json:"type"`
		AllowedHosts *[]string `json:"allowed_hosts"`
	}
	if err := field(raw, path, &n); err != nil {
		return nil, err
	}
	if n.Type == nil {
		return nil, errdefs.InvalidArgument("%s.type is required", path)
	}
	switch *n.Type {
	case "unrestricted":
		return nil, refuse("credential.auth.networking unrestricted", path+".type")
	case "limited":
	default:
		return nil, enumError(path+".type", *n.Type, []string{"unrestricted", "limited"})
	}
	if n.AllowedHosts == nil || len(*n.AllowedHosts) == 0 {
		return nil, errdefs.InvalidArgument("%s.allowed_hosts: list at least one host the secret is sent to", path)
	}
	if len(*n.AllowedHosts) > maxCredentialHosts {
		return nil, errdefs.InvalidArgument("%s.allowed_hosts has %d entries; at most %d are allowed", path, len(*n.AllowedHosts), maxCredentialHosts)
	}
	return hostPatterns(*n.AllowedHosts, path+".allowed_hosts")
}

// checkInjection reads injection_location: the secret is substituted in
// header values only, so body true is refused, and so is header false
// (the secret would be substituted nowhere).
func checkInjection(raw json.RawMessage) error {
	const path = "auth.injection_location"
	if !present(raw) || isNull(raw) {
		return nil
	}
	var in struct {
		Body   *bool `json:"body"`
		Header *bool `json:"header"`
	}
	if err := field(raw, path, &in); err != nil {
		return err
	}
	if in.Body != nil && *in.Body {
		return refuse("credential.auth.injection_location.body", path+".body")
	}
	if in.Header != nil && !*in.Header {
		return errdefs.InvalidArgument("%s.header: false would substitute the secret nowhere (header values are the only place it is substituted); send true or leave it out", path)
	}
	return nil
}

// decodeEnvCreate reads an environment_variable create's auth into c and
// secrets.
func decodeEnvCreate(raw json.RawMessage, c *store.Credential, secrets *store.CredentialSecrets) error {
	var a envVariable
	if err := field(raw, "auth", &a); err != nil {
		return err
	}
	var err error
	if c.SecretName, err = secretName(a.SecretName); err != nil {
		return err
	}
	if secrets.Token, err = bearerToken(a.SecretValue, "auth.secret_value"); err != nil {
		return err
	}
	if c.AllowedHosts, err = credentialNetworking(a.Networking); err != nil {
		return err
	}
	return checkInjection(a.InjectionLocation)
}

// applyEnvUpdate applies an environment_variable update's auth to cur: a
// new secret, networking (replacing the hosts whole), an injection
// location. The variable's name cannot change.
func applyEnvUpdate(raw json.RawMessage, cur store.Credential) (store.Credential, store.SecretsPatch, error) {
	var patch store.SecretsPatch
	var a envVariable
	if err := field(raw, "auth", &a); err != nil {
		return cur, patch, err
	}
	if present(a.SecretName) {
		return cur, patch, errdefs.InvalidArgument("auth.secret_name cannot change after a credential is created; archive it and create another")
	}
	if a.SecretValue != nil {
		s, err := bearerToken(a.SecretValue, "auth.secret_value")
		if err != nil {
			return cur, patch, err
		}
		patch.Token = &s
	}
	if present(a.Networking) {
		hosts, err := credentialNetworking(a.Networking)
		if err != nil {
			return cur, patch, err
		}
		cur.AllowedHosts = hosts
	}
	return cur, patch, checkInjection(a.InjectionLocation)
}
