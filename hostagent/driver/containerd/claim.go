package containerd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// Claim binds a warm-pool sandbox (one made with driver.PoolLabel and never
// used) to the session spec describes: in one update of the container's
// metadata its key and labels become spec's (the pool label goes) and the
// process spec every exec starts from gets spec's environment. A crash
// leaves the sandbox either pooled as it was or claimed, never half of
// each. The image and limits are the ones it was made with: matching them
// to spec is the caller's (the host agent's pool classes). The sandbox
// must be untouched: a workspace or outputs directory with anything in it
// is refused, and the caller destroys the sandbox.
func (d *Driver) Claim(ctx context.Context, ref driver.Ref, spec driver.Spec) (driver.Ref, error) {
	if err := checkProvider(d.name, ref); err != nil {
		return driver.Ref{}, err
	}
	if spec.Key == "" {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox key is required")
	}
	if _, ok := spec.Labels[driver.PoolLabel]; ok {
		return driver.Ref{}, errdefs.InvalidArgument("sandbox %q: the label %s is the host agent's", spec.Key, driver.PoolLabel)
	}
	ctx = d.ns(ctx)
	// The session's key (one sandbox per key) and the pool's (one claim).
	defer d.lockKey(spec.Key)()
	if ref.Key != spec.Key {
		defer d.lockKey(ref.Key)()
	}
	c, info, err := d.load(ctx, ref.ID)
	if err != nil {
		return driver.Ref{}, err
	}
	if info.Labels[labelUser+driver.PoolLabel] == "" || info.Labels[labelKey] != ref.Key {
		return driver.Ref{}, errdefs.FailedPrecondition("sandbox %s is not an unclaimed pool sandbox", ref.ID)
	}
	existing, err := d.client.Containers(ctx, d.filter(fmt.Sprintf(`labels.%q==%q`, labelKey, spec.Key)))
	if err != nil {
		return driver.Ref{}, kindOf(err, "looking up sandbox %q", spec.Key)
	}
	if len(existing) > 0 {
		return driver.Ref{}, errdefs.AlreadyExists("sandbox %q exists already (%s)", spec.Key, existing[0].ID())
	}
	dirs := dirsFor(d.cfg.StateDir, ref.ID)
	for _, dir := range []string{dirs.workspace, dirs.outputs} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return driver.Ref{}, fmt.Errorf("claiming sandbox %s: %w", ref.ID, err)
		}
		if len(ents) > 0 {
			return driver.Ref{}, errdefs.FailedPrecondition("pool sandbox %s is not untouched: %s holds %d entries", ref.ID, dir, len(ents))
		}
	}
	if info.Spec == nil {
		return driver.Ref{}, errdefs.FailedPrecondition("sandbox %s has no spec", ref.ID)
	}
	var s specs.Spec
	if err := json.Unmarshal(info.Spec.GetValue(), &s); err != nil || s.Process == nil {
		return driver.Ref{}, fmt.Errorf("sandbox %s: reading its spec: %v", ref.ID, err)
	}
	s.Process.Env = envList(spec.Env)
	labels := map[string]string{labelProvider: d.name, labelKey: spec.Key, labelDir: d.cfg.StateDir, labelState: stateReady}
	for k, v := range spec.Labels {
		labels[labelUser+k] = v
	}
	bind := func(ctx context.Context, cl *client.Client, cc *containers.Container) error {
		if err := client.WithSpec(&s)(ctx, cl, cc); err != nil {
			return err
		}
		cc.Labels = labels // replaces all: the pool label and the pool's key go
		return nil
	}
	if err := c.Update(ctx, bind); err != nil {
		return driver.Ref{}, kindOf(err, "claiming sandbox %s for %q", ref.ID, spec.Key)
	}
	return d.ref(ref.ID, labels), nil
}
