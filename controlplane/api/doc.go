// Package api is the control plane's edge: the HTTP handler (health, readiness,
// and, in later releases, the Managed Agents REST API with SSE), the gRPC admin
// services, and the grpc-gateway that serves those admin services as REST.
//
// The gateway does not call the services in process: it dials the node's own
// gRPC listener over loopback, so every admin call, whichever transport it
// arrived on, passes through the same interceptors (request id, logging, panic
// recovery, error translation).
//
//	client ──HTTP──▶ Handler ─┬─ /healthz, /readyz
//	                          └─ /admin/... ─▶ gateway ──gRPC (loopback)──┐
//	client ──gRPC──────────────────────────────────────────────────────────┴─▶ interceptors ─▶ services
//
// Errors become statuses in one place: errdefs (kinds to gRPC codes and HTTP
// statuses); this package only applies it.
package api
