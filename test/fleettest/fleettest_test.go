package fleettest

import (
	"fmt"
	"sync/atomic"
	"testing"

	"corral.dev/corral/controlplane/tenant"
)

func TestSessionsConformance(t *testing.T) {
	s := NewSessions()
	var n atomic.Int64
	CheckSessions(t, SessionRecords{Sessions: s, Notices: s,
		Create: func(*testing.T) (tenant.ID, string) {
			id := fmt.Sprintf("sesn_%d", n.Add(1))
			s.Add(id)
			return Tenant, id
		},
		Delete:  func(_ *testing.T, _ tenant.ID, id string) { s.Delete(id) },
		Archive: func(_ *testing.T, _ tenant.ID, id string) { s.Archive(id) },
	})
}
