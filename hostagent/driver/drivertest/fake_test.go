package drivertest

import (
	"testing"

	"corral.dev/corral/hostagent/driver"
)

func TestFake(t *testing.T) {
	Run(t, func(t *testing.T) Harness {
		f := NewFake(t.TempDir())
		return Harness{Driver: f, Reopen: func(*testing.T) driver.Driver { return f.Reopen() }, Pauses: true}
	})
}
