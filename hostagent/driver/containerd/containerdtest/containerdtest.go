// Package containerdtest finds the sandbox runtime for tests outside the
// containerd driver: the private containerd that scripts/runtime starts, and
// runsc. On a machine without them a test skips and says why; under CI,
// where `make test` sets them up, it fails instead, so a green CI always ran
// the real suites.
package containerdtest

import (
	"os"
	"strings"
	"testing"

	"corral.dev/corral/hostagent/driver/containerd"
)

// Address returns the containerd address tests use (CORRAL_CONTAINERD_ADDRESS,
// or the private containerd's), once it has checked that this machine can
// run gVisor sandboxes through it: root, the socket, runsc.
func Address(tb testing.TB) string {
	tb.Helper()
	skip := func(format string, args ...any) {
		tb.Helper()
		if os.Getenv("CI") != "" {
			tb.Fatalf("CI is set, so the gVisor runtime must be here: "+format, args...)
		}
		tb.Skipf(format, args...)
	}
	if os.Geteuid() != 0 {
		skip("gVisor sandboxes through containerd need root (run `make test` as root: it starts containerd)")
	}
	addr := os.Getenv("CORRAL_CONTAINERD_ADDRESS")
	if addr == "" {
		addr = containerd.DefaultAddress
	}
	if p := strings.TrimPrefix(addr, "unix://"); strings.HasPrefix(p, "/") {
		if _, err := os.Stat(p); err != nil {
			skip("no containerd at %s (scripts/runtime/containerd.sh start): %v", p, err)
		}
	}
	if _, err := os.Stat(containerd.DefaultRunscPath); err != nil {
		skip("no runsc at %s (make runtime): %v", containerd.DefaultRunscPath, err)
	}
	return addr
}
