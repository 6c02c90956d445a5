package model

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Fake is the offline model: deterministic, and scripted by the user's
// message so that tests and demos can make it do anything a real model does.
//
// Without a script it answers "echo: <the last user message>". A script is
// one or more lines starting with "!"; each model call of a turn plays the
// next line (the first call plays line 1; after a tool result comes back, the
// second call plays line 2; and so on). When lines run out it ends the turn
// with "done".
//
//	!reply TEXT               answer with TEXT
//	!tool NAME JSON           call tool NAME with input JSON (default {})
//	!tools NAME JSON; NAME JSON   call several tools at once (a JSON is read
//	                          as JSON: a ';' inside one is its own)
//	!stream N                 answer with N words, streamed one delta per word
//	!error TYPE [MESSAGE]     fail with session.error TYPE (model_overloaded_error, ...)
//	!refuse [CATEGORY [TEXT]] decline with "I can't help with that.", a refusal of
//	                          CATEGORY ("-" or none: no category) explained by TEXT
//	!echo                     answer with the tool results it was given
//	!system                   answer with the system prompt it was given
//
// Example, a custom-tool round trip:
//
//	!tool get_weather {"city":"Paris"}
//	!reply It is sunny in Paris.
type Fake struct{}

var _ Client = Fake{}

// Generate plays the script line for this call.
func (Fake) Generate(ctx context.Context, req Request, onDelta DeltaFunc) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err
	}
	userText, calls, lastResults := scriptState(req.Messages)
	lines := scriptLines(userText)
	usage := Usage{InputTokens: countTokens(req), OutputTokens: 0}
	if len(lines) == 0 {
		return textResponse("echo: "+userText, usage, onDelta, false), nil
	}
	if calls >= len(lines) {
		return textResponse("done", usage, onDelta, false), nil
	}
	verb, rest, _ := strings.Cut(strings.TrimPrefix(lines[calls], "!"), " ")
	rest = strings.TrimSpace(rest)
	switch verb {
	case "reply":
		return textResponse(rest, usage, onDelta, false), nil
	case "stream":
		n, err := strconv.Atoi(rest)
		if err != nil || n < 1 || n > 100000 {
			return Response{}, &Error{Type: "model_request_failed_error", Message: "fake model: !stream wants a word count from 1 to 100000"}
		}
		words := make([]string, n)
		for i := range words {
			words[i] = "word" + strconv.Itoa(i+1)
		}
		return textResponse(strings.Join(words, " "), usage, onDelta, true), nil
	case "tool", "tools":
		specs, err := parseToolCalls(rest)
		if err != nil {
			return Response{}, &Error{Type: "model_request_failed_error", Message: "fake model: " + err.Error()}
		}
		var blocks []Block
		for i, c := range specs {
			blocks = append(blocks, Block{Type: "tool_use", ID: fmt.Sprintf("fake_%d_%d", calls, i), Name: c.name, Input: c.input})
		}
		usage.OutputTokens = int64(len(rest) / 4)
		return Response{Content: blocks, StopReason: "tool_use", Usage: usage}, nil
	case "refuse":
		category, explanation, _ := strings.Cut(rest, " ")
		if category == "-" {
			category = ""
		}
		// As a real refusal, it says so in a message too.
		resp := textResponse("I can't help with that.", usage, onDelta, false)
		resp.StopReason, resp.Refusal = "refusal", &Refusal{Category: category, Explanation: strings.TrimSpace(explanation)}
		return resp, nil
	case "error":
		typ, msg, _ := strings.Cut(rest, " ")
		if !ErrorTypes[typ] {
			return Response{}, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("fake model: unknown error type %q", typ)}
		}
		if msg == "" {
			msg = "scripted failure"
		}
		return Response{}, &Error{Type: typ, Message: msg, Retryable: typ == "model_overloaded_error" || typ == "model_rate_limited_error"}
	case "system":
		return textResponse("system: "+req.System, usage, onDelta, false), nil
	case "echo":
		var parts []string
		for _, r := range lastResults {
			for _, c := range r.Content {
				parts = append(parts, c.Text)
			}
			if r.IsError {
				parts = append(parts, "(error)")
			}
		}
		return textResponse("results: "+strings.Join(parts, " | "), usage, onDelta, false), nil
	}
	return Response{}, &Error{Type: "model_request_failed_error", Message: fmt.Sprintf("fake model: unknown script verb %q", verb)}
}

// toolCall is one NAME JSON of a !tool line.
type toolCall struct {
	name  string
	input json.RawMessage
}

// parseToolCalls reads "NAME JSON; NAME JSON; ...", where each JSON (by
// default {}) is read as JSON, to its end: a ';' inside a string of it
// (a bash command "a; b") is the command's, not a separator.
func parseToolCalls(s string) ([]toolCall, error) {
	var calls []toolCall
	for {
		s = strings.TrimLeft(s, " \t")
		end := strings.IndexAny(s, " \t;")
		if end < 0 {
			end = len(s)
		}
		name := s[:end]
		s = strings.TrimLeft(s[end:], " \t")
		if name == "" {
			return nil, fmt.Errorf("bad tool call %q (want NAME JSON)", s)
		}
		input := json.RawMessage("{}")
		if s != "" && s[0] != ';' {
			dec := json.NewDecoder(strings.NewReader(s))
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, fmt.Errorf("bad tool call %q (want NAME JSON): %v", name+" "+s, err)
			}
			input = raw
			s = strings.TrimLeft(s[dec.InputOffset():], " \t")
		}
		calls = append(calls, toolCall{name: name, input: input})
		switch {
		case s == "":
			return calls, nil
		case s[0] != ';':
			return nil, fmt.Errorf("bad tool call %q: want ';' or the end of the line after %s's JSON", s, name)
		}
		s = s[1:]
	}
}

// scriptState finds the last user text message, how many assistant messages
// followed it (the script position), and the tool results of the last user
// turn.
func scriptState(msgs []Message) (userText string, calls int, lastResults []Block) {
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == "assistant" {
			calls++
			continue
		}
		var text []string
		var results []Block
		for _, b := range m.Content {
			switch b.Type {
			case "text":
				text = append(text, b.Text)
			case "tool_result":
				results = append(results, b)
			}
		}
		if i == len(msgs)-1 {
			lastResults = results
		}
		if len(text) > 0 {
			return strings.Join(text, "\n"), calls, lastResults
		}
	}
	return "", calls, lastResults
}

func scriptLines(text string) []string {
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "!") {
			lines = append(lines, l)
		}
	}
	return lines
}

func textResponse(text string, usage Usage, onDelta DeltaFunc, perWord bool) Response {
	if onDelta != nil {
		if perWord {
			words := strings.SplitAfter(text, " ")
			for _, w := range words {
				onDelta(0, w)
			}
		} else {
			onDelta(0, text)
		}
	}
	usage.OutputTokens = int64(len(text)/4 + 1)
	return Response{Content: []Block{{Type: "text", Text: text}}, StopReason: "end_turn", Usage: usage}
}

// countTokens is a rough, deterministic input size: four bytes a token,
// counting what the blocks carry (not marshalling the request, which would
// make the fake model the slowest part of a long session's step).
func countTokens(req Request) int64 {
	n := len(req.System)
	for _, m := range req.Messages {
		n += len(m.Role) + blockBytes(m.Content)
	}
	return int64(n/4 + 1)
}

func blockBytes(blocks []Block) int {
	n := 0
	for _, b := range blocks {
		n += len(b.Type) + len(b.Text) + len(b.ID) + len(b.Name) + len(b.Input) + len(b.ToolUseID) + blockBytes(b.Content) + len(b.Title) + len(b.Context)
		if b.Source != nil {
			n += len(b.Source.Data) + len(b.Source.URL)
		}
	}
	return n
}
