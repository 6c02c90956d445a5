package textcut

import (
	"testing"
	"unicode/utf8"
)

func TestPrefix(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{
		{"hello", 10, "hello"},
		{"hello", 5, "hello"},
		{"hello", 3, "hel"},
		{"héllo", 2, "h"},  // é is 2 bytes: not split
		{"héllo", 3, "hé"}, // fits whole
		{"日本", 4, "日"},
		{"日本", 2, ""},
		{"abc", 0, ""},
		{"abc", -1, ""},
	} {
		got := Prefix(tt.s, tt.n)
		if got != tt.want || !utf8.ValidString(got) {
			t.Errorf("Prefix(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}
