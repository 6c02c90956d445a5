package process

import (
	"context"
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

func TestCommandByPath(t *testing.T) {
	d, err := New(Config{Dir: t.TempDir(), AllowUntrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref, err := d.Create(ctx, driver.Spec{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "bin/hello", []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"/bin/sh", "-c", "echo hello"}, {"./bin/hello"}} {
		res, err := sb.Exec(ctx, driver.ExecRequest{Command: cmd})
		if err != nil || string(res.Stdout) != "hello\n" {
			t.Errorf("Exec(%q) = %+v, %v", cmd, res, err)
		}
	}
}
