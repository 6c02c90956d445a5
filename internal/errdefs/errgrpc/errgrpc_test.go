package errgrpc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"corral.dev/corral/internal/errdefs"
)

func TestCode(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{errdefs.InvalidArgument("bad"), codes.InvalidArgument},
		{errdefs.NotFound("x"), codes.NotFound},
		{errdefs.AlreadyExists("x"), codes.AlreadyExists},
		{errdefs.Conflict("x"), codes.Aborted},
		{errdefs.FailedPrecondition("x"), codes.FailedPrecondition},
		{errdefs.PermissionDenied("x"), codes.PermissionDenied},
		{errdefs.Unauthenticated("x"), codes.Unauthenticated},
		{errdefs.ResourceExhausted("x"), codes.ResourceExhausted},
		{errdefs.Unavailable("x"), codes.Unavailable},
		{errdefs.TooLarge("x"), codes.ResourceExhausted},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("boom"), codes.Internal},
	}
	for _, tt := range tests {
		if got := Code(tt.err); got != tt.want {
			t.Errorf("Code(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestKindRoundTrip(t *testing.T) {
	for k := errdefs.InvalidArgumentKind; k <= errdefs.DeadlineExceededKind; k++ {
		if k == errdefs.TooLargeKind {
			continue // shares ResourceExhausted on the gRPC side
		}
		err := &errdefs.Error{Kind: k, Msg: "x"}
		if got := Kind(Code(err)); got != k {
			t.Errorf("kind %v: round trip through gRPC gave %v", k, got)
		}
	}
}

func TestStatusRoundTrip(t *testing.T) {
	err := FromStatus(ToStatus(errdefs.NotFound("sandbox %s", "k"), false))
	if !errdefs.IsNotFound(err) || err.Error() != "sandbox k" {
		t.Fatalf("round trip gave %v (%v)", err, errdefs.KindOf(err))
	}
	internal := errors.New("disk on fire")
	if got := FromStatus(ToStatus(internal, false)).Error(); got != "internal error" {
		t.Fatalf("public server leaked %q", got)
	}
	if got := FromStatus(ToStatus(internal, true)).Error(); got != "internal error: disk on fire" {
		t.Fatalf("trusted server said %q", got)
	}
	if ToStatus(nil, true) != nil || FromStatus(nil) != nil {
		t.Fatal("nil must stay nil")
	}
}
