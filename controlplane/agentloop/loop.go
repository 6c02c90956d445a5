package agentloop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// Store is the session's event log, as the loop needs it. Sequence
// numbers count a session's events from 1, with no gaps, and an event is
// visible only once every event before it is: a reader that has seen up to
// n misses nothing by asking for what follows n.
type Store interface {
	// Load returns the session's agent snapshot and its events, oldest
	// first, with Seq set, and Processed on consumed user events. The
	// snapshot is no older than the events: a change to it is logged, as
	// a session.updated event, with it.
	Load(ctx context.Context, sessionID string) (Agent, []Event, error)
	// LoadSince returns the session's events with a sequence number above
	// after, oldest first, as Load returns them: what was appended since
	// a Load (or LoadSince) that ended at after. It is the loop's read
	// before every step, so it must be cheap when nothing or little is new.
	// An unknown (deleted) session is not found, as with Load.
	LoadSince(ctx context.Context, sessionID string, after int64) ([]Event, error)
	// Queued returns the session's user events that no commit has
	// consumed yet, oldest first. It must be cheap in a long log.
	Queued(ctx context.Context, sessionID string) ([]Event, error)
	// Commit applies one step atomically: marks user events processed,
	// appends events in order and sets the session's status ("" keeps it).
	Commit(ctx context.Context, sessionID string, c Commit) error
	// PinMCPTools records the tools an MCP server offered the session.
	// The first pin of a server wins; later ones change nothing. Load
	// returns the pins in Agent.MCPTools.
	PinMCPTools(ctx context.Context, sessionID, server string, tools []MCPTool) error
}

// Commit is the outcome of one step.
type Commit struct {
	Consume []string
	Events  []Out
	Status  string // "running", "idle" or ""
}

// Previews receives live previews of agent messages while the model writes
// them (the stream's event_start and event_delta). They are best effort and
// never stored.
type Previews interface {
	Start(sessionID, eventID, eventType string)
	Delta(sessionID, eventID string, index int, text string)
}

// Toolbox runs built-in tools in the session's sandbox.
type Toolbox interface {
	Run(ctx context.Context, sessionID string, call ToolCall) (ToolResult, error)
}

// ToolCanceler is what a Toolbox may also do: stop a call that may be
// running still, wherever it was started (the call of an interrupted turn).
// Stopping one that finished or never started is not an error.
type ToolCanceler interface {
	CancelTool(ctx context.Context, sessionID string, call ToolCall) error
}

// MCP reaches MCP servers for the loop: from the control plane, never
// from the sandbox. sessionID is the session on whose behalf it asks (its
// vaults hold the credentials sent to the server).
type MCP interface {
	// ListTools returns the tools the server offers.
	ListTools(ctx context.Context, sessionID string, server MCPServer) ([]MCPTool, error)
	// CallTool calls a tool. A tool that fails is a result with IsError;
	// an error means the server could not be asked.
	CallTool(ctx context.Context, sessionID string, server MCPServer, name string, input []byte) (ToolResult, error)
}

// ErrMCPAuthentication is wrapped by an MCP port's errors when the server
// refused the session's credentials (or their absence): the session.error
// is then an mcp_authentication_failed_error.
var ErrMCPAuthentication = errors.New("the MCP server refused to authenticate the session")

// ToolResult is a tool's output.
type ToolResult struct {
	Content []model.Block
	IsError bool
}

// ErrNoSandbox is what NoSandbox returns for every call.
var ErrNoSandbox = errors.New("built-in tools run in sandboxes, which this release of corral does not provide yet")

// NoSandbox refuses every built-in tool call: the turn then ends with a
// session.error, never a made-up result.
type NoSandbox struct{}

// Run implements Toolbox.
func (NoSandbox) Run(context.Context, string, ToolCall) (ToolResult, error) {
	return ToolResult{}, ErrNoSandbox
}

// ModelPicker picks the model client a session's requests go to.
type ModelPicker interface {
	// ModelFor returns the session's model client, or nil for the Loop's
	// Model. An error fails the step before its model request starts
	// (the step is tried again).
	ModelFor(ctx context.Context, sessionID string) (model.Client, error)
}

// Limits decide whether a session may make its next model request (a
// tenant's token quota, the session's budget).
type Limits interface {
	// BeforeModelRequest returns nil to go on, or the Stop that ends the
	// turn instead. An error fails the step (it is tried again).
	BeforeModelRequest(ctx context.Context, sessionID string) (*Stop, error)
}

// Stop ends a turn before its next model request: idle with Reason,
// after a session.error when Error is set.
type Stop struct {
	Reason StopReason
	Error  *ErrorInfo
}

// Loop carries out Decide's actions through the ports.
type Loop struct {
	Store Store
	Model model.Client
	// Models, when set, picks a session's model client instead of Model
	// (a tenant that brings its own model access).
	Models ModelPicker
	// Limits, when set, may end a turn before each model request.
	Limits Limits
	Tools  Toolbox
	// MCP, when set, offers the tools of the agent's MCP toolsets:
	// discovered and pinned when a turn starts, called from here.
	MCP      MCP
	Previews Previews // optional
	// NewID returns a fresh event id (sevt_...).
	NewID  func() string
	Config Config
	// ModelRetries is how often a retryable model error is retried within
	// a step. Default 2.
	ModelRetries int
	// Backoff returns the wait before model retry n (1-based); default
	// 500ms·n.
	Backoff func(n int) time.Duration
	// ToolRetries is how often a built-in tool call that failed with a
	// transient error (errdefs kind unavailable: the database, a host or
	// its stream went away for a moment) is tried again within the step
	// before the turn ends with a session.error. Repeating a call is safe:
	// bash carries an execution id the host runs once, and the file tools
	// are idempotent by content. Default 4 (5 tries); negative: none.
	ToolRetries int
	// ToolBackoff returns the wait before tool retry n (1-based); default
	// 100ms·2^(n-1), at most 2s.
	ToolBackoff func(n int) time.Duration
	// PrepareSandbox, when set, is called as a turn starts in a session
	// whose agent uses the sandbox tools, so that its sandbox is made
	// ready while the model writes its first answer (fleet.Prepare). It
	// must not block; Tools reports whatever it could not do.
	PrepareSandbox func(ctx context.Context, sessionID string)
	// Log receives the full text of errors whose session.error says less
	// (optional).
	Log *slog.Logger
	// ObserveStep, when set, receives each step once it is done: the
	// action Decide chose (ActionName) and how long the step took, its
	// reads, model or tool calls and commit included. It must not block
	// (metrics).
	ObserveStep func(action string, d time.Duration)
	// Tracer, when set, makes a span of each step that acts (waits make
	// none), named by its action, under the span context of the wake
	// that started the Run (Pool.WakeFrom) or as a new trace. The step's
	// model and tool calls are its children through ctx. Nil: no spans.
	Tracer trace.Tracer
}

// ActionName names an action for ObserveStep: "wait", "consume_only",
// "start_turn", "call_model", "run_tools", "block", "end_turn"; "invalid"
// when Decide found the session's snapshot broken.
func ActionName(a Action) string {
	switch a.(type) {
	case Wait:
		return "wait"
	case ConsumeOnly:
		return "consume_only"
	case StartTurn:
		return "start_turn"
	case CallModel:
		return "call_model"
	case RunTools:
		return "run_tools"
	case Block:
		return "block"
	case EndTurn:
		return "end_turn"
	}
	return "invalid"
}

// Run steps the session until it waits for input. It returns early only on
// an error from the store or ctx.
func (r *Loop) Run(ctx context.Context, sessionID string) error {
	var s session
	return r.run(ctx, sessionID, &s)
}

// run is Run over s, which it reads whole first unless s is a copy an
// earlier Run left that still holds (see resume), and keeps current after
// that (see session); it is left as the last step saw the session.
func (r *Loop) run(ctx context.Context, sessionID string, s *session) error {
	if err := r.resume(ctx, sessionID, s); err != nil {
		return err
	}
	for {
		waiting, err := r.step(ctx, sessionID, s)
		if err != nil {
			s.drop()
			return err
		}
		if waiting {
			return nil
		}
	}
}

// Step performs one action, from a full read of the session. It reports
// whether the session now waits for input.
func (r *Loop) Step(ctx context.Context, sessionID string) (waiting bool, err error) {
	var s session
	return r.step(ctx, sessionID, &s)
}

// step brings s up to date, decides and performs one action.
func (r *Loop) step(ctx context.Context, sessionID string, s *session) (waiting bool, err error) {
	if _, err := r.refresh(ctx, sessionID, s); err != nil {
		return false, err
	}
	if r.ObserveStep != nil || r.Tracer != nil {
		start := time.Now()
		var act Action
		var span trace.Span
		if r.Tracer != nil {
			ctx, span = r.startStep(ctx, sessionID, start)
		}
		defer func() {
			if r.ObserveStep != nil {
				r.ObserveStep(ActionName(act), time.Since(start))
			}
			if span != nil {
				endStep(span, ActionName(act), err)
			}
		}()
		return r.decideAndAct(ctx, sessionID, s, &act)
	}
	return r.decideAndAct(ctx, sessionID, s, nil)
}

// startStep starts a step's span; its name waits for the action.
func (r *Loop) startStep(ctx context.Context, sessionID string, start time.Time) (context.Context, trace.Span) {
	t, _ := tenant.From(ctx)
	return r.Tracer.Start(ctx, "agentloop step", trace.WithTimestamp(start), trace.WithAttributes(
		attribute.String("corral.session_id", sessionID), attribute.String("corral.tenant", string(t))))
}

// endStep names a step's span by its action and ends it; a wait is
// dropped (every Run ends with one, and it did nothing). An error's text
// stays out of the span: it may quote what the tenant's tools said.
func endStep(span trace.Span, action string, err error) {
	if action == "wait" && err == nil {
		return // never ended: an unended span is never exported
	}
	span.SetName("agentloop " + action)
	span.SetAttributes(attribute.String("corral.loop.action", action))
	if err != nil {
		span.SetStatus(codes.Error, "step failed")
	}
	span.End()
}

// decideAndAct is step after its refresh; it leaves the action it chose
// in *chosen when that is not nil.
func (r *Loop) decideAndAct(ctx context.Context, sessionID string, s *session, chosen *Action) (waiting bool, err error) {
	act, err := Decide(s.agent, s.log, r.Config)
	if chosen != nil {
		*chosen = act
	}
	if err != nil {
		// A broken snapshot cannot make progress: report it and idle.
		return true, r.commit(ctx, sessionID, s, Commit{
			Events: []Out{r.errorEvent(ErrorInfo{Type: "unknown_error", Message: err.Error(), RetryStatus: "terminal"}), r.idle(StopReason{Type: "end_turn"})},
			Status: "idle",
		})
	}
	switch a := act.(type) {
	case Wait:
		return true, nil
	case ConsumeOnly:
		return false, r.commit(ctx, sessionID, s, Commit{Consume: a.Consume})
	case StartTurn:
		if r.PrepareSandbox != nil && s.agent.NeedsSandbox() {
			r.PrepareSandbox(ctx, sessionID)
		}
		found, pinned, err := r.discoverMCP(ctx, sessionID, s.agent)
		if err != nil {
			return false, err
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if len(found) == 0 && !pinned {
			// Nothing to report first: the turn's first model request
			// follows at once, and the status goes with its start, in one
			// write instead of two.
			if call, ok := r.firstCall(s, a); ok {
				return false, r.callModel(ctx, sessionID, s, call)
			}
		}
		err = r.commit(ctx, sessionID, s, Commit{Consume: a.Consume, Events: append([]Out{r.out(StatusRunning, nil)}, found...), Status: "running"})
		if pinned {
			s.drop() // the next step reads the pins with the snapshot
		}
		return false, err
	case Block:
		return true, r.commit(ctx, sessionID, s, Commit{
			Events: []Out{r.idle(StopReason{Type: "requires_action", EventIDs: a.EventIDs})},
			Status: "idle",
		})
	case EndTurn:
		if tc, ok := r.Tools.(ToolCanceler); ok {
			for _, c := range a.Abandon {
				// Best effort: the turn ends either way, and a command
				// left running ends at its timeout.
				_ = tc.CancelTool(ctx, sessionID, c)
			}
		}
		var evs []Out
		if a.Error != nil {
			evs = append(evs, r.errorEvent(*a.Error))
		}
		evs = append(evs, r.idle(a.Stop))
		return false, r.commit(ctx, sessionID, s, Commit{Consume: a.Consume, Events: evs, Status: "idle"})
	case CallModel:
		return false, r.callModel(ctx, sessionID, s, a)
	case RunTools:
		return false, r.runTools(ctx, sessionID, s, a)
	}
	return false, fmt.Errorf("unknown action %T", act)
}

// firstCall is the step that follows StartTurn a, decided over s's log as
// it will be once a is committed (its messages consumed, the session
// running): the turn's first model request, which then carries a's
// consumption and status change itself.
func (r *Loop) firstCall(s *session, a StartTurn) (CallModel, bool) {
	log := make([]Event, len(s.log), len(s.log)+1)
	copy(log, s.log)
	for _, id := range a.Consume {
		i, ok := s.at[id]
		if !ok {
			return CallModel{}, false
		}
		log[i].Processed = true
	}
	log = append(log, Event{Type: StatusRunning})
	act, err := Decide(s.agent, log, r.Config)
	call, ok := act.(CallModel)
	if err != nil || !ok {
		return CallModel{}, false
	}
	call.NeedRunning, call.Consume = true, append(append([]string(nil), a.Consume...), call.Consume...)
	return call, true
}

func (r *Loop) callModel(ctx context.Context, sessionID string, s *session, a CallModel) error {
	client := r.Model
	if r.Models != nil {
		c, err := r.Models.ModelFor(ctx, sessionID)
		if err != nil {
			return fmt.Errorf("choosing the model client of session %s: %w", sessionID, err)
		}
		if c != nil {
			client = c
		}
	}
	var pre []Out
	if a.NeedRunning {
		pre = append(pre, r.out(StatusRunning, nil))
	}
	if r.Limits != nil {
		stop, err := r.Limits.BeforeModelRequest(ctx, sessionID)
		if err != nil {
			return fmt.Errorf("checking the limits of session %s: %w", sessionID, err)
		}
		if stop != nil {
			evs := pre
			if stop.Error != nil {
				evs = append(evs, r.errorEvent(*stop.Error))
			}
			return r.commit(ctx, sessionID, s, Commit{Consume: a.Consume, Events: append(evs, r.idle(stop.Reason)), Status: "idle"})
		}
	}
	start := r.out(SpanModelRequestStart, nil)
	if err := r.commit(ctx, sessionID, s, Commit{Consume: a.Consume, Events: append(pre, start), Status: "running"}); err != nil {
		return err
	}

	tools, _ := resolveTools(s.agent, r.Config.Exec) // Decide already checked them
	retries := r.ModelRetries
	if retries == 0 {
		retries = 2
	}
	var resp model.Response
	var err error
	for attempt := 0; ; attempt++ {
		msgID := r.NewID()
		started := false
		thinking := map[int]string{} // agent.thinking ids previewed, by block index
		onDelta := func(index int, text string) {
			if r.Previews == nil {
				return
			}
			if text == "" {
				// A thinking block began: its preview is start-only, and
				// its event comes under the same id.
				if _, ok := thinking[index]; !ok {
					thinking[index] = r.NewID()
					r.Previews.Start(sessionID, thinking[index], AgentThinking)
				}
				return
			}
			if !started {
				r.Previews.Start(sessionID, msgID, AgentMessage)
				started = true
			}
			r.Previews.Delta(sessionID, msgID, index, text)
		}
		resp, err = client.Generate(ctx, a.Request, onDelta)
		if err == nil && resp.StopReason == "refusal" {
			// The model declined: what it said, then idle with the
			// refusal (no tool it named runs).
			resp.Content = slices.DeleteFunc(resp.Content, func(b model.Block) bool { return b.Type != "text" })
			evs := withModel(r.responseEvents(resp, msgID, thinking, start.ID, tools), a.Request.Model)
			return r.commit(ctx, sessionID, s, Commit{Events: append(evs, r.refused(resp.Refusal)), Status: "idle"})
		}
		if err == nil {
			return r.commit(ctx, sessionID, s, Commit{Events: withModel(r.responseEvents(resp, msgID, thinking, start.ID, tools), a.Request.Model)})
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		info := modelError(err)
		var me *model.Error
		retryable := errors.As(err, &me) && me.Retryable
		if !retryable || attempt >= retries {
			info.RetryStatus = "exhausted"
			return r.commit(ctx, sessionID, s, Commit{
				Events: []Out{r.spanEnd(start.ID, true, model.Usage{}), r.errorEvent(info), r.idle(StopReason{Type: "retries_exhausted"})},
				Status: "idle",
			})
		}
		info.RetryStatus = "retrying"
		if err := r.commit(ctx, sessionID, s, Commit{Events: []Out{r.errorEvent(info)}}); err != nil {
			return err
		}
		wait := 500 * time.Millisecond * time.Duration(attempt+1)
		if r.Backoff != nil {
			wait = r.Backoff(attempt + 1)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// responseEvents turns a model response into events: agent.thinking for
// thinking (under the id its preview used, in thinking by block index),
// agent.message for text (the first one under the id its previews used), agent.tool_use with the
// evaluated permission for built-ins, agent.custom_tool_use for custom tools,
// an error result for each tool use whose input cannot be stored as written
// (storable.go), and the closing span.
func (r *Loop) responseEvents(resp model.Response, msgID string, thinking map[int]string, startID string, tools toolTable) []Out {
	var evs, refused []Out
	serverUses := map[string]string{} // the provider's tool use id -> its agent.tool_use event
	for i, b := range resp.Content {
		switch b.Type {
		case "thinking", "redacted_thinking":
			// Thinking shows as a sign of progress only, as the API has
			// it; the block itself goes back to the model.
			id, ok := thinking[i]
			if !ok {
				id = r.NewID()
			}
			evs = append(evs, Out{ID: id, Type: AgentThinking, Fields: map[string]any{}, Private: privateBlock(b)})
		case "server_tool_use":
			input := any(map[string]any{})
			if len(b.Input) > 0 {
				input = jsonRaw(storableJSON(b.Input))
			}
			use := Out{ID: r.NewID(), Type: AgentToolUse, Private: privateBlock(b), Fields: map[string]any{
				"name": storableText(b.Name), "input": input, "evaluated_permission": "allow"}}
			serverUses[b.ID] = use.ID
			evs = append(evs, use)
		case "web_search_tool_result", "web_fetch_tool_result":
			useID, ok := serverUses[b.ToolUseID]
			if !ok {
				// A result without its use in the response: kept for the
				// model, named by the provider's id.
				useID = storableText(b.ToolUseID)
			}
			content, isError := serverResultContent(b)
			evs = append(evs, Out{ID: r.NewID(), Type: AgentToolResult, Private: privateBlock(b), Fields: map[string]any{
				"tool_use_id": useID, "content": content, "is_error": isError}})
		case "text":
			id := msgID
			if msgID == "" {
				id = r.NewID()
			}
			msgID = ""
			evs = append(evs, Out{ID: id, Type: AgentMessage, Fields: map[string]any{"content": textBlocks(storableText(b.Text))}})
		case "tool_use":
			input := any(map[string]any{})
			// unstorable: the input cannot be stored as the model wrote it
			// (see storable.go): it is stored cleaned and answered at once.
			unstorable := len(b.Input) > 0 && CheckStorable(b.Input) != nil
			switch {
			case unstorable:
				input = jsonRaw(storableJSON(b.Input))
			case len(b.Input) > 0:
				input = jsonRaw(b.Input)
			}
			name := storableText(b.Name)
			switch tools.kinds[b.Name] {
			case customTool:
				evs = append(evs, r.out(AgentCustomToolUse, map[string]any{"name": name, "input": input}))
			case builtinTool, mcpTool:
				perm := "allow"
				if tools.ask[b.Name] {
					perm = "ask"
				}
				fields := map[string]any{"name": name, "input": input, "evaluated_permission": perm}
				typ, result, useID := AgentToolUse, AgentToolResult, "tool_use_id"
				if srv := tools.mcpServer[b.Name]; srv != "" {
					typ, fields["mcp_server_name"] = AgentMCPToolUse, srv
					result, useID = AgentMCPToolResult, "mcp_tool_use_id"
				}
				use := r.out(typ, fields)
				evs = append(evs, use)
				if unstorable {
					refused = append(refused, r.out(result, map[string]any{useID: use.ID, "content": textBlocks(ErrUnstorable.Error()), "is_error": true}))
				}
			default:
				evs = append(evs, r.out(AgentToolUse, map[string]any{"name": name, "input": input, "evaluated_permission": "deny"}))
			}
		}
	}
	// The refusals follow every tool use, as results do.
	evs = append(evs, refused...)
	end := r.spanEnd(startID, false, resp.Usage)
	if resp.StopReason != "" {
		end.Private = &Private{StopReason: storableText(textcut.Prefix(resp.StopReason, 64))}
	}
	return append(evs, end)
}

func (r *Loop) logger() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// TenantMessage is what a session.error says of err, which the loop logs
// whole: the words of a classified error the caller can act on (a quota,
// a refused placement), an outage named as such, and "internal error" for
// the rest (a host's, runtime's or transport's words stay in the log).
func TenantMessage(err error) string {
	var e *errdefs.Error
	switch errdefs.KindOf(err) {
	case errdefs.ResourceExhaustedKind, errdefs.FailedPreconditionKind, errdefs.PermissionDeniedKind, errdefs.InvalidArgumentKind, errdefs.TooLargeKind:
		if errors.As(err, &e) {
			msg, _, _ := strings.Cut(e.Error(), "\n")
			return storableText(msg)
		}
	case errdefs.UnavailableKind:
		msg := "the session's sandbox is unavailable"
		var t *triedErr
		if errors.As(err, &t) {
			msg += fmt.Sprintf(" (tried %d times)", t.tries)
		}
		return msg + "; try again"
	case errdefs.DeadlineExceededKind:
		return "the session's sandbox did not answer in time; try again"
	case errdefs.NotFoundKind:
		return "the session's sandbox is gone; try again"
	}
	return "internal error"
}

func (r *Loop) out(typ string, fields map[string]any) Out {
	if fields == nil {
		fields = map[string]any{}
	}
	return Out{ID: r.NewID(), Type: typ, Fields: fields}
}

// idle is session.status_idle for stop; its stop_details is null: nothing
// more to report (refused has a refusal's).
func (r *Loop) idle(stop StopReason) Out {
	return r.out(StatusIdle, map[string]any{"stop_reason": stop, "stop_details": nil})
}

// Bounds on what a model's refusal puts into an event.
const (
	maxRefusalCategory    = 64
	maxRefusalExplanation = 4 << 10
)

// refused is session.status_idle after the model declined (ref nil: it
// said nothing of why).
func (r *Loop) refused(ref *model.Refusal) Out {
	details := map[string]any{"type": "refusal", "category": nil, "explanation": nil}
	if ref != nil {
		if c := storableText(textcut.Prefix(ref.Category, maxRefusalCategory)); c != "" {
			details["category"] = c
		}
		if e := storableText(textcut.Prefix(ref.Explanation, maxRefusalExplanation)); e != "" {
			details["explanation"] = e
		}
	}
	return r.out(StatusIdle, map[string]any{"stop_reason": StopReason{Type: "refusal"}, "stop_details": details})
}

// withModel names the model on the span.model_request_end among evs, for
// metering.
func withModel(evs []Out, name string) []Out {
	for i := range evs {
		if evs[i].Type != SpanModelRequestEnd || name == "" {
			continue
		}
		if evs[i].Private == nil {
			evs[i].Private = &Private{}
		}
		evs[i].Private.Model = storableText(textcut.Prefix(name, maxModelName))
	}
	return evs
}

// maxModelName bounds the model name kept for metering.
const maxModelName = 256

func (r *Loop) spanEnd(startID string, isError bool, u model.Usage) Out {
	return r.out(SpanModelRequestEnd, map[string]any{
		"model_request_start_id": startID,
		"is_error":               isError,
		"model_usage":            u,
	})
}

func (r *Loop) errorEvent(e ErrorInfo) Out { return ErrorEvent(r.NewID(), e) }

// ErrorEvent is the session.error event id for e: for what tells a
// session of an error outside its loop's steps (an idle's outputs that
// were not published).
func ErrorEvent(id string, e ErrorInfo) Out {
	body := map[string]any{
		"type":         e.Type,
		"message":      e.Message,
		"retry_status": map[string]string{"type": e.RetryStatus},
	}
	if e.MCPServerName != "" {
		body["mcp_server_name"] = e.MCPServerName
	}
	return Out{ID: id, Type: SessionError, Fields: map[string]any{"error": body}}
}

func modelError(err error) ErrorInfo {
	var me *model.Error
	if errors.As(err, &me) {
		return ErrorInfo{Type: me.Type, Message: me.Message}
	}
	return ErrorInfo{Type: "model_request_failed_error", Message: err.Error()}
}
