package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// A host may offer several runtimes (Config.Runtimes), each run by its own
// driver. An ensure names its runtime and is created by that runtime's
// driver; everything after that goes by the sandbox's Ref, whose Provider
// is its driver's name. Capacity, pressure and the pool's room are the
// host's, whichever runtime a sandbox has.

// driverOf is the driver of runtime ("" for the host's default), or
// InvalidArgument naming the runtimes this host runs.
func (a *Agent) driverOf(runtime string) (driver.Driver, error) {
	if d := a.cfg.runtimeDriver(runtime); d != nil {
		return d, nil
	}
	return nil, errdefs.InvalidArgument("host %s runs runtime %s, not %q", a.cfg.HostID, a.runtimeNames(), runtime)
}

// runtimeDriver is the driver of runtime ("" for the default), or nil
// when c has no such runtime: the one lookup of a runtime's driver, for
// ensures and warm pool classes alike.
func (c *Config) runtimeDriver(runtime string) driver.Driver {
	if runtime == "" || runtime == c.Runtime && c.Driver != nil {
		return c.Driver
	}
	for _, r := range c.Runtimes {
		if r.Name == runtime {
			return r.Driver
		}
	}
	return nil
}

// runtimeList is the host's runtimes, the default first.
func (a *Agent) runtimeList() []string {
	names := make([]string, len(a.cfg.Runtimes))
	for i, r := range a.cfg.Runtimes {
		names[i] = r.Name
	}
	return names
}

// runtimeNames lists the host's runtimes for messages: "gvisor" or
// "gvisor, runc".
func (a *Agent) runtimeNames() string { return strings.Join(a.runtimeList(), ", ") }

// runtimeOf is the runtime whose driver made ref ("" when none does).
func (a *Agent) runtimeOf(ref driver.Ref) string {
	for _, r := range a.cfg.Runtimes {
		if r.Driver.Name() == ref.Provider {
			return r.Name
		}
	}
	return ""
}

// driverFor is the driver of a sandbox the host made, by its Ref's
// provider; a Ref without one (recorded before refs named it) is the
// default runtime's. A provider this host no longer runs (its runtime
// taken out of the configuration) answers as goneDriver does.
func (a *Agent) driverFor(ref driver.Ref) driver.Driver {
	if ref.Provider == "" {
		return a.cfg.Driver
	}
	for _, r := range a.cfg.Runtimes {
		if r.Driver.Name() == ref.Provider {
			return r.Driver
		}
	}
	return goneDriver{name: ref.Provider, log: a.log}
}

// driverNames lists the host's drivers' names for messages.
func (a *Agent) driverNames() string {
	names := make([]string, len(a.cfg.Runtimes))
	for i, r := range a.cfg.Runtimes {
		names[i] = r.Driver.Name()
	}
	return strings.Join(names, ", ")
}

// drivers are the host's drivers, the default runtime's first.
func (a *Agent) drivers() []driver.Driver {
	ds := make([]driver.Driver, len(a.cfg.Runtimes))
	for i, r := range a.cfg.Runtimes {
		ds[i] = r.Driver
	}
	return ds
}

// listAll lists every driver's sandboxes: the refs of the drivers that
// answered, and the errors of those that did not. Callers act on the refs
// they have; a sandbox of a driver that did not answer is left alone.
func (a *Agent) listAll(ctx context.Context) ([]driver.Ref, error) {
	var (
		refs []driver.Ref
		errs []error
	)
	for _, d := range a.drivers() {
		rs, err := d.List(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.Name(), err))
			continue
		}
		refs = append(refs, rs...)
	}
	return refs, errors.Join(errs...)
}

// goneDriver stands for the driver of a provider this host no longer runs:
// its recorded sandboxes are lost to it. Attach says so (not found: the
// sandbox is reported lost and replaced), and Destroy forgets the sandbox,
// saying in the log that its container, if any, is left as it was.
type goneDriver struct {
	name string
	log  *slog.Logger
}

func (g goneDriver) err() error {
	return errdefs.NotFound("provider %s does not run on this host any more", g.name)
}

func (g goneDriver) Name() string { return g.name }
func (g goneDriver) Create(context.Context, driver.Spec) (driver.Ref, error) {
	return driver.Ref{}, g.err()
}
func (g goneDriver) Attach(context.Context, driver.Ref) (driver.Sandbox, error) { return nil, g.err() }
func (g goneDriver) List(context.Context) ([]driver.Ref, error)                 { return nil, nil }
func (g goneDriver) Pause(context.Context, driver.Ref) error                    { return g.err() }
func (g goneDriver) Resume(context.Context, driver.Ref) error                   { return g.err() }
func (g goneDriver) Destroy(_ context.Context, ref driver.Ref) error {
	g.log.Warn("forgetting a sandbox of a provider this host no longer runs; its container, if any, is left as it is",
		"session_id", ref.Key, "id", ref.ID, "provider", g.name)
	return nil
}
