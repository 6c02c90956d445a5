package server

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/envbuild"
	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/allowlist"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// buildRetryAfter is how long a failed build stays failed before a new
// session of the same packages (or an environment update) asks for it
// again: a mirror that was down gets another try, a package that does
// not exist is not rebuilt at every session.
const buildRetryAfter = 5 * time.Minute

// buildRequest is the request template of a build sandbox: the gVisor
// runtime profile's, since a build runs the tenant's package scripts and
// only gVisor isolates them; false when the policy has no gVisor class
// (packages are then refused).
func buildRequest(pol *policy.Policy, image string) (scheduler.Request, bool) {
	cl, ok := pol.SandboxClasses[admission.RuntimeGVisor]
	prof, pok := pol.Runtimes[admission.RuntimeGVisor]
	if !ok || !pok || cl.Runtime != admission.RuntimeGVisor {
		return scheduler.Request{}, false
	}
	r := request(admission.RuntimeGVisor, image, prof)
	r.Provider = cl.Provider()
	return r, true
}

// requestBuild is publicapi's RequestBuild: it asks for (or with ask
// false only checks) the build of an environment's packages for
// sandboxes of class (""; the environment's own, or the tenant's default)
// and returns its key.
func (s *Server) requestBuild(ctx context.Context, env store.Environment, class string, ask bool) (string, error) {
	b, err := s.buildOf(ctx, env, class)
	if err != nil || b.Key == "" || !ask {
		return b.Key, err
	}
	if b, err = s.store.Builds().Request(ctx, b, buildRetryAfter); err != nil {
		return "", err
	}
	if b.Status == store.BuildPending {
		s.fleet.BuildRequested()
	}
	return b.Key, nil
}

// buildOf is the build an environment's packages make for sandboxes of
// class, as requestBuild would ask for it; a zero Key when it has none.
func (s *Server) buildOf(ctx context.Context, env store.Environment, class string) (store.Build, error) {
	pkgs := publicapi.StoredPackages(env.Config)
	if pkgs.Empty() {
		return store.Build{}, nil
	}
	t, err := tenant.Required(ctx)
	if err != nil {
		return store.Build{}, err
	}
	if class == "" {
		class = env.Metadata[policy.ClassMetadataKey]
	}
	cl, err := s.classes.Resolve(string(t), class)
	if err != nil {
		return store.Build{}, err
	}
	if cl.Request.Image == "" {
		return store.Build{}, errdefs.InvalidArgument("config.packages: sandbox class %s runs no image (runtime %s), so packages cannot be installed for it; use a class with an image", cl.Name, cl.Request.Runtime)
	}
	if err := envbuild.Validate(pkgs, s.mirrors); err != nil {
		return store.Build{}, err // the operator's mirrors changed since the environment was stored
	}
	key := envbuild.Key(string(t), cl.Request.Image, pkgs, s.mirrors)
	used := map[string]string{}
	for i, l := range pkgs.Lists() {
		if len(l) > 0 {
			used[envbuild.Managers[i]] = s.mirrors[envbuild.Managers[i]].Spec
		}
	}
	pj, _ := json.Marshal(pkgs)
	mj, _ := json.Marshal(used)
	return store.Build{Key: key, Image: envbuild.ImageRef(key), BaseImage: cl.Request.Image, Packages: pj, Mirrors: mj, EnvironmentID: env.ID}, nil
}

// environmentBuildKey is the admin API's: the key of the build an
// environment's packages name now ("" none), without asking for it.
func (s *Server) environmentBuildKey(ctx context.Context, environmentID string) (string, error) {
	env, err := s.store.Environments().Get(ctx, environmentID)
	if err != nil {
		return "", err
	}
	if len(s.mirrors) == 0 {
		return "", nil
	}
	b, err := s.buildOf(ctx, env, "")
	return b.Key, err
}

// buildRecords is fleet.Builds over the store.
type buildRecords struct{ st *store.Store }

var _ fleet.Builds = buildRecords{}

// Next implements fleet.Builds.
func (r buildRecords) Next(ctx context.Context, staleBefore time.Time) (fleet.BuildJob, bool, error) {
	refs, err := r.st.ClaimableBuilds(ctx, staleBefore, 8)
	if err != nil {
		return fleet.BuildJob{}, false, err
	}
	for _, ref := range refs {
		tctx := tenant.With(ctx, ref.TenantID)
		b, err := r.st.Builds().Claim(tctx, ref.Key, staleBefore)
		if errdefs.IsNotFound(err) {
			continue // another builder took it
		}
		if err != nil {
			return fleet.BuildJob{}, false, err
		}
		job, err := jobOf(b)
		if err != nil {
			// A row this node cannot plan fails, rather than coming back.
			if ferr := r.st.Builds().Finish(tctx, store.Build{Key: b.Key, Status: store.BuildFailed, Error: err.Error()}); ferr != nil {
				return fleet.BuildJob{}, false, ferr
			}
			continue
		}
		return job, true, nil
	}
	return fleet.BuildJob{}, false, nil
}

func jobOf(b store.Build) (fleet.BuildJob, error) {
	var pkgs envbuild.Packages
	if err := json.Unmarshal(b.Packages, &pkgs); err != nil {
		return fleet.BuildJob{}, fmt.Errorf("the build's packages: %w", err)
	}
	var specs map[string]string
	if err := json.Unmarshal(b.Mirrors, &specs); err != nil {
		return fleet.BuildJob{}, fmt.Errorf("the build's mirrors: %w", err)
	}
	var flags []string
	for _, m := range slices.Sorted(maps.Keys(specs)) {
		flags = append(flags, m+"="+specs[m])
	}
	mirrors, err := envbuild.ParseMirrors(flags)
	if err != nil {
		return fleet.BuildJob{}, err
	}
	return fleet.BuildJob{Tenant: b.TenantID, Key: b.Key, Image: b.Image, BaseImage: b.BaseImage, Packages: pkgs, Mirrors: mirrors}, nil
}

// Progress implements fleet.Builds.
func (r buildRecords) Progress(ctx context.Context, key, hostID, log string) error {
	return r.st.Builds().Progress(ctx, key, hostID, log)
}

// Finish implements fleet.Builds.
func (r buildRecords) Finish(ctx context.Context, key string, res fleet.BuildResult) error {
	if res.Retry {
		return r.st.Builds().Requeue(ctx, key, res.Log)
	}
	b := store.Build{Key: key, Status: store.BuildReady, Error: res.Error, Log: res.Log, HostID: res.HostID,
		Digest: res.Digest, LayerBytes: res.LayerBytes, BlobKey: res.BlobKey}
	if res.Failed {
		b.Status = store.BuildFailed
	}
	return r.st.Builds().Finish(ctx, b)
}

// OfSession implements fleet.Builds.
func (r buildRecords) OfSession(ctx context.Context, sessionID string) (fleet.BuildState, error) {
	sess, err := r.st.Sessions().Get(ctx, sessionID)
	if err != nil || sess.PackageBuild == "" {
		return fleet.BuildState{}, err
	}
	b, err := r.st.Builds().Get(ctx, sess.PackageBuild)
	if err != nil {
		return fleet.BuildState{}, err
	}
	return fleet.BuildState{Key: b.Key, Status: b.Status, Image: b.Image, Error: b.Error, HostID: b.HostID, BlobKey: b.BlobKey}, nil
}

// Stale implements fleet.Builds.
func (r buildRecords) Stale(ctx context.Context, before time.Time) ([]fleet.StaleBuild, error) {
	got, err := r.st.SweepableBuilds(ctx, before, 100)
	out := make([]fleet.StaleBuild, 0, len(got))
	for _, b := range got {
		out = append(out, fleet.StaleBuild{Tenant: b.TenantID, Key: b.Key, Image: b.Image, BlobKey: b.BlobKey})
	}
	return out, err
}

// Remove implements fleet.Builds.
func (r buildRecords) Remove(ctx context.Context, key string, before time.Time) (bool, error) {
	return r.st.Builds().Delete(ctx, key, before)
}

// withHosts is hosts with more added, once each: the allowlist of a
// sandbox whose environment allows package managers (their mirrors) or
// MCP servers (their hosts).
func withHosts(hosts, more []string) []string {
	out := slices.Clone(hosts)
	for _, h := range more {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// mcpServerHosts are the host names of an agent snapshot's mcp_servers,
// sorted, once each: what allow_mcp_servers lets its sandbox reach. A
// server named by an IP address is left out (the egress proxy reaches
// names only).
func mcpServerHosts(agent json.RawMessage) []string {
	var a agentloop.Agent
	if json.Unmarshal(agent, &a) != nil {
		return nil
	}
	var out []string
	for _, m := range a.MCPServers {
		u, err := url.Parse(m.URL)
		if err != nil || u.Hostname() == "" {
			continue
		}
		name := allowlist.Normalize(u.Hostname())
		if _, err := netip.ParseAddr(name); err == nil || !allowlist.ValidName(name) {
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// buildsFn is publicapi's RequestBuild, nil when this node has no
// package mirrors (packages are then refused).
func (s *Server) buildsFn() func(context.Context, store.Environment, string, bool) (string, error) {
	if len(s.mirrors) == 0 {
		return nil
	}
	return s.requestBuild
}
