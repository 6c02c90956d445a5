// Package console is the web console the control plane serves at
// /console/: plain HTML, CSS and JavaScript embedded in the binary (no
// build step), which call the same APIs every other client does. Tenant
// users see agents, sessions with their live event stream, tool calls,
// pending confirmations (approved or denied from the page) and files,
// through /v1/; operators see hosts with their providers and health, pools
// and labels, sandboxes, drains in progress and cluster members, through
// the admin gateway at /admin/.
//
//	browser ─GET /console/…─▶ Handler (static files, security headers)
//	   │
//	   └─fetch, Authorization: Bearer <key>─▶ /v1/… (tenant) and /admin/v1/… (operator)
//
// The server holds no console session: the page keeps the credential the
// user signs in with (an API key, an OIDC token the user obtained, or one
// the sign-in below got) in sessionStorage and sends it as a header, never
// in a URL. What the page shows is what that credential may read; a
// refusal is shown as its text.
//
// Users sign in with an OpenID Provider through the issuers that have a
// console client (auth.IssuerConfig's console_client_id), which SignIn
// lists: the authorization-code flow with PKCE (RFC 7636), the page a
// public client.
//
//	page ─GET /console/config.json─▶ issuers with a console client, and each
//	   │                             one's authorization endpoint (discovery,
//	   │                             done by the server)
//	   ├─ state, code_verifier (crypto.getRandomValues) ─▶ sessionStorage
//	   ├─ navigate ─▶ authorization_endpoint?response_type=code&client_id&
//	   │              redirect_uri=<origin>/console/&scope&state&
//	   │              code_challenge=S256(verifier)     (the user signs in)
//	   ◀─ /console/?code&state ── provider; the page checks state, then
//	   │  history.replaceState drops code and state from the address
//	   └─POST /console/oidc/token {issuer, code, code_verifier, redirect_uri}
//	        ─▶ the issuer, matched exactly among the configured ones
//	        ─▶ its token_endpoint (grant_type=authorization_code, client_id,
//	           code_verifier; no secret; 10s, no redirects followed)
//	        ─▶ the access token, else the ID token, that the API accepts
//	           (SignIn.Verify: the API's own check, package api adapting
//	           auth.Authenticator: audience, tenant, roles) ─▶ {token} ─▶ page
//
// The page connects to this origin only: it navigates to the provider but
// never fetches from it, so connect-src stays 'self'. Redeeming the code on
// the server keeps it so (a provider's token endpoint would need its
// origin in connect-src, and CORS), checks the token exactly as the API
// will before the page keeps it, and puts the provider's refusals in the
// server's log rather than the page (the browser reads only the server's
// own words). The token endpoint takes no credentials, so it is bounded:
// a few KiB of body, only configured issuers (no posting codes anywhere
// else), one upstream request per call, and a few at a time per node.
//
// Every response carries a Content-Security-Policy that allows scripts,
// styles and connections to this origin only (no inline script or style),
// and refuses framing. The script writes tenant data into the page only
// as text (textContent), never as markup.
package console
