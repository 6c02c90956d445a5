package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// SandboxFor returns the sandbox of a session, placing it if the session
// has none yet. Its errors end the turn with a session.error.
type SandboxFor func(ctx context.Context, sessionID string) (Sandbox, error)

// Replaced is what SandboxFor returns, once, for a session whose sandbox
// was lost and placed anew: the toolset forgets the session's bash
// directory, and the tool result of that call starts with Notice (say, that
// the earlier files are gone).
type Replaced struct {
	Sandbox
	Notice string
}

// Noticed is what SandboxFor returns, once, for a session whose sandbox
// moved with what it holds (a drained host's): the tool result of that
// call starts with Notice (say, that it moved live); the session's bash
// directory is kept.
type Noticed struct {
	Sandbox
	Notice string
}

// Toolset runs built-in tool calls in the session's sandbox.
type Toolset struct {
	sandboxFor SandboxFor
	// limits bound bash commands (defaults filled).
	limits agentloop.ExecLimits

	// mu guards cwds and noBash.
	mu     sync.Mutex
	cwds   map[string]string // session id -> where its last bash command ended
	noBash map[string]bool   // session ids whose image has no bash
}

var (
	_ agentloop.Toolbox      = (*Toolset)(nil)
	_ agentloop.ToolCanceler = (*Toolset)(nil)
)

// execCanceler is a Sandbox that can kill a command by its execution id
// (Remote).
type execCanceler interface {
	CancelExec(ctx context.Context, executionID string) error
}

// CancelTool implements agentloop.ToolCanceler: it kills the bash command
// of call (and of its sh fallback) if it still runs on the host, whichever
// runner started it.
func (r *Toolset) CancelTool(ctx context.Context, sessionID string, call agentloop.ToolCall) error {
	if call.Name != "bash" || call.EventID == "" {
		return nil
	}
	sb, err := r.sandboxFor(ctx, sessionID)
	if err != nil {
		return err
	}
	if _, ok := sb.(Replaced); ok {
		return nil // a new sandbox: nothing of the old one runs
	}
	if n, ok := sb.(Noticed); ok {
		sb = n.Sandbox
	}
	c, ok := sb.(execCanceler)
	if !ok {
		return nil
	}
	id := ExecutionID(sessionID, call.EventID)
	if err := c.CancelExec(ctx, id); err != nil {
		return err
	}
	return c.CancelExec(ctx, id+"/sh")
}

// NewToolset returns a Toolset that finds sandboxes with sandboxFor and
// bounds bash commands by limits, the sessions' runtime profile (zero
// fields: agentloop.DefaultExecLimits). The loop must tell the model the
// same limits (agentloop.Config.Exec).
func NewToolset(sandboxFor SandboxFor, limits agentloop.ExecLimits) *Toolset {
	return &Toolset{sandboxFor: sandboxFor, limits: limits.WithDefaults(), cwds: map[string]string{}, noBash: map[string]bool{}}
}

// Forget drops what the toolset keeps for a session (its bash directory
// and shell); call it when the session is deleted or its sandbox replaced.
func (r *Toolset) Forget(sessionID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.cwds, sessionID)
	delete(r.noBash, sessionID)
}

// shell is the shell bash commands of the session run under.
func (r *Toolset) shell(sessionID string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.noBash[sessionID] {
		return "sh"
	}
	return "bash"
}

func (r *Toolset) setNoBash(sessionID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.noBash[sessionID] = true
}

func (r *Toolset) cwd(sessionID string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cwds[sessionID]
}

func (r *Toolset) setCwd(sessionID, dir string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if dir == "" {
		delete(r.cwds, sessionID)
		return
	}
	r.cwds[sessionID] = dir
}

// inputErr is a call the model got wrong: it becomes a tool result with
// is_error, never a session error.
type inputErr struct{ msg string }

func (e *inputErr) Error() string { return e.msg }

func inputError(format string, args ...any) error {
	return &inputErr{msg: fmt.Sprintf(format, args...)}
}

// decodeInput decodes a tool's input strictly: an object with only the
// schema's properties, each of its type.
func decodeInput(tool string, raw []byte, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return inputError("%s: the input must be a JSON object", tool)
			}
			return inputError("%s: %s must be of type %s, not %s", tool, te.Field, schemaType(te.Type.Kind().String()), te.Value)
		}
		return inputError("%s: the input does not match the tool's schema: %v", tool, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return inputError("%s: the input has data after its JSON object", tool)
	}
	return nil
}

// schemaType names a Go kind in JSON Schema's words.
func schemaType(kind string) string {
	switch kind {
	case "string", "ptr":
		return "string"
	case "bool":
		return "boolean"
	case "int", "int64":
		return "integer"
	case "slice":
		return "array"
	}
	return kind
}

// hostError is the one place where an error from the session's sandbox
// (its host agent, its driver) becomes what the model sees. Errors of the
// kinds the host gives for what the call asked (invalid argument,
// permission denied, too large, resource exhausted) are tool results with
// is_error, in the host's words, which say what was wrong with the path or
// the command and nothing of the host. Anything else is returned: the loop
// retries a transient one and ends the turn with a session.error, whose
// message it classifies (agentloop), logging the full text.
func hostError(what string, err error) (string, bool, error) {
	if isSandboxErr(err) {
		return "", false, err
	}
	switch errdefs.KindOf(err) {
	case errdefs.InvalidArgumentKind, errdefs.PermissionDeniedKind, errdefs.TooLargeKind, errdefs.ResourceExhaustedKind:
		return what + ": " + hostMessage(err), true, nil
	}
	return "", false, err
}

// maxHostMessage bounds the host's words in a tool result.
const maxHostMessage = 500

// hostMessage is the host's own words for err (the outermost classified
// error's, without the control plane's wrapping), on one line, bounded.
func hostMessage(err error) string {
	msg := err.Error()
	var e *errdefs.Error
	if errors.As(err, &e) {
		msg = e.Error()
	}
	msg, _, _ = strings.Cut(msg, "\n")
	if len(msg) > maxHostMessage {
		msg = textcut.Prefix(msg, maxHostMessage) + "..."
	}
	return msg
}

func isSandboxErr(err error) bool {
	var se *sandboxErr
	return errors.As(err, &se)
}

// sandboxErr is a failure to get the session's sandbox: never a tool
// result, always the loop's error.
type sandboxErr struct{ err error }

func (e *sandboxErr) Error() string { return "the session's sandbox: " + e.err.Error() }
func (e *sandboxErr) Unwrap() error { return e.err }

// lazySandbox asks for the session's sandbox on first use, so a call the
// model got wrong is answered without placing one.
type lazySandbox struct {
	r         *Toolset
	sessionID string
	sb        Sandbox
	notice    string // from a Replaced sandbox
}

func (l *lazySandbox) get(ctx context.Context) (Sandbox, error) {
	if l.sb == nil {
		sb, err := l.r.sandboxFor(ctx, l.sessionID)
		if err != nil {
			return nil, &sandboxErr{err: err}
		}
		if rep, ok := sb.(Replaced); ok {
			l.r.Forget(l.sessionID)
			sb, l.notice = rep.Sandbox, rep.Notice
		}
		if n, ok := sb.(Noticed); ok {
			sb, l.notice = n.Sandbox, n.Notice
		}
		l.sb = sb
	}
	return l.sb, nil
}

func (l *lazySandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	sb, err := l.get(ctx)
	if err != nil {
		return ExecResult{}, err
	}
	return sb.Exec(ctx, req)
}

func (l *lazySandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	sb, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return sb.ReadFile(ctx, path)
}

func (l *lazySandbox) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	sb, err := l.get(ctx)
	if err != nil {
		return err
	}
	return sb.WriteFile(ctx, path, data, mode)
}

func (l *lazySandbox) ListFiles(ctx context.Context, dir string) ([]FileInfo, error) {
	sb, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return sb.ListFiles(ctx, dir)
}

// ExecutionID is the host's execution id of a session's bash call: the
// session and its agent.tool_use event. A runner that takes the session
// over mid-call asks again under the same id and attaches to the command
// instead of running it twice. write and edit need no id: they are
// idempotent by content (a write repeated writes the same bytes; an edit
// repeated after it applied finds old_string gone, or, with replace_all,
// nothing left to replace, and says so in its result).
func ExecutionID(sessionID, toolUseID string) string {
	if toolUseID == "" {
		return ""
	}
	return sessionID + "/" + toolUseID
}

// Run implements agentloop.Toolbox.
func (r *Toolset) Run(ctx context.Context, sessionID string, call agentloop.ToolCall) (agentloop.ToolResult, error) {
	sb := &lazySandbox{r: r, sessionID: sessionID}
	text, isErr, err := r.run(ctx, sb, sessionID, call)
	var ie *inputErr
	if errors.As(err, &ie) {
		text, isErr, err = ie.msg, true, nil
	}
	if err != nil {
		return agentloop.ToolResult{}, err
	}
	if st, ok := sb.sb.(Stepper); ok { // the call reached the sandbox
		if note := st.AfterStep(ctx); note != "" {
			text += "\n\n" + note
		}
	}
	if sb.notice != "" {
		text = sb.notice + "\n\n" + text
	}
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: text}}, IsError: isErr}, nil
}

func (r *Toolset) run(ctx context.Context, sb *lazySandbox, sessionID string, call agentloop.ToolCall) (string, bool, error) {
	var in any
	switch call.Name {
	case "bash":
		in = &bashInput{}
	case "read":
		in = &readInput{}
	case "write":
		in = &writeInput{}
	case "edit":
		in = &editInput{}
	case "glob":
		in = &globInput{}
	case "grep":
		in = &grepInput{}
	default:
		return "", false, inputError("tool %q does not run in the sandbox", call.Name)
	}
	if err := agentloop.CheckStorable(call.Input); err != nil {
		return "", false, inputError("%s: %v", call.Name, err)
	}
	if err := decodeInput(call.Name, call.Input, in); err != nil {
		return "", false, err
	}
	switch in := in.(type) {
	case *bashInput:
		return r.runBash(ctx, sessionID, ExecutionID(sessionID, call.EventID), sb, *in)
	case *readInput:
		return r.runRead(ctx, sb, *in)
	case *writeInput:
		return r.runWrite(ctx, sb, *in)
	case *editInput:
		return r.runEdit(ctx, sb, *in)
	case *globInput:
		return r.runGlob(ctx, sb, *in)
	default:
		return r.runGrep(ctx, sb, *in.(*grepInput))
	}
}
