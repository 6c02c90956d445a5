package process

import (
	"testing"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/internal/errdefs"
)

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Harness {
		dir := t.TempDir()
		open := func(t *testing.T) driver.Driver {
			d, err := New(Config{Dir: dir, AllowUntrusted: true})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		return drivertest.Harness{Driver: open(t), Reopen: open}
	})
}

func TestRefusedWithoutOverride(t *testing.T) {
	_, err := New(Config{Dir: t.TempDir()})
	if errdefs.KindOf(err) != errdefs.PermissionDeniedKind {
		t.Fatalf("New without AllowUntrusted = %v, want permission denied", err)
	}
}
