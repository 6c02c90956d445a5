package hosts_test

import (
	"context"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"errors"
	"io"
	"testing"
	"time"

	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// requireGVisor skips unless this machine runs gVisor sandboxes through the
// private containerd of scripts/runtime; under CI it fails instead.
func requireGVisor(t *testing.T) string {
	t.Helper()
	return containerdtest.Address(t)
}

// exec runs a shell command in a session's sandbox on a host.
func (c *cluster) exec(hostID, key, script string) (string, error) {
	sb, err := c.any().Sandbox(hostID)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := sb.Exec(ctx, &pb.ExecRequest{Key: key, Command: []string{"sh", "-c", script}})
	if err != nil {
		return "", errdefs.FromGRPCStatus(err)
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return "", errors.New("exec ended without a result")
		}
		if err != nil {
			return "", errdefs.FromGRPCStatus(err)
		}
		if r := m.GetResult(); r != nil {
			if r.ExitCode != 0 {
				return "", errors.New("exit " + string(r.Stderr))
			}
			return string(r.Stdout), nil
		}
	}
}

// TestDrainGVisor drains a host whose sandboxes are gVisor sandboxes: the
// session's files move with it, and its next tool call runs on the other
// host and sees them.
func TestDrainGVisor(t *testing.T) {
	addr := requireGVisor(t)
	c := setup(t)
	c.runtime, c.image = containerd.RuntimeGVisor, "localhost/corral/busybox:1"
	c.resources = scheduler.Resources{CPUMillis: 1000, MemoryMiB: 512}
	c.newDriver = func(t *testing.T) driver.Driver {
		return containerdtest.NewDriver(t, containerd.Config{Address: addr, Runtime: containerd.RuntimeGVisor})
	}
	c.startHost("h1")
	c.startHost("h2")
	if p := c.place("s1"); p.HostID != "h1" {
		t.Fatalf("s1 placed on %s, want h1", p.HostID)
	}
	// Sandboxes outlive their agents: remove this one before the agents
	// stop (cleanups run last first).
	t.Cleanup(func() {
		if err := c.any().Evict(context.Background(), "s1"); err != nil {
			t.Errorf("evicting s1: %v", err)
			return
		}
		waitfor.Cond(t, 30*time.Second, "s1 to be destroyed", func() bool {
			_, err1 := c.readFile("h1", "s1", "src/main.txt")
			_, err2 := c.readFile("h2", "s1", "src/main.txt")
			return errdefs.IsNotFound(err1) && errdefs.IsNotFound(err2)
		})
	})
	// A tool call before the drain leaves files behind, one made inside the
	// sandbox.
	c.writeFile("h1", "s1", "src/main.txt", "written through WriteFile")
	if _, err := c.exec("h1", "s1", "mkdir -p out && echo made-in-gvisor > out/result.txt && hostname > out/host.txt"); err != nil {
		t.Fatal(err)
	}
	var steps []hosts.DrainProgress
	if err := c.any().Drain(context.Background(), "h1", 5*time.Minute, func(p hosts.DrainProgress) { steps = append(steps, p) }); err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || steps[0].State != hosts.DrainMoved || steps[0].To != "h2" {
		t.Fatalf("progress %+v", steps)
	}
	// The next tool call runs on h2 and sees the files.
	out, err := c.exec("h2", "s1", "cat src/main.txt out/result.txt")
	if err != nil {
		t.Fatal(err)
	}
	if out != "written through WriteFile\nmade-in-gvisor\n" && out != "written through WriteFilemade-in-gvisor\n" {
		t.Fatalf("files on the new host: %q", out)
	}
	waitfor.Cond(t, 30*time.Second, "the old sandbox to go", func() bool {
		_, err := c.readFile("h1", "s1", "src/main.txt")
		return errdefs.IsNotFound(err)
	})
}
