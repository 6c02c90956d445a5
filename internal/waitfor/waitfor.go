// Package waitfor is how tests wait for something to happen: on the channel
// that signals it where one exists (Chan), otherwise by polling a condition
// on the real state until a deadline (Cond, State). Never by sleeping for a
// while and then reading the state.
//
// The deadline only bounds a failure: a passing test returns as soon as the
// event happens, however long the deadline. Choose it for a loaded 2-core
// machine with another CPU-heavy job beside the tests: seconds for
// in-process work, tens of seconds for cluster and host events (elections,
// heartbeats, sandboxes starting).
//
// Every function fails the test with t.Fatalf, so it must be called from
// the goroutine running the test, like t.Fatal itself.
package waitfor

import (
	"testing"
	"time"
)

// Poll intervals: the first poll comes soon, so fast events are seen
// quickly, and the interval grows so a long wait costs little CPU.
const (
	firstPoll = time.Millisecond
	maxPoll   = 20 * time.Millisecond
)

// Cond polls cond until it returns true, failing t if d passes first. what
// names the awaited state for the failure message ("host h1 connected").
func Cond(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	State(t, d, what, func() (bool, string) { return cond(), "" })
}

// State polls cond until it reports true, failing t if d passes first. The
// string cond returns describes the state it saw; the failure message
// carries the last one, so a timeout says what was there instead.
func State(t testing.TB, d time.Duration, what string, cond func() (ok bool, state string)) {
	t.Helper()
	if msg, ok := poll(d, what, cond); !ok {
		t.Fatal(msg)
	}
}

// Chan waits until ch yields a value and returns it, failing t if d passes
// first or if ch is closed without a value.
func Chan[T any](t testing.TB, d time.Duration, what string, ch <-chan T) T {
	t.Helper()
	start := time.Now()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("waiting for %s: the channel closed after %v", what, time.Since(start).Round(time.Millisecond))
		}
		return v
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
	var zero T
	return zero
}

// Closed waits until ch is closed, discarding whatever it yields before,
// failing t if d passes first.
func Closed[T any](t testing.TB, d time.Duration, what string, ch <-chan T) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// poll runs cond until it holds or d passes; on a timeout it returns the
// failure message.
func poll(d time.Duration, what string, cond func() (bool, string)) (string, bool) {
	start := time.Now()
	deadline := start.Add(d)
	interval := firstPoll
	for {
		ok, state := cond()
		if ok {
			return "", true
		}
		if time.Now().After(deadline) {
			msg := "timed out after " + time.Since(start).Round(time.Millisecond).String() + " waiting for " + what
			if state != "" {
				msg += "; last state: " + state
			}
			return msg, false
		}
		time.Sleep(interval) // polling the state, bounded by the deadline
		interval = min(2*interval, maxPoll)
	}
}
