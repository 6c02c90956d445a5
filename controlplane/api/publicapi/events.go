package publicapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/tracing"
)

// EventsHandler serves a session's events: send, list and the live stream.
type EventsHandler struct {
	Store *store.Store
	Hub   *events.Hub
	// Wake runs the session's agent loop after client events arrive. ctx
	// is the request's, whose trace the loop continues; the loop outlives
	// it.
	Wake func(ctx context.Context, t tenant.ID, sessionID string)
	// WriteError writes an error in the API's envelope.
	WriteError func(w http.ResponseWriter, r *http.Request, err error)
	// Closing, when closed, ends every open stream (the node is shutting
	// down; clients reconnect elsewhere with Last-Event-ID).
	Closing <-chan struct{}
	// KeepAlive is the interval between pings on an idle stream. Default 15s.
	KeepAlive time.Duration
	// Guard authorizes every route. Required.
	Guard *Guard
	// Admit, when set, is asked before a user.message is stored (ctx carries
	// the tenant): an error refuses the events, for example a quota that
	// leaves no room for the sandbox the session's turn would need.
	Admit func(ctx context.Context, sessionID string) error
	// OpenStreams, when set, counts the event streams open now: Inc when
	// one starts, Dec when it ends (a Prometheus gauge).
	OpenStreams interface {
		Inc()
		Dec()
	}
}

// Register mounts the events routes on mux, each behind the guard (see
// Rules).
func (h *EventsHandler) Register(mux *http.ServeMux) {
	h.Guard.handle(mux, "POST /v1/sessions/{session_id}/events", h.send)
	h.Guard.handle(mux, "GET /v1/sessions/{session_id}/events", h.list)
	h.Guard.handle(mux, "GET /v1/sessions/{session_id}/events/stream", h.stream)
}

// clientEventTypes are the events a client may send, each with the members
// it may carry besides type. The refused types (unsupported.go) carry none.
var clientEventTypes = map[string][]string{
	"user.message":            {"content"},
	"user.interrupt":          {"session_thread_id"},
	"user.tool_confirmation":  {"tool_use_id", "result", "deny_message"},
	"user.custom_tool_result": {"custom_tool_use_id", "content", "is_error"},
	"user.define_outcome":     nil,
	"user.tool_result":        {"tool_use_id", "content", "is_error"},
	"system.message":          nil,
}

// refusedEventTypes are client events corral refuses (unsupported.go).
var refusedEventTypes = map[string]bool{"user.define_outcome": true, "system.message": true}

// maxToolResultBytes bounds the text of one user.tool_result (a worker's
// bash keeps 100 KiB of output; the model is sent all of it).
const maxToolResultBytes = 1 << 20

// maxEventsPerSend bounds one POST.
const maxEventsPerSend = 50

// workerSession confines an environment key to its environment's
// sessions: another's is not found, as another tenant's is. Other
// principals pass.
func workerSession(ctx context.Context, st *store.Store, sessionID string) error {
	p, _ := auth.From(ctx)
	if p.EnvironmentID == "" {
		return nil
	}
	s, err := st.Sessions().Get(ctx, sessionID)
	if err != nil {
		return err
	}
	if s.EnvironmentID != p.EnvironmentID {
		return errdefs.NotFound("session %s not found", sessionID)
	}
	return nil
}

// workerEventTypes are what an environment key may send: the results of
// the tool calls its worker ran.
var workerEventTypes = map[string]bool{"user.tool_result": true, "user.custom_tool_result": true}

func (h *EventsHandler) send(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sid := r.PathValue("session_id")
	if err := workerSession(ctx, h.Store, sid); err != nil {
		h.WriteError(w, r, err)
		return
	}
	var body struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := decodeBody(w, r, &body); err != nil {
		h.WriteError(w, r, err)
		return
	}
	if len(body.Events) == 0 {
		h.WriteError(w, r, errdefs.InvalidArgument("events must hold at least one event"))
		return
	}
	if p, _ := auth.From(ctx); p.EnvironmentID != "" {
		for i, raw := range body.Events {
			var e struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(raw, &e) != nil || !workerEventTypes[e.Type] {
				h.WriteError(w, r, errdefs.PermissionDenied("events[%d]: an environment key sends only user.tool_result and user.custom_tool_result events", i))
				return
			}
		}
	}
	stored, err := h.AppendUserEvents(ctx, sid, body.Events)
	if err != nil {
		h.WriteError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	var buf bytes.Buffer
	buf.WriteString(`{"data":[`)
	for i, e := range stored {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(e)
	}
	buf.WriteString(`]}`)
	_, _ = w.Write(buf.Bytes())
}

// AppendUserEvents validates client events, appends them to the session's
// log (queued for the agent loop) and wakes the loop. It returns the events
// as stored. Session creation uses it for initial_events.
func (h *EventsHandler) AppendUserEvents(ctx context.Context, sessionID string, raw []json.RawMessage) ([]json.RawMessage, error) {
	t, err := tenant.Required(ctx)
	if err != nil {
		return nil, err
	}
	if len(raw) > maxEventsPerSend {
		return nil, errdefs.InvalidArgument("events: at most %d events per request (got %d)", maxEventsPerSend, len(raw))
	}
	exists := func(eventID string) error {
		_, err := h.Store.Events().SeqOf(ctx, sessionID, eventID)
		return err
	}
	var evs []store.NewEvent
	for i, r := range raw {
		e, err := validateClientEvent(r, "events["+strconv.Itoa(i)+"]", exists)
		if err != nil {
			return nil, err
		}
		evs = append(evs, e)
	}
	if h.Admit != nil && slices.ContainsFunc(evs, func(e store.NewEvent) bool { return e.Type == "user.message" }) {
		if err := h.Admit(ctx, sessionID); err != nil {
			return nil, err
		}
	}
	stored, err := h.Store.Events().AppendClient(ctx, sessionID, evs)
	if err != nil {
		return nil, err
	}
	if span := tracing.Recording(ctx); span != nil {
		span.SetAttributes(tracing.SessionIDKey.String(sessionID), tracing.TenantKey.String(string(t)))
	}
	if h.Wake != nil {
		h.Wake(ctx, t, sessionID)
	}
	out := make([]json.RawMessage, len(stored))
	for i, s := range stored {
		out[i] = s.JSON
	}
	return out, nil
}

// contentBlock is a content block of a client event: text, or in a user
// message an image or a document, which the conversation sent to the model
// carries. Tool results carry text only; the API's search_result blocks are
// refused (unsupported.go).
type contentBlock struct {
	Type    string       `json:"type"`
	Text    *string      `json:"text,omitempty"`
	Source  *mediaSource `json:"source,omitempty"`
	Title   *string      `json:"title,omitempty"`
	Context *string      `json:"context,omitempty"`
}

// mediaSource is an image's or a document's source as the API has it.
type mediaSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
	FileID    string `json:"file_id,omitempty"`
}

// Bounds on an image's or a document's metadata (their data is bounded by
// the request body's limit).
const (
	maxMediaURL        = 2048
	maxDocumentTitle   = 500
	maxDocumentContext = 10000
)

// imageTypes are the media types of a base64 image the Messages API takes.
var imageTypes = []string{"image/jpeg", "image/png", "image/gif", "image/webp"}

// checkMedia checks an image or document block b at path p.
func checkMedia(b *contentBlock, p string) error {
	if b.Text != nil {
		return errdefs.InvalidArgument("%s.text is not a member of the %s block", p, b.Type)
	}
	if b.Type == "image" && (b.Title != nil || b.Context != nil) {
		return errdefs.InvalidArgument("%s: title and context are members of a document block, not an image", p)
	}
	if b.Title != nil && len(*b.Title) > maxDocumentTitle {
		return errdefs.InvalidArgument("%s.title: at most %d bytes", p, maxDocumentTitle)
	}
	if b.Context != nil && len(*b.Context) > maxDocumentContext {
		return errdefs.InvalidArgument("%s.context: at most %d bytes", p, maxDocumentContext)
	}
	src := b.Source
	if src == nil {
		return errdefs.InvalidArgument("%s.source is required", p)
	}
	sp := p + ".source"
	// stray is the first member set that a source of this type does not
	// have.
	stray := func(members ...string) string {
		for _, m := range []struct {
			name string
			set  bool
		}{{"media_type", src.MediaType != ""}, {"data", src.Data != ""}, {"url", src.URL != ""}, {"file_id", src.FileID != ""}} {
			if m.set && !slices.Contains(members, m.name) {
				return m.name
			}
		}
		return ""
	}
	var allowed []string
	switch src.Type {
	case "base64", "text":
		allowed = []string{"media_type", "data"}
	case "url":
		allowed = []string{"url"}
	case "file":
		allowed = []string{"file_id"}
	}
	if m := stray(allowed...); allowed != nil && m != "" {
		return errdefs.InvalidArgument("%s.%s is not a member of a %s source", sp, m, src.Type)
	}
	switch src.Type {
	case "base64":
		if b.Type == "image" && !slices.Contains(imageTypes, src.MediaType) {
			return errdefs.InvalidArgument("%s.media_type %q: want one of %s", sp, src.MediaType, strings.Join(imageTypes, ", "))
		}
		if b.Type == "document" && src.MediaType != "application/pdf" {
			return errdefs.InvalidArgument("%s.media_type %q: a base64 document is application/pdf (plain text goes in a source of type text)", sp, src.MediaType)
		}
		if src.Data == "" {
			return errdefs.InvalidArgument("%s.data is required", sp)
		}
		if _, err := base64.StdEncoding.DecodeString(src.Data); err != nil {
			return errdefs.InvalidArgument("%s.data is not base64", sp)
		}
	case "text":
		if b.Type != "document" {
			return errdefs.InvalidArgument("%s.type \"text\" is for documents; an image's source is base64 or url", sp)
		}
		if src.MediaType != "" && src.MediaType != "text/plain" {
			return errdefs.InvalidArgument("%s.media_type %q: a text source is text/plain", sp, src.MediaType)
		}
		if src.Data == "" {
			return errdefs.InvalidArgument("%s.data is required", sp)
		}
		src.MediaType = "text/plain"
	case "url":
		u, err := url.Parse(src.URL)
		if err != nil || len(src.URL) > maxMediaURL || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return errdefs.InvalidArgument("%s.url: want an http or https URL of at most %d bytes", sp, maxMediaURL)
		}
	case "file":
		return refuse("user.message image or document source of type file", sp)
	default:
		return errdefs.InvalidArgument("%s.type %q: want base64, text (documents), url or file", sp, src.Type)
	}
	return nil
}

// checkContent checks a client event's content blocks (raw, so that a block
// corral refuses is named as such rather than as an unknown member).
// media says whether images and documents are taken; refusedTypes are the
// API's block types this event may carry that corral refuses, with refused
// naming their unsupportedFields row.
func checkContent(raw []json.RawMessage, path string, required, media bool, refusedTypes []string, refused string) ([]contentBlock, error) {
	if required && len(raw) == 0 {
		return nil, errdefs.InvalidArgument("%s must hold at least one content block", path)
	}
	blocks := make([]contentBlock, 0, len(raw))
	for i, r := range raw {
		p := path + "[" + strconv.Itoa(i) + "]"
		var head struct {
			Type *string `json:"type"`
		}
		if jsonKind(r) != "an object" {
			return nil, errdefs.InvalidArgument("%s: expected an object, got %s", p, jsonKind(r))
		}
		_ = json.Unmarshal(r, &head)
		switch {
		case head.Type == nil || *head.Type == "":
			return nil, errdefs.InvalidArgument("%s.type is required", p)
		case *head.Type == "text":
		case media && (*head.Type == "image" || *head.Type == "document"):
		case slices.Contains(refusedTypes, *head.Type):
			return nil, refuse(refused, p)
		default:
			return nil, errdefs.InvalidArgument("%s.type %q is not a known content block type", p, *head.Type)
		}
		var b contentBlock
		if err := decodeObject(r, p, &b); err != nil {
			return nil, err
		}
		if b.Type != "text" {
			if err := checkMedia(&b, p); err != nil {
				return nil, err
			}
			blocks = append(blocks, b)
			continue
		}
		if b.Text == nil {
			return nil, errdefs.InvalidArgument("%s.text is required", p)
		}
		if b.Source != nil || b.Title != nil || b.Context != nil {
			return nil, errdefs.InvalidArgument("%s: a text block has type and text only", p)
		}
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// validateClientEvent checks one client event and gives it an id. exists
// reports whether an event the client refers to is in the session (an error
// of kind not found when it is not).
func validateClientEvent(raw json.RawMessage, path string, exists func(eventID string) error) (store.NewEvent, error) {
	var e struct {
		Type            string            `json:"type"`
		Content         []json.RawMessage `json:"content"`
		SessionThreadID *string           `json:"session_thread_id"`
		ToolUseID       *string           `json:"tool_use_id"`
		Result          *string           `json:"result"`
		DenyMessage     *string           `json:"deny_message"`
		CustomToolUseID *string           `json:"custom_tool_use_id"`
		IsError         *bool             `json:"is_error"`
		// user.define_outcome's, decoded only to be refused with the type.
		Description   json.RawMessage `json:"description"`
		Rubric        json.RawMessage `json:"rubric"`
		MaxIterations json.RawMessage `json:"max_iterations"`
	}
	if err := decodeObject(raw, path, &e); err != nil {
		return store.NewEvent{}, err
	}
	members, known := clientEventTypes[e.Type]
	switch {
	case e.Type == "":
		return store.NewEvent{}, errdefs.InvalidArgument("%s.type is required", path)
	case !known:
		return store.NewEvent{}, errdefs.InvalidArgument("%s.type %q is not an event a client can send", path, e.Type)
	case refusedEventTypes[e.Type]:
		return store.NewEvent{}, refuse(e.Type, path)
	}
	// A member of another event type would be dropped: refuse it.
	var all map[string]json.RawMessage
	_ = json.Unmarshal(raw, &all)
	for k, v := range all {
		if k != "type" && !slices.Contains(members, k) && !isNull(v) {
			return store.NewEvent{}, errdefs.InvalidArgument("%s.%s is not a member of %s", path, k, e.Type)
		}
	}
	out := map[string]any{"type": e.Type}
	refersTo := func(id *string, name string) error {
		if id == nil || *id == "" {
			return errdefs.InvalidArgument("%s.%s is required", path, name)
		}
		if err := exists(*id); err != nil {
			if errdefs.IsNotFound(err) {
				return errdefs.InvalidArgument("%s.%s %q does not name an event of this session", path, name, *id)
			}
			return err
		}
		out[name] = *id
		return nil
	}
	switch e.Type {
	case "user.message":
		blocks, err := checkContent(e.Content, path+".content", true, true, nil, "")
		if err != nil {
			return store.NewEvent{}, err
		}
		out["content"] = blocks
	case "user.interrupt":
		if e.SessionThreadID != nil {
			return store.NewEvent{}, refuse("user.interrupt.session_thread_id", path+".session_thread_id")
		}
	case "user.tool_confirmation":
		if err := refersTo(e.ToolUseID, "tool_use_id"); err != nil {
			return store.NewEvent{}, err
		}
		if e.Result == nil || (*e.Result != "allow" && *e.Result != "deny") {
			return store.NewEvent{}, errdefs.InvalidArgument("%s.result must be \"allow\" or \"deny\"", path)
		}
		out["result"] = *e.Result
		if e.DenyMessage != nil {
			if *e.Result != "deny" {
				return store.NewEvent{}, errdefs.InvalidArgument("%s.deny_message is only allowed with result \"deny\"", path)
			}
			out["deny_message"] = *e.DenyMessage
		}
	case "user.custom_tool_result":
		if err := refersTo(e.CustomToolUseID, "custom_tool_use_id"); err != nil {
			return store.NewEvent{}, err
		}
		blocks, err := checkContent(e.Content, path+".content", false, false, []string{"image", "document", "search_result"}, "user.custom_tool_result image, document or search_result block")
		if err != nil {
			return store.NewEvent{}, err
		}
		out["content"] = blocks
		out["is_error"] = e.IsError != nil && *e.IsError
	case "user.tool_result":
		// The store checks, under the session's lock, that the session is
		// self-hosted and the call still waits (store.NewEvent.Answers).
		if err := refersTo(e.ToolUseID, "tool_use_id"); err != nil {
			return store.NewEvent{}, err
		}
		blocks, err := checkContent(e.Content, path+".content", false, false, []string{"image", "document", "search_result"}, "user.tool_result image, document or search_result block")
		if err != nil {
			return store.NewEvent{}, err
		}
		n := 0
		for _, b := range blocks {
			n += len(*b.Text)
		}
		if n > maxToolResultBytes {
			return store.NewEvent{}, errdefs.TooLarge("%s.content: %d bytes of text; a tool result holds at most %d", path, n, maxToolResultBytes)
		}
		out["content"] = blocks
		out["is_error"] = e.IsError != nil && *e.IsError
	}
	id := store.NewEventID()
	out["id"] = id
	b, err := json.Marshal(out)
	if err != nil {
		return store.NewEvent{}, err
	}
	ne := store.NewEvent{ID: id, Type: e.Type, Body: b}
	if e.Type == "user.tool_result" {
		ne.Answers = *e.ToolUseID
	}
	return ne, nil
}

func (h *EventsHandler) list(w http.ResponseWriter, r *http.Request) {
	sid := r.PathValue("session_id")
	if err := workerSession(r.Context(), h.Store, sid); err != nil {
		h.WriteError(w, r, err)
		return
	}
	eq, order, err := eventQuery(r.URL.Query(), sid)
	if err != nil {
		h.WriteError(w, r, err)
		return
	}
	limit := eq.Limit
	eq.Limit++ // one more tells whether another page follows
	evs, err := h.Store.Events().List(r.Context(), sid, eq)
	if err != nil {
		h.WriteError(w, r, err)
		return
	}
	var next *string
	if len(evs) > limit {
		evs = evs[:limit]
		next = cursor{List: "events:" + sid, Order: order, N: evs[len(evs)-1].Seq}.encode()
	}
	var buf bytes.Buffer
	buf.WriteString(`{"data":[`)
	for i, e := range evs {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(e.JSON)
	}
	buf.WriteString(`],"next_page":`)
	nb, _ := json.Marshal(next)
	buf.Write(nb)
	buf.WriteString("}")
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
}

// eventQuery parses the events list's parameters: limit (1 to 1000, default
// 1000), order (asc by default), types[], created_at[...] and the page
// cursor, which holds the last sequence number seen.
func eventQuery(q url.Values, sid string) (store.EventQuery, string, error) {
	eq := store.EventQuery{Limit: 1000, Types: queryList(q, "types")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return eq, "", errdefs.InvalidArgument("limit: %q is not an integer from 1 to 1000", v)
		}
		eq.Limit = n
	}
	order, err := queryOrder(q, "asc")
	if err != nil {
		return eq, "", err
	}
	for key, dst := range map[string]**time.Time{"created_at[gt]": &eq.CreatedGT, "created_at[gte]": &eq.CreatedGTE, "created_at[lt]": &eq.CreatedLT, "created_at[lte]": &eq.CreatedLTE} {
		if *dst, err = queryTime(q, key); err != nil {
			return eq, "", err
		}
	}
	c, err := decodeCursor(q, "events:"+sid, order)
	if err != nil {
		return eq, "", err
	}
	switch {
	case c != nil && order == "asc":
		eq.After = c.N
	case c != nil:
		eq.Before = c.N
	case order == "desc":
		eq.Before = math.MaxInt64
	}
	return eq, order, nil
}
