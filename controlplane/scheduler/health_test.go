package scheduler_test

import (
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
)

// A host offers several providers; one failing its canary keeps only its
// own requests off the host, and a request without a provider asks for
// its runtime's.
func TestProviderHealthPerProvider(t *testing.T) {
	h := host("a", func(h *scheduler.Host) {
		h.Runtimes = []string{"gvisor", "runc"}
		h.Providers = []string{"gvisor", "runc"}
		h.Offers = []scheduler.Provider{
			{Name: "gvisor", Isolation: "user_kernel", Platform: "systrap", Healthy: false, Reason: "canary failed"},
			{Name: "runc", Isolation: "container", Healthy: true},
		}
	})
	v := schedulertest.New(t, h)
	p, err := v.Place(req("s1", func(r *scheduler.Request) { r.Runtime = "runc" }))
	if err != nil {
		t.Fatalf("runc on a host whose runc is healthy: %v", err)
	}
	if p.Provider != "runc" {
		t.Errorf("plan provider = %q, want the runtime's, runc", p.Provider)
	}
	_, err = v.Place(req("s2", func(r *scheduler.Request) { r.Runtime = "gvisor" }))
	if !scheduler.IsNoFit(err) || !strings.Contains(err.Error(), "provider_healthy: 1") {
		t.Fatalf("gvisor on a host whose gvisor fails its canary: %v", err)
	}
	_, err = v.Place(req("s3", func(r *scheduler.Request) { r.Runtime = "gvisor"; r.Provider = "runc" }))
	if err != nil {
		t.Fatalf("an explicit healthy provider: %v", err)
	}
}

// A plan made while the host was healthy is refused at commit once the
// host is not (Validate runs the health filters), so the leader plans again.
func TestValidateRefusesAHostThatTurnedUnhealthy(t *testing.T) {
	h := host("a", nil)
	v := schedulertest.New(t, h)
	p, err := v.Place(req("s", nil))
	if err != nil {
		t.Fatal(err)
	}
	sick := host("a", func(h *scheduler.Host) {
		h.Conditions = []scheduler.Condition{{Type: "memory_pressure", Reason: "2% available"}}
	})
	err = scheduler.Validate(schedulertest.NewView(sick), p)
	if errdefs.KindOf(err) != errdefs.ConflictKind || !strings.Contains(err.Error(), "healthy") {
		t.Fatalf("validate on the sick host: %v, want a conflict naming healthy", err)
	}
	sick.Offers = []scheduler.Provider{{Name: "runsc", Reason: "canary failed"}}
	sick.Conditions = nil
	err = scheduler.Validate(schedulertest.NewView(sick), p)
	if errdefs.KindOf(err) != errdefs.ConflictKind || !strings.Contains(err.Error(), "provider_healthy") {
		t.Fatalf("validate with the provider failing: %v, want a conflict naming provider_healthy", err)
	}
}

func TestUnschedulableSaysWhy(t *testing.T) {
	since := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		h    scheduler.Host
		want []string
	}{
		{"healthy", host("a", func(h *scheduler.Host) {
			h.Offers = []scheduler.Provider{{Name: "gvisor", Healthy: true}}
			h.Conditions = []scheduler.Condition{{Type: "memory_pressure", OK: true}}
		}), nil},
		{"down and cordoned", host("a", func(h *scheduler.Host) { h.Status = scheduler.StatusDown; h.Eligible = false }), []string{"status down", "cordoned"}},
		{"pressure", host("a", func(h *scheduler.Host) {
			h.Conditions = []scheduler.Condition{{Type: "disk_pressure", Reason: "1% free", Since: since}}
		}), []string{"disk_pressure: 1% free (since 2026-05-01T12:00:00Z)"}},
		{"every provider failing", host("a", func(h *scheduler.Host) {
			h.Offers = []scheduler.Provider{{Name: "gvisor", Reason: "canary: runsc exited 1", Since: since}}
		}), []string{"provider gvisor: canary: runsc exited 1 (since 2026-05-01T12:00:00Z)"}},
		{"one provider of two failing", host("a", func(h *scheduler.Host) {
			h.Offers = []scheduler.Provider{{Name: "gvisor", Reason: "x"}, {Name: "runc", Healthy: true}}
		}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.h.Unschedulable()
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("Unschedulable() = %q, want %q", got, tt.want)
			}
		})
	}
}
