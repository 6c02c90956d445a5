// Package auth decides who is calling: it turns the credentials of a request
// (an API key in x-api-key or Authorization: Bearer, or an OIDC bearer token)
// into a Principal carried in the request's context, with the tenant the
// principal belongs to (none for fleet principals such as operators) and its
// roles from policy/. What the principal may do is package authz's question.
//
//	credentials ─┬─ sk-corral-… ─▶ API key: SHA-256 ─▶ authenticate_api_key() ─▶ cache (10s)
//	             └─ JWT ─────────▶ issuer by "iss" ─▶ go-oidc: signature (JWKS, refetched
//	                               on an unknown key id), issuer, audience, expiry
//	                               ─▶ tenant (claim or fixed) ─▶ roles (groups mapping)
//	─▶ Principal{Subject, Tenant, Roles} ─▶ ctx
//
// An environment key (the credential of a self-hosted environment's
// workers) is an API key with an environment: its principal carries
// EnvironmentID and no roles, and authz lets it call only a worker's
// routes.
//
// An issuer may also have a console client (console_client_id): the web
// console's sign-in offers it, through ConsoleIssuers and Endpoints (the
// provider's authorization and token endpoints, from the discovery
// document this package reads anyway), and the tokens that sign-in gets
// are verified here like any other before the page keeps one.
//
// Host agents authenticate with mutual TLS on their own listener; a host
// certificate never reaches this package and never authorizes an API call.
package auth
