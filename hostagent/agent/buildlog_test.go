package agent

import (
	"strings"
	"testing"
)

// TestBuildLog: output becomes lines, each cut to 4 KiB, at most 1 MiB of
// them sent, the rest counted.
func TestBuildLog(t *testing.T) {
	var got []string
	l := &buildLog{send: func(s string) error { got = append(got, s); return nil }}
	l.Write([]byte("one\ntw"))
	l.Write([]byte("o\r\n"))
	l.Write([]byte(strings.Repeat("x", 10000) + "\nlast"))
	l.flush()
	if len(got) != 4 || got[0] != "one" || got[1] != "two" || got[2] != strings.Repeat("x", maxBuildLineBytes) || got[3] != "last" {
		t.Fatalf("lines: %d %.40q", len(got), got)
	}
	got = nil
	l = &buildLog{send: func(s string) error { got = append(got, s); return nil }}
	line := strings.Repeat("y", 1023) + "\n"
	for range 2048 {
		l.Write([]byte(line))
	}
	sent := 0
	for _, s := range got {
		sent += len(s)
	}
	if sent > maxBuildLogBytes || len(got) != maxBuildLogBytes/1023 || l.dropped != int64(2048-len(got)) {
		t.Errorf("sent %d bytes in %d lines, dropped %d", sent, len(got), l.dropped)
	}
}
