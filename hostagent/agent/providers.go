package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Provider is one kind of sandbox this host offers. The host registers
// each with its capabilities, runs its canary periodically (the canary
// loop, never a heartbeat) and reports the outcome in every heartbeat: a
// provider that fails its canary takes no new placements on this host.
type Provider interface {
	// Name is what placements ask for ("gvisor", "runc", "process").
	Name() string
	// Capabilities say what the provider's sandboxes can do.
	Capabilities() Capabilities
	// Canary returns nil when the provider can run a sandbox now. It
	// bounds its own time; expensive parts may run less often than it is
	// called, reporting their last outcome in between.
	Canary(ctx context.Context) error
}

// Capabilities are a provider's, as the control plane records them.
type Capabilities struct {
	// Isolation: "vm", "user_kernel" (gVisor), "container", "none".
	Isolation string
	// Platform is gVisor's ("systrap", "ptrace", "kvm").
	Platform   string
	Checkpoint bool
	// NetworkModes a sandbox can have: "none", "limited".
	NetworkModes []string
	GPU          bool
}

// Isolation classes, strongest first.
const (
	IsolationVM         = "vm"
	IsolationUserKernel = "user_kernel"
	IsolationContainer  = "container"
	IsolationNone       = "none"
)

// ProviderConfig is what a provider is built from: the host's
// configuration for the runtime it serves.
type ProviderConfig struct {
	// Driver runs the provider's sandboxes, and its canary sandbox.
	Driver driver.Driver
	// Binary is the runtime binary the canary asks for its version
	// (gvisor: runsc; runc: runc, looked up on PATH when empty).
	Binary string
	// Platform is gVisor's: "systrap" (default), "ptrace", or "kvm",
	// which needs /dev/kvm usable. The driver must run runsc on it (the
	// containerd driver's GVisorPlatform).
	Platform string
	// Checkpoint: the driver pauses and restores its sandboxes.
	Checkpoint bool
	// CanaryImage is the image of the canary sandbox; empty: no canary
	// sandbox, only the binary's check.
	CanaryImage string
	// SandboxEvery is how often at most the canary boots a sandbox
	// (default 5m); the binary's check runs at every call.
	SandboxEvery time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// providerKinds is the registry of providers by name: the extension point
// for later ones (a VM provider, a remote service).
var providerKinds = map[string]func(ProviderConfig) (Provider, error){
	"gvisor":  newGVisorProvider,
	"runc":    newRuncProvider,
	"process": newProcessProvider,
}

// NewProvider builds the provider name from c; an unknown name is one
// clear error.
func NewProvider(name string, c ProviderConfig) (Provider, error) {
	mk, ok := providerKinds[name]
	if !ok {
		return nil, errdefs.InvalidArgument("unknown sandbox provider %q: want gvisor, runc or process", name)
	}
	if c.SandboxEvery == 0 {
		c.SandboxEvery = 5 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return mk(c)
}

// KVMUsable reports whether /dev/kvm can be opened for reading and
// writing, as gVisor's kvm platform needs.
func KVMUsable() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// canaryProvider is a provider whose canary runs a binary's version check
// at every call and a canary sandbox at most every SandboxEvery.
type canaryProvider struct {
	name string
	caps Capabilities
	cfg  ProviderConfig

	// mu serialises canaries and guards the sandbox's last run.
	mu          sync.Mutex
	sandboxAt   time.Time
	sandboxErr  error
	sandboxOnce bool
}

func (p *canaryProvider) Name() string               { return p.name }
func (p *canaryProvider) Capabilities() Capabilities { return p.caps }

func (p *canaryProvider) Canary(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Binary != "" {
		if err := versionCheck(ctx, p.cfg.Binary); err != nil {
			return err
		}
	}
	if p.cfg.CanaryImage == "" || p.cfg.Driver == nil {
		return nil
	}
	now := p.cfg.Now()
	// A failing sandbox is tried again at the next call: recovery should
	// show as soon as it happens, and a broken runtime fails fast.
	if p.sandboxOnce && p.sandboxErr == nil && now.Sub(p.sandboxAt) < p.cfg.SandboxEvery {
		return nil
	}
	p.sandboxAt, p.sandboxErr, p.sandboxOnce = now, runCanary(ctx, p.cfg.Driver, p.cfg.CanaryImage, []string{"true"}), true
	return p.sandboxErr
}

// maxCanaryOutput bounds what a canary keeps of a binary's output.
const maxCanaryOutput = 4 << 10

// versionCheck runs "binary --version" within 10 seconds.
func versionCheck(ctx context.Context, binary string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out boundedBuffer
	out.max = maxCanaryOutput
	cmd := exec.CommandContext(ctx, binary, "--version")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if msg != "" {
			return fmt.Errorf("canary: %s --version: %v: %s", binary, err, msg)
		}
		return fmt.Errorf("canary: %s --version: %w", binary, err)
	}
	return nil
}

// boundedBuffer keeps the first max bytes written to it. (It does not
// embed bytes.Buffer: io.Copy would use the buffer's ReadFrom and read
// past the bound.)
type boundedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string { return b.buf.String() }

func newGVisorProvider(c ProviderConfig) (Provider, error) {
	switch c.Platform {
	case "":
		c.Platform = "systrap"
	case "systrap":
	case "ptrace":
	case "kvm":
		// The driver runs runsc on the platform (containerd's
		// platform.go); the canary then tells whether a sandbox runs on
		// it, as a machine whose nested KVM makes runsc panic shows.
		if err := KVMUsable(); err != nil {
			return nil, errdefs.Wrap(errdefs.FailedPreconditionKind, err, "gVisor platform kvm needs /dev/kvm usable")
		}
	default:
		return nil, errdefs.InvalidArgument("unknown gVisor platform %q: want systrap, ptrace or kvm", c.Platform)
	}
	if c.Binary == "" {
		return nil, errdefs.InvalidArgument("the gvisor provider needs the runsc binary")
	}
	return &canaryProvider{name: "gvisor", cfg: c, caps: Capabilities{
		Isolation: IsolationUserKernel, Platform: c.Platform, Checkpoint: c.Checkpoint,
		NetworkModes: []string{"none", "limited"},
	}}, nil
}

func newRuncProvider(c ProviderConfig) (Provider, error) {
	if c.Binary == "" {
		// containerd's runc shim runs the runc on its PATH.
		path, err := exec.LookPath("runc")
		if err != nil {
			return nil, errdefs.Wrap(errdefs.FailedPreconditionKind, err, "the runc provider needs runc on PATH")
		}
		c.Binary = path
	}
	return &canaryProvider{name: "runc", cfg: c, caps: Capabilities{
		Isolation: IsolationContainer, NetworkModes: []string{"none", "limited"},
	}}, nil
}

func newProcessProvider(ProviderConfig) (Provider, error) {
	// A folder on the host: nothing to check that the driver did not
	// check when it started.
	return &canaryProvider{name: "process", caps: Capabilities{Isolation: IsolationNone, NetworkModes: []string{"none"}}}, nil
}

// defaultProvider is what a host configured without providers offers:
// its runtime, by that name, with no canary (tests, embedders).
type defaultProvider string

func (p defaultProvider) Name() string { return string(p) }
func (p defaultProvider) Capabilities() Capabilities {
	switch p {
	case "gvisor":
		return Capabilities{Isolation: IsolationUserKernel, Platform: "systrap", NetworkModes: []string{"none", "limited"}}
	case "runc":
		return Capabilities{Isolation: IsolationContainer, NetworkModes: []string{"none", "limited"}}
	case "process":
		return Capabilities{Isolation: IsolationNone, NetworkModes: []string{"none"}}
	}
	return Capabilities{}
}
func (defaultProvider) Canary(context.Context) error { return nil }

// Bounds on what the host reports about its providers (the control plane
// checks them too).
const (
	maxProviderName   = 64
	maxProviderReason = 512
)

// providerHealth is a provider's last canary outcome.
type providerHealth struct {
	err       error
	checkedAt time.Time
}

// CheckProviders runs every provider's canary now and records the
// outcomes; a change of any provider's health wakes the heartbeat loop,
// which reports it at once. The canary loop calls it every
// CanaryInterval, and Run once before it first registers.
func (a *Agent) CheckProviders(ctx context.Context) {
	a.canaryMu.Lock()
	defer a.canaryMu.Unlock()
	for _, p := range a.cfg.Providers {
		err := p.Canary(ctx)
		if ctx.Err() != nil {
			return // stopping: not the provider's fault
		}
		a.mu.Lock()
		old, seen := a.health[p.Name()]
		a.health[p.Name()] = providerHealth{err: err, checkedAt: a.cfg.Now()}
		changed := !seen || errString(old.err) != errString(err)
		if changed {
			close(a.healthChanged)
			a.healthChanged = make(chan struct{})
		}
		a.mu.Unlock()
		switch {
		case changed && err != nil:
			a.log.Warn("sandbox provider failed its canary: no new placements for it here", "provider", p.Name(), "err", err)
		case changed && seen:
			a.log.Info("sandbox provider passes its canary again", "provider", p.Name())
		}
	}
}

// HealthChanged returns a channel closed at the next change of a
// provider's health. Take it before reading what it tells about.
func (a *Agent) HealthChanged() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.healthChanged
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// canaryLoop runs the canaries every CanaryInterval until ctx ends.
func (a *Agent) canaryLoop(ctx context.Context) {
	tick, stop := a.cfg.NewCanaryTicker(a.cfg.CanaryInterval)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			a.CheckProviders(ctx)
		}
	}
}

// providersPB is what Register says of the providers.
func (a *Agent) providersPB() []*pb.Provider {
	health := a.providerHealthPB()
	out := make([]*pb.Provider, 0, len(a.cfg.Providers))
	for i, p := range a.cfg.Providers {
		c := p.Capabilities()
		out = append(out, &pb.Provider{Name: p.Name(), Health: health[i], Capabilities: &pb.ProviderCapabilities{
			Isolation: c.Isolation, Platform: c.Platform, Checkpoint: c.Checkpoint, NetworkModes: c.NetworkModes, Gpu: c.GPU,
		}})
	}
	return out
}

// providerHealthPB is each provider's last outcome, in configuration
// order; a provider not checked yet is reported healthy as of now (the
// canary runs before the first Register, so only a canary cut short by a
// stop leaves one unchecked).
func (a *Agent) providerHealthPB() []*pb.ProviderHealth {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*pb.ProviderHealth, 0, len(a.cfg.Providers))
	for _, p := range a.cfg.Providers {
		h, ok := a.health[p.Name()]
		if !ok {
			h.checkedAt = a.cfg.Now()
		}
		ph := &pb.ProviderHealth{Name: p.Name(), Ok: h.err == nil, CheckedAt: timestamppb.New(h.checkedAt)}
		if h.err != nil {
			ph.Reason = truncate(h.err.Error(), maxProviderReason)
		}
		out = append(out, ph)
	}
	return out
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// validateProviders checks the configured providers: unique, short names,
// one of them each runtime's (none configured: the runtimes' defaults).
func (c *Config) validateProviders() error {
	if len(c.Providers) == 0 {
		return nil
	}
	seen := map[string]bool{}
	for _, p := range c.Providers {
		n := p.Name()
		switch {
		case n == "" || len(n) > maxProviderName:
			return errdefs.InvalidArgument("a provider's name must be 1 to %d bytes: %q", maxProviderName, n)
		case seen[n]:
			return errdefs.InvalidArgument("provider %q is configured twice", n)
		}
		seen[n] = true
	}
	for _, r := range c.Runtimes {
		if !seen[r.Name] {
			return errdefs.InvalidArgument("the host's runtime %q has no provider among those configured", r.Name)
		}
	}
	return nil
}
