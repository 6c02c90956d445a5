package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// switchable is a provider whose canary fails while broken is set.
type switchable struct {
	name   string
	broken atomic.Bool
	runs   atomic.Int32
}

func (p *switchable) Name() string { return p.name }
func (p *switchable) Capabilities() agent.Capabilities {
	return agent.Capabilities{Isolation: agent.IsolationUserKernel, Platform: "systrap", Checkpoint: true, NetworkModes: []string{"none", "limited"}}
}
func (p *switchable) Canary(context.Context) error {
	p.runs.Add(1)
	if p.broken.Load() {
		return errors.New("canary: runsc exited 1: broken on purpose")
	}
	return nil
}

func providerHealth(hb *pb.Heartbeat, name string) *pb.ProviderHealth {
	for _, p := range hb.GetProviders() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Register carries the providers with their capabilities and the first
// canary's outcome; a canary that starts failing is reported at once, in
// a heartbeat of its own (no heartbeat tick), and so is its recovery.
func TestProvidersRegisterAndReportTheirCanaries(t *testing.T) {
	e := setup(t)
	main, other := &switchable{name: "fake"}, &switchable{name: "other"}
	main.broken.Store(true)
	e.providers = []agent.Provider{main, other}
	e.canaryTick = make(chan time.Time)
	r := e.start()
	defer r.stop()

	reg := e.ctl.Hosts()[hostID].Register
	if len(reg.Providers) != 2 {
		t.Fatalf("registered providers %v, want 2", reg.Providers)
	}
	p := reg.Providers[0]
	if p.Name != "fake" || p.Capabilities.GetIsolation() != "user_kernel" || p.Capabilities.GetPlatform() != "systrap" ||
		!p.Capabilities.GetCheckpoint() || len(p.Capabilities.GetNetworkModes()) != 2 {
		t.Errorf("registered provider %v", p)
	}
	// The canary ran before the first Register: it already says why.
	if p.Health.GetOk() || !strings.Contains(p.Health.GetReason(), "broken on purpose") || p.Health.GetCheckedAt() == nil {
		t.Errorf("registered health %v, want failing with the canary's reason", p.Health)
	}
	if !reg.Providers[1].Health.GetOk() {
		t.Errorf("provider other registered unhealthy: %v", reg.Providers[1].Health)
	}

	main.broken.Store(false)
	e.canaryTick <- e.clock.Now()
	e.wait("a heartbeat saying the provider recovered", func(h hostctl.Host) bool {
		ph := providerHealth(h.Last, "fake")
		return ph != nil && ph.Ok
	})
	main.broken.Store(true)
	e.canaryTick <- e.clock.Now()
	e.wait("a heartbeat saying the provider fails", func(h hostctl.Host) bool {
		ph := providerHealth(h.Last, "fake")
		return ph != nil && !ph.Ok && strings.Contains(ph.Reason, "broken on purpose")
	})
	if ph := providerHealth(e.heartbeat(r), "other"); ph == nil || !ph.Ok {
		t.Errorf("provider other in a heartbeat: %v", ph)
	}
}

func TestProviderConfigRefused(t *testing.T) {
	e := setup(t)
	cfg := e.config()
	cfg.Providers = []agent.Provider{&switchable{name: "other"}}
	if _, err := agent.New(context.Background(), cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `runtime "fake" has no provider`) {
		t.Fatalf("a host whose runtime has no provider: %v", err)
	}
	cfg.Providers = []agent.Provider{&switchable{name: "fake"}, &switchable{name: "fake"}}
	if _, err := agent.New(context.Background(), cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a provider configured twice: %v", err)
	}
	if _, err := agent.NewProvider("firecracker", agent.ProviderConfig{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an unknown provider: %v", err)
	}
	if _, err := agent.NewProvider("gvisor", agent.ProviderConfig{Binary: "/bin/true", Platform: "vmx"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an unknown gVisor platform: %v", err)
	}
	if agent.KVMUsable() != nil {
		if _, err := agent.NewProvider("gvisor", agent.ProviderConfig{Binary: "/bin/true", Platform: "kvm"}); errdefs.KindOf(err) != errdefs.FailedPreconditionKind || !strings.Contains(err.Error(), "/dev/kvm") {
			t.Fatalf("platform kvm without /dev/kvm: %v", err)
		}
	} else if p, err := agent.NewProvider("gvisor", agent.ProviderConfig{Binary: "/bin/true", Platform: "kvm"}); err != nil || p.Capabilities().Platform != "kvm" {
		t.Fatalf("platform kvm with /dev/kvm: %v", err)
	}
	if p, err := agent.NewProvider("gvisor", agent.ProviderConfig{Binary: "/bin/true", Platform: "ptrace"}); err != nil || p.Capabilities().Platform != "ptrace" {
		t.Fatalf("platform ptrace: %v", err)
	}
}

// The gVisor provider's canary runs its runsc: a runsc that fails makes
// the canary fail with what it said (bounded); one that works passes.
func TestGVisorCanaryRunsItsRunsc(t *testing.T) {
	dir := t.TempDir()
	runsc := filepath.Join(dir, "runsc")
	write := func(script string) {
		t.Helper()
		if err := os.WriteFile(runsc+".new", []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(runsc+".new", runsc); err != nil {
			t.Fatal(err)
		}
	}
	write("#!/bin/sh\necho 'runsc version test'\n")
	p, err := agent.NewProvider("gvisor", agent.ProviderConfig{Binary: runsc})
	if err != nil {
		t.Fatal(err)
	}
	if c := p.Capabilities(); p.Name() != "gvisor" || c.Isolation != agent.IsolationUserKernel || c.Platform != "systrap" {
		t.Fatalf("provider %s %+v", p.Name(), c)
	}
	if err := p.Canary(context.Background()); err != nil {
		t.Fatalf("canary of a working runsc: %v", err)
	}
	write("#!/bin/sh\nhead -c 100000 /dev/zero | tr '\\0' x >&2\necho 'cannot start' >&2\nexit 3\n")
	err = p.Canary(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || len(err.Error()) > 5000 {
		t.Fatalf("canary of a failing runsc: %.200v (%d bytes)", err, len(errString(err)))
	}
	if p, err := agent.NewProvider("process", agent.ProviderConfig{}); err != nil || p.Canary(context.Background()) != nil {
		t.Fatalf("the process provider: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
