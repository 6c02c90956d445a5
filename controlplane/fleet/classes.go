package fleet

import (
	"cmp"
	"context"
	"slices"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// Class is a sandbox class as the fleet places it (policy classes.yaml):
// its name and the template of its sandboxes' requests.
type Class struct {
	Name string
	// Request carries the class's runtime, provider, image, requests,
	// limits and pids; the fleet fills in the session, tenant and pools.
	Request scheduler.Request
	// NoNetwork is set when the class allows no network: a session whose
	// environment allows hosts is refused a sandbox of it.
	NoNetwork bool
}

// Classes resolves sandbox classes from policy and the sessions' records.
type Classes interface {
	// Resolve returns class name for the tenant, "" standing for the
	// tenant's default. An unknown class is errdefs.InvalidArgument and
	// one the tenant may not use errdefs.PermissionDenied, each naming
	// the class.
	Resolve(tenantID, name string) (Class, error)
	// OfSession returns the class session sessionID was created with
	// (ctx carries its tenant); "" for a session created before classes,
	// which gets its tenant's default.
	OfSession(ctx context.Context, sessionID string) (string, error)
}

// AdmitSession refuses to create a session for the tenant in ctx whose
// sandboxes the fleet could not run for it, before anything is stored:
// an unknown class (400), a class the tenant may not use (403), and,
// when needsSandbox (the session's agent uses the sandbox tools), a real
// model in the process runtime (409) or a class whose provider no host in
// the tenant's pools offers now (409, since it is the fleet's state that
// refuses it, and a host that joins changes the answer). class
// is the one the session's environment names ("" for its tenant's
// default); it returns the class resolved, which the session keeps.
// Placement checks the class again.
func (f *Fleet) AdmitSession(ctx context.Context, class string, needsSandbox bool) (string, error) {
	t, err := tenant.Required(ctx)
	if err != nil {
		return "", err
	}
	if f.cfg.Classes == nil {
		return "", f.checkTrusted(t)
	}
	c, err := f.cfg.Classes.Resolve(string(t), class)
	if err != nil {
		return "", err
	}
	if !needsSandbox {
		return c.Name, nil // its sandbox is asked for again if its agent changes
	}
	if f.cfg.RealModel {
		if err := admission.CheckProcessRuntime("a real model", c.Request.Runtime, f.cfg.AllowProcess); err != nil {
			return "", err
		}
	}
	req := c.Request
	req.Tenant = string(t)
	if !f.offered(req) {
		return "", errdefs.FailedPrecondition("no host this tenant may use offers sandbox class %s (provider %s) now: ask the operator to add such a host, or pick another class with the environment's metadata %q", c.Name, cmp.Or(req.Provider, req.Runtime), policy.ClassMetadataKey)
	}
	return c.Name, nil
}

// CheckClass refuses a class the tenant in ctx may not name: unknown
// (400) or not allowed (403). Environments are checked with it when they
// are created or changed; whether a host offers the class is asked when a
// session is created, since hosts come and go.
func (f *Fleet) CheckClass(ctx context.Context, class string) error {
	t, err := tenant.Required(ctx)
	if err != nil {
		return err
	}
	if f.cfg.Classes == nil {
		return errdefs.InvalidArgument("sandbox class %q: this fleet defines no sandbox classes", class)
	}
	_, err = f.cfg.Classes.Resolve(string(t), class)
	return err
}

// offered reports whether, on this node's state, some host that is not
// down and is in one of the request's tenant's pools offers its provider.
// Its health and room are not asked: a canary failing now or a full host
// make the placement wait or fail with their own reasons.
func (f *Fleet) offered(req scheduler.Request) bool {
	req = f.withPlacement(req)
	provider := cmp.Or(req.Provider, req.Runtime)
	found := false
	f.node.Read(func(v raftfsm.View) {
		for _, h := range v.Hosts() {
			if h.Status == scheduler.StatusDown || len(req.Pools) > 0 && !slices.Contains(req.Pools, h.Labels[scheduler.PoolLabel]) {
				continue
			}
			if provider == "" || slices.Contains(h.Providers, provider) || slices.Contains(h.Runtimes, provider) {
				found = true
				return
			}
		}
	})
	return found
}

// sessionClass is a session's sandbox class: the one it was created
// with, checked again against its tenant's policy (which may have changed
// since), or, without Classes, Request unnamed.
func (f *Fleet) sessionClass(ctx context.Context, t tenant.ID, sessionID string) (Class, error) {
	if f.cfg.Classes == nil {
		return Class{Request: f.cfg.Request}, f.checkTrusted(t)
	}
	name, err := f.cfg.Classes.OfSession(ctx, sessionID)
	if err != nil {
		return Class{}, err
	}
	return f.cfg.Classes.Resolve(string(t), name)
}

// notOffered is the refusal of a placement of class c that found no
// host, when no host the tenant may use offers the class's provider at
// all (nil otherwise: the hosts are full, or unhealthy, and say so).
func (f *Fleet) notOffered(c Class, req scheduler.Request) error {
	if c.Name == "" || f.offered(req) {
		return nil
	}
	return errdefs.FailedPrecondition("no host this tenant may use offers this session's sandbox class %s (provider %s) now; its tool calls run once such a host joins", c.Name, cmp.Or(req.Provider, req.Runtime))
}

// pausable reports whether the session's sandbox is one that pauses: a
// gVisor sandbox (a placement recorded before it carried its runtime has
// the node's).
func (f *Fleet) pausable(sessionID string) bool {
	p, _, ok := f.placement(sessionID)
	return ok && cmp.Or(p.Runtime, f.cfg.Request.Runtime) == admission.RuntimeGVisor
}
