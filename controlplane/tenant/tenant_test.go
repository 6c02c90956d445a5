package tenant

import (
	"context"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

func TestRequired(t *testing.T) {
	if _, err := Required(context.Background()); errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
		t.Fatalf("Required without tenant: err = %v, want unauthenticated", err)
	}
	if _, err := Required(With(context.Background(), "")); err == nil {
		t.Fatal("an empty tenant id must not count as a tenant")
	}
	got, err := Required(With(context.Background(), "tenant_a"))
	if err != nil || got != "tenant_a" {
		t.Fatalf("Required = %q, %v", got, err)
	}
}

func TestValidate(t *testing.T) {
	for _, ok := range []ID{Default, "tenant_a", "tenant_A-9_x"} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []ID{"", "a", "tenant_a'b", "tenant_ a", "org_x"} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}
