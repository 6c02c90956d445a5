package scheduler

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// HostStatus is whether a host's agent is heartbeating.
type HostStatus string

// Host statuses.
const (
	StatusReady HostStatus = "ready"
	StatusDown  HostStatus = "down"
)

// Resources is an amount of CPU, memory and disk.
//
// A sandbox has two: its request, what its placement reserves on its host
// (Host.Allocated sums them, the tenant's Usage counts them), and its
// limit, what its cgroup enforces on the host. The request is at most the
// limit; hosts overcommit requests (Overcommit), never limits.
type Resources struct {
	CPUMillis int64 `json:"cpu_millis"`
	MemoryMiB int64 `json:"memory_mib"`
	DiskMiB   int64 `json:"disk_mib"`
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{r.CPUMillis + o.CPUMillis, r.MemoryMiB + o.MemoryMiB, r.DiskMiB + o.DiskMiB}
}

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources {
	return Resources{r.CPUMillis - o.CPUMillis, r.MemoryMiB - o.MemoryMiB, r.DiskMiB - o.DiskMiB}
}

// Within reports whether every dimension of r is at most the same one of limit.
func (r Resources) Within(limit Resources) bool {
	return r.CPUMillis <= limit.CPUMillis && r.MemoryMiB <= limit.MemoryMiB && r.DiskMiB <= limit.DiskMiB
}

func (r Resources) validate() error {
	if r.CPUMillis < 0 || r.MemoryMiB < 0 || r.DiskMiB < 0 {
		return errdefs.InvalidArgument("resources must not be negative: %+v", r)
	}
	return nil
}

// Overcommit is, per resource, how far the requests placed on a host may
// add up beyond what the host offers: a host's Capacity is its Offered
// resources times these. 1 (or 0) is none.
type Overcommit struct {
	CPU    float64 `json:"cpu,omitempty"`
	Memory float64 `json:"memory,omitempty"`
	Disk   float64 `json:"disk,omitempty"`
}

// Apply returns what r offers with the ratios applied, rounded down.
func (o Overcommit) Apply(r Resources) Resources {
	scale := func(v int64, ratio float64) int64 {
		if ratio <= 1 {
			return v
		}
		return int64(math.Floor(float64(v) * ratio))
	}
	return Resources{scale(r.CPUMillis, o.CPU), scale(r.MemoryMiB, o.Memory), scale(r.DiskMiB, o.Disk)}
}

// OvercommitFromPolicy converts the policy's ratios.
func OvercommitFromPolicy(o policy.Overcommit) Overcommit {
	return Overcommit{CPU: o.CPU, Memory: o.Memory, Disk: o.Disk}
}

// Host is one sandbox host as the scheduler sees it.
type Host struct {
	ID       string     `json:"id"`
	Status   HostStatus `json:"status"`
	Eligible bool       `json:"eligible"` // false: cordoned, no new placements
	Draining bool       `json:"draining"`
	// Runtimes and Providers are what the host advertises (e.g. "runsc", "runc";
	// "gpu", "browser").
	Runtimes  []string `json:"runtimes,omitempty"`
	Providers []string `json:"providers,omitempty"`
	// Offers are the providers the host registered, with their
	// capabilities and their canaries' health as last reported; empty
	// for a host registered without them (the admin API, older agents),
	// whose providers count as healthy.
	Offers []Provider `json:"offers,omitempty"`
	// Conditions are the host's health as last reported (and its
	// heartbeat's, set by the control plane): one not OK stops new
	// placements on the host.
	Conditions []Condition `json:"conditions,omitempty"`
	// Capacity is what placements' requests may add up to: Offered with
	// the fleet's overcommit ratios applied. Allocated is the sum of the
	// requests of the host's placements.
	Capacity  Resources `json:"capacity"`
	Allocated Resources `json:"allocated"`
	// Offered is what the host offers to sandboxes (its allocatable
	// resources as it registered them), before overcommit; zero in a host
	// recorded before overcommit existed, whose Capacity is what it offered.
	Offered Resources         `json:"offered,omitzero"`
	Labels  map[string]string `json:"labels,omitempty"`
	Images  []string          `json:"images,omitempty"`
	// Address is where the host serves SandboxService (host:port).
	Address string `json:"address,omitempty"`
	// Warm counts warm sandboxes ready to be claimed, keyed by WarmKey.
	Warm map[string]int `json:"warm,omitempty"`
	// Pausable: the host's sandboxes checkpoint with their processes, so
	// they move live to another pausable host (as it registered).
	Pausable bool `json:"pausable,omitempty"`
}

// WarmKey is the key of Host.Warm for an image and runtime.
func WarmKey(image, runtime string) string { return image + "|" + runtime }

// Free is the capacity not yet allocated.
func (h *Host) Free() Resources { return h.Capacity.Sub(h.Allocated) }

// Placement is a session's sandbox committed onto a host.
//
// Its JSON is the Raft log's and snapshots' stored form, so its names do
// not follow renames: "session_key" is the session's id, as it was called
// when clusters first wrote it (and in the raftfsm commands that carry it).
// Everywhere a person reads it (API, CLI, logs) it is session_id.
type Placement struct {
	SessionID string `json:"session_key"`
	Tenant    string `json:"tenant"`
	HostID    string `json:"host_id"`
	SandboxID string `json:"sandbox_id,omitempty"`
	// Resources is the sandbox's request: what the placement reserves on
	// its host and counts against its tenant's quota.
	Resources Resources `json:"resources"`
	// Limits is what the host's cgroup enforces on the sandbox. Zero in a
	// placement recorded before requests and limits were apart: its
	// Resources were its limits too (LimitsOrRequest).
	Limits Resources `json:"limits,omitzero"`
	// What the host is asked to run, from the plan: enough to place the
	// session again elsewhere when its host is lost or drained.
	Runtime  string `json:"runtime,omitempty"`
	Provider string `json:"provider,omitempty"`
	Image    string `json:"image,omitempty"`
	// Pids is the sandbox's process limit, from the runtime's profile: the
	// host applies it, the scheduler does not count it (0: the host's
	// default).
	Pids int64 `json:"pids,omitempty"`
	// AllowedHosts is the sandbox's egress allowlist, from its
	// environment when it was placed: the host gives it an egress network
	// for these names (empty: no network).
	AllowedHosts []string `json:"allowed_hosts,omitempty"`

	// The sandbox's life after placement, kept by the FSM (the scheduler
	// neither reads nor sets them): Ready once the host reported the
	// sandbox usable; Fence while a mover (a drain, an eviction) holds it.
	Ready bool   `json:"ready,omitempty"`
	Fence *Fence `json:"fence,omitempty"`
	// State is "" while the sandbox runs and PlacementPaused while it is
	// paused (checkpointed and stopped on its host, kept by the FSM): a
	// paused placement reserves its disk but no CPU or memory (Reserved),
	// and counts apart in its tenant's usage.
	State string `json:"state,omitempty"`
	// PausedDiskMiB is what a paused placement's sandbox holds of its
	// host's disk, as the host measured it at the pause (its disk image's
	// allocated blocks and its checkpoint): all the disk it reserves until
	// it resumes, since it cannot grow meanwhile. 0: not measured, and
	// the whole disk request stays reserved.
	PausedDiskMiB int64 `json:"paused_disk_mib,omitempty"`
	// Moved says how a drain brought the sandbox to this host (one of the
	// Moved constants; "" when it was placed here): set as the mover lifts
	// its fence, read by the session's next tool call to tell it.
	Moved string `json:"moved,omitempty"`
}

// How a drain moved a placement's sandbox (Placement.Moved).
const (
	// MovedLive: checkpointed and restored, its processes running on.
	MovedLive = "live"
	// MovedWorkspace: a new sandbox with the old one's workspace.
	MovedWorkspace = "workspace"
	// MovedWithoutWorkspace: a new sandbox whose workspace could not be
	// restored.
	MovedWithoutWorkspace = "without_workspace"
)

// PlacementPaused is the State of a placement whose sandbox is paused.
const PlacementPaused = "paused"

// Paused reports whether the placement's sandbox is paused.
func (p Placement) Paused() bool { return p.State == PlacementPaused }

// Reserved is what the placement holds of its host: its resources while
// it runs; while it is paused only disk, what its sandbox held when it
// paused (PausedDiskMiB, which may exceed its disk request: the checkpoint
// lies beside the disk image) or, unmeasured, its whole disk request.
// Resuming takes its whole request back.
func (p Placement) Reserved() Resources {
	if p.Paused() {
		if p.PausedDiskMiB > 0 {
			return Resources{DiskMiB: p.PausedDiskMiB}
		}
		return Resources{DiskMiB: p.Resources.DiskMiB}
	}
	return p.Resources
}

// LimitsOrRequest is what the host enforces on the sandbox: its Limits, or
// for a placement recorded without them its Resources.
func (p Placement) LimitsOrRequest() Resources {
	if p.Limits == (Resources{}) {
		return p.Resources
	}
	return p.Limits
}

// Fence is a mover's hold on a placement's sandbox: tool calls wait while
// it holds, until Until at the latest.
type Fence struct {
	Owner string    `json:"owner"`
	Until time.Time `json:"until"`
}

// Holds reports whether the fence holds at now (a nil fence never does).
func (f *Fence) Holds(now time.Time) bool { return f != nil && now.Before(f.Until) }

// Usage is what a tenant's placements hold.
type Usage struct {
	Sandboxes int   `json:"sandboxes"`
	CPUMillis int64 `json:"cpu_millis"`
	MemoryMiB int64 `json:"memory_mib"`
	// PausedSandboxes are the tenant's paused sandboxes: counted apart,
	// not in Sandboxes (the concurrent_sandboxes quota counts running
	// ones), CPUMillis or MemoryMiB.
	PausedSandboxes int `json:"paused_sandboxes,omitempty"`
}

// Quota bounds a tenant's usage. A zero field means no limit.
type Quota struct {
	ConcurrentSandboxes int   `json:"concurrent_sandboxes"`
	CPUMillis           int64 `json:"cpu_millis"`
	MemoryMiB           int64 `json:"memory_mib"`
	// HostSharePercent bounds the share of each host's Capacity (each of
	// CPU, memory and disk) that the tenant's placements may reserve
	// (CheckHostShare); 0 or 100 is no bound.
	HostSharePercent int `json:"host_share_percent,omitempty"`
}

// View is a read-only fleet. Implementations must not change while a call to
// this package runs; callers must not modify what it returns.
type View interface {
	// Hosts returns every host, in any order.
	Hosts() []*Host
	// Host returns the host with id, or false.
	Host(id string) (*Host, bool)
	// Placement returns the placement for a session key, or false.
	Placement(sessionID string) (Placement, bool)
	// Usage returns what a tenant's placements hold.
	Usage(tenant string) Usage
	// TenantAllocated returns the sum of the requests of a tenant's
	// placements on a host.
	TenantAllocated(hostID, tenant string) Resources
	// TenantSandboxes returns how many placements a tenant has on a host
	// (zone spread counts them).
	TenantSandboxes(hostID, tenant string) int
	// Quota returns a tenant's quota.
	Quota(tenant string) Quota
}

// Op is how a Constraint compares a label.
type Op string

// Constraint operators.
const (
	OpEqual    Op = "=="
	OpNotEqual Op = "!="
	OpExists   Op = "exists"
)

// Constraint is a hard label requirement.
type Constraint struct {
	Key   string `json:"key"`
	Op    Op     `json:"op"`
	Value string `json:"value,omitempty"`
}

func (c Constraint) match(labels map[string]string) bool {
	v, ok := labels[c.Key]
	switch c.Op {
	case OpEqual:
		return ok && v == c.Value
	case OpNotEqual:
		return !ok || v != c.Value
	case OpExists:
		return ok
	}
	return false
}

// Affinity is a soft label preference: hosts whose label Key equals Value get
// Weight added to their score (a negative weight is an anti-affinity).
type Affinity struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Weight int64  `json:"weight"`
}

// Request asks for a sandbox for one session.
type Request struct {
	SessionID string `json:"session_key"`
	Tenant    string `json:"tenant"`
	Runtime   string `json:"runtime,omitempty"` // required runtime, "" for any
	// Provider is the provider required, "" for the runtime's (a runtime
	// is a provider of its name): the host must offer it, healthy.
	Provider string `json:"provider,omitempty"`
	// Resources is what the placement reserves (the request); Limits what
	// the host enforces (zero: Resources).
	Resources Resources `json:"resources"`
	Limits    Resources `json:"limits,omitzero"`
	Image     string    `json:"image,omitempty"`
	// Pids is the sandbox's process limit, carried to the placement (not a
	// resource the scheduler counts).
	Pids int64 `json:"pids,omitempty"`
	// AllowedHosts is the sandbox's egress allowlist (empty: no network):
	// only a host whose provider offers limited networking takes it
	// (FilterNetwork), and the placement carries it to the host.
	AllowedHosts []string     `json:"allowed_hosts,omitempty"`
	Constraints  []Constraint `json:"constraints,omitempty"`
	Affinity     []Affinity   `json:"affinity,omitempty"`
	// Pools, when set, are the host pools the tenant may use (its
	// policy's, ApplyPlacement): a host whose pool label is not among
	// them is refused ("" stands for the hosts without one). Unset: any
	// host, as when the policy defines no pools.
	Pools []string `json:"pools,omitempty"`
	// SpreadZones prefers, above every score, the hosts of a zone that
	// holds the fewest of the tenant's sandboxes.
	SpreadZones bool `json:"spread_zones,omitempty"`
}

// Validate checks a request's shape.
func (r *Request) Validate() error {
	if r.SessionID == "" {
		return errdefs.InvalidArgument("request needs a session key")
	}
	if r.Tenant == "" {
		return errdefs.InvalidArgument("request for session %s needs a tenant", r.SessionID)
	}
	for _, c := range r.Constraints {
		switch c.Op {
		case OpEqual, OpNotEqual, OpExists:
		default:
			return errdefs.InvalidArgument("constraint on %q: unknown operator %q", c.Key, c.Op)
		}
	}
	if err := r.Resources.validate(); err != nil {
		return err
	}
	return checkLimits(r.Resources, r.Limits)
}

// checkLimits refuses limits below the request (zero limits are the
// request's).
func checkLimits(request, limits Resources) error {
	if limits == (Resources{}) {
		return nil
	}
	if err := limits.validate(); err != nil {
		return err
	}
	if !request.Within(limits) {
		return errdefs.InvalidArgument("a request must be within its limits: request %+v, limits %+v", request, limits)
	}
	return nil
}

// Plan is a host chosen for a request.
type Plan struct {
	SessionID string    `json:"session_key"`
	Tenant    string    `json:"tenant"`
	HostID    string    `json:"host_id"`
	Runtime   string    `json:"runtime,omitempty"`
	Provider  string    `json:"provider,omitempty"`
	Resources Resources `json:"resources"`
	Limits    Resources `json:"limits,omitzero"`
	Image     string    `json:"image,omitempty"`
	Pids      int64     `json:"pids,omitempty"`
	// AllowedHosts are the request's.
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
	// Pools are the request's: the commit checks the host's pool again.
	Pools []string `json:"pools,omitempty"`
	// Existing is set when the session already had a placement; Place then
	// returns it unchanged.
	Existing bool  `json:"existing,omitempty"`
	Score    int64 `json:"score"`
	// WarmAvailable is set when the host had a warm sandbox for the request.
	WarmAvailable bool `json:"warm_available,omitempty"`
}

// Strategy is how the fit score weighs a host's utilization.
type Strategy string

// Strategies.
const (
	BinPack Strategy = "binpack" // prefer fuller hosts
	Spread  Strategy = "spread"  // prefer emptier hosts
)

// Config weighs the scores. The zero Config is DefaultConfig.
type Config struct {
	Strategy    Strategy
	WarmWeight  int64 // added when a warm sandbox is available
	ImageWeight int64 // added when the image is present
	FitWeight   int64 // multiplied by the fit in [0, 1]
}

// DefaultConfig bin-packs, and prefers a warm sandbox over a present image over fit.
var DefaultConfig = Config{Strategy: BinPack, WarmWeight: 4000, ImageWeight: 2000, FitWeight: 1000}

func (c Config) withDefaults() Config {
	if c == (Config{}) {
		return DefaultConfig
	}
	if c.Strategy == "" {
		c.Strategy = BinPack
	}
	return c
}

// Filter names a reason a host was rejected.
type Filter string

// The filters, in the order Place applies them; a host is counted against the
// first one it fails.
const (
	FilterReady    Filter = "ready"
	FilterEligible Filter = "eligible"
	FilterDraining Filter = "not_draining"
	// FilterHealthy rejects a host with a condition not OK (memory or
	// disk pressure, containerd unreachable, no heartbeat).
	FilterHealthy Filter = "healthy"
	// FilterPool rejects a host whose pool the tenant may not use.
	FilterPool     Filter = "pool"
	FilterRuntime  Filter = "runtime"
	FilterProvider Filter = "provider"
	// FilterProviderHealthy rejects a host whose provider for the
	// request fails its canary.
	FilterProviderHealthy Filter = "provider_healthy"
	// FilterNetwork rejects, for a request with allowed hosts, a host
	// whose provider does not offer limited networking (egress).
	FilterNetwork   Filter = "network"
	FilterResources Filter = "resources"
	// FilterTenantShare rejects a host on which the tenant's placements
	// would reserve more than its quota's HostSharePercent.
	FilterTenantShare Filter = "tenant_share"
	FilterLabels      Filter = "labels"
)

var filters = []struct {
	name Filter
	pass func(v View, h *Host, r *Request) bool
}{
	{FilterReady, func(_ View, h *Host, _ *Request) bool { return h.Status == StatusReady }},
	{FilterEligible, func(_ View, h *Host, _ *Request) bool { return h.Eligible }},
	{FilterDraining, func(_ View, h *Host, _ *Request) bool { return !h.Draining }},
	{FilterHealthy, func(_ View, h *Host, _ *Request) bool { return h.Healthy() }},
	{FilterPool, func(_ View, h *Host, r *Request) bool { return poolAllowed(h, r.Pools) }},
	{FilterRuntime, func(_ View, h *Host, r *Request) bool {
		return r.Runtime == "" || slices.Contains(h.Runtimes, r.Runtime)
	}},
	{FilterProvider, func(_ View, h *Host, r *Request) bool { return h.offers(r.provider()) }},
	{FilterProviderHealthy, func(_ View, h *Host, r *Request) bool { return h.providerHealthy(r.provider()) }},
	{FilterNetwork, func(_ View, h *Host, r *Request) bool {
		return len(r.AllowedHosts) == 0 || h.offersNetwork(r.provider(), NetworkLimited)
	}},
	{FilterResources, func(_ View, h *Host, r *Request) bool { return r.Resources.Within(h.Free()) }},
	{FilterTenantShare, func(v View, h *Host, r *Request) bool {
		return CheckHostShare(v.TenantAllocated(h.ID, r.Tenant), h.Capacity, v.Quota(r.Tenant).HostSharePercent, r.Resources) == nil
	}},
	{FilterLabels, func(_ View, h *Host, r *Request) bool {
		for _, c := range r.Constraints {
			if !c.match(h.Labels) {
				return false
			}
		}
		return true
	}},
}

// CheckHostShare reports whether a tenant that reserves onHost on a host
// of capacity may reserve r more there within percent of the capacity
// (each of CPU, memory and disk whose capacity is set), with an
// errdefs.ResourceExhausted error naming the resource when not. percent 0
// or 100 is no bound. A tenant with nothing on the host may always place
// one sandbox there (if the host has room), so a request above the share
// of a small host is not refused everywhere.
func CheckHostShare(onHost, capacity Resources, percent int, r Resources) error {
	if percent <= 0 || percent >= 100 || onHost == (Resources{}) {
		return nil
	}
	after := onHost.Add(r)
	for _, c := range []struct {
		what       string
		after, cap int64
	}{
		{"cpu_millis", after.CPUMillis, capacity.CPUMillis},
		{"memory_mib", after.MemoryMiB, capacity.MemoryMiB},
		{"disk_mib", after.DiskMiB, capacity.DiskMiB},
	} {
		if c.cap > 0 && c.after*100 > c.cap*int64(percent) {
			return errdefs.ResourceExhausted("the tenant's sandboxes would reserve %d %s of the host's %d, over its share of %d%%", c.after, c.what, c.cap, percent)
		}
	}
	return nil
}

// firstFailing returns the first filter h fails, or "".
func firstFailing(v View, h *Host, r *Request) Filter {
	for _, f := range filters {
		if !f.pass(v, h, r) {
			return f.name
		}
	}
	return ""
}

// NoFitError says no host passed every filter. Its kind is ResourceExhausted.
type NoFitError struct {
	SessionID  string
	Considered int
	Rejected   map[Filter]int // hosts rejected, by the first filter they failed
	// Pools are the request's: the pools the tenant may use.
	Pools []string
}

func (e *NoFitError) Error() string {
	keys := make([]string, 0, len(e.Rejected))
	for f := range e.Rejected {
		keys = append(keys, string(f))
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %d", k, e.Rejected[Filter(k)])
	}
	in := ""
	if e.Pools != nil {
		in = " in the pools its tenant may use (" + PoolNames(e.Pools) + ")"
	}
	return fmt.Sprintf("no host%s fits session %s (%d considered; rejected by %s)", in, e.SessionID, e.Considered, b.String())
}

// Unwrap gives the error its errdefs kind.
func (e *NoFitError) Unwrap() error { return errdefs.ResourceExhausted("no host fits") }

// Place chooses a host for r. It returns the existing placement when the
// session already has one, a *NoFitError when no host fits, and
// errdefs.InvalidArgument for a malformed request.
func Place(v View, r Request, cfg Config) (Plan, error) {
	if err := r.Validate(); err != nil {
		return Plan{}, err
	}
	if p, ok := v.Placement(r.SessionID); ok {
		return Plan{SessionID: p.SessionID, Tenant: p.Tenant, HostID: p.HostID, Resources: p.Resources, Existing: true}, nil
	}
	cfg = cfg.withDefaults()
	if ix, ok := v.(Indexed); ok {
		// The candidates only: the hosts of the request's pools that
		// offer its provider. When none fits, the full scan below
		// builds the error, counting every host.
		index := ix.Index()
		zones := func(z string) int { return index.ZoneSandboxes(z, r.Tenant) }
		if p, ok := choose(v, &r, cfg, index.Candidates(r.Pools, r.provider()), zones, nil); ok {
			return p, nil
		}
	}
	hosts := v.Hosts()
	nofit := NoFitError{SessionID: r.SessionID, Considered: len(hosts), Rejected: map[Filter]int{}, Pools: r.Pools}
	if p, ok := choose(v, &r, cfg, [][]*Host{hosts}, nil, nofit.Rejected); ok {
		return p, nil
	}
	return Plan{}, &nofit
}

// choose returns the plan for the best host of lists for r, or false when
// none passes every filter. It counts the hosts rejected by each filter in
// rejected, when set. zones, when set, counts the tenant's sandboxes in a
// zone of the whole fleet (for zone spread); otherwise lists are the
// whole fleet.
func choose(v View, r *Request, cfg Config, lists [][]*Host, zones func(string) int, rejected map[Filter]int) (Plan, bool) {
	var (
		best     *Host
		bestSc   int64
		bestZone bool
		warmKey  = WarmKey(r.Image, r.Runtime)
		cands    []*Host // with SpreadZones: the hosts that pass every filter
	)
	// consider scores h, a host that passes every filter. Zone spread
	// comes before the score: a host of a zone holding more of the
	// tenant's sandboxes (z false) never wins over one of the fewest.
	// The order is total (ties go to the lowest id), so the order of
	// the hosts does not change the choice.
	consider := func(h *Host, z bool) {
		sc := score(h, r, cfg, warmKey)
		if best == nil || (z && !bestZone) || (z == bestZone && (sc > bestSc || (sc == bestSc && h.ID < best.ID))) {
			best, bestSc, bestZone = h, sc, z
		}
	}
	for _, hosts := range lists {
		for _, h := range hosts {
			if f := firstFailing(v, h, r); f != "" {
				if rejected != nil {
					rejected[f]++
				}
				continue
			}
			if r.SpreadZones {
				cands = append(cands, h)
				continue
			}
			consider(h, true)
		}
	}
	if r.SpreadZones && len(cands) > 0 {
		count := zones
		if count == nil {
			count = fleetZones(v, lists[0], r.Tenant)
		}
		least := leastZones(count, cands)
		for _, h := range cands {
			consider(h, least[h.Labels[ZoneLabel]])
		}
	}
	if best == nil {
		return Plan{}, false
	}
	return Plan{
		SessionID: r.SessionID, Tenant: r.Tenant, HostID: best.ID,
		Runtime: r.Runtime, Provider: r.provider(), Resources: r.Resources, Limits: r.Limits, Image: r.Image, Pids: r.Pids,
		AllowedHosts: r.AllowedHosts, Pools: r.Pools, Score: bestSc, WarmAvailable: r.Image != "" && best.Warm[warmKey] > 0,
	}, true
}

// score is the host's desirability for r; higher is better. Integer arithmetic
// keeps it identical on every machine.
func score(h *Host, r *Request, cfg Config, warmKey string) int64 {
	var s int64
	if r.Image != "" && h.Warm[warmKey] > 0 {
		s += cfg.WarmWeight
	}
	if r.Image != "" && slices.Contains(h.Images, r.Image) {
		s += cfg.ImageWeight
	}
	// Utilization after placing r, in thousandths, averaged over CPU and memory.
	after := h.Allocated.Add(r.Resources)
	util := (permille(after.CPUMillis, h.Capacity.CPUMillis) + permille(after.MemoryMiB, h.Capacity.MemoryMiB)) / 2
	fit := util
	if cfg.Strategy == Spread {
		fit = 1000 - util
	}
	s += cfg.FitWeight * fit / 1000
	for _, a := range r.Affinity {
		if h.Labels[a.Key] == a.Value {
			s += a.Weight
		}
	}
	return s
}

func permille(used, capacity int64) int64 {
	if capacity <= 0 {
		return 1000
	}
	return min(used*1000/capacity, 1000)
}

// Validate re-checks a plan against the current view, as the leader does
// before committing it. A plan for a session that already holds a placement
// on the same host is valid (committing it again changes nothing); anything
// that no longer holds is errdefs.Conflict, and the caller plans again.
func Validate(v View, p Plan) error {
	if p.SessionID == "" || p.HostID == "" || p.Tenant == "" {
		return errdefs.InvalidArgument("plan needs a session key, a tenant and a host")
	}
	if err := p.Resources.validate(); err != nil {
		return err
	}
	if err := checkLimits(p.Resources, p.Limits); err != nil {
		return err
	}
	if cur, ok := v.Placement(p.SessionID); ok {
		if cur.HostID != p.HostID {
			return errdefs.Conflict("session %s is already placed on host %s", p.SessionID, cur.HostID)
		}
		return nil
	}
	h, ok := v.Host(p.HostID)
	if !ok {
		return errdefs.Conflict("plan for session %s: host %s is not registered", p.SessionID, p.HostID)
	}
	r := Request{Tenant: p.Tenant, Runtime: p.Runtime, Provider: p.Provider, Resources: p.Resources, Pools: p.Pools}
	for _, f := range filters {
		if f.name == FilterLabels {
			continue // labels do not change under a plan
		}
		if !f.pass(v, h, &r) {
			return errdefs.Conflict("plan for session %s is stale: host %s no longer passes %s (free %+v, wanted %+v)",
				p.SessionID, h.ID, f.name, h.Free(), p.Resources)
		}
	}
	return nil
}

// CheckQuota reports whether adding r to usage stays within q, with an
// errdefs.ResourceExhausted error naming the exceeded quota when not.
func CheckQuota(tenant string, usage Usage, q Quota, r Resources) error {
	switch {
	case q.ConcurrentSandboxes > 0 && usage.Sandboxes+1 > q.ConcurrentSandboxes:
		return errdefs.ResourceExhausted("tenant %s: quota concurrent_sandboxes exceeded (%d in use, limit %d)", tenant, usage.Sandboxes, q.ConcurrentSandboxes)
	case q.CPUMillis > 0 && usage.CPUMillis+r.CPUMillis > q.CPUMillis:
		return errdefs.ResourceExhausted("tenant %s: quota cpu_millis exceeded (%d in use, %d requested, limit %d)", tenant, usage.CPUMillis, r.CPUMillis, q.CPUMillis)
	case q.MemoryMiB > 0 && usage.MemoryMiB+r.MemoryMiB > q.MemoryMiB:
		return errdefs.ResourceExhausted("tenant %s: quota memory_mib exceeded (%d in use, %d requested, limit %d)", tenant, usage.MemoryMiB, r.MemoryMiB, q.MemoryMiB)
	}
	return nil
}

// Admit is the commit-time check: Validate, then (for a new placement) the
// tenant's quota. It is deterministic, so every Raft replica agrees.
func Admit(v View, p Plan, q Quota) error {
	if err := Validate(v, p); err != nil {
		return err
	}
	if _, ok := v.Placement(p.SessionID); ok {
		return nil
	}
	return CheckQuota(p.Tenant, v.Usage(p.Tenant), q, p.Resources)
}

// IsNoFit reports whether err says no host fits.
func IsNoFit(err error) bool {
	var nf *NoFitError
	return errors.As(err, &nf)
}

// QuotaFromPolicy converts the policy's quota.
func QuotaFromPolicy(q policy.Quota) Quota {
	return Quota{ConcurrentSandboxes: q.ConcurrentSandboxes, CPUMillis: int64(q.CPUMillis), MemoryMiB: int64(q.MemoryMiB), HostSharePercent: q.HostSharePercent}
}
