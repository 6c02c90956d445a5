package model

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func user(text string) Message {
	return Message{Role: "user", Content: []Block{{Type: "text", Text: text}}}
}

func TestFakeScripts(t *testing.T) {
	ctx := context.Background()
	f := Fake{}

	resp, err := f.Generate(ctx, Request{Messages: []Message{user("hello")}}, nil)
	if err != nil || resp.Content[0].Text != "echo: hello" || resp.StopReason != "end_turn" {
		t.Fatalf("echo: %+v %v", resp, err)
	}

	script := "!tool get_weather {\"city\":\"Paris\"}\n!reply It is sunny."
	msgs := []Message{user(script)}
	resp, err = f.Generate(ctx, Request{Messages: msgs}, nil)
	if err != nil || resp.StopReason != "tool_use" || len(resp.Content) != 1 {
		t.Fatalf("tool call: %+v %v", resp, err)
	}
	tu := resp.Content[0]
	var in map[string]string
	if tu.Name != "get_weather" || json.Unmarshal(tu.Input, &in) != nil || in["city"] != "Paris" {
		t.Fatalf("tool_use block = %+v", tu)
	}
	msgs = append(msgs, Message{Role: "assistant", Content: resp.Content},
		Message{Role: "user", Content: []Block{{Type: "tool_result", ToolUseID: tu.ID, Content: []Block{{Type: "text", Text: "sunny"}}}}})
	resp, err = f.Generate(ctx, Request{Messages: msgs}, nil)
	if err != nil || resp.Content[0].Text != "It is sunny." {
		t.Fatalf("second call: %+v %v", resp, err)
	}
	msgs = append(msgs, Message{Role: "assistant", Content: resp.Content})
	if resp, _ = f.Generate(ctx, Request{Messages: msgs}, nil); resp.Content[0].Text != "done" {
		t.Fatalf("past the script: %+v", resp)
	}
}

func TestFakeStreamsDeltas(t *testing.T) {
	var got strings.Builder
	deltas := 0
	resp, err := Fake{}.Generate(context.Background(), Request{Messages: []Message{user("!stream 50")}}, func(i int, s string) {
		deltas++
		got.WriteString(s)
	})
	if err != nil {
		t.Fatal(err)
	}
	if deltas != 50 || got.String() != resp.Content[0].Text || !strings.HasSuffix(got.String(), "word50") {
		t.Fatalf("%d deltas, text %q, final %q", deltas, got.String(), resp.Content[0].Text)
	}
}

func TestFakeErrors(t *testing.T) {
	tests := map[string]string{
		"!error model_overloaded_error busy": "model_overloaded_error",
		"!error no_such_error":               "model_request_failed_error",
		"!tool":                              "model_request_failed_error",
		"!tool x {not json":                  "model_request_failed_error",
		"!dance":                             "model_request_failed_error",
		"!stream many":                       "model_request_failed_error",
	}
	for script, want := range tests {
		_, err := Fake{}.Generate(context.Background(), Request{Messages: []Message{user(script)}}, nil)
		e, ok := err.(*Error)
		if !ok || e.Type != want {
			t.Errorf("%q: err = %v, want type %s", script, err, want)
		}
	}
	_, err := Fake{}.Generate(context.Background(), Request{Messages: []Message{user("!error model_overloaded_error busy")}}, nil)
	if ee, ok := err.(*Error); !ok || !ee.Retryable || ee.Message != "busy" {
		t.Fatalf("overloaded: %+v", err)
	}
}

func TestFakeMultipleTools(t *testing.T) {
	resp, err := Fake{}.Generate(context.Background(), Request{Messages: []Message{user(`!tools a {"x":1}; b {}`)}}, nil)
	if err != nil || len(resp.Content) != 2 || resp.Content[0].Name != "a" || resp.Content[1].Name != "b" || resp.Content[0].ID == resp.Content[1].ID {
		t.Fatalf("%+v %v", resp, err)
	}
}
