package tools_test

import (
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/test/fleettest"
)

const debianImage = "localhost/corral/debian:bookworm-2"

// host is a one-node control plane's fleet with one real host agent
// joined, and one session's sandbox placed on it through the fleet, as a
// tool call places it.
type host struct {
	c   *fleettest.Cluster
	key string
}

// Sandbox is the session's sandbox as the tools see it.
func (h *host) Sandbox() tools.Sandbox { return h.c.Sandbox(0, h.key) }

// startHost joins an agent over d to a fresh control plane and places a
// session's sandbox of image on it.
func startHost(t testing.TB, d driver.Driver, runtime, image string) *host {
	t.Helper()
	c := fleettest.Start(t, fleettest.Options{Runtime: runtime, Image: image,
		Resources: scheduler.Resources{CPUMillis: 1000, MemoryMiB: 1024},
		NewDriver: func(testing.TB) driver.Driver { return d }})
	c.StartHost("h1", fleettest.HostOptions{})
	h := &host{c: c, key: "sesn_tools"}
	h.Sandbox()
	return h
}

// processHost runs the process driver: a folder on this machine.
func processHost(t testing.TB) *host {
	t.Helper()
	d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	return startHost(t, d, "process", "")
}

// gvisorHost runs containerd with gVisor and the Debian image. Outside CI it
// skips, saying why, when the machine cannot; under CI it fails instead.
func gvisorHost(t testing.TB) *host {
	t.Helper()
	return startHost(t, gvisorDriver(t), containerd.RuntimeGVisor, debianImage)
}

// gvisorDriver is the containerd driver with gVisor, or a skip (a failure
// under CI) saying why the machine cannot run it.
func gvisorDriver(t testing.TB) *containerd.Driver {
	t.Helper()
	return containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
}
