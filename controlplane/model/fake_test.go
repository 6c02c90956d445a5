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

// A ';' inside a tool call's JSON is the JSON's: `{"command":"a; b"}` is
// one bash call, not two broken ones.
func TestFakeToolJSONIsReadAsJSON(t *testing.T) {
	tests := []struct {
		script string
		names  []string
		inputs []string
	}{
		{`!tool bash {"command":"a; b"}`, []string{"bash"}, []string{`{"command":"a; b"}`}},
		{`!tools bash {"command":"x;y"};read {"file_path":"/a;b"}`, []string{"bash", "read"}, []string{`{"command":"x;y"}`, `{"file_path":"/a;b"}`}},
		{`!tools a; b {"k":"}; c"} ; c`, []string{"a", "b", "c"}, []string{`{}`, `{"k":"}; c"}`, `{}`}},
		{"!tool multi {\"a\":\n1}", nil, nil}, // a script line ends at its newline: this JSON is cut
	}
	for _, tt := range tests {
		resp, err := Fake{}.Generate(context.Background(), Request{Messages: []Message{user(tt.script)}}, nil)
		if tt.names == nil {
			if err == nil {
				t.Errorf("%q: %+v, want an error", tt.script, resp)
			}
			continue
		}
		if err != nil || len(resp.Content) != len(tt.names) {
			t.Errorf("%q: %+v, %v", tt.script, resp, err)
			continue
		}
		for i, b := range resp.Content {
			if b.Name != tt.names[i] || string(b.Input) != tt.inputs[i] {
				t.Errorf("%q: call %d is %s %s, want %s %s", tt.script, i, b.Name, b.Input, tt.names[i], tt.inputs[i])
			}
		}
	}
	for _, bad := range []string{`!tool a {} junk`, `!tools a {};`, `!tool a {"x":1`} {
		if _, err := (Fake{}).Generate(context.Background(), Request{Messages: []Message{user(bad)}}, nil); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestFakeRefuse(t *testing.T) {
	for script, want := range map[string]Refusal{
		"!refuse cyber not this": {Category: "cyber", Explanation: "not this"},
		"!refuse -":              {},
		"!refuse":                {},
	} {
		resp, err := Fake{}.Generate(context.Background(), Request{Messages: []Message{user(script)}}, nil)
		if err != nil || resp.StopReason != "refusal" || resp.Refusal == nil || *resp.Refusal != want || len(resp.Content) != 1 {
			t.Errorf("%q: %+v (refusal %+v), %v", script, resp, resp.Refusal, err)
		}
	}
}
