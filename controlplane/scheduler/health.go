package scheduler

import (
	"fmt"
	"slices"
	"time"
)

// Provider is one kind of sandbox a host offers ("gvisor", "runc",
// "process"), with its capabilities and its health. A placement asks for
// a provider by name (Request.Provider, or its runtime when it names
// none); the host must offer it, healthy.
type Provider struct {
	Name string `json:"name"`
	// Isolation is how strongly a sandbox is kept from the host: "vm",
	// "user_kernel" (gVisor), "container", "none".
	Isolation string `json:"isolation,omitempty"`
	// Platform is gVisor's ("systrap", "kvm"); empty for others.
	Platform     string   `json:"platform,omitempty"`
	Checkpoint   bool     `json:"checkpoint,omitempty"`
	NetworkModes []string `json:"network_modes,omitempty"`
	GPU          bool     `json:"gpu,omitempty"`
	// Healthy is false while the provider's canary fails on the host: it
	// takes no new placements there (FilterProviderHealthy). Reason says
	// why; Since is when the health last changed.
	Healthy bool      `json:"healthy"`
	Reason  string    `json:"reason,omitempty"`
	Since   time.Time `json:"since,omitzero"`
}

// Condition is one of a host's health conditions ("memory_pressure",
// "disk_pressure", "containerd_reachable", "heartbeat"). One that is not
// OK stops new placements on the host (FilterHealthy); the host's
// existing placements stay.
type Condition struct {
	Type   string    `json:"type"`
	OK     bool      `json:"ok"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since,omitzero"`
}

// ConditionHeartbeat is the condition the control plane sets itself: not
// OK once the host has not heartbeat for its TTL (and the host is down).
const ConditionHeartbeat = "heartbeat"

// Offer returns the provider name the host offers with its details, or
// false when the host recorded none for it (a host registered without
// details, whose providers count as healthy).
func (h *Host) Offer(name string) (Provider, bool) {
	for _, p := range h.Offers {
		if p.Name == name {
			return p, true
		}
	}
	return Provider{}, false
}

// offers reports whether the host offers provider name: one of its
// providers, or of its runtimes (a runtime is a provider of its name).
func (h *Host) offers(name string) bool {
	return name == "" || slices.Contains(h.Providers, name) || slices.Contains(h.Runtimes, name)
}

// NetworkLimited is the network mode of a sandbox with egress through its
// host's proxy.
const NetworkLimited = "limited"

// offersNetwork reports whether the host's provider name ("": any) offers
// network mode.
func (h *Host) offersNetwork(name, mode string) bool {
	for _, p := range h.Offers {
		if (name == "" || p.Name == name) && slices.Contains(p.NetworkModes, mode) {
			return true
		}
	}
	return false
}

// Healthy reports whether every condition of the host is OK.
func (h *Host) Healthy() bool {
	for _, c := range h.Conditions {
		if !c.OK {
			return false
		}
	}
	return true
}

// providerHealthy reports whether the host's provider name, if it has
// details for it, passes its canary.
func (h *Host) providerHealthy(name string) bool {
	p, ok := h.Offer(name)
	return !ok || p.Healthy
}

// Condition returns the host's condition of type typ, or false.
func (h *Host) Condition(typ string) (Condition, bool) {
	for _, c := range h.Conditions {
		if c.Type == typ {
			return c, true
		}
	}
	return Condition{}, false
}

// Unschedulable says why the host takes no new placements, one reason per
// line, or nothing when it takes them (for some provider it offers). It
// is what an operator reads (corral hosts ls); Place decides by the
// filters, which say the same.
func (h *Host) Unschedulable() []string {
	var out []string
	if h.Status != StatusReady {
		out = append(out, fmt.Sprintf("status %s", h.Status))
	}
	if h.Draining {
		out = append(out, "draining")
	} else if !h.Eligible {
		out = append(out, "cordoned")
	}
	for _, c := range h.Conditions {
		if !c.OK {
			out = append(out, fmt.Sprintf("%s: %s (since %s)", c.Type, c.Reason, c.Since.UTC().Format(time.RFC3339)))
		}
	}
	healthy := len(h.Offers) == 0
	for _, p := range h.Offers {
		if p.Healthy {
			healthy = true
		}
	}
	if !healthy {
		for _, p := range h.Offers {
			out = append(out, fmt.Sprintf("provider %s: %s (since %s)", p.Name, p.Reason, p.Since.UTC().Format(time.RFC3339)))
		}
	}
	return out
}

// provider is the provider a request asks for: its own, or its runtime's.
func (r *Request) provider() string {
	if r.Provider != "" {
		return r.Provider
	}
	return r.Runtime
}
