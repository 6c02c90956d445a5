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
// user signs in with (an API key, or an OIDC token the user obtained) in
// sessionStorage and sends it as a header, never in a URL. What the page
// shows is what that credential may read; a refusal is shown as its text.
//
// Every response carries a Content-Security-Policy that allows scripts,
// styles and connections to this origin only (no inline script or style),
// and refuses framing. The script writes tenant data into the page only
// as text (textContent), never as markup.
package console
