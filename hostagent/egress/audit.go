package egress

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"time"

	"corral.dev/corral/internal/textcut"
)

// Record is one egress connection as the audit trail keeps it.
type Record struct {
	// ID is unique among the host's records, across agent restarts (a
	// random prefix per Audit and a counter): the control plane stores a
	// record once per host and ID, however often it is sent.
	ID              string
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
// sandbox's proxy and emptied by whatever ships them (the host agent's
// heartbeat). When it is full new records are dropped and counted: the
// count goes out with the next shipment, so a gap is never silent.
//
// A shipper either drains (Drain: a record is gone once taken), or keeps
// records until their receiver has acknowledged them: Pending returns the
// oldest records still held and a Mark, and Ack(mark) forgets them. Until
// then every Pending returns them again, so a shipment that is lost (a
// heartbeat whose stream broke) loses nothing; the receiver dedupes by
// Record.ID. Held records count against the capacity.
type Audit struct {
	capacity int
	notify   chan struct{}
	prefix   string // of every ID

	// mu guards the fields below.
	mu sync.Mutex
	// records are held, oldest first; num[i] is records[i]'s number.
	records []Record
	num     []uint64
	next    uint64 // the number of the next record
	// dropped counts the records dropped over the Audit's life;
	// droppedAcked how many of those an acknowledged shipment told.
	dropped, droppedAcked int64
	// totals count what the Audit took over its life, for the metrics.
	totals AuditTotals
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

// Mark is where a Pending shipment ends: Ack forgets what it carried.
type Mark struct {
	num     uint64 // the last record's number (0: none)
	dropped int64  // Audit.dropped when it was taken
}

// DefaultAuditCapacity is the records a host keeps between drains.
const DefaultAuditCapacity = 4096

// NewAudit returns a queue of capacity records (zero: the default).
func NewAudit(capacity int) *Audit {
	if capacity <= 0 {
		capacity = DefaultAuditCapacity
	}
	var b [8]byte
	rand.Read(b[:])
	return &Audit{capacity: capacity, notify: make(chan struct{}, 1), prefix: hex.EncodeToString(b[:]) + "-", next: 1}
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
		r.ID = a.prefix + strconv.FormatUint(a.next, 10)
		a.records = append(a.records, r)
		a.num = append(a.num, a.next)
		a.next++
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
	a.num = append(a.num[:0], a.num[n:]...)
	d := a.dropped - a.droppedAcked
	a.droppedAcked = a.dropped
	return out, d
}

// Pending returns up to max records (zero: all) still held, oldest first,
// the count of records dropped that no acknowledged shipment told, and the
// Mark to Ack once the receiver has them. The records stay held.
func (a *Audit) Pending(max int) ([]Record, int64, Mark) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.records)
	if max > 0 && max < n {
		n = max
	}
	m := Mark{dropped: a.dropped}
	if n > 0 {
		m.num = a.num[n-1]
	}
	return append([]Record(nil), a.records[:n]...), a.dropped - a.droppedAcked, m
}

// Ack forgets the records and drops up to m. Marks may come in any order
// and more than once: what a later Mark covers includes an earlier one's.
func (a *Audit) Ack(m Mark) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for n < len(a.num) && a.num[n] <= m.num {
		n++
	}
	a.records = append(a.records[:0], a.records[n:]...)
	a.num = append(a.num[:0], a.num[n:]...)
	a.droppedAcked = max(a.droppedAcked, m.dropped)
}

// Held is the number of records held (not yet drained or acknowledged).
func (a *Audit) Held() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.records)
}
