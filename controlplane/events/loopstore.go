package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// LoopStore is the agent loop's Store over PostgreSQL.
type LoopStore struct{ St *store.Store }

var _ agentloop.Store = LoopStore{}

// Load implements agentloop.Store: the session's snapshot and its whole
// log, up to the sequence number read with the snapshot, so that a
// session.updated in the log is never newer than the snapshot.
func (l LoopStore) Load(ctx context.Context, sessionID string) (agentloop.Agent, []agentloop.Event, error) {
	st, err := l.St.Events().LoopState(ctx, sessionID)
	if err != nil {
		return agentloop.Agent{}, nil, err
	}
	var agent agentloop.Agent
	if err := json.Unmarshal(st.Agent, &agent); err != nil {
		return agentloop.Agent{}, nil, fmt.Errorf("session %s agent snapshot: %w", sessionID, err)
	}
	agent.SelfHosted = st.SelfHosted
	if err := l.memoryNotes(ctx, sessionID, &agent); err != nil {
		return agentloop.Agent{}, nil, err
	}
	if agent.Skills, err = l.skills(ctx, st.Agent); err != nil {
		return agentloop.Agent{}, nil, fmt.Errorf("session %s skills: %w", sessionID, err)
	}
	pins, err := l.St.Events().MCPTools(ctx, sessionID)
	if err != nil {
		return agentloop.Agent{}, nil, err
	}
	for server, raw := range pins {
		var tools []agentloop.MCPTool
		if err := json.Unmarshal(raw, &tools); err != nil {
			return agentloop.Agent{}, nil, fmt.Errorf("session %s MCP tools of %s: %w", sessionID, server, err)
		}
		if agent.MCPTools == nil {
			agent.MCPTools = map[string][]agentloop.MCPTool{}
		}
		agent.MCPTools[server] = tools
	}
	if st.LastSeq == 0 {
		return agent, nil, nil
	}
	log, err := l.since(ctx, sessionID, 0, st.LastSeq, true)
	if err != nil {
		return agentloop.Agent{}, nil, err
	}
	return agent, log, nil
}

// LoadSince implements agentloop.Store: one indexed range read, of no rows
// when nothing was appended, after a look up of the session in the same
// transaction, so that a session deleted under a running loop is not found
// (and its loop stops) rather than left with nothing new.
func (l LoopStore) LoadSince(ctx context.Context, sessionID string, after int64) ([]agentloop.Event, error) {
	return l.since(ctx, sessionID, after, 0, false)
}

// since reads the events after seq after, up to seq until (0: all);
// known skips the check that the session exists.
func (l LoopStore) since(ctx context.Context, sessionID string, after, until int64, known bool) ([]agentloop.Event, error) {
	var log []agentloop.Event
	const page = 1000
	for {
		got, err := l.St.Events().List(ctx, sessionID, store.EventQuery{After: after, Limit: page, SessionKnown: known})
		if err != nil {
			return nil, err
		}
		for _, se := range got {
			if until > 0 && se.Seq > until {
				return log, nil
			}
			e, err := loopEvent(se)
			if err != nil {
				return nil, err
			}
			log = append(log, e)
			after = se.Seq
		}
		known = true
		if len(got) < page || until > 0 && after >= until {
			return log, nil
		}
	}
}

// Queued implements agentloop.Store.
func (l LoopStore) Queued(ctx context.Context, sessionID string) ([]agentloop.Event, error) {
	got, err := l.St.Events().Queued(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	out := make([]agentloop.Event, 0, len(got))
	for _, se := range got {
		e, err := loopEvent(se)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func loopEvent(se store.StoredEvent) (agentloop.Event, error) {
	var e agentloop.Event
	if err := json.Unmarshal(se.JSON, &e); err != nil {
		return e, fmt.Errorf("event %s: %w", se.ID, err)
	}
	e.Seq, e.Processed = se.Seq, se.ProcessedAt != nil
	if len(se.Private) > 0 {
		e.Private = new(agentloop.Private)
		if err := json.Unmarshal(se.Private, e.Private); err != nil {
			return e, fmt.Errorf("event %s: what the loop kept: %w", se.ID, err)
		}
	}
	return e, nil
}

// Commit implements agentloop.Store.
func (l LoopStore) Commit(ctx context.Context, sessionID string, c agentloop.Commit) error {
	a := store.Append{Consume: c.Consume, Status: c.Status}
	for _, o := range c.Events {
		b, err := json.Marshal(o)
		if err != nil {
			return err
		}
		ne := store.NewEvent{ID: o.ID, Type: o.Type, Body: b}
		if o.Private != nil {
			if ne.Private, err = json.Marshal(o.Private); err != nil {
				return err
			}
		}
		a.Events = append(a.Events, ne)
		if u, ok := o.Fields["model_usage"].(model.Usage); ok && o.Type == agentloop.SpanModelRequestEnd {
			a.Usage.InputTokens += u.InputTokens
			a.Usage.OutputTokens += u.OutputTokens
			a.Usage.CacheReadInputTokens += u.CacheReadInputTokens
			a.Usage.CacheCreationInputTokens += u.CacheCreationInputTokens
			if o.Private != nil {
				a.Usage.Model = o.Private.Model
			}
		}
	}
	a.RunnerEpoch, _ = ctx.Value(runnerEpochKey{}).(int64)
	_, err := l.St.Events().Append(ctx, sessionID, a)
	if errors.Is(err, store.ErrStaleRunner) {
		return fmt.Errorf("%w: %w", agentloop.ErrNotRunner, err)
	}
	return err
}

// PinMCPTools implements agentloop.Store.
func (l LoopStore) PinMCPTools(ctx context.Context, sessionID, server string, tools []agentloop.MCPTool) error {
	if tools == nil {
		tools = []agentloop.MCPTool{}
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return err
	}
	return l.St.Events().PinMCPTools(ctx, sessionID, server, b)
}

type runnerEpochKey struct{}

// WithRunnerEpoch returns ctx carrying the session runner's epoch, claimed
// with store.Events.ClaimRunner: LoopStore.Commit's appends under it are
// refused (agentloop.ErrNotRunner) once a newer runner has claimed the
// session.
func WithRunnerEpoch(ctx context.Context, epoch int64) context.Context {
	return context.WithValue(ctx, runnerEpochKey{}, epoch)
}

// Previews publishes live previews to every node's streams.
type Previews struct {
	St  *store.Store
	Log *slog.Logger
}

var _ agentloop.Previews = Previews{}

// maxDeltaBytes keeps a notification under PostgreSQL's 8000-byte payload
// limit, with room for the envelope.
const maxDeltaBytes = 3000

// Start implements agentloop.Previews.
func (p Previews) Start(sessionID, eventID, eventType string) {
	p.send(sessionID, map[string]any{"type": "event_start", "event": map[string]string{"id": eventID, "type": eventType}})
}

// Delta implements agentloop.Previews. Long deltas go out in pieces.
func (p Previews) Delta(sessionID, eventID string, index int, text string) {
	for len(text) > 0 {
		n := len(textcut.Prefix(text, maxDeltaBytes))
		if n == 0 { // no character boundary within the bound: not UTF-8
			n = min(len(text), maxDeltaBytes)
		}
		p.send(sessionID, map[string]any{
			"type":     "event_delta",
			"event_id": eventID,
			"delta":    map[string]any{"type": "content_delta", "index": index, "content": map[string]string{"type": "text", "text": text[:n]}},
		})
		text = text[n:]
	}
}

func (p Previews) send(sessionID string, frame map[string]any) {
	f, _ := json.Marshal(frame)
	b, _ := json.Marshal(wireDelta{SessionID: sessionID, Frame: f})
	// Best effort: a preview that cannot be sent is simply not seen.
	if err := p.St.Notify(context.Background(), store.DeltasChannel, string(b)); err != nil && p.Log != nil {
		p.Log.Debug("dropping preview", "session_id", sessionID, "err", err)
	}
}

// Resume wakes the loops of every session that had work when the node last
// stopped.
func Resume(ctx context.Context, st *store.Store, wake func(tenant.ID, string)) error {
	list, err := st.SessionsNeedingRunner(ctx)
	if err != nil {
		return err
	}
	for _, ts := range list {
		wake(ts.Tenant, ts.SessionID)
	}
	return nil
}

// memoryNotes tells the model where the session's memory stores are
// mounted, with their descriptions and instructions, after the agent's
// system prompt (as the Managed Agents API does). A session's stores are
// fixed when it is created, so the snapshot stays true.
func (l LoopStore) memoryNotes(ctx context.Context, sessionID string, agent *agentloop.Agent) error {
	s, err := l.St.Sessions().Get(ctx, sessionID)
	if err != nil || len(s.Resources) == 0 {
		return err
	}
	var rs []struct {
		Type         string  `json:"type"`
		MountPath    string  `json:"mount_path"`
		Access       string  `json:"access"`
		Name         *string `json:"name"`
		Description  *string `json:"description"`
		Instructions *string `json:"instructions"`
	}
	if err := json.Unmarshal(s.Resources, &rs); err != nil {
		return fmt.Errorf("decoding the resources of session %s: %w", sessionID, err)
	}
	var b strings.Builder
	for _, r := range rs {
		if r.Type != "memory_store" || r.Name == nil {
			continue
		}
		fmt.Fprintf(&b, "\n\nMemory store %q is mounted %s at %s/ (one file per memory).", *r.Name, strings.ReplaceAll(r.Access, "_", "-"), r.MountPath)
		if r.Access == "read_write" {
			b.WriteString(" What you write, add or remove there is saved to the store after each tool call; other sessions may change it too.")
		}
		if r.Description != nil && *r.Description != "" {
			fmt.Fprintf(&b, " Description: %s", *r.Description)
		}
		if r.Instructions != nil && *r.Instructions != "" {
			fmt.Fprintf(&b, " Instructions: %s", *r.Instructions)
		}
	}
	if b.Len() > 0 {
		agent.System = strings.TrimPrefix(agent.System+b.String(), "\n\n")
	}
	return nil
}

// skills reads the name and description of each skill the snapshot pins.
// A version deleted since the session started is left out: the model is
// not told of files the sandbox will not have.
func (l LoopStore) skills(ctx context.Context, snapshot json.RawMessage) ([]agentloop.Skill, error) {
	var snap struct {
		Skills []struct {
			Type    string `json:"type"`
			SkillID string `json:"skill_id"`
			Version string `json:"version"`
		} `json:"skills"`
	}
	if err := json.Unmarshal(snapshot, &snap); err != nil {
		return nil, err
	}
	var out []agentloop.Skill
	for _, sk := range snap.Skills {
		if sk.Type != "custom" || sk.Version == "" {
			continue // never in force (the API's neutralize)
		}
		v, err := l.St.Skills().Version(ctx, sk.SkillID, sk.Version)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, agentloop.Skill{Name: v.Name, Description: v.Description})
	}
	return out, nil
}
