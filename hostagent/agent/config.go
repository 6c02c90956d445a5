package agent

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/metrics"
	"corral.dev/corral/internal/tracing"
)

// Resources are amounts of CPU, memory and disk.
type Resources struct {
	CPUMillis   int64 // 1000 = one core
	MemoryBytes int64
	DiskBytes   int64
}

// Pressure is what a PressureFunc reports.
type Pressure struct {
	Memory bool
	Disk   bool
}

// PressureFunc tells whether the host is short of memory or disk now.
type PressureFunc func(ctx context.Context) (Pressure, error)

// Check is one health condition reported in every heartbeat.
type Check struct {
	// Type names the condition ("containerd_reachable"); providers' canaries
	// are not Checks but Providers.
	Type string
	// Run returns nil when healthy. It is called once per heartbeat and
	// should cache what is expensive.
	Run func(ctx context.Context) error
}

// Config configures an Agent. Zero fields take the defaults noted.
type Config struct {
	// HostID names the host: a DNS label, the subject of its certificate.
	// Required.
	HostID string
	// ControlPlane is host:port of the control plane's HostService, or a
	// comma-separated list of every control-plane node's: the agent tries
	// them in turn and follows a node's hint to the leader. Required.
	ControlPlane string
	// JoinToken is needed only when the state dir holds no host certificate
	// yet.
	JoinToken logging.Secret
	// StateDir holds the host certificate (pki/), sandbox records
	// (sandboxes/) and the workspaces of evicted sandboxes (evicted/).
	// Required.
	StateDir string
	// MetricsAddr, when set, serves Prometheus metrics on /metrics, in
	// plaintext: on a loopback address, or beyond it with
	// MetricsInsecureListen. Default: off.
	MetricsAddr           string
	MetricsInsecureListen bool
	// Tracing exports OpenTelemetry traces when its Endpoint is set: a
	// span of every SandboxService call, continuing the trace context the
	// control plane sent (package tracing). ServiceName, NodeID and
	// Version are filled in. Default: off, with no exporter.
	Tracing tracing.Config
	// Listener serves SandboxService; if nil, ListenAddr is listened on.
	Listener   net.Listener
	ListenAddr string
	// AdvertiseAddr is the SandboxService address given to the control
	// plane; default: the listener's address.
	AdvertiseAddr string

	// Driver runs the sandboxes of Runtime. Required unless Runtimes is
	// set.
	Driver driver.Driver
	// Runtime is the runtime this host offers ("gvisor", "runc", "process"),
	// its default: an ensure that names no runtime gets it. Required
	// unless Runtimes is set.
	Runtime string
	// Runtimes are the runtimes this host offers, each with the driver that
	// runs its sandboxes, the first the default (Runtime and Driver are
	// then set from it). Ensures for any other runtime are refused. Each
	// driver has its own provider name (driver.Ref.Provider), by which a
	// recorded sandbox finds its driver again. Default: Runtime run by
	// Driver.
	Runtimes []RuntimeDriver
	// Egress is the host's egress policy for sandboxes ensured with
	// allowed hosts (egress.go).
	Egress EgressConfig
	// GVisorPlatform is reported at registration ("systrap"); empty without
	// gVisor.
	GVisorPlatform string
	// Capacity is the host's total; Allocatable what sandboxes may reserve
	// (default: Capacity). A zero field is not enforced.
	Capacity    Resources
	Allocatable Resources
	// DefaultLimits apply to an ensure whose limits are zero, for the
	// capacity check.
	DefaultLimits driver.Limits
	// MaxReadBytes bounds a file ReadFile returns, whatever the caller
	// asks (bytes; default driver.DefaultMaxReadBytes, 16 MiB; at most a
	// quarter of MaxMessageBytes, so an answer never nears the message
	// limit).
	MaxReadBytes int64
	// MaxImageBytes bounds an image archive ImportImage takes and
	// ExportImage sends (bytes; default DefaultMaxImageBytes, 8 GiB).
	MaxImageBytes int64
	Labels        map[string]string
	// Images lists the image references present on the host, asked at
	// every registration (default: none).
	Images  func(ctx context.Context) ([]string, error)
	Version string
	// Usage measures what the host uses now, for heartbeats (default:
	// nothing reported).
	Usage func(ctx context.Context) (Resources, error)

	// HeartbeatInterval is used until the control plane names one
	// (default 10s).
	HeartbeatInterval time.Duration
	// ReconnectDelay is the wait between attempts to reach the control plane
	// (default 2s).
	ReconnectDelay time.Duration
	// ReapInterval is how often the agent looks for sandboxes nothing
	// claims, besides once when Run starts (default 5m).
	ReapInterval time.Duration
	// ReapGrace is how long after the driver created it a sandbox nothing
	// claims is left alone before it is destroyed (default 10m): no record
	// and no placement here, or its state dir gone.
	ReapGrace time.Duration
	// Pools are the warm pool's classes (pool.go): sandboxes created ahead
	// of any session and claimed by the ensures of their runtime, image
	// and limits (default: none). The driver must be able to bind a
	// sandbox to a session after creating it (the containerd driver can).
	Pools []PoolClass
	// PoolDemandWindow is how far back ensures count as demand: each class
	// fills to its Min plus the ensures of the class within the window, at
	// most its Max (default 1m).
	PoolDemandWindow time.Duration
	// PoolRefillHold bounds how long the refill after a claim waits for
	// the claimed sandbox's first command to end (pool.go; default
	// DefaultPoolRefillHold).
	PoolRefillHold time.Duration
	// Pressure reports memory and disk pressure (default: never).
	Pressure PressureFunc
	// Checks are reported as conditions in every heartbeat.
	Checks []Check
	// Providers are the sandbox providers the host offers (providers.go),
	// one of them the Runtime's; each one's canary runs every
	// CanaryInterval (default: one provider named Runtime, without a
	// canary).
	Providers []Provider
	// CanaryInterval is how often the providers' canaries run, besides
	// once before the first registration (default 1m).
	CanaryInterval time.Duration
	// NewCanaryTicker makes the canary loop's ticker (default
	// time.NewTicker); tests pass one they drive.
	NewCanaryTicker func(d time.Duration) (c <-chan time.Time, stop func())

	// NewTicker makes the heartbeat ticker (default time.NewTicker); tests
	// pass one they drive.
	NewTicker func(d time.Duration) (c <-chan time.Time, stop func())
	// NewReapTicker makes the reaper's ticker (default time.NewTicker,
	// whatever NewTicker is); tests pass one they drive.
	NewReapTicker func(d time.Duration) (c <-chan time.Time, stop func())
	// After is the reconnect timer (default time.After).
	After func(d time.Duration) <-chan time.Time
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// RuntimeDriver is one runtime a host offers and the driver that runs it.
type RuntimeDriver struct {
	Name   string
	Driver driver.Driver
}

func (c *Config) setDefaults() {
	if len(c.Runtimes) == 0 && (c.Runtime != "" || c.Driver != nil) {
		c.Runtimes = []RuntimeDriver{{Name: c.Runtime, Driver: c.Driver}}
	}
	if len(c.Runtimes) > 0 {
		c.Runtime, c.Driver = c.Runtimes[0].Name, c.Runtimes[0].Driver
	}
	if c.Allocatable == (Resources{}) {
		c.Allocatable = c.Capacity
	}
	if c.MaxReadBytes == 0 {
		c.MaxReadBytes = driver.DefaultMaxReadBytes
	}
	if c.MaxImageBytes == 0 {
		c.MaxImageBytes = DefaultMaxImageBytes
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.ReconnectDelay == 0 {
		c.ReconnectDelay = 2 * time.Second
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = 5 * time.Minute
	}
	if c.ReapGrace == 0 {
		c.ReapGrace = 10 * time.Minute
	}
	if c.PoolDemandWindow == 0 {
		c.PoolDemandWindow = time.Minute
	}
	if c.PoolRefillHold == 0 {
		c.PoolRefillHold = DefaultPoolRefillHold
	}
	if len(c.Providers) == 0 {
		for _, r := range c.Runtimes {
			if r.Name != "" {
				c.Providers = append(c.Providers, defaultProvider(r.Name))
			}
		}
	}
	if c.CanaryInterval == 0 {
		c.CanaryInterval = time.Minute
	}
	if c.NewCanaryTicker == nil {
		c.NewCanaryTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	if c.Pressure == nil {
		c.Pressure = func(context.Context) (Pressure, error) { return Pressure{}, nil }
	}
	if c.NewTicker == nil {
		c.NewTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	if c.NewReapTicker == nil {
		c.NewReapTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	if c.After == nil {
		c.After = time.After
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
}

// Validate reports the first mistake in c, as one clear error.
func (c *Config) Validate() error {
	if err := hostpki.ValidateHostID(c.HostID); err != nil {
		return err
	}
	if err := c.Tracing.Validate(); err != nil {
		return err
	}
	switch {
	case len(c.controlPlanes()) == 0:
		return errdefs.InvalidArgument("the control plane's address is required")
	case c.StateDir == "" || !filepath.IsAbs(c.StateDir):
		return errdefs.InvalidArgument("state dir %q must be an absolute path", c.StateDir)
	case c.Listener == nil && c.ListenAddr == "":
		return errdefs.InvalidArgument("a listen address for the sandbox service is required")
	case c.Driver == nil && len(c.Runtimes) == 0:
		return errdefs.InvalidArgument("a sandbox driver is required")
	case c.Runtime == "" && len(c.Runtimes) == 0:
		return errdefs.InvalidArgument("the runtime name is required")
	case c.MaxReadBytes < 0 || c.MaxReadBytes > MaxMessageBytes/4:
		return errdefs.InvalidArgument("max read bytes %d must be between 0 (the default) and %d", c.MaxReadBytes, MaxMessageBytes/4)
	case c.MaxImageBytes < 0:
		return errdefs.InvalidArgument("max image bytes %d must not be negative", c.MaxImageBytes)
	case c.HeartbeatInterval < 0 || c.ReconnectDelay < 0 || c.ReapInterval < 0 || c.ReapGrace < 0:
		return errdefs.InvalidArgument("intervals must not be negative")
	case c.MetricsAddr != "" && !c.MetricsInsecureListen && !metrics.IsLoopback(c.MetricsAddr):
		return errdefs.InvalidArgument("refusing to serve --metrics-addr in plaintext on %s, which is not a loopback address: metrics describe this host's sandboxes; give --metrics-insecure-listen to serve them there anyway", c.MetricsAddr)
	}
	if c.AdvertiseAddr == "" {
		addr := c.ListenAddr
		if c.Listener != nil {
			addr = c.Listener.Addr().String()
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return errdefs.InvalidArgument("sandbox service listen address %q: %v", addr, err)
		}
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			return errdefs.InvalidArgument("the sandbox service listens on %s, which the control plane cannot dial: give the address to advertise", addr)
		}
	}
	if c.CanaryInterval < 0 {
		return errdefs.InvalidArgument("the canary interval must not be negative")
	}
	if err := c.validateRuntimes(); err != nil {
		return err
	}
	if err := c.validateProviders(); err != nil {
		return err
	}
	if err := c.validatePools(); err != nil {
		return err
	}
	for _, r := range []Resources{c.Capacity, c.Allocatable} {
		if r.CPUMillis < 0 || r.MemoryBytes < 0 || r.DiskBytes < 0 {
			return errdefs.InvalidArgument("capacity must not be negative: %+v", r)
		}
	}
	return nil
}

// Paths under the state dir.
func (c *Config) pkiDir() string      { return filepath.Join(c.StateDir, "pki") }
func (c *Config) recordsDir() string  { return filepath.Join(c.StateDir, "sandboxes") }
func (c *Config) archivesDir() string { return filepath.Join(c.StateDir, "evicted") }

// executionsDir holds the finished executions kept per sandbox.
func (c *Config) executionsDir() string { return filepath.Join(c.StateDir, "executions") }

// controlPlanes is ControlPlane split into its addresses.
func (c *Config) controlPlanes() []string {
	var out []string
	for _, a := range strings.Split(c.ControlPlane, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// validateRuntimes checks the runtimes: each named once and run by a
// driver of a provider name no other runtime's driver has, since a
// recorded sandbox finds its driver by that name.
func (c *Config) validateRuntimes() error {
	names, providers := map[string]bool{}, map[string]string{}
	for _, r := range c.Runtimes {
		switch {
		case r.Name == "":
			return errdefs.InvalidArgument("a runtime of the host has no name")
		case r.Driver == nil:
			return errdefs.InvalidArgument("runtime %s has no sandbox driver", r.Name)
		case names[r.Name]:
			return errdefs.InvalidArgument("runtime %s is configured twice", r.Name)
		}
		if other, ok := providers[r.Driver.Name()]; ok {
			return errdefs.InvalidArgument("runtimes %s and %s are run by drivers of one provider name, %s: each needs its own", other, r.Name, r.Driver.Name())
		}
		names[r.Name], providers[r.Driver.Name()] = true, r.Name
	}
	return nil
}
