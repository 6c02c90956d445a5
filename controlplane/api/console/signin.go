package console

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"corral.dev/corral/internal/errdefs"
)

// The console's sign-in with OpenID Providers.
const (
	// ConfigPath lists the providers the sign-in form offers (GET, no
	// credentials: nothing in it is secret).
	ConfigPath = "/console/config.json"
	// TokenPath redeems a sign-in code for a token (POST, no credentials:
	// the code and its PKCE verifier are the proof).
	TokenPath = "/console/oidc/token"
	// MaxTokenRequestBytes bounds a TokenPath body: an issuer URL, a code,
	// a verifier and a redirect URI.
	MaxTokenRequestBytes = 4 << 10
)

const (
	maxCodeBytes        = 2048
	maxRedirectURIBytes = 2048
	// maxTokenResponseBytes bounds a provider's token response: the API
	// takes tokens of at most 8 KiB (auth.MaxCredentialBytes).
	maxTokenResponseBytes = 64 << 10
	// tokenTimeout bounds one token request to a provider.
	tokenTimeout = 10 * time.Second
	// maxExchanges bounds the sign-ins in flight on a node: each is a
	// request to a provider, and anyone may ask for one.
	maxExchanges = 16
)

// Provider is an OpenID Provider the sign-in offers: an issuer the server
// trusts that has a console client.
type Provider struct {
	Issuer string
	// ClientID is the console's public client at the provider.
	ClientID string
	// Scopes are the space-separated scopes the page asks for.
	Scopes string
	// Name labels the provider's button.
	Name string
}

// Endpoints are where a provider's OAuth flows go, from its discovery
// document; either may be empty.
type Endpoints struct {
	Authorization, Token string
}

// SignIn is what the console's sign-in needs of the server's
// authentication (the api package adapts auth.Authenticator): which
// providers to offer, where they are, and whether a token is good.
type SignIn interface {
	// Providers returns the providers to offer, in configuration order.
	Providers() []Provider
	// Endpoints returns the OAuth endpoints of the provider whose issuer
	// is iss: an error while the provider cannot be reached.
	Endpoints(ctx context.Context, iss string) (Endpoints, error)
	// Verify returns nil if the API accepts token as a bearer credential,
	// exactly as for an API request, and the API's refusal otherwise.
	Verify(ctx context.Context, token string) error
}

// signInHandler serves ConfigPath and TokenPath.
type signInHandler struct {
	signIn     SignIn
	client     *http.Client
	writeError func(http.ResponseWriter, *http.Request, error)
	log        *slog.Logger
	// slots holds a token for each exchange in flight (maxExchanges).
	slots chan struct{}
}

func newSignInHandler(opts Options) *signInHandler {
	return &signInHandler{
		signIn: opts.SignIn,
		client: &http.Client{
			Timeout: tokenTimeout,
			// A token endpoint that redirects is misconfigured: a code
			// is posted to the endpoint the provider published, nowhere
			// else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		writeError: opts.WriteError,
		log:        opts.Logger,
		slots:      make(chan struct{}, maxExchanges),
	}
}

// providerEntry is one provider in ConfigPath.
type providerEntry struct {
	Issuer   string `json:"issuer"`
	ClientID string `json:"client_id"`
	Scopes   string `json:"scopes"`
	Name     string `json:"name"`
	// AuthorizationEndpoint is where the page sends the browser, from the
	// provider's discovery document (so the page fetches nothing from the
	// provider); empty while the provider cannot be reached.
	AuthorizationEndpoint string `json:"authorization_endpoint"`
}

func (s *signInHandler) config(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Providers []providerEntry `json:"providers"`
	}{Providers: []providerEntry{}}
	if s.signIn != nil {
		for _, c := range s.signIn.Providers() {
			p := providerEntry{Issuer: c.Issuer, ClientID: c.ClientID, Scopes: c.Scopes, Name: c.Name}
			e, err := s.signIn.Endpoints(r.Context(), c.Issuer)
			switch {
			case err != nil:
				s.log.Warn("console sign-in: provider unavailable", "issuer", c.Issuer, "err", err)
			case e.Authorization == "" || e.Token == "":
				s.log.Warn("console sign-in: the provider publishes no authorization or token endpoint", "issuer", c.Issuer)
			default:
				p.AuthorizationEndpoint = e.Authorization
			}
			out.Providers = append(out.Providers, p)
		}
	}
	writeJSON(w, out)
}

// tokenRequest is a TokenPath body: what the provider sent the browser
// back with, and what the page kept for it.
type tokenRequest struct {
	Issuer       string `json:"issuer"`
	Code         string `json:"code"`
	CodeVerifier string `json:"code_verifier"`
	RedirectURI  string `json:"redirect_uri"`
}

// token redeems a sign-in code at the provider's token endpoint as the
// issuer's public client and answers the token the API accepts: the
// access token, or else the ID token.
func (s *signInHandler) token(w http.ResponseWriter, r *http.Request) {
	if s.signIn == nil {
		s.writeError(w, r, errdefs.NotFound("no route for %s %s", r.Method, r.URL.Path))
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		s.writeError(w, r, errdefs.InvalidArgument("a sign-in is sent as application/json"))
		return
	}
	var req tokenRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxTokenRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			s.writeError(w, r, errdefs.TooLarge("a sign-in is at most %d bytes", MaxTokenRequestBytes))
			return
		}
		s.writeError(w, r, errdefs.InvalidArgument("a sign-in is a JSON object of issuer, code, code_verifier and redirect_uri"))
		return
	}
	c, err := s.validate(r, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		s.writeError(w, r, errdefs.ResourceExhausted("too many sign-ins in progress: try again"))
		return
	}
	tok, err := s.exchange(r.Context(), c, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, struct {
		Token string `json:"token"`
	}{tok})
}

// validate returns the configuration of req's issuer, which must be one
// with a console client, matched exactly (the server posts codes to no
// other), and checks the rest of req.
func (s *signInHandler) validate(r *http.Request, req tokenRequest) (Provider, error) {
	var c Provider
	for _, p := range s.signIn.Providers() {
		if p.Issuer == req.Issuer {
			c = p
			break
		}
	}
	if c.Issuer == "" {
		return c, errdefs.InvalidArgument("issuer is not one of this console's sign-in providers")
	}
	if req.Code == "" || len(req.Code) > maxCodeBytes || strings.ContainsFunc(req.Code, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		return c, errdefs.InvalidArgument("code must be 1 to %d printable ASCII characters", maxCodeBytes)
	}
	if !codeVerifier(req.CodeVerifier) {
		return c, errdefs.InvalidArgument("code_verifier must be 43 to 128 of the characters A-Z, a-z, 0-9, '-', '.', '_' and '~' (RFC 7636)")
	}
	u, err := url.Parse(req.RedirectURI)
	if len(req.RedirectURI) > maxRedirectURIBytes || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" ||
		u.User != nil || u.Path != "/console/" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return c, errdefs.InvalidArgument("redirect_uri must be this console's address, <origin>/console/")
	}
	// A page elsewhere posting a code for this console is refused (it
	// could not have the verifier anyway). A browser may send "null" for
	// the console's own page, whose referrer policy is no-referrer (Fetch,
	// "append a request Origin header"): that tells nothing.
	if o := r.Header.Get("Origin"); o != "" && o != "null" && o != u.Scheme+"://"+u.Host {
		return c, errdefs.InvalidArgument("redirect_uri must be this console's address, <origin>/console/")
	}
	return c, nil
}

// codeVerifier reports whether v is a PKCE code verifier (RFC 7636 4.1).
func codeVerifier(v string) bool {
	if len(v) < 43 || len(v) > 128 {
		return false
	}
	for _, c := range []byte(v) {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
			return false
		}
	}
	return true
}

// exchange posts req's code to c's token endpoint (RFC 6749 4.1.3, as a
// public client: its client_id and the PKCE verifier, no secret) and
// returns the first of the tokens the API accepts. What the provider says
// when it refuses is logged, never returned: its text is not ours to show.
func (s *signInHandler) exchange(ctx context.Context, c Provider, req tokenRequest) (string, error) {
	unavailable := errdefs.Unavailable("the sign-in provider %s cannot be reached: try again later", c.Name)
	e, err := s.signIn.Endpoints(ctx, c.Issuer)
	if err != nil || e.Token == "" {
		s.log.Warn("console sign-in: no token endpoint", "issuer", c.Issuer, "err", err)
		return "", unavailable
	}
	ctx, cancel := context.WithTimeout(ctx, tokenTimeout)
	defer cancel()
	form := url.Values{
		"grant_type": {"authorization_code"}, "code": {req.Code}, "redirect_uri": {req.RedirectURI},
		"client_id": {c.ClientID}, "code_verifier": {req.CodeVerifier},
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, e.Token, strings.NewReader(form.Encode()))
	if err != nil {
		s.log.Warn("console sign-in: token request", "issuer", c.Issuer, "err", err)
		return "", unavailable
	}
	hreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	hreq.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(hreq)
	if err != nil {
		s.log.Warn("console sign-in: token request", "issuer", c.Issuer, "err", err)
		return "", unavailable
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponseBytes+1))
	if err != nil || len(b) > maxTokenResponseBytes {
		s.log.Warn("console sign-in: token response unreadable or too large", "issuer", c.Issuer, "status", resp.StatusCode, "err", err)
		return "", unavailable
	}
	var tr struct {
		AccessToken string `json:"access_token"`
		IDToken     string `json:"id_token"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	jsonErr := json.Unmarshal(b, &tr)
	if resp.StatusCode != http.StatusOK {
		s.log.Warn("console sign-in: the provider refused the code", "issuer", c.Issuer, "status", resp.StatusCode,
			"error", clip(tr.Error), "error_description", clip(tr.Description))
		if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnauthorized {
			// RFC 6749 5.2: invalid_grant (a used, expired or forged
			// code, a wrong verifier) and its kin.
			return "", errdefs.InvalidArgument("the sign-in provider did not accept the sign-in (its code may have expired or been used): sign in again")
		}
		return "", unavailable
	}
	if jsonErr != nil {
		s.log.Warn("console sign-in: token response is not JSON", "issuer", c.Issuer, "err", jsonErr)
		return "", unavailable
	}
	// Access tokens are what APIs take; an ID token is the fallback for
	// providers whose access tokens are opaque or meant for another
	// audience (its audience is the console's client id).
	last := errdefs.Unauthenticated("the sign-in provider returned no token")
	for _, tok := range []string{tr.AccessToken, tr.IDToken} {
		if tok == "" {
			continue
		}
		if err := s.signIn.Verify(ctx, tok); err != nil {
			last = err
			continue
		}
		return tok, nil
	}
	s.log.Info("console sign-in: no token of the provider's is accepted", "issuer", c.Issuer, "err", last)
	// The API's own refusal (audience, tenant, suspension): what the user
	// would read had they pasted the token.
	return "", last
}

// clip shortens what a provider said, for the log.
func clip(s string) string {
	if len(s) > 256 {
		s = s[:256]
	}
	return strings.ToValidUTF8(s, "?")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}
