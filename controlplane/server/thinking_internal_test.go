package server

import "testing"

// --anthropic-thinking: adaptive, or enabled with a budget the request's
// max tokens leave room for; with the anthropic model only.
func TestThinkingConfig(t *testing.T) {
	for _, tc := range []struct {
		model, v string
		ok       bool
		budget   int
	}{
		{"anthropic", "", true, 0},
		{"anthropic", "adaptive", true, 0},
		{"anthropic", "enabled:2048", true, 2048},
		{"anthropic", "enabled", false, 0},
		{"anthropic", "enabled:512", false, 0},
		{"anthropic", "enabled:4096", false, 0},
		{"anthropic", "enabled:lots", false, 0},
		{"anthropic", "sometimes", false, 0},
		{"fake", "adaptive", false, 0},
	} {
		c := Config{Model: tc.model, AnthropicThinking: tc.v}
		th, err := c.thinking()
		if (err == nil) != tc.ok {
			t.Errorf("%s %q: %v, want ok %v", tc.model, tc.v, err, tc.ok)
			continue
		}
		if tc.ok && tc.v != "" && (th == nil || th.BudgetTokens != tc.budget) {
			t.Errorf("%s %q: %+v", tc.model, tc.v, th)
		}
	}
}
