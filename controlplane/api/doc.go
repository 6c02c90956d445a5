// Package api is the control plane's edge: the HTTP handler (health,
// readiness, the Managed Agents REST API of package publicapi behind
// Security.Authenticate), the gRPC admin services (cluster status; tenants,
// keys, quotas and the audit log; usage for billing), and the grpc-gateway
// that serves those admin services as REST (the usage export also as CSV,
// for a request that accepts text/csv: usage.go).
//
// The gateway does not call the services in process: it dials the node's own
// gRPC server over a loopback listener of its own (plaintext, while the public
// gRPC listener may serve TLS), so every admin call, whichever transport it
// arrived on, passes through the same interceptors (request id, logging, panic
// recovery, error translation; then authentication, the tenant's rate limit,
// authorization by authz.Methods, audit).
//
//	client ──HTTP──▶ Handler ─┬─ /healthz, /readyz
//	                          ├─ /console/ ─▶ the web console's static files (package console)
//	                          ├─ /v1/... ─▶ authenticate, rate limit ─▶ publicapi (rule per route)
//	                          └─ /admin/... ─▶ gateway ──gRPC (loopback)──┐
//	client ──gRPC──────────────────────────────────────────────────────────┴─▶ interceptors ─▶ services
//
// Every request body is capped by route before routing and authentication
// (limitBody): 413 in the error envelope, never read whole first. A file
// upload (POST /v1/files) has a cap of its own, the file limit plus its
// multipart framing; its handler streams the body to the blob store.
//
// Errors become statuses in one place: errdefs (kinds to gRPC codes and HTTP
// statuses); this package only applies it.
package api
