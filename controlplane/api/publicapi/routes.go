package publicapi

import (
	"fmt"
	"net"
	"net/http"
	"strconv"

	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/audit"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/authz"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
)

// Rules is the one table of what every public route needs. Every route is
// tenant data: fleet principals (operators) get none of it. Environment keys
// get the routes marked Worker, whose handlers confine them to their
// environment (work.go, workerSession). A route
// registered without a rule here panics at start-up.
var Rules = map[string]authz.Rule{
	"POST /v1/agents":                                                 {Tenant: authz.A("agents", "write")},
	"GET /v1/agents":                                                  {Tenant: authz.A("agents", "read")},
	"GET /v1/agents/{id}":                                             {Tenant: authz.A("agents", "read")},
	"POST /v1/agents/{id}":                                            {Tenant: authz.A("agents", "write")},
	"POST /v1/agents/{id}/archive":                                    {Tenant: authz.A("agents", "write")},
	"GET /v1/agents/{id}/versions":                                    {Tenant: authz.A("agents", "read")},
	"POST /v1/environments":                                           {Tenant: authz.A("environments", "write")},
	"GET /v1/environments":                                            {Tenant: authz.A("environments", "read")},
	"GET /v1/environments/{id}":                                       {Tenant: authz.A("environments", "read")},
	"POST /v1/environments/{id}":                                      {Tenant: authz.A("environments", "write")},
	"DELETE /v1/environments/{id}":                                    {Tenant: authz.A("environments", "write")},
	"POST /v1/environments/{id}/archive":                              {Tenant: authz.A("environments", "write")},
	"POST /v1/sessions":                                               {Tenant: authz.A("sessions", "write")},
	"GET /v1/sessions":                                                {Tenant: authz.A("sessions", "read")},
	"GET /v1/sessions/{id}":                                           {Tenant: authz.A("sessions", "read"), Worker: true},
	"POST /v1/sessions/{id}":                                          {Tenant: authz.A("sessions", "write")},
	"DELETE /v1/sessions/{id}":                                        {Tenant: authz.A("sessions", "write")},
	"POST /v1/sessions/{id}/archive":                                  {Tenant: authz.A("sessions", "write")},
	"POST /v1/sessions/{session_id}/events":                           {Tenant: authz.A("sessions", "write"), Worker: true},
	"GET /v1/sessions/{session_id}/events":                            {Tenant: authz.A("sessions", "read"), Worker: true},
	"GET /v1/sessions/{session_id}/events/stream":                     {Tenant: authz.A("sessions", "read"), Worker: true},
	"GET /v1/sessions/{session_id}/resources":                         {Tenant: authz.A("sessions", "read")},
	"POST /v1/sessions/{session_id}/resources":                        {Tenant: authz.A("sessions", "write")},
	"GET /v1/sessions/{session_id}/resources/{resource_id}":           {Tenant: authz.A("sessions", "read")},
	"POST /v1/sessions/{session_id}/resources/{resource_id}":          {Tenant: authz.A("sessions", "write")},
	"DELETE /v1/sessions/{session_id}/resources/{resource_id}":        {Tenant: authz.A("sessions", "write")},
	"POST /v1/memory_stores":                                          {Tenant: authz.A("memory_stores", "write")},
	"GET /v1/memory_stores":                                           {Tenant: authz.A("memory_stores", "read")},
	"GET /v1/memory_stores/{id}":                                      {Tenant: authz.A("memory_stores", "read")},
	"POST /v1/memory_stores/{id}":                                     {Tenant: authz.A("memory_stores", "write")},
	"POST /v1/memory_stores/{id}/archive":                             {Tenant: authz.A("memory_stores", "write")},
	"DELETE /v1/memory_stores/{id}":                                   {Tenant: authz.A("memory_stores", "write")},
	"POST /v1/memory_stores/{id}/memories":                            {Tenant: authz.A("memory_stores", "write")},
	"GET /v1/memory_stores/{id}/memories":                             {Tenant: authz.A("memory_stores", "read")},
	"GET /v1/memory_stores/{id}/memories/{memory_id}":                 {Tenant: authz.A("memory_stores", "read")},
	"POST /v1/memory_stores/{id}/memories/{memory_id}":                {Tenant: authz.A("memory_stores", "write")},
	"DELETE /v1/memory_stores/{id}/memories/{memory_id}":              {Tenant: authz.A("memory_stores", "write")},
	"GET /v1/memory_stores/{id}/memory_versions":                      {Tenant: authz.A("memory_stores", "read")},
	"GET /v1/memory_stores/{id}/memory_versions/{version_id}":         {Tenant: authz.A("memory_stores", "read")},
	"POST /v1/memory_stores/{id}/memory_versions/{version_id}/redact": {Tenant: authz.A("memory_stores", "write")},
	// A self-hosted environment's work queue: its workers (environment
	// keys) and the tenant's principals.
	"GET /v1/environments/{id}/work/poll":                      {Tenant: authz.A("environments", "write"), Worker: true},
	"GET /v1/environments/{id}/work/stats":                     {Tenant: authz.A("environments", "read"), Worker: true},
	"GET /v1/environments/{id}/work":                           {Tenant: authz.A("environments", "read"), Worker: true},
	"GET /v1/environments/{id}/work/{work_id}":                 {Tenant: authz.A("environments", "read"), Worker: true},
	"POST /v1/environments/{id}/work/{work_id}":                {Tenant: authz.A("environments", "write"), Worker: true},
	"POST /v1/environments/{id}/work/{work_id}/ack":            {Tenant: authz.A("environments", "write"), Worker: true},
	"POST /v1/environments/{id}/work/{work_id}/heartbeat":      {Tenant: authz.A("environments", "write"), Worker: true},
	"POST /v1/environments/{id}/work/{work_id}/stop":           {Tenant: authz.A("environments", "write"), Worker: true},
	"POST /v1/vaults":                                          {Tenant: authz.A("vaults", "write")},
	"GET /v1/vaults":                                           {Tenant: authz.A("vaults", "read")},
	"GET /v1/vaults/{id}":                                      {Tenant: authz.A("vaults", "read")},
	"POST /v1/vaults/{id}":                                     {Tenant: authz.A("vaults", "write")},
	"DELETE /v1/vaults/{id}":                                   {Tenant: authz.A("vaults", "write")},
	"POST /v1/vaults/{id}/archive":                             {Tenant: authz.A("vaults", "write")},
	"POST /v1/vaults/{id}/credentials":                         {Tenant: authz.A("vaults", "write")},
	"GET /v1/vaults/{id}/credentials":                          {Tenant: authz.A("vaults", "read")},
	"GET /v1/vaults/{id}/credentials/{credential_id}":          {Tenant: authz.A("vaults", "read")},
	"POST /v1/vaults/{id}/credentials/{credential_id}":         {Tenant: authz.A("vaults", "write")},
	"DELETE /v1/vaults/{id}/credentials/{credential_id}":       {Tenant: authz.A("vaults", "write")},
	"POST /v1/vaults/{id}/credentials/{credential_id}/archive": {Tenant: authz.A("vaults", "write")},
	"POST /v1/files":                                           {Tenant: authz.A("files", "write")},
	"GET /v1/files":                                            {Tenant: authz.A("files", "read")},
	"GET /v1/files/{id}":                                       {Tenant: authz.A("files", "read")},
	"GET /v1/files/{id}/content":                               {Tenant: authz.A("files", "read")},
	"DELETE /v1/files/{id}":                                    {Tenant: authz.A("files", "write")},
	"POST /v1/skills":                                          {Tenant: authz.A("skills", "write")},
	"GET /v1/skills":                                           {Tenant: authz.A("skills", "read")},
	"GET /v1/skills/{id}":                                      {Tenant: authz.A("skills", "read")},
	"DELETE /v1/skills/{id}":                                   {Tenant: authz.A("skills", "write")},
	"POST /v1/skills/{id}/versions":                            {Tenant: authz.A("skills", "write")},
	"GET /v1/skills/{id}/versions":                             {Tenant: authz.A("skills", "read")},
	"GET /v1/skills/{id}/versions/{version}":                   {Tenant: authz.A("skills", "read")},
	"DELETE /v1/skills/{id}/versions/{version}":                {Tenant: authz.A("skills", "write")},
	"GET /v1/skills/{id}/versions/{version}/content":           {Tenant: authz.A("skills", "read")},
}

// unaudited are write routes whose successes are not audited (refusals
// still are): a worker repeats its poll every second or so, and what a poll
// hands out is audited when the worker acks it.
var unaudited = map[string]bool{"GET /v1/environments/{id}/work/poll": true}

// Guard authorizes each route's requests against Rules and audits writes
// and refusals. The principal must already be in the request's context
// (api.Authenticate puts it there).
type Guard struct {
	Authz *authz.Authorizer
	// Audit receives records; nil records nothing (tests).
	Audit *audit.Log
}

// handle mounts fn at pattern behind g.
func (g *Guard) handle(mux *http.ServeMux, pattern string, fn http.HandlerFunc) {
	rule, ok := Rules[pattern]
	if !ok {
		panic(fmt.Sprintf("publicapi: route %s has no authorization rule", pattern))
	}
	if g == nil || g.Authz == nil {
		panic("publicapi: routes need a Guard with an Authorizer")
	}
	mux.Handle(pattern, g.wrap(rule, unaudited[pattern], fn))
}

func (g *Guard) wrap(rule authz.Rule, quiet bool, next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := auth.From(r.Context())
		if !ok {
			api.WriteError(w, r, errdefs.Unauthenticated("no credentials"))
			return
		}
		action := rule.For(p)
		if err := g.Authz.Check(p, rule); err != nil {
			g.record(r, p, action, audit.Denied)
			api.WriteError(w, r, err)
			return
		}
		if !action.IsWrite() || quiet {
			next(w, r)
			return
		}
		rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next(rec, r)
		outcome := audit.OK
		if rec.status >= 400 {
			outcome = "error: " + strconv.Itoa(rec.status)
		}
		g.record(r, p, action, outcome)
	})
}

func (g *Guard) record(r *http.Request, p auth.Principal, action authz.Action, outcome string) {
	if g.Audit == nil {
		return
	}
	g.Audit.Record(store.AuditRecord{
		TenantID:   p.Tenant,
		Principal:  p.Subject,
		Action:     action.String(),
		Resource:   r.Method + " " + r.URL.Path,
		Outcome:    outcome,
		RemoteAddr: remoteHost(r.RemoteAddr),
		RequestID:  api.RequestID(r.Context()),
	})
}

func remoteHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
