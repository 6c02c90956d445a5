package agent

import (
	"context"
	"strings"
	"testing"
)

// TestBuildLog: output becomes lines, each cut to 4 KiB, at most 1 MiB of
// them sent, the rest counted; a line written after the build's end is
// dropped, not waited for.
func TestBuildLog(t *testing.T) {
	var got []string
	l := newBuildLog(t.Context(), func(s string) error { got = append(got, s); return nil })
	l.Write([]byte("one\ntw"))
	l.Write([]byte("o\r\n"))
	l.Write([]byte(strings.Repeat("x", 10000) + "\nlast"))
	if dropped := l.close(); dropped != 0 || len(got) != 4 || got[0] != "one" || got[1] != "two" || got[2] != strings.Repeat("x", maxBuildLineBytes) || got[3] != "last" {
		t.Fatalf("lines: %d %.40q, dropped %d", len(got), got, dropped)
	}

	got = nil
	l = newBuildLog(t.Context(), func(s string) error { got = append(got, s); return nil })
	line := strings.Repeat("y", 1023) + "\n"
	for range 2048 {
		l.Write([]byte(line))
	}
	dropped := l.close()
	sent := 0
	for _, s := range got {
		sent += len(s)
	}
	if sent > maxBuildLogBytes || len(got) != maxBuildLogBytes/1023 || dropped != int64(2048-len(got)) {
		t.Errorf("sent %d bytes in %d lines, dropped %d", sent, len(got), dropped)
	}

	// A reader that takes nothing: once the queue is full, the build's
	// end unblocks the writer.
	ctx, cancel := context.WithCancel(t.Context())
	block := make(chan struct{})
	l = newBuildLog(ctx, func(string) error { <-block; return nil })
	wrote := make(chan struct{})
	go func() {
		for range buildLogQueue + 10 {
			l.Write([]byte("z\n"))
		}
		close(wrote)
	}()
	cancel()
	<-wrote
	close(block)
	if dropped := l.close(); dropped == 0 {
		t.Error("nothing dropped past the build's end")
	}
}
