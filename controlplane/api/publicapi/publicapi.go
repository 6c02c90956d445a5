package publicapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/envbuild"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/seal"
)

// EventAppender stores client events in a session's event log. The events
// package implements it.
type EventAppender interface {
	// AppendUserEvents appends events, each a JSON object already checked for
	// its shape (type user.message or user.define_outcome), to session
	// sessionID's log in order, and returns them as stored (with id and
	// processed_at). It runs with the tenant in ctx.
	AppendUserEvents(ctx context.Context, sessionID string, events []json.RawMessage) ([]json.RawMessage, error)
}

// Options configure the Handler.
type Options struct {
	Store *store.Store
	// Events stores a session's initial_events. While nil, session creates
	// that carry initial_events are rejected.
	Events EventAppender
	// Guard authorizes every route. Required.
	Guard *Guard
	// SessionDeleted, when set, is told of each session deleted through the
	// API (ctx carries its tenant), after the delete: the fleet releases
	// the session's sandbox. It must not fail the request; what it cannot
	// do now, it repairs later.
	SessionDeleted func(ctx context.Context, sessionID string)
	// SessionArchived, when set, is told of each session archived through
	// the API, after the archive (archiving again tells it again): the
	// fleet pauses the session's sandbox and releases it after the
	// runtime's retention. It must not fail the request.
	SessionArchived func(sessionID string)
	// SessionCreated, when set, is told of each session created through
	// the API, after the create (ctx carries its tenant): the server
	// readies it for its first input (its runner; a warm sandbox, for a
	// session that is not self-hosted, if a host has one of its class). It
	// must not block or fail the request.
	SessionCreated func(ctx context.Context, sessionID string)
	// AdmitSession, when set, is asked before a session is created (ctx
	// carries the tenant), with the sandbox class its environment names
	// (metadata policy.ClassMetadataKey; "" for none) and the session's
	// agent snapshot: the fleet refuses a class the tenant may not use or
	// no host offers, and returns the class resolved, which the session
	// keeps. Its error is the response.
	AdmitSession func(ctx context.Context, class string, agent json.RawMessage) (string, error)
	// CheckSandboxClass, when set, refuses a sandbox class an environment
	// names that the tenant in ctx may not use (unknown: 400; not
	// allowed: 403). While nil, an environment naming a class is refused.
	CheckSandboxClass func(ctx context.Context, class string) error
	// UnrestrictedNetworking, when set, reports whether the tenant in ctx
	// holds the grant for unrestricted networking (policy: quotas.yaml's
	// unrestricted_networking). While nil no tenant does, and an
	// environment asking for it is refused.
	UnrestrictedNetworking func(ctx context.Context) bool
	// PackageMirrors are the operator's package mirrors (--package-mirror):
	// an environment's packages are accepted for the managers that have
	// one, and allow_package_managers when there is any. Only with
	// RequestBuild.
	PackageMirrors envbuild.Mirrors
	// RequestBuild, when set, asks for the build of an environment's
	// packages (envbuild) for sandboxes of a class (ctx carries the
	// tenant; "": the environment's own class) and returns its key (""
	// when the environment has no packages); with ask false it only checks
	// that the build can be asked for. An environment create or update
	// checks before it is stored (packages its class cannot take are
	// refused) and asks once it is, so its build starts at once; a session
	// create pins the key. While nil, packages and package managers are
	// refused.
	RequestBuild func(ctx context.Context, env store.Environment, class string, ask bool) (string, error)
	// Keyring is the cluster's seal keyring, which seals each tenant's
	// data key (vault credentials). Without one, the vault routes answer
	// with a failed precondition and sessions cannot name vaults.
	Keyring *seal.Keyring
	// Blobs keeps files' content (files.go). Without one, uploads and
	// downloads answer with a failed precondition.
	Blobs blob.Store
	// FileMaxBytes bounds one file (default DefaultFileMaxBytes). The
	// HTTP handler's upload body limit must allow it (api.HandlerOptions).
	FileMaxBytes int64
	// FileQuota returns the file storage limit in bytes of the tenant in
	// ctx (its quota's file_storage_mib); nil or 0 is no limit.
	FileQuota func(ctx context.Context) (int64, error)
	// WorkLeaseTTL is how long a self-hosted work item's lease lasts
	// after an ack or heartbeat that does not ask for another length
	// (default DefaultWorkLeaseTTL). A worker that misses it loses the
	// item, which the next poll hands to another.
	WorkLeaseTTL time.Duration
	// ListCost prices a session's usage for its budget (nil: budgets are
	// refused as model_not_budgetable).
	ListCost ListCostFunc
	// ModelCredentials is the node's policy for model_api_key credentials
	// (a tenant's own model access); the zero value refuses them.
	ModelCredentials ModelCredentialPolicy
	Logger           *slog.Logger
}

// ListCostFunc is the list cost, in billionths of a US dollar, of usage u
// on model, and whether model has a list price.
type ListCostFunc func(model string, u store.SessionUsage) (nanos int64, ok bool)

// ModelCredentialPolicy says whether the node honours model_api_key
// credentials and where their base URLs may point.
type ModelCredentialPolicy struct {
	// Allowed: the node's model client can run on a tenant's key (the
	// anthropic client; the fake needs none, and refuses them).
	Allowed bool
	// AllowLoopback lets a base URL be http to a loopback address (the
	// server allows private networks, as for MCP servers).
	AllowLoopback bool
}

// Handler serves the public API.
type Handler struct {
	store    *store.Store
	events   EventAppender
	guard    *Guard
	deleted  func(ctx context.Context, sessionID string)
	archived func(sessionID string)
	created  func(ctx context.Context, sessionID string)
	admit    func(ctx context.Context, class string, agent json.RawMessage) (string, error)
	class    func(ctx context.Context, class string) error
	// unrestricted: UnrestrictedNetworking.
	unrestricted func(ctx context.Context) bool
	keyring      *seal.Keyring
	blobs        blob.Store
	fileMax      int64
	quota        func(ctx context.Context) (int64, error)
	// workLease is a work item's lease without desired_ttl_seconds.
	workLease time.Duration
	mirrors   envbuild.Mirrors
	build     func(ctx context.Context, env store.Environment, class string, ask bool) (string, error)
	models    ModelCredentialPolicy
	listCost  ListCostFunc
	log       *slog.Logger
}

// New returns a Handler.
func New(opts Options) *Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.FileMaxBytes == 0 {
		opts.FileMaxBytes = DefaultFileMaxBytes
	}
	if opts.WorkLeaseTTL == 0 {
		opts.WorkLeaseTTL = DefaultWorkLeaseTTL
	}
	if opts.RequestBuild == nil {
		opts.PackageMirrors = nil
	}
	return &Handler{mirrors: opts.PackageMirrors, store: opts.Store, events: opts.Events, guard: opts.Guard, deleted: opts.SessionDeleted, archived: opts.SessionArchived, created: opts.SessionCreated,
		admit: opts.AdmitSession, class: opts.CheckSandboxClass, unrestricted: opts.UnrestrictedNetworking, keyring: opts.Keyring, blobs: opts.Blobs, fileMax: opts.FileMaxBytes,
		quota: opts.FileQuota, workLease: opts.WorkLeaseTTL, build: opts.RequestBuild, models: opts.ModelCredentials, listCost: opts.ListCost, log: opts.Logger}
}

// fileQuota is the file storage limit of the tenant in ctx; 0 is none.
func (h *Handler) fileQuota(ctx context.Context) (int64, error) {
	if h.quota == nil {
		return 0, nil
	}
	return h.quota(ctx)
}

// Register mounts the API's routes on mux, each behind the guard (see
// Rules).
func (h *Handler) Register(mux *http.ServeMux) {
	routes := map[string]http.HandlerFunc{
		"POST /v1/agents":                                          h.createAgent,
		"GET /v1/agents":                                           h.listAgents,
		"GET /v1/agents/{id}":                                      h.getAgent,
		"POST /v1/agents/{id}":                                     h.updateAgent,
		"POST /v1/agents/{id}/archive":                             h.archiveAgent,
		"GET /v1/agents/{id}/versions":                             h.listAgentVersions,
		"POST /v1/environments":                                    h.createEnvironment,
		"GET /v1/environments":                                     h.listEnvironments,
		"GET /v1/environments/{id}":                                h.getEnvironment,
		"POST /v1/environments/{id}":                               h.updateEnvironment,
		"DELETE /v1/environments/{id}":                             h.deleteEnvironment,
		"POST /v1/environments/{id}/archive":                       h.archiveEnvironment,
		"POST /v1/sessions":                                        h.createSession,
		"GET /v1/sessions":                                         h.listSessions,
		"GET /v1/sessions/{id}":                                    h.getSession,
		"POST /v1/sessions/{id}":                                   h.updateSession,
		"DELETE /v1/sessions/{id}":                                 h.deleteSession,
		"POST /v1/sessions/{id}/archive":                           h.archiveSession,
		"GET /v1/sessions/{session_id}/resources":                  h.listResources,
		"POST /v1/sessions/{session_id}/resources":                 h.addResource,
		"GET /v1/sessions/{session_id}/resources/{resource_id}":    h.getResource,
		"POST /v1/sessions/{session_id}/resources/{resource_id}":   h.updateResource,
		"DELETE /v1/sessions/{session_id}/resources/{resource_id}": h.deleteResource,
		"POST /v1/vaults":                                          h.createVault,
		"GET /v1/vaults":                                           h.listVaults,
		"GET /v1/vaults/{id}":                                      h.getVault,
		"POST /v1/vaults/{id}":                                     h.updateVault,
		"DELETE /v1/vaults/{id}":                                   h.deleteVault,
		"POST /v1/vaults/{id}/archive":                             h.archiveVault,
		"POST /v1/vaults/{id}/credentials":                         h.createCredential,
		"GET /v1/vaults/{id}/credentials":                          h.listCredentials,
		"GET /v1/vaults/{id}/credentials/{credential_id}":          h.getCredential,
		"POST /v1/vaults/{id}/credentials/{credential_id}":         h.updateCredential,
		"DELETE /v1/vaults/{id}/credentials/{credential_id}":       h.deleteCredential,
		"POST /v1/vaults/{id}/credentials/{credential_id}/archive": h.archiveCredential,
		"POST /v1/files":                                           h.uploadFile,
		"GET /v1/files":                                            h.listFiles,
		"GET /v1/files/{id}":                                       h.getFile,
		"GET /v1/files/{id}/content":                               h.downloadFile,
		"DELETE /v1/files/{id}":                                    h.deleteFile,
		"POST /v1/skills":                                          h.createSkill,
		"GET /v1/skills":                                           h.listSkills,
		"GET /v1/skills/{id}":                                      h.getSkill,
		"DELETE /v1/skills/{id}":                                   h.deleteSkill,
		"POST /v1/skills/{id}/versions":                            h.createSkillVersion,
		"GET /v1/skills/{id}/versions":                             h.listSkillVersions,
		"GET /v1/skills/{id}/versions/{version}":                   h.getSkillVersion,
		"DELETE /v1/skills/{id}/versions/{version}":                h.deleteSkillVersion,
		"GET /v1/skills/{id}/versions/{version}/content":           h.downloadSkillVersion,
		"GET /v1/environments/{id}/work/poll":                      h.pollWork,
		"GET /v1/environments/{id}/work/stats":                     h.workStats,
		"GET /v1/environments/{id}/work":                           h.listWork,
		"GET /v1/environments/{id}/work/{work_id}":                 h.getWork,
		"POST /v1/environments/{id}/work/{work_id}":                h.updateWork,
		"POST /v1/environments/{id}/work/{work_id}/ack":            h.ackWork,
		"POST /v1/environments/{id}/work/{work_id}/heartbeat":      h.heartbeatWork,
		"POST /v1/environments/{id}/work/{work_id}/stop":           h.stopWork,
	}
	maps.Copy(routes, h.memoryRoutes())
	for pattern, fn := range routes {
		h.guard.handle(mux, pattern, checkPathID(fn))
	}
	// Anything else under /v1/ gets the error envelope, not the mux's text.
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		api.WriteError(w, r, errdefs.NotFound("no route for %s %s", r.Method, r.URL.Path))
	})
}

// checkPathID answers 404 for an {id} that no resource can have, before it
// reaches the database (which cannot even compare NUL or invalid UTF-8).
func checkPathID(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for _, name := range []string{"id", "credential_id", "resource_id", "work_id", "memory_id", "version_id"} {
			if id := r.PathValue(name); id != "" && !validID(id) {
				api.WriteError(w, r, errdefs.NotFound("%q is not the id of anything", truncate(id)))
				return
			}
		}
		next(w, r)
	}
}

// validID reports whether s has the shape of a corral id: letters, digits,
// _ and -, at most 128 of them.
func validID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errdefs.KindOf(err) == errdefs.Unknown {
		h.log.Error("public api", "method", r.Method, "path", r.URL.Path, "request_id", api.RequestID(r.Context()), "err", err)
	}
	api.WriteError(w, r, err)
}

// page is the body of every list response. PrevPage is only sent by the
// sessions list (the SDK's bidirectional cursor).
type page[T any] struct {
	Data     []T     `json:"data"`
	NextPage *string `json:"next_page"`
}

type bidiPage[T any] struct {
	Data     []T     `json:"data"`
	NextPage *string `json:"next_page"`
	PrevPage *string `json:"prev_page"`
}

// cursor is what a page token holds.
type cursor struct {
	List  string `json:"l"`           // which list: agents, agent_versions:<id>, environments, sessions
	Order string `json:"o"`           // asc or desc
	Back  bool   `json:"b,omitempty"` // a prev_page cursor: walks against the order
	At    string `json:"t,omitempty"` // created_at, RFC 3339 with nanoseconds
	ID    string `json:"i,omitempty"`
	N     int64  `json:"n,omitempty"` // version lists: the version
}

func (c cursor) encode() *string {
	b, _ := json.Marshal(c)
	s := base64.RawURLEncoding.EncodeToString(b)
	return &s
}

func (c cursor) key() *store.Key {
	t, _ := time.Parse(time.RFC3339Nano, c.At)
	return &store.Key{CreatedAt: t, ID: c.ID}
}

func keyCursor(list, order string, back bool, at time.Time, id string) *string {
	return cursor{List: list, Order: order, Back: back, At: at.UTC().Format(time.RFC3339Nano), ID: id}.encode()
}

// decodeCursor parses the page parameter, if any, for list and order.
func decodeCursor(q url.Values, list, order string) (*cursor, error) {
	p := q.Get("page")
	if p == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(p)
	var c cursor
	if err != nil || json.Unmarshal(b, &c) != nil || c.List == "" {
		return nil, errdefs.InvalidArgument("page: not a page cursor this server issued")
	}
	if c.List != list {
		return nil, errdefs.InvalidArgument("page: the cursor belongs to another list")
	}
	if c.Order != order {
		return nil, errdefs.InvalidArgument("page: the cursor was made with order=%s and cannot be used with order=%s", c.Order, order)
	}
	if c.At != "" {
		if _, err := time.Parse(time.RFC3339Nano, c.At); err != nil {
			return nil, errdefs.InvalidArgument("page: not a page cursor this server issued")
		}
	}
	return &c, nil
}

// queryLimit parses limit: default 20, 1 to 100.
func queryLimit(q url.Values) (int, error) {
	s := q.Get("limit")
	if s == "" {
		return 20, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 100 {
		return 0, errdefs.InvalidArgument("limit: %q is not an integer from 1 to 100", s)
	}
	return n, nil
}

func queryBool(q url.Values, name string) (bool, error) {
	s := q.Get(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, errdefs.InvalidArgument("%s: %q is not true or false", name, s)
	}
	return b, nil
}

func queryTime(q url.Values, name string) (*time.Time, error) {
	s := q.Get(name)
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, errdefs.InvalidArgument("%s: %q is not an RFC 3339 timestamp", name, s)
	}
	return &t, nil
}

func queryOrder(q url.Values, def string) (string, error) {
	s := q.Get("order")
	if s == "" {
		return def, nil
	}
	if s != "asc" && s != "desc" {
		return "", enumError("order", s, []string{"asc", "desc"})
	}
	return s, nil
}

// queryList returns the values of an array parameter, sent as name[]=a
// (the SDK's form) or name=a, comma-joined values split.
func queryList(q url.Values, name string) []string {
	var out []string
	for _, v := range slices.Concat(q[name+"[]"], q[name]) {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// ts formats a timestamp for the wire: RFC 3339 in UTC.
func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// tsPtr is ts for nullable timestamps: nil stays null.
func tsPtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := ts(*t)
	return &s
}

// noBody drains and ignores a body on endpoints that take none (the SDK
// sends none; some clients send {}), still under the cap.
func noBody(w http.ResponseWriter, r *http.Request) error {
	_, err := readBody(w, r)
	return err
}

// grantsUnrestricted reports whether the tenant in ctx holds the grant for
// unrestricted networking.
func (h *Handler) grantsUnrestricted(ctx context.Context) bool {
	return h.unrestricted != nil && h.unrestricted(ctx)
}
