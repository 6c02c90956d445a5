package publicapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// sessionResponse is the wire form of a session.
type sessionResponse struct {
	Type               string            `json:"type"`
	ID                 string            `json:"id"`
	Title              *string           `json:"title"`
	Status             string            `json:"status"`
	Agent              json.RawMessage   `json:"agent"`
	EnvironmentID      string            `json:"environment_id"`
	Resources          json.RawMessage   `json:"resources"`
	VaultIDs           []string          `json:"vault_ids"`
	Metadata           map[string]string `json:"metadata"`
	OutcomeEvaluations []struct{}        `json:"outcome_evaluations"`
	Stats              sessionStats      `json:"stats"`
	Usage              sessionUsage      `json:"usage"`
	Budget             *budgetLimit      `json:"budget"`
	DeploymentID       *string           `json:"deployment_id"`
	CreatedAt          string            `json:"created_at"`
	UpdatedAt          string            `json:"updated_at"`
	ArchivedAt         *string           `json:"archived_at"`
}

// budgetLimit is a session's budget as the API has it: a hard ceiling on
// its list cost.
type budgetLimit struct {
	Type        string         `json:"type"` // "limit"
	MaxListCost monetaryAmount `json:"max_list_cost"`
}

// monetaryAmount is an amount in minor units of the currency, as an
// integer decimal string ("2500" is $25.00).
type monetaryAmount struct {
	Amount   string `json:"amount"`
	Currency string `json:"currency"`
}

// maxBudgetCents bounds a budget (a billion dollars): its cost in
// billionths of a dollar stays within an int64.
const maxBudgetCents = 100_000_000_000

// decodeBudget reads a budget object (type "limit", elidable, and
// max_list_cost in USD) into cents.
func decodeBudget(raw json.RawMessage) (int64, error) {
	var in struct {
		Type        *string         `json:"type"`
		MaxListCost json.RawMessage `json:"max_list_cost"`
	}
	if err := field(raw, "budget", &in); err != nil {
		return 0, err
	}
	if in.Type != nil && *in.Type != "limit" {
		return 0, enumError("budget.type", *in.Type, []string{"limit"})
	}
	if !present(in.MaxListCost) || isNull(in.MaxListCost) {
		return 0, errdefs.InvalidArgument("budget.max_list_cost is required")
	}
	var m struct {
		Amount   *string `json:"amount"`
		Currency *string `json:"currency"`
	}
	if err := field(in.MaxListCost, "budget.max_list_cost", &m); err != nil {
		return 0, err
	}
	if m.Currency == nil || *m.Currency != "USD" {
		return 0, errdefs.InvalidArgument("budget.max_list_cost.currency: USD is the only currency")
	}
	if m.Amount == nil {
		return 0, errdefs.InvalidArgument("budget.max_list_cost.amount is required")
	}
	a := *m.Amount
	n, err := strconv.ParseInt(a, 10, 64)
	if err != nil || a == "" || a[0] < '1' || a[0] > '9' || strings.Trim(a, "0123456789") != "" || n > maxBudgetCents {
		return 0, errdefs.InvalidArgument("budget.max_list_cost.amount: want cents as an integer string without leading zeros, from 1 to %d", maxBudgetCents)
	}
	return n, nil
}

// agentModel is the model id of a stored agent snapshot.
func agentModel(snapshot json.RawMessage) string {
	var a struct {
		Model struct {
			ID string `json:"id"`
		} `json:"model"`
	}
	_ = json.Unmarshal(snapshot, &a)
	return a.Model.ID
}

// budgetable refuses a budget for a session on model, which has no list
// price (model_not_budgetable, as the API names it).
func budgetable(listCost ListCostFunc, model string) error {
	if listCost != nil {
		if _, ok := listCost(model, store.SessionUsage{}); ok {
			return nil
		}
	}
	return errdefs.InvalidArgument("budget: the model %q has no list price on this server (model_not_budgetable); remove the budget or use a priced model", truncate(model))
}

type sessionStats struct {
	ActiveSeconds   float64 `json:"active_seconds"`
	DurationSeconds float64 `json:"duration_seconds"`
}

type sessionUsage struct {
	// ActiveSeconds counts time with any thread running once; with one
	// thread per session it equals stats.active_seconds.
	ActiveSeconds        float64 `json:"active_seconds"`
	InputTokens          int64   `json:"input_tokens"`
	OutputTokens         int64   `json:"output_tokens"`
	CacheReadInputTokens int64   `json:"cache_read_input_tokens"`
	// ListCost is the session's tokens at the policy's list prices (nil:
	// its model has none).
	ListCost      *monetaryAmount `json:"list_cost"`
	CacheCreation struct {
		Ephemeral1hInputTokens int64 `json:"ephemeral_1h_input_tokens"`
		Ephemeral5mInputTokens int64 `json:"ephemeral_5m_input_tokens"`
	} `json:"cache_creation"`
}

const (
	maxTitle         = 1000
	maxInitialEvents = 50
)

var sessionStatuses = []string{store.SessionRescheduling, store.SessionRunning, store.SessionIdle, store.SessionTerminated}

// sessionOut is s as the API returns it; listCost (nil: none) prices its
// usage.list_cost.
func sessionOut(s store.Session, now time.Time, listCost ListCostFunc) sessionResponse {
	end := now
	if s.ArchivedAt != nil {
		end = *s.ArchivedAt
	}
	out := sessionResponse{
		Type: "session", ID: s.ID, Title: s.Title, Status: s.Status, Agent: reportedAgent(s.Agent),
		EnvironmentID: s.EnvironmentID, Resources: s.Resources, VaultIDs: s.VaultIDs,
		Metadata: s.Metadata, OutcomeEvaluations: []struct{}{},
		Stats:     sessionStats{ActiveSeconds: s.ActiveSeconds, DurationSeconds: max(0, end.Sub(s.CreatedAt).Seconds())},
		CreatedAt: ts(s.CreatedAt), UpdatedAt: ts(s.UpdatedAt), ArchivedAt: tsPtr(s.ArchivedAt),
	}
	if len(out.Resources) == 0 {
		out.Resources = json.RawMessage("[]")
	}
	if out.VaultIDs == nil {
		out.VaultIDs = []string{}
	}
	out.Usage.ActiveSeconds = s.ActiveSeconds
	out.Usage.InputTokens = s.Usage.InputTokens
	out.Usage.OutputTokens = s.Usage.OutputTokens
	out.Usage.CacheReadInputTokens = s.Usage.CacheReadInputTokens
	out.Usage.CacheCreation.Ephemeral1hInputTokens = s.Usage.CacheCreation1hInputTokens
	out.Usage.CacheCreation.Ephemeral5mInputTokens = s.Usage.CacheCreation5mInputTokens
	if c := s.BudgetCents; c != nil {
		out.Budget = &budgetLimit{Type: "limit", MaxListCost: monetaryAmount{Amount: strconv.FormatInt(*c, 10), Currency: "USD"}}
	}
	if listCost != nil {
		if nanos, ok := listCost(agentModel(s.Agent), s.Usage); ok {
			// Whole cents, rounded down; absent (null) for a model without
			// a list price, as the API leaves it until it can price one.
			out.Usage.ListCost = &monetaryAmount{Amount: strconv.FormatInt(nanos/10_000_000, 10), Currency: "USD"}
		}
	}
	return out
}

// reportedAgent is a session's stored agent snapshot as the session really
// runs it: a snapshot stored before some of its fields were refused reports
// them neutral, since nothing that runs a session ever read them
// (unsupported.go). The events already logged (session.updated) stay as
// they were written: they are the session's history.
func reportedAgent(stored json.RawMessage) json.RawMessage {
	var snap sessionAgent
	if json.Unmarshal(stored, &snap) != nil || !neutralize(&snap.agentCore) {
		return stored
	}
	b, err := json.Marshal(snap)
	if err != nil {
		return stored
	}
	return b
}

func (h *Handler) writeSession(w http.ResponseWriter, r *http.Request, s store.Session, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionOut(s, time.Now(), h.listCost))
}

type sessionCreate struct {
	Agent         json.RawMessage `json:"agent"`
	EnvironmentID json.RawMessage `json:"environment_id"`
	Title         json.RawMessage `json:"title"`
	Metadata      json.RawMessage `json:"metadata"`
	InitialEvents json.RawMessage `json:"initial_events"`
	Resources     json.RawMessage `json:"resources"`
	VaultIDs      json.RawMessage `json:"vault_ids"`
	Budget        json.RawMessage `json:"budget"`
}

// decodeTitle decodes a nullable title.
func decodeTitle(raw json.RawMessage) (*string, error) {
	if !present(raw) || isNull(raw) {
		return nil, nil
	}
	var t string
	if err := field(raw, "title", &t); err != nil {
		return nil, err
	}
	if err := checkLen(t, "title", 0, maxTitle); err != nil {
		return nil, err
	}
	return &t, nil
}

// emptyList accepts an absent, null or empty array member that corral
// refuses when non-empty (unsupportedField names it).
func emptyList(raw json.RawMessage, name, unsupportedField string) error {
	if !present(raw) || isNull(raw) {
		return nil
	}
	var l []json.RawMessage
	if err := field(raw, name, &l); err != nil {
		return err
	}
	if len(l) > 0 {
		return refuse(unsupportedField, name)
	}
	return nil
}

// decodeInitialEvents checks initial_events' shape: at most 50 objects of
// type user.message or user.define_outcome. The event log validates them in
// full when it appends them.
func decodeInitialEvents(raw json.RawMessage) ([]json.RawMessage, error) {
	if !present(raw) || isNull(raw) {
		return nil, nil
	}
	items, err := rawList(raw, "initial_events", maxInitialEvents)
	if err != nil {
		return nil, err
	}
	for i, it := range items {
		path := fmt.Sprintf("initial_events[%d]", i)
		var head struct {
			Type    *string         `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(it, &head)
		if head.Type == nil {
			return nil, errdefs.InvalidArgument("%s.type is required", path)
		}
		switch *head.Type {
		case "user.message":
			var content []json.RawMessage
			if !present(head.Content) || isNull(head.Content) {
				return nil, errdefs.InvalidArgument("%s.content is required", path)
			}
			if err := field(head.Content, path+".content", &content); err != nil {
				return nil, err
			}
			if len(content) == 0 {
				return nil, errdefs.InvalidArgument("%s.content must hold at least one content block", path)
			}
		case "user.define_outcome":
		default:
			return nil, enumError(path+".type", *head.Type, []string{"user.message", "user.define_outcome"})
		}
	}
	return items, nil
}

func (h *Handler) createSession(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	c, err := h.decodeSessionCreate(b)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	once, err := createOnce(r, b)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(c.resources) > 0 {
		if err := h.checkFiles(r.Context(), c.resources, func(i int) string { return fmt.Sprintf("resources[%d]", i) }); err != nil {
			h.fail(w, r, err)
			return
		}
		stamp(c.resources, time.Now())
		if c.session.Resources, err = json.Marshal(c.resources); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	// The agent version and environment are read in the transaction that
	// inserts the session; the fleet admits the environment's sandbox
	// class there, before the insert.
	s, existing, err := h.store.Sessions().CreateOnce(r.Context(), once, c.agent.ID, c.agent.Version, c.envID, func(a store.Agent, env store.Environment) (store.Session, error) {
		if env.ArchivedAt != nil {
			return store.Session{}, errdefs.InvalidArgument("environment %s is archived; archived environments cannot start sessions", env.ID)
		}
		snap, err := c.agent.snapshot(a)
		if err != nil {
			return store.Session{}, err
		}
		if err := h.resolveSkills(r.Context(), &snap.agentCore); err != nil {
			return store.Session{}, err
		}
		s := c.session
		if s.Agent, err = json.Marshal(snap); err != nil {
			return s, err
		}
		s.SelfHosted = selfHosted(env.Config)
		if Unrestricted(SandboxAllowedHosts(env.Config)) && !h.grantsUnrestricted(r.Context()) {
			return s, ErrUnrestrictedRevoked
		}
		if s.SelfHosted && len(c.resources) > 0 {
			return s, errSelfHostedResources
		}
		if s.SelfHosted && len(snap.Skills) > 0 {
			return s, errSelfHostedSkills
		}
		if s.BudgetCents != nil {
			if err := budgetable(h.listCost, agentModel(s.Agent)); err != nil {
				return s, err
			}
		}
		if h.admit != nil && !s.SelfHosted {
			// A self-hosted session's tools run on the tenant's worker:
			// no sandbox class applies and no host is asked.
			if s.SandboxClass, err = h.admit(r.Context(), env.Metadata[policy.ClassMetadataKey], s.Agent); err != nil {
				return s, err
			}
		}
		if h.build != nil && !s.SelfHosted {
			// The session runs the image of its environment's packages
			// as they are now; an update later builds for new sessions.
			if s.PackageBuild, err = h.build(r.Context(), env, s.SandboxClass, true); err != nil {
				return s, err
			}
		}
		return s, nil
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if existing {
		// A repeated create: the first one appended the initial events.
		writeJSON(w, http.StatusOK, sessionOut(s, time.Now(), h.listCost))
		return
	}
	if len(c.initial) > 0 {
		if _, err := h.events.AppendUserEvents(r.Context(), s.ID, c.initial); err != nil {
			// The session and its initial events are one request: undo.
			if derr := h.store.Sessions().Delete(context.WithoutCancel(r.Context()), s.ID); derr != nil {
				h.log.Warn("removing session after its initial events failed", "session_id", s.ID, "err", derr)
			}
			h.fail(w, r, err)
			return
		}
		if cur, err := h.store.Sessions().Get(r.Context(), s.ID); err == nil {
			s = cur
		}
	}
	if h.created != nil {
		h.created(r.Context(), s.ID)
	}
	writeJSON(w, http.StatusOK, sessionOut(s, time.Now(), h.listCost))
}

// How a session create is made safe to repeat. The official SDKs retry a
// create that failed with a 5xx or a broken connection, and one that did
// make its session before it failed would make a second: a retry (the
// SDKs count their attempts in retryCountHeader) gets the session that the
// same principal's same body made within retryWindow. A caller that wants
// more (its own retries, hours apart) sends an Idempotency-Key: a create
// under a key already used gets that key's session, for as long as the
// session exists, or a 409 if the body differs.
const (
	idempotencyKeyHeader = "Idempotency-Key"
	retryCountHeader     = "X-Stainless-Retry-Count"
	retryWindow          = 10 * time.Minute
	maxIdempotencyKey    = 255
)

// createOnce reads how the create request r, with body b, may repeat an
// earlier one.
func createOnce(r *http.Request, b []byte) (store.Once, error) {
	p, _ := auth.From(r.Context())
	h := sha256.New()
	for _, part := range []string{string(p.Tenant), p.Subject} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	h.Write(b)
	var once store.Once
	h.Sum(once.Request[:0])
	if key := r.Header.Get(idempotencyKeyHeader); key != "" {
		if len(key) > maxIdempotencyKey || strings.IndexFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
			return store.Once{}, errdefs.InvalidArgument("%s: want 1 to %d printable ASCII characters", idempotencyKeyHeader, maxIdempotencyKey)
		}
		once.Key = key
		return once, nil
	}
	if n, err := strconv.Atoi(r.Header.Get(retryCountHeader)); err == nil && n > 0 {
		once.RetryOf = retryWindow
	}
	return once, nil
}

// sessionCreateRequest is a validated create request, before the agent and
// environment are looked up.
type sessionCreateRequest struct {
	agent   agentRef
	envID   string
	session store.Session // title and metadata
	initial []json.RawMessage
	// resources are the files to mount, checked but not yet looked up.
	resources []sessionResource
}

// decodeSessionCreate validates a create request.
func (h *Handler) decodeSessionCreate(b []byte) (sessionCreateRequest, error) {
	var in sessionCreate
	var c sessionCreateRequest
	if err := decodeObject(b, "request body", &in); err != nil {
		return c, err
	}
	var err error
	if !present(in.Agent) || isNull(in.Agent) {
		return c, errdefs.InvalidArgument("agent is required")
	}
	if c.agent, err = parseAgentRef(in.Agent); err != nil {
		return c, err
	}
	if c.envID, err = stringField(in.EnvironmentID, "environment_id"); err != nil {
		return c, err
	}
	if c.envID == "" {
		return c, errdefs.InvalidArgument("environment_id is required")
	}
	if c.session.Title, err = decodeTitle(in.Title); err != nil {
		return c, err
	}
	if c.session.Metadata, err = metadataCreate(in.Metadata); err != nil {
		return c, err
	}
	if c.resources, err = decodeResources(in.Resources); err != nil {
		return c, err
	}
	if c.session.VaultIDs, err = decodeVaultIDs(in.VaultIDs); err != nil {
		return c, err
	}
	if len(c.session.VaultIDs) > 0 && h.keyring == nil {
		return c, errdefs.InvalidArgument("vault_ids: this server has no seal keyring, so it holds no vaults")
	}
	if present(in.Budget) && !isNull(in.Budget) {
		cents, err := decodeBudget(in.Budget)
		if err != nil {
			return c, err
		}
		c.session.BudgetCents = &cents
	}
	if c.initial, err = decodeInitialEvents(in.InitialEvents); err != nil {
		return c, err
	}
	if len(c.initial) > 0 && h.events == nil {
		return c, errdefs.InvalidArgument("initial_events: not supported by this server yet; create the session, then send the events")
	}
	return c, nil
}

func (h *Handler) getSession(w http.ResponseWriter, r *http.Request) {
	s, err := h.store.Sessions().Get(r.Context(), r.PathValue("id"))
	if p, _ := auth.From(r.Context()); err == nil && p.EnvironmentID != "" && p.EnvironmentID != s.EnvironmentID {
		err = errdefs.NotFound("session %s not found", s.ID)
	}
	h.writeSession(w, r, s, err)
}

type sessionUpdate struct {
	Title    json.RawMessage `json:"title"`
	Metadata json.RawMessage `json:"metadata"`
	Agent    json.RawMessage `json:"agent"`
	VaultIDs json.RawMessage `json:"vault_ids"`
	Budget   json.RawMessage `json:"budget"`
}

// applySessionUpdate applies an update to cur: title, a metadata patch,
// the agent's tools and mcp_servers (full replacements, only while the
// session is idle), and its budget as the API allows (replaced only if it
// has one and only above what it has spent at listCost's prices; removed
// with null).
func applySessionUpdate(b []byte, cur store.Session, listCost ListCostFunc) (store.Session, error) {
	var u sessionUpdate
	if err := decodeObject(b, "request body", &u); err != nil {
		return cur, err
	}
	// A session's vaults are fixed when it is created (as in the Managed
	// Agents API): their neutral value changes nothing.
	if err := emptyList(u.VaultIDs, "vault_ids", "session update vault_ids"); err != nil {
		return cur, err
	}
	if present(u.Budget) && isNull(u.Budget) {
		cur.BudgetCents = nil
	}
	if present(u.Budget) && !isNull(u.Budget) {
		cents, err := decodeBudget(u.Budget)
		if err != nil {
			return cur, err
		}
		if cur.BudgetCents == nil {
			return cur, errdefs.InvalidArgument("budget: session %s has no budget, and one can be set only when a session is created (budget_create_only)", cur.ID)
		}
		model := agentModel(cur.Agent)
		if err := budgetable(listCost, model); err != nil {
			return cur, err
		}
		if spent, _ := listCost(model, cur.Usage); cents*10_000_000 <= spent {
			return cur, errdefs.InvalidArgument("budget: %d cents is not above the %d the session has spent (budget_not_raised)", cents, spent/10_000_000)
		}
		cur.BudgetCents = &cents
	}
	var err error
	if present(u.Title) {
		if cur.Title, err = decodeTitle(u.Title); err != nil {
			return cur, err
		}
	}
	if cur.Metadata, err = metadataPatch(cur.Metadata, u.Metadata, false); err != nil {
		return cur, err
	}
	if present(u.Agent) && !isNull(u.Agent) {
		var f struct {
			Tools      json.RawMessage `json:"tools"`
			MCPServers json.RawMessage `json:"mcp_servers"`
		}
		if err := field(u.Agent, "agent", &f); err != nil {
			return cur, err
		}
		if cur.Status != store.SessionIdle {
			return cur, errdefs.FailedPrecondition("session %s is %s; its agent can only change while it is idle", cur.ID, cur.Status)
		}
		var snap sessionAgent
		if err := json.Unmarshal(cur.Agent, &snap); err != nil {
			return cur, fmt.Errorf("decoding stored agent snapshot of session %s: %w", cur.ID, err)
		}
		neutralize(&snap.agentCore)
		if err := applyCore(&snap.agentCore, agentFields{Tools: f.Tools, MCPServers: f.MCPServers}); err != nil {
			return cur, errdefs.InvalidArgument("agent.%s", err.Error())
		}
		if err := validateCore(snap.agentCore); err != nil {
			return cur, errdefs.InvalidArgument("agent.%s", err.Error())
		}
		if cur.Agent, err = json.Marshal(snap); err != nil {
			return cur, err
		}
	}
	return cur, nil
}

func (h *Handler) updateSession(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := decodeObject(b, "request body", &sessionUpdate{}); err != nil {
		h.fail(w, r, err)
		return
	}
	s, err := h.store.Sessions().Update(r.Context(), r.PathValue("id"), func(cur store.Session) (store.Session, []store.NewEvent, error) {
		next, err := applySessionUpdate(b, cur, h.listCost)
		if err != nil {
			return cur, nil, err
		}
		ev, err := sessionUpdatedEvent(cur, next)
		return next, ev, err
	})
	h.writeSession(w, r, s, err)
}

func (h *Handler) archiveSession(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	s, err := h.store.Sessions().Archive(r.Context(), r.PathValue("id"))
	if err == nil && h.archived != nil {
		h.archived(s.ID)
	}
	h.writeSession(w, r, s, err)
}

func (h *Handler) deleteSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := h.store.Sessions().Delete(r.Context(), id); err != nil {
		h.fail(w, r, err)
		return
	}
	if h.deleted != nil {
		h.deleted(context.WithoutCancel(r.Context()), id)
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "type": "session_deleted"})
}

// sessionListQuery parses the list filters.
func sessionListQuery(r *http.Request) (opts store.SessionListOptions, order string, c *cursor, none bool, err error) {
	q := r.URL.Query()
	if opts.Limit, err = queryLimit(q); err != nil {
		return
	}
	if opts.IncludeArchived, err = queryBool(q, "include_archived"); err != nil {
		return
	}
	if id := q.Get("agent_id"); id != "" {
		opts.AgentID = &id
	}
	if s := q.Get("agent_version"); s != "" {
		v, perr := strconv.ParseInt(s, 10, 64)
		if perr != nil || v < 1 {
			err = errdefs.InvalidArgument("agent_version: %q is not a positive integer", s)
			return
		}
		if opts.AgentID == nil {
			err = errdefs.InvalidArgument("agent_version needs agent_id")
			return
		}
		opts.AgentVersion = &v
	}
	for name, dst := range map[string]**time.Time{
		"created_at[gt]": &opts.Created.Gt, "created_at[gte]": &opts.Created.Gte,
		"created_at[lt]": &opts.Created.Lt, "created_at[lte]": &opts.Created.Lte,
	} {
		if *dst, err = queryTime(q, name); err != nil {
			return
		}
	}
	for _, s := range queryList(q, "statuses") {
		if !slices.Contains(sessionStatuses, s) {
			err = enumError("statuses", s, sessionStatuses)
			return
		}
		opts.Statuses = append(opts.Statuses, s)
	}
	// corral has no deployments or memory stores yet: nothing matches them.
	none = q.Get("deployment_id") != "" || q.Get("memory_store_id") != ""
	if order, err = queryOrder(q, "desc"); err != nil {
		return
	}
	c, err = decodeCursor(q, "sessions", order)
	return
}

func (h *Handler) listSessions(w http.ResponseWriter, r *http.Request) {
	opts, order, c, none, err := sessionListQuery(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := bidiPage[sessionResponse]{Data: []sessionResponse{}}
	if none {
		writeJSON(w, http.StatusOK, out)
		return
	}
	back := c != nil && c.Back
	asc := order == "asc"
	opts.Ascending = asc != back
	if c != nil {
		opts.Key = c.key()
	}
	sessions, more, err := h.store.Sessions().List(r.Context(), opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if back {
		slices.Reverse(sessions)
	}
	now := time.Now()
	for _, s := range sessions {
		out.Data = append(out.Data, sessionOut(s, now, h.listCost))
	}
	if n := len(sessions); n > 0 {
		first, last := sessions[0], sessions[n-1]
		if (!back && more) || back {
			out.NextPage = keyCursor("sessions", order, false, last.CreatedAt, last.ID)
		}
		if (back && more) || (!back && c != nil) {
			out.PrevPage = keyCursor("sessions", order, true, first.CreatedAt, first.ID)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// sessionUpdatedEvent describes what an update changed as a session.updated
// event: the new title, the full metadata (when non-empty) and the full agent
// snapshot, each only when it changed. Nothing changed, no event.
func sessionUpdatedEvent(cur, next store.Session) ([]store.NewEvent, error) {
	body := map[string]any{}
	if !equalPtr(cur.Title, next.Title) {
		body["title"] = next.Title
	}
	if !maps.Equal(cur.Metadata, next.Metadata) && len(next.Metadata) > 0 {
		body["metadata"] = next.Metadata
	}
	if !bytes.Equal(cur.Agent, next.Agent) {
		body["agent"] = json.RawMessage(next.Agent)
	}
	if len(body) == 0 {
		return nil, nil
	}
	id := store.NewEventID()
	body["id"], body["type"] = id, "session.updated"
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return []store.NewEvent{{ID: id, Type: "session.updated", Body: b}}, nil
}

func equalPtr(a, b *string) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}
