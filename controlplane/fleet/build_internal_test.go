package fleet

import "testing"

func TestBuildErrorSummary(t *testing.T) {
	for in, want := range map[string]string{
		"":                           "no reason was recorded",
		"step apt failed (exit 100)": "step apt failed (exit 100)",
		"step apt failed (exit 100): Ign:1 http://m ./ InRelease\nGet:2 ...\nE: Unable to locate package nope\n": "step apt failed (exit 100) ... E: Unable to locate package nope",
	} {
		if got := summary(in); got != want {
			t.Errorf("summary(%q) = %q, want %q", in, got, want)
		}
	}
	var tl tail
	for i := 0; i < 3*maxBuildLog/10; i++ {
		tl.Add("123456789")
	}
	if s := tl.String(); len(s) != maxBuildLog || s[len(s)-10:] != "123456789\n" {
		t.Errorf("tail kept %d bytes ending %q", len(s), s[len(s)-10:])
	}
}
