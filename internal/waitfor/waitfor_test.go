package waitfor

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records a failure and ends its goroutine, as testing.T does.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatal(args ...any) {
	f.failed = fmt.Sprint(args...)
	runtime.Goexit()
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a fakeT on its own goroutine and returns the failure
// message, empty if none.
func run(fn func(t testing.TB)) string {
	f := &fakeT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.failed
}

func TestCond(t *testing.T) {
	var n atomic.Int32
	if msg := run(func(t testing.TB) { Cond(t, 10*time.Second, "three polls", func() bool { return n.Add(1) == 3 }) }); msg != "" {
		t.Fatalf("failed: %s", msg)
	}
	msg := run(func(t testing.TB) { Cond(t, 30*time.Millisecond, "never", func() bool { return false }) })
	if !strings.Contains(msg, "timed out after") || !strings.Contains(msg, "waiting for never") {
		t.Fatalf("timeout message %q", msg)
	}
}

func TestStateSaysWhatItSawLast(t *testing.T) {
	var n atomic.Int32
	msg := run(func(t testing.TB) {
		State(t, 30*time.Millisecond, "the count at -1", func() (bool, string) { return false, fmt.Sprintf("count %d", n.Add(1)) })
	})
	if want := fmt.Sprintf("last state: count %d", n.Load()); !strings.Contains(msg, want) {
		t.Fatalf("message %q, want it to contain %q", msg, want)
	}
}

func TestChan(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	var got int
	if msg := run(func(t testing.TB) { got = Chan(t, time.Second, "a value", ch) }); msg != "" || got != 7 {
		t.Fatalf("got %d, failure %q", got, msg)
	}
	if msg := run(func(t testing.TB) { Chan(t, 10*time.Millisecond, "a value", ch) }); !strings.Contains(msg, "timed out") {
		t.Fatalf("timeout message %q", msg)
	}
	close(ch)
	if msg := run(func(t testing.TB) { Chan(t, time.Second, "a value", ch) }); !strings.Contains(msg, "closed") {
		t.Fatalf("closed message %q", msg)
	}
}

func TestClosed(t *testing.T) {
	ch := make(chan int, 2)
	ch <- 1
	ch <- 2
	close(ch)
	if msg := run(func(t testing.TB) { Closed(t, time.Second, "the end", ch) }); msg != "" {
		t.Fatalf("failed: %s", msg)
	}
	open := make(chan int)
	if msg := run(func(t testing.TB) { Closed(t, 10*time.Millisecond, "the end", open) }); !strings.Contains(msg, "timed out") {
		t.Fatalf("timeout message %q", msg)
	}
}
