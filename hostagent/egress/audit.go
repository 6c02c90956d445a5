package egress

import (
	"sync"
	"time"

	"corral.dev/corral/internal/textcut"
)

// Record is one egress connection as the audit trail keeps it.
type Record struct {
	Tenant, Session string
	// Host is the name the sandbox asked for (CONNECT target, Host header
	// or TLS server name), cut to maxHostBytes; Port its port.
	Host string
	Port int
	// Address is the address dialled ("" when none was).
	Address string
	// Allowed is the verdict; Reason says why it was denied ("" when
	// allowed), or why an allowed connection was cut (a cap).
	Allowed bool
	Reason  string
	// Injected: the proxy put a credential's secret into a request of
	// this connection in place of its placeholder (never the secret).
	Injected bool
	// BytesUp were sent by the sandbox, BytesDown received by it.
	BytesUp, BytesDown int64
	Start, End         time.Time
}

// Bounds on what a record holds: the host name is the sandbox's to choose.
const (
	maxHostBytes   = 253
	maxReasonBytes = 256
)

// Audit is a host's bounded queue of egress records, filled by every
// sandbox's proxy and drained by whatever ships them (the host agent's
// heartbeat). When it is full new records are dropped and counted: the
// count goes out with the next drain, so a gap is never silent.
type Audit struct {
	capacity int
	notify   chan struct{}

	// mu guards records, dropped and totals.
	mu      sync.Mutex
	records []Record
	dropped int64
	totals  AuditTotals
}

// AuditTotals count the records an Audit took since it was made (for the
// host's metrics; they never go down).
type AuditTotals struct {
	Allowed, Denied, Dropped int64
}

// Totals returns the counts so far.
func (a *Audit) Totals() AuditTotals {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.totals
}

// DefaultAuditCapacity is the records a host keeps between drains.
const DefaultAuditCapacity = 4096

// NewAudit returns a queue of capacity records (zero: the default).
func NewAudit(capacity int) *Audit {
	if capacity <= 0 {
		capacity = DefaultAuditCapacity
	}
	return &Audit{capacity: capacity, notify: make(chan struct{}, 1)}
}

func (a *Audit) add(r Record) {
	r.Host = textcut.Prefix(r.Host, maxHostBytes)
	r.Reason = textcut.Prefix(r.Reason, maxReasonBytes)
	a.mu.Lock()
	if r.Allowed {
		a.totals.Allowed++
	} else {
		a.totals.Denied++
	}
	if len(a.records) >= a.capacity {
		a.dropped++
		a.totals.Dropped++
	} else {
		a.records = append(a.records, r)
	}
	a.mu.Unlock()
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// Added is signalled after records are added (coalesced): a sender or a
// test waits on it instead of polling.
func (a *Audit) Added() <-chan struct{} { return a.notify }

// Drain takes up to max records (zero: all), oldest first, and the count
// of records dropped since the last drain.
func (a *Audit) Drain(max int) ([]Record, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.records)
	if max > 0 && max < n {
		n = max
	}
	out := append([]Record(nil), a.records[:n]...)
	a.records = append(a.records[:0], a.records[n:]...)
	d := a.dropped
	a.dropped = 0
	return out, d
}
