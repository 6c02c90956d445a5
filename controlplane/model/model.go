// Package model holds the model clients the agent loop talks to: the fake
// (deterministic, offline, the default) and Anthropic, the Messages API
// through the official Go SDK. Both implement Client.
//
// The types here are the loop's view of a conversation, close to the Messages
// API but owned by corral, so the loop never depends on an SDK's types.
package model

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// Block is one content block of a message.
type Block struct {
	// Type is "text", "image", "document", "tool_use", "tool_result",
	// "thinking", "redacted_thinking", or a server tool's block:
	// "server_tool_use", "web_search_tool_result", "web_fetch_tool_result".
	Type string `json:"type"`
	// Text of a text block.
	Text string `json:"text,omitempty"`
	// Source of an image or document block, and a document's Title and
	// Context: as the API has them, checked when the user sent them.
	Source  *Source `json:"source,omitempty"`
	Title   string  `json:"title,omitempty"`
	Context string  `json:"context,omitempty"`
	// ID, Name and Input of a tool_use block. ID is the agent.*tool_use
	// event's id, so results can name it.
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// ToolUseID, Content and IsError of a tool_result block.
	ToolUseID string  `json:"tool_use_id,omitempty"`
	Content   []Block `json:"content,omitempty"`
	IsError   bool    `json:"is_error,omitempty"`
	// Thinking and Signature of a thinking block, Data of a
	// redacted_thinking one: the model's reasoning, sent back to it as it
	// came (the provider checks the signature) and never shown to clients.
	Thinking  string `json:"thinking,omitempty"`
	Signature string `json:"signature,omitempty"`
	Data      string `json:"data,omitempty"`
	// Raw is a server tool block (server_tool_use, *_tool_result) as the
	// provider returned it, sent back byte for byte: its results are
	// encrypted, and only the provider reads them. ID, Name and Input (a
	// server_tool_use) or ToolUseID (a result) are copied from it for the
	// loop's events.
	Raw json.RawMessage `json:"raw,omitempty"`
}

// Server reports whether b is a server tool's block: the provider ran the
// tool, and its use and result come back in the same response.
func (b Block) Server() bool {
	return b.Type == "server_tool_use" || strings.HasSuffix(b.Type, "_tool_result") && b.Type != "tool_result"
}

// Source is where an image's or a document's content is: Type "base64"
// (Data, of MediaType), "text" (a plain text document's Data) or "url"
// (URL).
type Source struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

// Message is one turn of the conversation.
type Message struct {
	Role    string  `json:"role"` // "user" or "assistant"
	Content []Block `json:"content"`
}

// Tool describes a tool the model may call.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// Server, when set, is the provider's server tool type
	// (ServerWebSearch, ServerWebFetch): the model's provider runs the tool
	// itself and the tool has no schema here. Clients without server tools
	// leave it out.
	Server string `json:"server,omitempty"`
	// Web holds a web server tool's options (nil: none).
	Web *WebOptions `json:"web,omitempty"`
}

// WebOptions are the options of the web server tools, as the agent's
// toolset config sets them: domain filters (one or the other) for both,
// a content limit for web_fetch and a location for web_search.
type WebOptions struct {
	AllowedDomains   []string      `json:"allowed_domains,omitempty"`
	BlockedDomains   []string      `json:"blocked_domains,omitempty"`
	MaxContentTokens int64         `json:"max_content_tokens,omitempty"`
	UserLocation     *UserLocation `json:"user_location,omitempty"`
}

// UserLocation localizes web_search's results (type "approximate").
type UserLocation struct {
	Type     string `json:"type"`
	City     string `json:"city,omitempty"`
	Region   string `json:"region,omitempty"`
	Country  string `json:"country,omitempty"`
	Timezone string `json:"timezone,omitempty"`
}

// Server tool types the anthropic client declares natively.
const (
	ServerWebSearch = "web_search_20250305"
	ServerWebFetch  = "web_fetch_20250910"
)

// Request is one model call.
type Request struct {
	Model     string
	System    string
	Messages  []Message
	Tools     []Tool
	MaxTokens int
	// Thinking, when set, enables the model's extended thinking.
	Thinking *Thinking
}

// Thinking configures extended thinking: Type "adaptive" (the model
// decides how much to think) or "enabled" with a BudgetTokens (at least
// 1024, below the request's MaxTokens).
type Thinking struct {
	Type         string `json:"type"`
	BudgetTokens int    `json:"budget_tokens,omitempty"`
}

// Validate reports whether t can be honoured.
func (t *Thinking) Validate() error {
	switch {
	case t == nil || t.Type == "adaptive" && t.BudgetTokens == 0:
		return nil
	case t.Type == "adaptive":
		return fmt.Errorf("thinking: adaptive thinking takes no budget_tokens")
	case t.Type != "enabled":
		return fmt.Errorf("thinking: type %q is not one of adaptive, enabled", t.Type)
	case t.BudgetTokens < 1024:
		return fmt.Errorf("thinking: budget_tokens %d is below the minimum of 1024", t.BudgetTokens)
	}
	return nil
}

// Usage counts tokens of one call.
type Usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// Response is the model's answer: text and tool_use blocks.
type Response struct {
	Content []Block
	// StopReason is "end_turn", "tool_use", "max_tokens", "refusal", or
	// "pause_turn": the provider paused a long server tool turn, and the
	// conversation, this response included, is to be sent back to go on.
	StopReason string
	// Refusal, with StopReason "refusal", is what the model said of it.
	Refusal *Refusal
	Usage   Usage
}

// Refusal is why a model declined to go on: a policy category ("cyber",
// "bio", ...; empty when it names none) and an explanation (empty when it
// gives none).
type Refusal struct {
	Category, Explanation string
}

// DeltaFunc receives text as it is generated: index is the block's index in
// Response.Content. Text "" marks the start of a thinking block at index
// (thinking itself is never previewed: clients see only that it began).
type DeltaFunc func(index int, text string)

// Client calls a model.
type Client interface {
	// Generate runs one call. onDelta, if not nil, receives text deltas of
	// text blocks before Generate returns. Errors of type *Error carry the
	// session.error type to report.
	Generate(ctx context.Context, req Request, onDelta DeltaFunc) (Response, error)
}

// Error is a failed model call, typed as session.error reports it.
type Error struct {
	// Type is a session.error type: model_overloaded_error,
	// model_rate_limited_error, model_request_failed_error, unknown_error.
	Type    string
	Message string
	// Retryable reports whether the same call may succeed later.
	Retryable bool
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Type, e.Message) }

// ErrorTypes are the session.error types a model call can fail with.
var ErrorTypes = map[string]bool{
	"model_overloaded_error":     true,
	"model_rate_limited_error":   true,
	"model_request_failed_error": true,
	"unknown_error":              true,
	"billing_error":              true,
}
