package publicapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
)

// agentResponse is the wire form of an agent version.
type agentResponse struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Version int64  `json:"version"`
	Name    string `json:"name"`
	agentCore
	Metadata   map[string]string `json:"metadata"`
	CreatedAt  string            `json:"created_at"`
	UpdatedAt  string            `json:"updated_at"`
	ArchivedAt *string           `json:"archived_at"`
}

// sessionAgent is the resolved agent snapshot a session stores and returns.
type sessionAgent struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Version int64  `json:"version"`
	Name    string `json:"name"`
	agentCore
}

func decodeSpec(a store.Agent) (agentSpec, error) {
	var s agentSpec
	if err := json.Unmarshal(a.Spec, &s); err != nil {
		return s, fmt.Errorf("decoding stored agent %s version %d: %w", a.ID, a.Version, err)
	}
	if s.Metadata == nil {
		s.Metadata = map[string]string{}
	}
	// A version stored before some of its fields were refused reports
	// them neutral: none of them was ever in force (unsupported.go).
	neutralize(&s.agentCore)
	return s, nil
}

func agentOut(a store.Agent) (agentResponse, error) {
	s, err := decodeSpec(a)
	if err != nil {
		return agentResponse{}, err
	}
	return agentResponse{
		Type: "agent", ID: a.ID, Version: a.Version, Name: a.Name,
		agentCore: s.agentCore, Metadata: s.Metadata,
		CreatedAt: ts(a.CreatedAt), UpdatedAt: ts(a.UpdatedAt), ArchivedAt: tsPtr(a.ArchivedAt),
	}, nil
}

func (h *Handler) writeAgent(w http.ResponseWriter, r *http.Request, a store.Agent, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out, err := agentOut(a)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// decodeAgentCreate validates a create request: name and model required.
func decodeAgentCreate(b []byte) (name string, spec agentSpec, err error) {
	var f agentFields
	if err := decodeObject(b, "request body", &f); err != nil {
		return "", spec, err
	}
	name, err = stringField(f.Name, "name")
	if err != nil {
		return "", spec, err
	}
	if err := checkLen(name, "name", 1, maxAgentName); err != nil {
		return "", spec, err
	}
	if !present(f.Model) {
		return "", spec, errdefs.InvalidArgument("model is required")
	}
	spec.agentCore = defaultCore()
	if err := applyCore(&spec.agentCore, f); err != nil {
		return "", spec, err
	}
	if err := validateCore(spec.agentCore); err != nil {
		return "", spec, err
	}
	spec.Metadata, err = metadataCreate(f.Metadata)
	return name, spec, err
}

func (h *Handler) createAgent(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	name, spec, err := decodeAgentCreate(b)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := h.resolveSkills(r.Context(), &spec.agentCore); err != nil {
		h.fail(w, r, err)
		return
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	a, err := h.store.Agents().Create(r.Context(), name, raw)
	h.writeAgent(w, r, a, err)
}

func (h *Handler) getAgent(w http.ResponseWriter, r *http.Request) {
	var version int64
	if s := r.URL.Query().Get("version"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 1 {
			h.fail(w, r, errdefs.InvalidArgument("version: %q is not a positive integer", s))
			return
		}
		version = v
	}
	a, err := h.store.Agents().Get(r.Context(), r.PathValue("id"), version)
	h.writeAgent(w, r, a, err)
}

// agentUpdate is an update request: the agent fields plus the optimistic
// concurrency version.
type agentUpdate struct {
	agentFields
	Version json.RawMessage `json:"version"`
}

// applyAgentUpdate applies an update request to the current version and
// returns the new name and spec. A version that is not current is a
// conflict the client must not retry blindly.
func applyAgentUpdate(b []byte, cur store.Agent) (string, agentSpec, error) {
	var u agentUpdate
	if err := decodeObject(b, "request body", &u); err != nil {
		return "", agentSpec{}, err
	}
	if present(u.Version) && !isNull(u.Version) {
		var v int64
		if err := field(u.Version, "version", &v); err != nil {
			return "", agentSpec{}, err
		}
		if v < 1 {
			return "", agentSpec{}, errdefs.InvalidArgument("version must be at least 1")
		}
		if v != cur.Version {
			return "", agentSpec{}, errdefs.Conflict("version %d is not the current version of agent %s (%d); fetch the agent and retry with its current version", v, cur.ID, cur.Version)
		}
	}
	spec, err := decodeSpec(cur)
	if err != nil {
		return "", spec, err
	}
	name := cur.Name
	if present(u.Name) {
		if isNull(u.Name) {
			return "", spec, errdefs.InvalidArgument("name cannot be cleared")
		}
		if name, err = stringField(u.Name, "name"); err != nil {
			return "", spec, err
		}
		if err := checkLen(name, "name", 1, maxAgentName); err != nil {
			return "", spec, err
		}
	}
	if err := applyCore(&spec.agentCore, u.agentFields); err != nil {
		return "", spec, err
	}
	if err := validateCore(spec.agentCore); err != nil {
		return "", spec, err
	}
	spec.Metadata, err = metadataPatch(spec.Metadata, u.Metadata, false)
	return name, spec, err
}

func (h *Handler) updateAgent(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// Decode once outside the transaction, so malformed bodies fail fast.
	if err := decodeObject(b, "request body", &agentUpdate{}); err != nil {
		h.fail(w, r, err)
		return
	}
	a, err := h.store.Agents().Update(r.Context(), r.PathValue("id"), func(cur store.Agent) (string, json.RawMessage, error) {
		name, spec, err := applyAgentUpdate(b, cur)
		if err != nil {
			return "", nil, err
		}
		if err := h.resolveSkills(r.Context(), &spec.agentCore); err != nil {
			return "", nil, err
		}
		raw, err := json.Marshal(spec)
		return name, raw, err
	})
	h.writeAgent(w, r, a, err)
}

func (h *Handler) archiveAgent(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	a, err := h.store.Agents().Archive(r.Context(), r.PathValue("id"))
	h.writeAgent(w, r, a, err)
}

func (h *Handler) listAgents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var opts store.AgentListOptions
	var err error
	if opts.Limit, err = queryLimit(q); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.IncludeArchived, err = queryBool(q, "include_archived"); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.CreatedGte, err = queryTime(q, "created_at[gte]"); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.CreatedLte, err = queryTime(q, "created_at[lte]"); err != nil {
		h.fail(w, r, err)
		return
	}
	c, err := decodeCursor(q, "agents", "desc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if c != nil {
		opts.After = c.key()
	}
	agents, more, err := h.store.Agents().List(r.Context(), opts)
	h.writeAgentPage(w, r, agents, more, err, func(last store.Agent) *string {
		return keyCursor("agents", "desc", false, last.CreatedAt, last.ID)
	})
}

func (h *Handler) listAgentVersions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id := r.PathValue("id")
	limit, err := queryLimit(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	list := "agent_versions:" + id
	c, err := decodeCursor(q, list, "desc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var before int64
	if c != nil {
		before = c.N
	}
	versions, more, err := h.store.Agents().ListVersions(r.Context(), id, limit, before)
	h.writeAgentPage(w, r, versions, more, err, func(last store.Agent) *string {
		return cursor{List: list, Order: "desc", N: last.Version}.encode()
	})
}

func (h *Handler) writeAgentPage(w http.ResponseWriter, r *http.Request, agents []store.Agent, more bool, err error, next func(store.Agent) *string) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[agentResponse]{Data: []agentResponse{}}
	for _, a := range agents {
		ar, err := agentOut(a)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		out.Data = append(out.Data, ar)
	}
	if more && len(agents) > 0 {
		out.NextPage = next(agents[len(agents)-1])
	}
	writeJSON(w, http.StatusOK, out)
}

// agentRef is a session create's agent member, parsed: an agent id (latest
// version), {type:"agent", id, version?} or {type:"agent_with_overrides", id,
// version?, model?, system?, tools?, mcp_servers?, skills?}.
type agentRef struct {
	ID        string
	Version   int64 // 0: latest
	Overrides agentFields
}

func parseAgentRef(raw json.RawMessage) (agentRef, error) {
	var ref struct {
		agentFields
		Type    *string         `json:"type"`
		ID      *string         `json:"id"`
		Version json.RawMessage `json:"version"`
	}
	switch jsonKind(raw) {
	case "a string":
		var id string
		_ = json.Unmarshal(raw, &id)
		ref.ID = &id
	case "an object":
		if err := field(raw, "agent", &ref); err != nil {
			return agentRef{}, err
		}
		if ref.Type == nil {
			return agentRef{}, errdefs.InvalidArgument("agent.type is required")
		}
		f := ref.agentFields
		switch *ref.Type {
		case "agent":
			if present(f.Model) || present(f.System) || present(f.Tools) || present(f.MCPServers) || present(f.Skills) ||
				present(f.Name) || present(f.Description) || present(f.Multiagent) || present(f.Metadata) || present(f.ExecutionIdentity) {
				return agentRef{}, errdefs.InvalidArgument("agent: overrides need type agent_with_overrides")
			}
		case "agent_with_overrides":
			if present(f.Name) || present(f.Description) || present(f.Multiagent) || present(f.Metadata) || present(f.ExecutionIdentity) {
				return agentRef{}, errdefs.InvalidArgument("agent: only model, system, tools, mcp_servers and skills can be overridden")
			}
			if present(f.Model) && isNull(f.Model) {
				return agentRef{}, errdefs.InvalidArgument("agent.model: the model cannot be cleared (agent_model_required)")
			}
		default:
			return agentRef{}, enumError("agent.type", *ref.Type, []string{"agent", "agent_with_overrides"})
		}
	case "nothing":
		return agentRef{}, errdefs.InvalidArgument("agent is required")
	default:
		return agentRef{}, errdefs.InvalidArgument("agent: expected an agent id or an object, got %s", jsonKind(raw))
	}
	if ref.ID == nil || *ref.ID == "" {
		return agentRef{}, errdefs.InvalidArgument("agent.id is required")
	}
	out := agentRef{ID: *ref.ID, Overrides: ref.agentFields}
	if present(ref.Version) && !isNull(ref.Version) {
		if err := field(ref.Version, "agent.version", &out.Version); err != nil {
			return agentRef{}, err
		}
		if out.Version < 1 {
			return agentRef{}, errdefs.InvalidArgument("agent.version must be at least 1")
		}
	}
	// Overrides are checked before any lookup, so a bad one is a 400 even
	// for an agent that does not exist.
	scratch := defaultCore()
	if err := applyCore(&scratch, out.Overrides); err != nil {
		return agentRef{}, errdefs.InvalidArgument("agent.%s", err.Error())
	}
	return out, nil
}

// snapshot resolves ref against agent version a: the session's agent.
// Archived agents cannot start sessions.
func (ref agentRef) snapshot(a store.Agent) (sessionAgent, error) {
	if a.ArchivedAt != nil {
		return sessionAgent{}, errdefs.InvalidArgument("agent %s is archived; archived agents cannot start sessions", a.ID)
	}
	spec, err := decodeSpec(a)
	if err != nil {
		return sessionAgent{}, err
	}
	core := spec.agentCore
	if err := applyCore(&core, ref.Overrides); err != nil {
		return sessionAgent{}, errdefs.InvalidArgument("agent.%s", err.Error())
	}
	if err := validateCore(core); err != nil {
		return sessionAgent{}, errdefs.InvalidArgument("agent.%s", err.Error())
	}
	return sessionAgent{Type: "agent", ID: a.ID, Version: a.Version, Name: a.Name, agentCore: core}, nil
}
