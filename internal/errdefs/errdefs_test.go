package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestKindSurvivesWrapping(t *testing.T) {
	base := NotFound("agent %s", "agent_1")
	wrapped := fmt.Errorf("loading session: %w", base)
	if !IsNotFound(wrapped) {
		t.Fatalf("IsNotFound(%v) = false after wrapping", wrapped)
	}
	if got, want := wrapped.Error(), "loading session: agent agent_1"; got != want {
		t.Fatalf("message = %q, want %q", got, want)
	}
}

func TestWrapKeepsCause(t *testing.T) {
	cause := errors.New("connection refused")
	err := Wrap(UnavailableKind, cause, "database")
	if !errors.Is(err, cause) {
		t.Fatal("Wrap dropped the cause from the chain")
	}
	if got := err.Error(); got != "database: connection refused" {
		t.Fatalf("message = %q", got)
	}
	if Wrap(UnavailableKind, nil, "x") != nil {
		t.Fatal("Wrap(nil) must be nil")
	}
}

func TestKindOf(t *testing.T) {
	tests := []struct {
		err  error
		want Kind
	}{
		{nil, Unknown},
		{errors.New("boom"), Unknown},
		{fmt.Errorf("op: %w", TooLarge("x")), TooLargeKind},
		{fmt.Errorf("op: %w", context.Canceled), CanceledKind},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), DeadlineExceededKind},
		{Wrap(UnavailableKind, context.DeadlineExceeded, "db"), UnavailableKind}, // the outermost kind wins
	}
	for _, tt := range tests {
		if got := KindOf(tt.err); got != tt.want {
			t.Errorf("KindOf(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
