package devstack

import "testing"

// Each warm pool class names the runtime it was read for: a host of
// several runtimes (corral host --runtime runc,gvisor) reads each one's
// pools, and a class without its runtime would be filled by the host's
// default runtime's driver instead.
func TestWarmPoolsNameTheirRuntime(t *testing.T) {
	pools, err := WarmPools("", "gvisor")
	if err != nil {
		t.Fatal(err)
	}
	if len(pools) == 0 {
		t.Fatal("the shipped policy keeps no gvisor warm pool; this test needs one")
	}
	for _, p := range pools {
		if p.Runtime != "gvisor" {
			t.Errorf("pool class of %s has runtime %q, want gvisor", p.Image, p.Runtime)
		}
	}
}
