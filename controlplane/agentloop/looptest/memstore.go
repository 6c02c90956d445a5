// Package looptest has an in-memory agentloop.Store for unit tests, and the
// conformance suite that it and the PostgreSQL-backed store both pass.
package looptest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/internal/errdefs"
)

// MemStore keeps sessions in memory.
type MemStore struct {
	mu sync.Mutex
	// sessions guarded by mu.
	sessions map[string]*memSession
}

type memSession struct {
	agent  agentloop.Agent
	status string
	events []agentloop.Event
	raw    []json.RawMessage
	pins   map[string][]agentloop.MCPTool
}

var _ agentloop.Store = (*MemStore)(nil)

// NewMemStore returns an empty store.
func NewMemStore() *MemStore { return &MemStore{sessions: map[string]*memSession{}} }

// CreateSession adds an idle session.
func (m *MemStore) CreateSession(id string, agent agentloop.Agent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sessions[id] = &memSession{agent: agent, status: "idle"}
}

// AddUserEvent queues a client event (JSON with id and type).
func (m *MemStore) AddUserEvent(id string, event []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return errdefs.NotFound("session %s", id)
	}
	var e agentloop.Event
	if err := json.Unmarshal(event, &e); err != nil {
		return err
	}
	s.add(e, event)
	return nil
}

// UpdateAgent replaces the session's agent snapshot, logging a
// session.updated event with it, as the API's session update does.
func (m *MemStore) UpdateAgent(id string, agent agentloop.Agent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return errdefs.NotFound("session %s", id)
	}
	snap, err := json.Marshal(agent)
	if err != nil {
		return err
	}
	evID := fmt.Sprintf("sevt_updated_%d", len(s.events)+1)
	raw, err := json.Marshal(map[string]any{"id": evID, "type": agentloop.SessionUpdated, "agent": json.RawMessage(snap)})
	if err != nil {
		return err
	}
	s.agent = agent
	s.add(agentloop.Event{ID: evID, Type: agentloop.SessionUpdated, Processed: true}, raw)
	return nil
}

// add appends e (raw as written) with the next sequence number. Called
// with m.mu held.
func (s *memSession) add(e agentloop.Event, raw json.RawMessage) {
	e.Seq = int64(len(s.events) + 1)
	s.events = append(s.events, e)
	s.raw = append(s.raw, raw)
}

// Status returns the session's status.
func (m *MemStore) Status(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[id].status
}

// Events returns the session's events as stored.
func (m *MemStore) Events(id string) []agentloop.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]agentloop.Event(nil), m.sessions[id].events...)
}

// RawEvents returns the session's events as JSON, as they were written.
func (m *MemStore) RawEvents(id string) []json.RawMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]json.RawMessage(nil), m.sessions[id].raw...)
}

// Load implements agentloop.Store.
func (m *MemStore) Load(_ context.Context, id string) (agentloop.Agent, []agentloop.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return agentloop.Agent{}, nil, errdefs.NotFound("session %s", id)
	}
	agent := s.agent
	if len(s.pins) > 0 {
		agent.MCPTools = maps.Clone(s.pins)
	}
	return agent, append([]agentloop.Event(nil), s.events...), nil
}

// LoadSince implements agentloop.Store.
func (m *MemStore) LoadSince(_ context.Context, id string, after int64) ([]agentloop.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return nil, errdefs.NotFound("session %s", id)
	}
	after = max(after, 0)
	if after >= int64(len(s.events)) {
		return nil, nil
	}
	return append([]agentloop.Event(nil), s.events[after:]...), nil
}

// Queued implements agentloop.Store.
func (m *MemStore) Queued(_ context.Context, id string) ([]agentloop.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return nil, errdefs.NotFound("session %s", id)
	}
	var out []agentloop.Event
	for _, e := range s.events {
		if !e.Processed {
			out = append(out, e)
		}
	}
	return out, nil
}

// PinMCPTools implements agentloop.Store.
func (m *MemStore) PinMCPTools(_ context.Context, id, server string, tools []agentloop.MCPTool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return errdefs.NotFound("session %s", id)
	}
	if s.pins == nil {
		s.pins = map[string][]agentloop.MCPTool{}
	}
	if _, pinned := s.pins[server]; !pinned {
		s.pins[server] = append([]agentloop.MCPTool{}, tools...)
	}
	return nil
}

// Commit implements agentloop.Store.
func (m *MemStore) Commit(_ context.Context, id string, c agentloop.Commit) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return errdefs.NotFound("session %s", id)
	}
	consume := map[string]bool{}
	for _, c := range c.Consume {
		consume[c] = true
	}
	found := 0
	for i := range s.events {
		if consume[s.events[i].ID] {
			s.events[i].Processed = true
			found++
		}
	}
	if found != len(consume) {
		return fmt.Errorf("consuming %d events, found %d", len(consume), found)
	}
	for _, o := range c.Events {
		b, err := json.Marshal(o)
		if err != nil {
			return err
		}
		var e agentloop.Event
		if err := json.Unmarshal(b, &e); err != nil {
			return err
		}
		e.Processed, e.Private = true, o.Private // Private is never part of the wire form
		s.add(e, b)
	}
	if c.Status != "" {
		s.status = c.Status
	}
	return nil
}
