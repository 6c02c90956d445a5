package publicapi

import (
	"testing"

	"corral.dev/corral/controlplane/authz"
	"corral.dev/corral/policy"
)

// testGuard is a Guard over the embedded policy, recording no audit.
func testGuard(t testing.TB) *Guard {
	t.Helper()
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	z, err := authz.New(p)
	if err != nil {
		t.Fatal(err)
	}
	return &Guard{Authz: z}
}
