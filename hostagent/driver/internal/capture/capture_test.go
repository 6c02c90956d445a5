package capture

import (
	"bytes"
	"strings"
	"testing"
)

func TestBuffer(t *testing.T) {
	tests := []struct {
		name      string
		max       int
		writes    []string
		want      string
		truncated bool
	}{
		{"fits", 10, []string{"abc", "de"}, "abcde", false},
		{"exact", 4, []string{"ab", "cd"}, "abcd", false},
		{"cut in one write", 4, []string{"abcdefgh"}, "ab\n[... 4 bytes cut ...]\ngh", true},
		{"cut across writes", 4, []string{"a", "b", "c", "d", "e", "f"}, "ab\n[... 2 bytes cut ...]\nef", true},
		{"ring wraps", 6, []string{"abc", "12", "34", "5"}, "abc\n[... 2 bytes cut ...]\n345", true},
		{"nothing kept", 0, []string{"abc"}, "\n[... 3 bytes cut ...]\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stream bytes.Buffer
			b := New(tt.max, &stream)
			for _, w := range tt.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if got := string(b.Bytes()); got != tt.want {
				t.Errorf("Bytes() = %q, want %q", got, tt.want)
			}
			if b.Truncated() != tt.truncated {
				t.Errorf("Truncated() = %v, want %v", b.Truncated(), tt.truncated)
			}
			if all := strings.Join(tt.writes, ""); stream.String() != all {
				t.Errorf("stream got %q, want every byte %q", stream.String(), all)
			}
		})
	}
}
