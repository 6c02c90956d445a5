package containerd

import (
	"context"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
)

// TestCommandsRightAfterTheSentryDies: under gVisor the host's OOM killer
// ends the whole sandbox when its memory passes the limit (the Sentry
// holds the memory), and the shim learns of it a moment later; a fork bomb
// may end it so, or fill it with processes, whose orphans, in a pausable
// sandbox, are init's (spawn.go). The next commands, sent at once with no
// waiting, must run (in a new init over the same workspace where the old
// one ended), and never be reported as commands that could not start.
func TestCommandsRightAfterTheSentryDies(t *testing.T) {
	for _, tt := range []struct {
		name, cmd       string
		pausable, shell bool
	}{
		{"memory hog", "dd if=/dev/zero of=/dev/null bs=600M count=1", false, false},
		{"memory hog, pausable", "dd if=/dev/zero of=/dev/null bs=600M count=1", true, false},
		{"memory hog, pausable, shell spawner", "dd if=/dev/zero of=/dev/null bs=600M count=1", true, true},
		{"fork bomb that returns at once", "b(){ b | b & }\nb", false, false},
		{"fork bomb that returns at once, pausable", "b(){ b | b & }\nb", true, false},
		{"fork bomb that returns at once, pausable, shell spawner", "b(){ b | b & }\nb", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			newDriver := newDriver
			if tt.shell {
				newDriver = newShellDriver
			}
			d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: tt.pausable, Logger: testLogger(t), Limits: driver.Limits{MemoryBytes: 256 << 20, Pids: 256}})
			ctx := d.ns(context.Background())
			_, sb := create(t, d, driver.Spec{})
			if err := sb.WriteFile(ctx, "kept.txt", []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _ = sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c", tt.cmd}, Timeout: 5 * time.Second})
			for i := range 3 {
				res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c", "cat kept.txt"}, Timeout: time.Minute})
				if err != nil || !strings.HasSuffix(string(res.Stdout), "kept") {
					t.Errorf("command %d after the %s: %+v, %v", i, tt.name, res, err)
				}
			}
		})
	}
}

// A command in a pausable sandbox does not inherit init's spawn FIFO or
// socket: it could read the ids meant for init, or hand init commands of
// its own; nor any of the relay's (host) descriptors.
func TestSpawnedCommandsDoNotInheritTheFIFO(t *testing.T) {
	for name, newDriver := range map[string]func(*testing.T, Config) *Driver{"compiled": newDriver, "shell": newShellDriver} {
		t.Run(name, func(t *testing.T) {
			d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
			_, sb := create(t, d, driver.Spec{})
			res := run(t, sb, `for f in /proc/$$/fd/*; do readlink "$f"; done`)
			fds := strings.Fields(string(res.Stdout))
			if len(fds) != 3 || strings.Contains(string(res.Stdout), "/spawn") || strings.Contains(string(res.Stdout), "socket") {
				t.Errorf("a spawned command's descriptors are %q, want its standard streams only", fds)
			}
		})
	}
}
