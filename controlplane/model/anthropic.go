package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"corral.dev/corral/internal/logging"
)

// AnthropicConfig configures the Anthropic Messages API client.
type AnthropicConfig struct {
	// BaseURL of the API; default https://api.anthropic.com. Tests point it
	// at a local server.
	BaseURL string
	// APIKey is sent as the x-api-key header. Exactly one of APIKey and
	// AuthToken is required.
	APIKey logging.Secret
	// AuthToken is sent as "Authorization: Bearer" instead of an API key.
	AuthToken logging.Secret
	// MaxRetries is how often the SDK itself retries a failed request before
	// Generate returns. Default 0: the agent loop retries retryable errors
	// between attempts (and reports each retry as a session.error with
	// retry_status "retrying"), so retrying inside the SDK as well would
	// multiply the attempts and hide them from the session's log.
	MaxRetries int
	// Timeout bounds one whole call, request and stream. Default 10 minutes.
	Timeout time.Duration
	// DefaultModel is the model id used when a request names none.
	DefaultModel string
	// Transport, when set, carries the client's requests (a tenant's own
	// base URL goes through one that refuses private destinations).
	Transport http.RoundTripper
	// MaxResponseBytes bounds what one response may send (a tenant's own
	// endpoint is the tenant's to write); past it the call fails. Default
	// DefaultMaxResponseBytes.
	MaxResponseBytes int64
}

// DefaultMaxResponseBytes bounds a response: far above what max_tokens
// and a web_fetch's content allow.
const DefaultMaxResponseBytes = 64 << 20

// CheckBaseURL reports whether u may be a tenant's own Messages API base
// URL: https, with a host and without user information, query or
// fragment; or, with allowLoopback, http to a loopback address (a local
// test server or proxy). Its errors name u's scheme and host, nothing
// more.
func CheckBaseURL(u string, allowLoopback bool) error {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" || p.User != nil || p.RawQuery != "" || p.Fragment != "" || p.Opaque != "" {
		return errors.New("must be an absolute http(s) URL with a host and no user information, query or fragment")
	}
	switch p.Scheme {
	case "https":
		return nil
	case "http":
		host := p.Hostname()
		ip, err := netip.ParseAddr(host)
		loopback := host == "localhost" || err == nil && ip.IsLoopback()
		if allowLoopback && loopback {
			return nil
		}
		if loopback {
			return errors.New("http to a loopback address needs a server that allows private networks; use https")
		}
		return errors.New("must use https")
	}
	return fmt.Errorf("scheme %q: must use https", p.Scheme)
}

// Validate fills defaults and reports the first bad field. Its errors never
// contain the credentials.
func (c *AnthropicConfig) Validate() error {
	switch {
	case c.APIKey == "" && c.AuthToken == "":
		return errors.New("anthropic model: an API key or an auth token is required")
	case c.APIKey != "" && c.AuthToken != "":
		return errors.New("anthropic model: give either an API key or an auth token, not both")
	case c.MaxRetries < 0:
		return errors.New("anthropic model: max retries must not be negative")
	case c.Timeout < 0:
		return errors.New("anthropic model: timeout must not be negative")
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.BaseURL != "" && !strings.HasPrefix(c.BaseURL, "http://") && !strings.HasPrefix(c.BaseURL, "https://") {
		return fmt.Errorf("anthropic model: base URL %q must start with http:// or https://", c.BaseURL)
	}
	return nil
}

// Anthropic is the model client for the Anthropic Messages API, through the
// official Go SDK with streaming.
type Anthropic struct {
	cfg    AnthropicConfig
	client anthropic.Client
}

var _ Client = (*Anthropic)(nil)

// NewAnthropic builds the client. It reads nothing from the environment
// (ANTHROPIC_API_KEY and friends are ignored): the credentials are the
// config's only.
func NewAnthropic(cfg AnthropicConfig) (*Anthropic, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := []option.RequestOption{
		option.WithoutEnvironmentDefaults(),
		option.WithHTTPClient(&http.Client{Transport: boundedTransport{next: cfg.Transport, max: cfg.MaxResponseBytes}}),
		option.WithMaxRetries(cfg.MaxRetries),
	}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	if cfg.APIKey != "" {
		// The Messages API's documented header for keys; set directly so
		// the SDK's credential defaults cannot change where the key goes.
		opts = append(opts, option.WithHeader("X-Api-Key", cfg.APIKey.Reveal()))
	} else {
		opts = append(opts, option.WithAuthToken(cfg.AuthToken.Reveal()))
	}
	return &Anthropic{cfg: cfg, client: anthropic.NewClient(opts...)}, nil
}

// Generate runs one streamed Messages API call: text deltas go to onDelta
// under their index in the returned Response.Content.
func (a *Anthropic) Generate(ctx context.Context, req Request, onDelta DeltaFunc) (Response, error) {
	params, err := a.params(req)
	if err != nil {
		return Response{}, err
	}
	callCtx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()

	stream := a.client.Messages.NewStreaming(callCtx, params)
	defer stream.Close()

	var msg anthropic.Message
	// index maps the stream's block index to the index in Response.Content,
	// which holds only the blocks the loop keeps (kept).
	index := map[int64]int{}
	stopped := false
	for stream.Next() {
		ev := stream.Current()
		if err := msg.Accumulate(ev); err != nil {
			return Response{}, &Error{Type: "model_request_failed_error", Message: "malformed response stream: " + err.Error(), Retryable: true}
		}
		switch ev.Type {
		case "message_stop":
			stopped = true
		case "content_block_start":
			if kept(ev.ContentBlock.Type) {
				index[ev.Index] = len(index)
			}
			if t := ev.ContentBlock.Type; onDelta != nil && (t == "thinking" || t == "redacted_thinking") {
				onDelta(index[ev.Index], "")
			}
		case "content_block_delta":
			if i, ok := index[ev.Index]; ok && ev.Delta.Type == "text_delta" && onDelta != nil && ev.Delta.Text != "" {
				onDelta(i, ev.Delta.Text)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return Response{}, a.mapError(ctx, callCtx, err)
	}
	if !stopped {
		// A stream cut short (a proxy or connection gave up) would
		// otherwise pass for a complete, shorter answer.
		return Response{}, &Error{Type: "model_request_failed_error", Message: "the response stream ended before message_stop", Retryable: true}
	}

	resp := Response{
		StopReason: string(msg.StopReason),
		Refusal:    refusalOf(msg),
		Usage: Usage{
			InputTokens:              msg.Usage.InputTokens,
			OutputTokens:             msg.Usage.OutputTokens,
			CacheCreationInputTokens: msg.Usage.CacheCreationInputTokens,
			CacheReadInputTokens:     msg.Usage.CacheReadInputTokens,
		},
	}
	for _, b := range msg.Content {
		switch b.Type {
		case "text":
			resp.Content = append(resp.Content, Block{Type: "text", Text: b.Text})
		case "tool_use":
			input := json.RawMessage(b.Input)
			if len(input) == 0 {
				input = json.RawMessage("{}")
			}
			if !json.Valid(input) {
				return Response{}, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("tool_use %s: the model's input is not valid JSON", b.Name), Retryable: true}
			}
			resp.Content = append(resp.Content, Block{Type: "tool_use", ID: b.ID, Name: b.Name, Input: input})
		case "thinking":
			resp.Content = append(resp.Content, Block{Type: "thinking", Thinking: b.Thinking, Signature: b.Signature})
		case "redacted_thinking":
			resp.Content = append(resp.Content, Block{Type: "redacted_thinking", Data: b.Data})
		case "server_tool_use":
			input := json.RawMessage(b.Input)
			if len(input) == 0 {
				input = json.RawMessage("{}")
			}
			raw := json.RawMessage(b.RawJSON())
			if !json.Valid(input) || !json.Valid(raw) {
				return Response{}, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("server_tool_use %s: the model's input is not valid JSON", b.Name), Retryable: true}
			}
			resp.Content = append(resp.Content, Block{Type: "server_tool_use", ID: b.ID, Name: b.Name, Input: input, Raw: raw})
		case "web_search_tool_result", "web_fetch_tool_result":
			raw := json.RawMessage(b.RawJSON())
			if !json.Valid(raw) {
				return Response{}, &Error{Type: "model_request_failed_error", Message: b.Type + ": malformed block", Retryable: true}
			}
			resp.Content = append(resp.Content, Block{Type: b.Type, ToolUseID: b.ToolUseID, Raw: raw})
		}
	}
	return resp, nil
}

// kept reports whether Generate keeps blocks of type t. Others (a server
// tool corral does not declare) are dropped; the loop never asks for them.
func kept(t string) bool {
	switch t {
	case "text", "tool_use", "thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result", "web_fetch_tool_result":
		return true
	}
	return false
}

// params maps a Request onto the Messages API's parameters.
// refusalOf is the refusal of a response that stopped with one.
func refusalOf(msg anthropic.Message) *Refusal {
	if msg.StopReason != anthropic.StopReasonRefusal {
		return nil
	}
	return &Refusal{Category: string(msg.StopDetails.Category), Explanation: msg.StopDetails.Explanation}
}

func (a *Anthropic) params(req Request) (anthropic.MessageNewParams, error) {
	modelID := req.Model
	if modelID == "" {
		modelID = a.cfg.DefaultModel
	}
	if modelID == "" {
		return anthropic.MessageNewParams{}, &Error{Type: "model_request_failed_error", Message: "no model id: the agent names none and no default is configured"}
	}
	maxTokens := req.MaxTokens
	if maxTokens <= 0 {
		maxTokens = 4096
	}
	p := anthropic.MessageNewParams{
		Model:     anthropic.Model(modelID),
		MaxTokens: int64(maxTokens),
	}
	if req.System != "" {
		p.System = []anthropic.TextBlockParam{{Text: req.System}}
	}
	if t := req.Thinking; t != nil {
		if err := t.Validate(); err != nil {
			return p, &Error{Type: "model_request_failed_error", Message: err.Error()}
		}
		switch t.Type {
		case "adaptive":
			p.Thinking = anthropic.ThinkingConfigParamUnion{OfAdaptive: &anthropic.ThinkingConfigAdaptiveParam{}}
		case "enabled":
			if t.BudgetTokens >= maxTokens {
				return p, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("thinking: budget_tokens %d must be below max_tokens %d", t.BudgetTokens, maxTokens)}
			}
			p.Thinking = anthropic.ThinkingConfigParamUnion{OfEnabled: &anthropic.ThinkingConfigEnabledParam{BudgetTokens: int64(t.BudgetTokens)}}
		}
	}
	for i, m := range req.Messages {
		blocks, err := contentParams(m.Content)
		if err != nil {
			return p, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("message %d: %v", i, err)}
		}
		switch m.Role {
		case "user":
			p.Messages = append(p.Messages, anthropic.NewUserMessage(blocks...))
		case "assistant":
			p.Messages = append(p.Messages, anthropic.NewAssistantMessage(blocks...))
		default:
			return p, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("message %d: unknown role %q", i, m.Role)}
		}
	}
	for _, t := range req.Tools {
		switch t.Server {
		case "":
		case ServerWebSearch:
			ws := &anthropic.WebSearchTool20250305Param{}
			if o := t.Web; o != nil {
				ws.AllowedDomains, ws.BlockedDomains = o.AllowedDomains, o.BlockedDomains
				if l := o.UserLocation; l != nil {
					ws.UserLocation = anthropic.UserLocationParam{}
					if l.City != "" {
						ws.UserLocation.City = anthropic.String(l.City)
					}
					if l.Region != "" {
						ws.UserLocation.Region = anthropic.String(l.Region)
					}
					if l.Country != "" {
						ws.UserLocation.Country = anthropic.String(l.Country)
					}
					if l.Timezone != "" {
						ws.UserLocation.Timezone = anthropic.String(l.Timezone)
					}
				}
			}
			p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfWebSearchTool20250305: ws})
			continue
		case ServerWebFetch:
			wf := &anthropic.WebFetchTool20250910Param{}
			if o := t.Web; o != nil {
				wf.AllowedDomains, wf.BlockedDomains = o.AllowedDomains, o.BlockedDomains
				if o.MaxContentTokens > 0 {
					wf.MaxContentTokens = anthropic.Int(o.MaxContentTokens)
				}
			}
			p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfWebFetchTool20250910: wf})
			continue
		default:
			return p, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("tool %s: unknown server tool type %q", t.Name, t.Server)}
		}
		schema, err := inputSchema(t.InputSchema)
		if err != nil {
			return p, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("tool %s: %v", t.Name, err)}
		}
		tool := anthropic.ToolParam{Name: t.Name, InputSchema: schema}
		if t.Description != "" {
			tool.Description = anthropic.String(t.Description)
		}
		p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: &tool})
	}
	return p, nil
}

// contentParams maps blocks onto the API's content block params.
func contentParams(blocks []Block) ([]anthropic.ContentBlockParamUnion, error) {
	var out []anthropic.ContentBlockParamUnion
	for _, b := range blocks {
		switch b.Type {
		case "text":
			out = append(out, anthropic.NewTextBlock(b.Text))
		case "image", "document":
			block, err := mediaParam(b)
			if err != nil {
				return nil, err
			}
			out = append(out, block)
		case "tool_use":
			input := b.Input
			if len(input) == 0 {
				input = json.RawMessage("{}")
			}
			out = append(out, anthropic.NewToolUseBlock(b.ID, input, b.Name))
		case "tool_result":
			r := anthropic.ToolResultBlockParam{ToolUseID: b.ToolUseID}
			if b.IsError {
				r.IsError = anthropic.Bool(true)
			}
			for _, c := range b.Content {
				if c.Type != "text" {
					return nil, fmt.Errorf("tool_result %s: unsupported content block %q", b.ToolUseID, c.Type)
				}
				r.Content = append(r.Content, anthropic.ToolResultBlockParamContentUnion{OfText: &anthropic.TextBlockParam{Text: c.Text}})
			}
			out = append(out, anthropic.ContentBlockParamUnion{OfToolResult: &r})
		case "thinking":
			out = append(out, anthropic.NewThinkingBlock(b.Signature, b.Thinking))
		case "redacted_thinking":
			out = append(out, anthropic.NewRedactedThinkingBlock(b.Data))
		case "server_tool_use":
			if len(b.Raw) == 0 {
				return nil, fmt.Errorf("server_tool_use %s without the provider's block", b.ID)
			}
			out = append(out, anthropic.ContentBlockParamUnion{OfServerToolUse: ptr(param.Override[anthropic.ServerToolUseBlockParam](b.Raw))})
		case "web_search_tool_result":
			if len(b.Raw) == 0 {
				return nil, fmt.Errorf("web_search_tool_result %s without the provider's block", b.ToolUseID)
			}
			out = append(out, anthropic.ContentBlockParamUnion{OfWebSearchToolResult: ptr(param.Override[anthropic.WebSearchToolResultBlockParam](b.Raw))})
		case "web_fetch_tool_result":
			if len(b.Raw) == 0 {
				return nil, fmt.Errorf("web_fetch_tool_result %s without the provider's block", b.ToolUseID)
			}
			out = append(out, anthropic.ContentBlockParamUnion{OfWebFetchToolResult: ptr(param.Override[anthropic.WebFetchToolResultBlockParam](b.Raw))})
		default:
			return nil, fmt.Errorf("unsupported content block %q", b.Type)
		}
	}
	return out, nil
}

func ptr[T any](v T) *T { return &v }

// mediaParam is an image or document block as the Messages API takes it.
func mediaParam(b Block) (anthropic.ContentBlockParamUnion, error) {
	src := b.Source
	if src == nil {
		return anthropic.ContentBlockParamUnion{}, fmt.Errorf("%s block without a source", b.Type)
	}
	if b.Type == "image" {
		switch src.Type {
		case "base64":
			return anthropic.NewImageBlockBase64(src.MediaType, src.Data), nil
		case "url":
			return anthropic.NewImageBlock(anthropic.URLImageSourceParam{URL: src.URL}), nil
		}
		return anthropic.ContentBlockParamUnion{}, fmt.Errorf("image source %q", src.Type)
	}
	var doc anthropic.ContentBlockParamUnion
	switch {
	case src.Type == "base64" && src.MediaType == "application/pdf":
		doc = anthropic.NewDocumentBlock(anthropic.Base64PDFSourceParam{Data: src.Data})
	case src.Type == "text":
		doc = anthropic.NewDocumentBlock(anthropic.PlainTextSourceParam{Data: src.Data})
	case src.Type == "url":
		doc = anthropic.NewDocumentBlock(anthropic.URLPDFSourceParam{URL: src.URL})
	default:
		return anthropic.ContentBlockParamUnion{}, fmt.Errorf("document source %q (%s)", src.Type, src.MediaType)
	}
	if b.Title != "" {
		doc.OfDocument.Title = anthropic.String(b.Title)
	}
	if b.Context != "" {
		doc.OfDocument.Context = anthropic.String(b.Context)
	}
	return doc, nil
}

// inputSchema maps a tool's JSON Schema onto the API's input_schema, keeping
// every keyword (properties and required as fields, the rest as extras).
func inputSchema(raw json.RawMessage) (anthropic.ToolInputSchemaParam, error) {
	var s anthropic.ToolInputSchemaParam
	if len(raw) == 0 {
		return s, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return s, fmt.Errorf("input_schema is not a JSON object: %w", err)
	}
	if t, ok := m["type"]; ok && t != "object" {
		return s, fmt.Errorf("input_schema type must be \"object\", not %v", t)
	}
	delete(m, "type")
	if p, ok := m["properties"]; ok {
		s.Properties = p
		delete(m, "properties")
	}
	if r, ok := m["required"]; ok {
		list, ok := r.([]any)
		if !ok {
			return s, errors.New("input_schema required must be a list of names")
		}
		for _, n := range list {
			name, ok := n.(string)
			if !ok {
				return s, errors.New("input_schema required must be a list of names")
			}
			s.Required = append(s.Required, name)
		}
		delete(m, "required")
	}
	if len(m) > 0 {
		s.ExtraFields = m
	}
	return s, nil
}

// mapError turns an SDK or transport error into the loop's view: ctx's own
// error when the caller gave up, otherwise a typed *Error. Messages carry the
// API's explanation and status, never request headers or credentials.
func (a *Anthropic) mapError(ctx, callCtx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if callCtx.Err() != nil {
		return &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("the model call did not finish within %s", a.cfg.Timeout), Retryable: true}
	}
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		// Transport failures (connection refused, reset mid-stream) and
		// unparseable error frames.
		return &Error{Type: "model_request_failed_error", Message: a.scrub(err.Error()), Retryable: true}
	}
	typ := string(apiErr.Type())
	detail := a.scrub(apiErr.Message)
	describe := func(what string) string {
		s := what
		if apiErr.StatusCode != 0 && apiErr.StatusCode != http.StatusOK {
			s += fmt.Sprintf(" (HTTP %d)", apiErr.StatusCode)
		}
		if detail != "" {
			s += ": " + detail
		}
		if apiErr.RequestID != "" {
			s += " (request-id " + apiErr.RequestID + ")"
		}
		return s
	}
	// A mid-stream error frame arrives on a 200 response: its type decides.
	status := apiErr.StatusCode
	switch {
	case status == 529 || typ == "overloaded_error":
		return &Error{Type: "model_overloaded_error", Message: describe("the model is overloaded"), Retryable: true}
	case status == http.StatusTooManyRequests || typ == "rate_limit_error":
		return &Error{Type: "model_rate_limited_error", Message: describe("rate limited by the model API"), Retryable: true}
	case status == http.StatusUnauthorized || status == http.StatusForbidden || typ == "authentication_error" || typ == "permission_error":
		return &Error{Type: "model_request_failed_error", Message: describe("authentication failed: check the configured API key or token")}
	case status == http.StatusPaymentRequired || typ == "billing_error":
		return &Error{Type: "billing_error", Message: describe("billing")}
	case status >= 500 || typ == "api_error":
		return &Error{Type: "model_request_failed_error", Message: describe("the model API failed"), Retryable: true}
	case status >= 400 || typ == "invalid_request_error" || typ == "not_found_error" || typ == "request_too_large":
		return &Error{Type: "model_request_failed_error", Message: describe("the model API rejected the request")}
	}
	return &Error{Type: "unknown_error", Message: describe("unexpected error from the model API")}
}

// scrub removes the credentials from s, should any API or transport message
// ever echo them.
func (a *Anthropic) scrub(s string) string {
	for _, secret := range []logging.Secret{a.cfg.APIKey, a.cfg.AuthToken} {
		if secret != "" {
			s = strings.ReplaceAll(s, secret.Reveal(), "[redacted]")
		}
	}
	return s
}

// boundedTransport ends a response body that sends more than max bytes
// with an error, so that no endpoint can make the client buffer without
// end.
type boundedTransport struct {
	next http.RoundTripper // nil: http.DefaultTransport
	max  int64
}

func (t boundedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &boundedBody{ReadCloser: resp.Body, left: t.max}
	return resp, nil
}

// errResponseTooLarge ends a response past its bound.
var errResponseTooLarge = errors.New("the model API's response exceeded its size bound")

type boundedBody struct {
	io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errResponseTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
