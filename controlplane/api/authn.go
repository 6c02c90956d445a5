package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"corral.dev/corral/controlplane/audit"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/authz"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Security is what both transports need to authenticate, rate-limit,
// authorize and audit a request.
type Security struct {
	Authn  *auth.Authenticator
	Authz  *authz.Authorizer
	Quotas *quota.Quotas
	// Audit receives records; nil records nothing.
	Audit *audit.Log
}

// maxCredentialHeader bounds the headers that carry credentials; the HTTP
// server bounds all headers together (1 MiB, Go's default).
const maxCredentialHeader = auth.MaxCredentialBytes + len("Bearer ")

// Authenticate is the HTTP middleware in front of the public API: it
// authenticates the request, puts the principal (and its tenant) in the
// context and takes one token from the tenant's rate bucket. Authorization
// is per route (publicapi.Guard).
func (s *Security) Authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Get("Authorization")) > maxCredentialHeader || len(r.Header.Get("X-Api-Key")) > maxCredentialHeader {
			s.refuse(r.Context(), "", r.Method+" "+r.URL.Path, hostOf(r.RemoteAddr))
			WriteError(w, r, errdefs.Unauthenticated("credential longer than %d bytes", auth.MaxCredentialBytes))
			return
		}
		p, err := s.Authn.Authenticate(r.Context(), auth.FromHeader(r.Header))
		if err != nil {
			s.refuse(r.Context(), outcomeOf(err), r.Method+" "+r.URL.Path, hostOf(r.RemoteAddr))
			WriteError(w, r, err)
			return
		}
		ctx := auth.With(r.Context(), p)
		if !p.Fleet() {
			if err := s.Quotas.Allow(ctx, p.Tenant); err != nil {
				WriteError(w, r, err)
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// refuse audits a request refused before any principal was known.
func (s *Security) refuse(ctx context.Context, outcome, resource, remote string) {
	if s.Audit == nil {
		return
	}
	if outcome == "" {
		outcome = audit.Unauthenticated
	}
	s.Audit.Record(store.AuditRecord{
		Principal:  "anonymous",
		Resource:   resource,
		Outcome:    outcome,
		RemoteAddr: remote,
		RequestID:  RequestID(ctx),
	})
}

func outcomeOf(err error) string {
	if errdefs.KindOf(err) == errdefs.PermissionDeniedKind {
		return audit.Denied
	}
	return audit.Unauthenticated
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// tenantScoped is any admin request that names a tenant.
type tenantScoped interface{ GetTenantId() string }

// unarySecurity authenticates every admin call (x-api-key or authorization
// metadata, which the gateway forwards), rate-limits tenant principals,
// authorizes through authz.Methods (closed by default: a method the table
// lacks is refused), keeps tenant principals to their own tenant, and
// audits writes and refusals.
func (s *Security) unarySecurity() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		remote := grpcRemote(ctx, md)
		for _, k := range []string{"authorization", "x-api-key"} {
			for _, v := range md.Get(k) {
				if len(v) > maxCredentialHeader {
					s.refuse(ctx, "", info.FullMethod, remote)
					return nil, errdefs.Unauthenticated("credential longer than %d bytes", auth.MaxCredentialBytes)
				}
			}
		}
		p, err := s.Authn.Authenticate(ctx, auth.FromMetadata(md))
		if err != nil {
			s.refuse(ctx, outcomeOf(err), info.FullMethod, remote)
			return nil, err
		}
		ctx = auth.With(ctx, p)
		if !p.Fleet() {
			if err := s.Quotas.Allow(ctx, p.Tenant); err != nil {
				if secs, ok := retryAfterOf(err); ok {
					// The gateway turns it into the retry-after header.
					_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", strconv.Itoa(secs)))
				}
				return nil, err
			}
		}
		rule, ok := authz.MethodRule(info.FullMethod)
		action := rule.For(p)
		target := info.FullMethod
		if ts, isScoped := req.(tenantScoped); isScoped && ts.GetTenantId() != "" {
			target += " " + ts.GetTenantId()
		}
		record := func(outcome string) {
			if s.Audit == nil {
				return
			}
			// An operator's successful action on a tenant is a row of that
			// tenant, which its admins read; refusals, failures and
			// deletions (whose tenant is gone when the record is written)
			// are fleet rows. Operators read both.
			tid := p.Tenant
			if ts, isScoped := req.(tenantScoped); isScoped && p.Fleet() && outcome == audit.OK &&
				!strings.HasSuffix(info.FullMethod, "/DeleteTenant") && tenant.ID(ts.GetTenantId()).Validate() == nil {
				tid = tenant.ID(ts.GetTenantId())
			}
			s.Audit.Record(store.AuditRecord{
				TenantID: tid, Principal: p.Subject, Action: action.String(), Resource: target,
				Outcome: outcome, RemoteAddr: remote, RequestID: RequestID(ctx),
			})
		}
		if !ok {
			record(audit.Denied)
			return nil, errdefs.PermissionDenied("%s has no authorization rule and is refused", info.FullMethod)
		}
		if err := s.Authz.Check(p, rule); err != nil {
			record(audit.Denied)
			return nil, err
		}
		// A tenant's principal acts on its own tenant only; another
		// tenant's id is answered as if it did not exist.
		if ts, isScoped := req.(tenantScoped); isScoped && !p.Fleet() && ts.GetTenantId() != "" && tenant.ID(ts.GetTenantId()) != p.Tenant {
			record(audit.Denied)
			return nil, errdefs.NotFound("tenant %s not found", ts.GetTenantId())
		}
		resp, err := handler(ctx, req)
		if action.IsWrite() {
			if err != nil {
				record("error: " + errdefs.KindOf(err).String())
			} else {
				record(audit.OK)
			}
		}
		return resp, err
	}
}

// streamSecurity is unarySecurity for streaming methods: the same
// authentication, rate limit and rule; a tenant principal's every received
// message that names a tenant must name its own.
func (s *Security) streamSecurity() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		md, _ := metadata.FromIncomingContext(ctx)
		remote := grpcRemote(ctx, md)
		p, err := s.Authn.Authenticate(ctx, auth.FromMetadata(md))
		if err != nil {
			s.refuse(ctx, outcomeOf(err), info.FullMethod, remote)
			return err
		}
		ctx = auth.With(ctx, p)
		if !p.Fleet() {
			if err := s.Quotas.Allow(ctx, p.Tenant); err != nil {
				return err
			}
		}
		rule, ok := authz.MethodRule(info.FullMethod)
		action := rule.For(p)
		record := func(outcome string) {
			if s.Audit != nil {
				s.Audit.Record(store.AuditRecord{
					TenantID: p.Tenant, Principal: p.Subject, Action: action.String(), Resource: info.FullMethod,
					Outcome: outcome, RemoteAddr: remote, RequestID: RequestID(ctx),
				})
			}
		}
		if !ok {
			record(audit.Denied)
			return errdefs.PermissionDenied("%s has no authorization rule and is refused", info.FullMethod)
		}
		if err := s.Authz.Check(p, rule); err != nil {
			record(audit.Denied)
			return err
		}
		err = handler(srv, &ctxStream{ServerStream: ss, ctx: ctx, recv: func(m any) error {
			if ts, isScoped := m.(tenantScoped); isScoped && !p.Fleet() && ts.GetTenantId() != "" && tenant.ID(ts.GetTenantId()) != p.Tenant {
				return errdefs.NotFound("tenant %s not found", ts.GetTenantId())
			}
			return nil
		}})
		if action.IsWrite() {
			if err != nil {
				record("error: " + errdefs.KindOf(err).String())
			} else {
				record(audit.OK)
			}
		}
		return err
	}
}

// grpcRemote is the caller's address: for calls through the gateway (from
// loopback), the last x-forwarded-for entry, which the gateway appends.
func grpcRemote(ctx context.Context, md metadata.MD) string {
	addr := ""
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		addr = hostOf(pr.Addr.String())
	}
	if ip := net.ParseIP(addr); ip != nil && ip.IsLoopback() {
		if fwd := md.Get("x-forwarded-for"); len(fwd) > 0 {
			parts := strings.Split(fwd[len(fwd)-1], ",")
			if last := strings.TrimSpace(parts[len(parts)-1]); last != "" {
				return last
			}
		}
	}
	return addr
}

// retryAfterError is a gRPC error whose trailer said when to retry.
type retryAfterError struct {
	error
	secs int
}

func (e retryAfterError) RetryAfterSeconds() int { return e.secs }
func (e retryAfterError) Unwrap() error          { return e.error }

// retryAfter is implemented by errors that say when to retry
// (quota.RateLimitedError, retryAfterError).
type retryAfter interface{ RetryAfterSeconds() int }

func retryAfterOf(err error) (int, bool) {
	var ra retryAfter
	if errors.As(err, &ra) {
		return ra.RetryAfterSeconds(), true
	}
	return 0, false
}
