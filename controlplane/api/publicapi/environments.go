package publicapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"corral.dev/corral/controlplane/envbuild"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/allowlist"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
	"corral.dev/corral/policy"
)

// environmentResponse is the wire form of an environment.
type environmentResponse struct {
	Type        string            `json:"type"`
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Description *string           `json:"description"`
	Config      json.RawMessage   `json:"config"`
	Metadata    map[string]string `json:"metadata"`
	Scope       string            `json:"scope"`
	CreatedAt   string            `json:"created_at"`
	UpdatedAt   string            `json:"updated_at"`
	ArchivedAt  *string           `json:"archived_at"`
}

// cloudConfig is the resolved cloud config: both networking and packages,
// with all six package lists, always present.
type cloudConfig struct {
	Type       string     `json:"type"`
	Networking networking `json:"networking"`
	Packages   packages   `json:"packages"`
}

type networking struct {
	Type                 string    `json:"type"`
	AllowedHosts         *[]string `json:"allowed_hosts,omitempty"`
	AllowPackageManagers *bool     `json:"allow_package_managers,omitempty"`
	AllowMCPServers      *bool     `json:"allow_mcp_servers,omitempty"`
}

type packages struct {
	Type  string   `json:"type"`
	Apt   []string `json:"apt"`
	Cargo []string `json:"cargo"`
	Gem   []string `json:"gem"`
	Go    []string `json:"go"`
	Npm   []string `json:"npm"`
	Pip   []string `json:"pip"`
}

const (
	maxEnvironmentName        = 256
	maxEnvironmentDescription = 2048
	maxPackagesPerManager     = 256
	maxAllowedHosts           = 256
)

// defaultCloud is what a cloud environment's sandbox gets when its config
// says nothing: no network at all, which the API's words say as limited
// networking that allows no host, no package manager and no MCP server;
// and no packages: its class's image as it is.
// Limited networking with allowed_hosts gets exactly those hosts, through
// its host's egress proxy (hostagent/egress).
func defaultCloud() cloudConfig {
	f := false
	return cloudConfig{
		Type:       "cloud",
		Networking: networking{Type: "limited", AllowedHosts: &[]string{}, AllowPackageManagers: &f, AllowMCPServers: &f},
		Packages:   packages{Type: "packages", Apt: []string{}, Cargo: []string{}, Gem: []string{}, Go: []string{}, Npm: []string{}, Pip: []string{}},
	}
}

// errUnrestricted refuses unrestricted networking to a tenant without the
// grant.
var errUnrestricted = errdefs.InvalidArgument("config.networking: unrestricted networking is not granted to this tenant (an operator grants it in the policy's unrestricted_networking); use limited networking and list the hosts in allowed_hosts")

// decodeEnvConfig resolves a config: absent or null is cloud with no
// network and no packages. What a sandbox would not get (unrestricted
// networking without the tenant's grant, package managers or packages
// without the operator's mirrors for them, MCP servers, a self-hosted
// sandbox's networking) is refused, never stored and ignored. Packages
// are built into their sessions' image from the operator's mirrors
// (envbuild), and allow_package_managers adds the mirrors' hosts to the
// sandbox's allowlist.
func decodeEnvConfig(raw json.RawMessage, unrestricted bool, mirrors envbuild.Mirrors) (json.RawMessage, error) {
	if !present(raw) || isNull(raw) {
		return json.Marshal(defaultCloud())
	}
	var in struct {
		Type       *string         `json:"type"`
		Networking json.RawMessage `json:"networking"`
		Packages   json.RawMessage `json:"packages"`
	}
	if err := field(raw, "config", &in); err != nil {
		return nil, err
	}
	if in.Type == nil {
		return nil, errdefs.InvalidArgument("config.type is required")
	}
	switch *in.Type {
	case "self_hosted":
		// The tenant's own worker runs the sessions' tools (work.go):
		// nothing of corral's sandboxes applies.
		if present(in.Networking) || present(in.Packages) {
			return nil, errdefs.InvalidArgument("config: a self_hosted environment has type only; networking and packages are the worker's machine's")
		}
		return json.Marshal(map[string]string{"type": "self_hosted"})
	case "cloud":
	default:
		return nil, enumError("config.type", *in.Type, []string{"cloud", "self_hosted"})
	}
	c := defaultCloud()
	if present(in.Networking) && !isNull(in.Networking) {
		var n struct {
			Type                 *string   `json:"type"`
			AllowedHosts         *[]string `json:"allowed_hosts"`
			AllowPackageManagers *bool     `json:"allow_package_managers"`
			AllowMCPServers      *bool     `json:"allow_mcp_servers"`
		}
		if err := field(in.Networking, "config.networking", &n); err != nil {
			return nil, err
		}
		if n.Type == nil {
			return nil, errdefs.InvalidArgument("config.networking.type is required")
		}
		switch *n.Type {
		case "unrestricted":
			if n.AllowedHosts != nil || n.AllowPackageManagers != nil || n.AllowMCPServers != nil {
				return nil, errdefs.InvalidArgument("config.networking: allowed_hosts, allow_package_managers and allow_mcp_servers apply to limited networking only")
			}
			if !unrestricted {
				return nil, errUnrestricted
			}
			// Enforced on the host: the sandbox's only way out is its
			// egress proxy, which allows any name but still refuses
			// private addresses, and audits and caps every connection.
			c.Networking = networking{Type: "unrestricted"}
		case "limited":
			if n.AllowedHosts != nil && len(*n.AllowedHosts) > maxAllowedHosts {
				return nil, errdefs.InvalidArgument("config.networking.allowed_hosts has %d entries; at most %d are allowed", len(*n.AllowedHosts), maxAllowedHosts)
			}
			if n.AllowedHosts != nil && len(*n.AllowedHosts) > 0 {
				// Enforced on the host: the sandbox's only way out is its
				// egress proxy, which allows exactly these names.
				hosts, err := hostPatterns(*n.AllowedHosts, "config.networking.allowed_hosts")
				if err != nil {
					return nil, err
				}
				c.Networking.AllowedHosts = &hosts
			}
			if n.AllowPackageManagers != nil && *n.AllowPackageManagers {
				if len(mirrors) == 0 {
					return nil, errdefs.InvalidArgument("config.networking.allow_package_managers: this corral has no package mirrors (the operator's --package-mirror), the only package sources a sandbox may reach; list the hosts in allowed_hosts instead")
				}
				// Enforced on the host: the mirrors' hosts join the
				// sandbox's allowlist (SandboxAllowedHosts' caller).
				t := true
				c.Networking.AllowPackageManagers = &t
			}
			if n.AllowMCPServers != nil && *n.AllowMCPServers {
				// Enforced on the host: the host names of the session's
				// agent's mcp_servers join its sandbox's allowlist
				// (SandboxAllowedHosts' caller).
				t := true
				c.Networking.AllowMCPServers = &t
			}
		default:
			return nil, enumError("config.networking.type", *n.Type, []string{"unrestricted", "limited"})
		}
	}
	if present(in.Packages) && !isNull(in.Packages) {
		var p struct {
			Type  *string  `json:"type"`
			Apt   []string `json:"apt"`
			Cargo []string `json:"cargo"`
			Gem   []string `json:"gem"`
			Go    []string `json:"go"`
			Npm   []string `json:"npm"`
			Pip   []string `json:"pip"`
		}
		if err := field(in.Packages, "config.packages", &p); err != nil {
			return nil, err
		}
		if p.Type != nil && *p.Type != "packages" {
			return nil, enumError("config.packages.type", *p.Type, []string{"packages"})
		}
		for _, l := range []struct {
			name string
			in   []string
		}{{"apt", p.Apt}, {"cargo", p.Cargo}, {"gem", p.Gem}, {"go", p.Go}, {"npm", p.Npm}, {"pip", p.Pip}} {
			if len(l.in) > maxPackagesPerManager {
				return nil, errdefs.InvalidArgument("config.packages.%s has %d entries; at most %d are allowed", l.name, len(l.in), maxPackagesPerManager)
			}
			for i, pkg := range l.in {
				if err := checkLen(pkg, fmt.Sprintf("config.packages.%s[%d]", l.name, i), 1, 256); err != nil {
					return nil, err
				}
			}
		}
		c.Packages = packages{Type: "packages", Apt: orEmpty(p.Apt), Cargo: orEmpty(p.Cargo), Gem: orEmpty(p.Gem), Go: orEmpty(p.Go), Npm: orEmpty(p.Npm), Pip: orEmpty(p.Pip)}
		if err := envbuild.Validate(c.Packages.build(), mirrors); err != nil {
			return nil, err
		}
	}
	return json.Marshal(c)
}

func decodeScope(raw json.RawMessage) (string, error) {
	if !present(raw) || isNull(raw) {
		return "organization", nil
	}
	var s string
	if err := field(raw, "scope", &s); err != nil {
		return "", err
	}
	switch s {
	case "organization":
		return s, nil
	case "account":
		return "", errdefs.InvalidArgument("scope: account-scoped environments are not supported; use organization")
	}
	return "", enumError("scope", s, []string{"organization", "account"})
}

type environmentFields struct {
	Name        json.RawMessage `json:"name"`
	Description json.RawMessage `json:"description"`
	Config      json.RawMessage `json:"config"`
	Scope       json.RawMessage `json:"scope"`
	Metadata    json.RawMessage `json:"metadata"`
}

// applyEnvironment applies a create (create true) or update request to e;
// unrestricted says whether the tenant holds the grant for unrestricted
// networking.
func applyEnvironment(b []byte, e store.Environment, create, unrestricted bool, mirrors envbuild.Mirrors) (store.Environment, error) {
	var f environmentFields
	if err := decodeObject(b, "request body", &f); err != nil {
		return e, err
	}
	if create || present(f.Name) {
		name, err := stringField(f.Name, "name")
		if err != nil {
			return e, err
		}
		if err := checkLen(name, "name", 1, maxEnvironmentName); err != nil {
			return e, err
		}
		e.Name = name
	}
	if present(f.Description) {
		e.Description = nil
		if !isNull(f.Description) {
			var d string
			if err := field(f.Description, "description", &d); err != nil {
				return e, err
			}
			if err := checkLen(d, "description", 0, maxEnvironmentDescription); err != nil {
				return e, err
			}
			e.Description = &d
		}
	}
	if create || present(f.Config) {
		c, err := decodeEnvConfig(f.Config, unrestricted, mirrors)
		if err != nil {
			return e, err
		}
		if !create && selfHosted(c) != selfHosted(e.Config) {
			// Its sessions were made for where their tools run.
			return e, errdefs.InvalidArgument("config.type: an environment's type (cloud or self_hosted) cannot change; create another environment")
		}
		e.Config = c
	}
	if create || present(f.Scope) {
		s, err := decodeScope(f.Scope)
		if err != nil {
			return e, err
		}
		e.Scope = s
	}
	var err error
	if create {
		e.Metadata, err = metadataCreate(f.Metadata)
	} else {
		e.Metadata, err = metadataPatch(e.Metadata, f.Metadata, true)
	}
	return e, err
}

func orEmpty(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// build is p as envbuild takes it.
func (p packages) build() envbuild.Packages {
	return envbuild.Packages{Apt: p.Apt, Cargo: p.Cargo, Gem: p.Gem, Go: p.Go, Npm: p.Npm, Pip: p.Pip}
}

// StoredPackages are the packages a stored environment config installs
// into its sessions' image (none for a self-hosted one).
func StoredPackages(stored json.RawMessage) envbuild.Packages {
	var c struct {
		Type     string   `json:"type"`
		Packages packages `json:"packages"`
	}
	if json.Unmarshal(stored, &c) != nil || c.Type != "cloud" {
		return envbuild.Packages{}
	}
	return c.Packages.build()
}

// SandboxAllowsMCPServers reports whether a stored config's limited
// networking allows MCP servers: its sandboxes may reach the hosts of
// their agent's mcp_servers.
func SandboxAllowsMCPServers(stored json.RawMessage) bool {
	var c struct {
		Type       string `json:"type"`
		Networking struct {
			Type            string `json:"type"`
			AllowMCPServers bool   `json:"allow_mcp_servers"`
		} `json:"networking"`
	}
	return json.Unmarshal(stored, &c) == nil && c.Type == "cloud" && c.Networking.Type == "limited" && c.Networking.AllowMCPServers
}

// SandboxAllowsPackageManagers reports whether a stored config's limited
// networking allows package managers: its sandboxes may reach the
// operator's mirrors.
func SandboxAllowsPackageManagers(stored json.RawMessage) bool {
	var c struct {
		Type       string `json:"type"`
		Networking struct {
			Type                 string `json:"type"`
			AllowPackageManagers bool   `json:"allow_package_managers"`
		} `json:"networking"`
	}
	return json.Unmarshal(stored, &c) == nil && c.Type == "cloud" && c.Networking.Type == "limited" && c.Networking.AllowPackageManagers
}

// selfHosted reports whether a stored config is self_hosted.
func selfHosted(config json.RawMessage) bool {
	var c struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(config, &c) == nil && c.Type == "self_hosted"
}

// reportedConfig is a stored config as its sandboxes really get it: the
// networking of SandboxAllowedHosts (an environment stored before
// networking was checked reports, unless its hosts pass today's checks, no
// network), package managers as stored, and the packages its sessions'
// image is built with. Unrestricted
// networking is reported as stored: its sandboxes get it, or, once the
// tenant has lost the grant, no new one (sessionNetworking).
func reportedConfig(stored json.RawMessage) json.RawMessage {
	var c struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(stored, &c) != nil || c.Type != "cloud" {
		return stored
	}
	out := defaultCloud()
	switch hosts := SandboxAllowedHosts(stored); {
	case Unrestricted(hosts):
		out.Networking = networking{Type: "unrestricted"}
	case len(hosts) > 0:
		out.Networking.AllowedHosts = &hosts
	}
	if SandboxAllowsPackageManagers(stored) && !Unrestricted(SandboxAllowedHosts(stored)) {
		t := true
		out.Networking.AllowPackageManagers = &t
	}
	if SandboxAllowsMCPServers(stored) && !Unrestricted(SandboxAllowedHosts(stored)) {
		t := true
		out.Networking.AllowMCPServers = &t
	}
	p := StoredPackages(stored)
	out.Packages = packages{Type: "packages", Apt: orEmpty(p.Apt), Cargo: orEmpty(p.Cargo), Gem: orEmpty(p.Gem), Go: orEmpty(p.Go), Npm: orEmpty(p.Npm), Pip: orEmpty(p.Pip)}
	b, err := json.Marshal(out)
	if err != nil {
		return stored
	}
	return b
}

// SandboxAllowedHosts is the egress allowlist a stored environment config
// gives its sessions' sandboxes: limited networking's allowed_hosts when
// they all pass the allowlist's checks, [allowlist.AnyName] for
// unrestricted networking, else none (no network). The fleet places
// sandboxes with it and the API reports it: one reading of the stored
// config for both. Whether the tenant still holds the grant for
// unrestricted networking is the caller's to check.
func SandboxAllowedHosts(stored json.RawMessage) []string {
	var c struct {
		Type       string `json:"type"`
		Networking struct {
			Type         string   `json:"type"`
			AllowedHosts []string `json:"allowed_hosts"`
		} `json:"networking"`
	}
	if json.Unmarshal(stored, &c) != nil || c.Type != "cloud" {
		return nil
	}
	if c.Networking.Type == "unrestricted" {
		return []string{allowlist.AnyName}
	}
	if c.Networking.Type != "limited" || len(c.Networking.AllowedHosts) == 0 {
		return nil
	}
	if _, err := allowlist.Parse(c.Networking.AllowedHosts); err != nil {
		return nil
	}
	return c.Networking.AllowedHosts
}

// Unrestricted reports whether an allowlist of SandboxAllowedHosts is
// unrestricted networking's.
func Unrestricted(hosts []string) bool { return len(hosts) == 1 && hosts[0] == allowlist.AnyName }

// ErrUnrestrictedRevoked refuses a new session, or a new sandbox, of an
// environment with unrestricted networking once its tenant no longer
// holds the grant.
var ErrUnrestrictedRevoked = errdefs.FailedPrecondition("the environment has unrestricted networking, which this tenant's policy no longer grants: sandboxes that run keep it, new ones are refused; change the environment to limited networking")

func environmentOut(e store.Environment) environmentResponse {
	return environmentResponse{
		Type: "environment", ID: e.ID, Name: e.Name, Description: e.Description,
		Config: reportedConfig(e.Config), Metadata: e.Metadata, Scope: e.Scope,
		CreatedAt: ts(e.CreatedAt), UpdatedAt: ts(e.UpdatedAt), ArchivedAt: tsPtr(e.ArchivedAt),
	}
}

// checkClass refuses an environment's metadata that names a sandbox class
// (policy.ClassMetadataKey) the tenant may not use, when it is new or
// changed from cur's: an environment that named a class before the
// policy dropped it can still be renamed, and its sessions are refused
// when they are created.
func (h *Handler) checkClass(r *http.Request, cur, md map[string]string) error {
	class, ok := md[policy.ClassMetadataKey]
	if old, had := cur[policy.ClassMetadataKey]; !ok || had && old == class {
		return nil
	}
	if h.class == nil {
		return errdefs.InvalidArgument("metadata.%s: this server places no sandbox classes; remove the key", policy.ClassMetadataKey)
	}
	if err := h.class(r.Context(), class); err != nil {
		return errdefs.Wrap(errdefs.KindOf(err), err, "metadata.%s", policy.ClassMetadataKey)
	}
	return nil
}

func (h *Handler) writeEnvironment(w http.ResponseWriter, r *http.Request, e store.Environment, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, environmentOut(e))
}

func (h *Handler) createEnvironment(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	e, err := applyEnvironment(b, store.Environment{}, true, h.grantsUnrestricted(r.Context()), h.mirrors)
	if err == nil {
		err = h.checkClass(r, nil, e.Metadata)
	}
	if err == nil {
		err = h.requestBuild(r.Context(), e, false)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	e, err = h.store.Environments().Create(r.Context(), e)
	if err == nil {
		h.startBuild(r.Context(), e)
	}
	h.writeEnvironment(w, r, e, err)
}

// requestBuild checks (ask false) or asks for (ask true) the build of an
// environment's packages, if it has any.
func (h *Handler) requestBuild(ctx context.Context, e store.Environment, ask bool) error {
	if h.build == nil || StoredPackages(e.Config).Empty() {
		return nil
	}
	_, err := h.build(ctx, e, "", ask)
	return err
}

// startBuild asks for the build of a stored environment's packages, so
// its image is built by the time its sessions need it. A failure here is
// logged: the first session asks again, and says why if it fails.
func (h *Handler) startBuild(ctx context.Context, e store.Environment) {
	if err := h.requestBuild(ctx, e, true); err != nil {
		h.log.Warn("asking for an environment's package build", "environment_id", e.ID, "err", err)
	}
}

func (h *Handler) getEnvironment(w http.ResponseWriter, r *http.Request) {
	e, err := h.store.Environments().Get(r.Context(), r.PathValue("id"))
	h.writeEnvironment(w, r, e, err)
}

func (h *Handler) updateEnvironment(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := decodeObject(b, "request body", &environmentFields{}); err != nil {
		h.fail(w, r, err)
		return
	}
	e, err := h.store.Environments().Update(r.Context(), r.PathValue("id"), func(cur store.Environment) (store.Environment, error) {
		e, err := applyEnvironment(b, cur, false, h.grantsUnrestricted(r.Context()), h.mirrors)
		if err != nil {
			return e, err
		}
		if err := h.checkClass(r, cur.Metadata, e.Metadata); err != nil {
			return e, err
		}
		return e, h.requestBuild(r.Context(), e, false)
	})
	if err == nil {
		h.startBuild(r.Context(), e)
	}
	h.writeEnvironment(w, r, e, err)
}

func (h *Handler) archiveEnvironment(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	e, err := h.store.Environments().Archive(r.Context(), r.PathValue("id"))
	h.writeEnvironment(w, r, e, err)
}

func (h *Handler) deleteEnvironment(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := h.store.Environments().Delete(r.Context(), id); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "type": "environment_deleted"})
}

func (h *Handler) listEnvironments(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var opts store.EnvironmentListOptions
	var err error
	if opts.Limit, err = queryLimit(q); err != nil {
		h.fail(w, r, err)
		return
	}
	if opts.IncludeArchived, err = queryBool(q, "include_archived"); err != nil {
		h.fail(w, r, err)
		return
	}
	c, err := decodeCursor(q, "environments", "desc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if c != nil {
		opts.After = c.key()
	}
	envs, more, err := h.store.Environments().List(r.Context(), opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[environmentResponse]{Data: []environmentResponse{}}
	for _, e := range envs {
		out.Data = append(out.Data, environmentOut(e))
	}
	if more && len(envs) > 0 {
		last := envs[len(envs)-1]
		out.NextPage = keyCursor("environments", "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// hostPatterns checks allowed hosts at path (exact names and *.suffix, no
// IP addresses: the egress proxy reaches names only) and returns them
// normalized, without repeats.
func hostPatterns(in []string, path string) ([]string, error) {
	hosts := make([]string, 0, len(in))
	for i, h := range in {
		if _, err := allowlist.Parse([]string{h}); err != nil {
			return nil, errdefs.InvalidArgument("%s[%d]: %q is not a host name or *.suffix (IP addresses are not allowed)", path, i, textcut.Prefix(h, 64))
		}
		name, wild := strings.CutPrefix(h, "*.")
		name = allowlist.Normalize(name)
		if wild {
			name = "*." + name
		}
		if !slices.Contains(hosts, name) {
			hosts = append(hosts, name)
		}
	}
	return hosts, nil
}
