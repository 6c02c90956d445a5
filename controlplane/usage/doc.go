// Package usage meters what tenants use, for billing: their sessions'
// model tokens and their sandboxes' seconds, running and paused. The
// record is PostgreSQL's (store.Usage, migration 00110); the admin API
// reads it back as a report (GetUsage, ExportUsage: JSON or CSV), and
// Prometheus counters follow it (corral_usage_model_tokens_total,
// corral_usage_sandbox_seconds_total).
//
// # Model tokens
//
// The agent loop names the model on each span.model_request_end; the
// store adds the request's tokens (input, output, cache reads, cache
// writes) to the session's row of that model and UTC hour in the same
// transaction that appends the request's events. That transaction is
// fenced by the session's runner epoch and its event ids are unique, so a
// retried append adds its tokens once or not at all.
//
// # Sandbox seconds
//
// Raft's placements are the truth of where a sandbox is and whether it
// runs: a placement becomes Ready when its host reports the sandbox
// usable, its State becomes paused and running again as the fleet pauses
// and resumes it, it moves (Ready again only on the new host) and goes
// away on release, eviction or the sweep of a deleted session; a host
// whose heartbeats stop past their TTL is down, and its placements count
// nothing from then on (they are placed anew, not Ready until their new
// host says so; should the host come back, they count again). The Meter
// runs on every node and acts only on the leader: at each change of its
// FSM, or of leadership (signals, no poll), it compares what the
// placements say with the intervals it holds open and writes the
// difference to PostgreSQL:
//
//	placement Ready, running   ──► interval (session, running, host) open
//	placement Ready, paused    ──► interval (session, paused, host) open
//	moved to another host      ──► closed; opened again when Ready there
//	not Ready, host down, gone ──► closed
//
// At most one interval per session is open (a unique index), and writing
// the state a session is already in changes nothing. So the leader never
// counts twice: a new leader loads the open intervals, applies what its
// own placements say, and a write the old one made before it lost the
// lead is only repeated. While no node leads, nothing is written: an
// interval stays open, and the sandbox on its host indeed keeps running
// or paused, until the next leader closes it at its own clock. A report
// closes the intervals still open at its own now.
//
// The meter is fenced by the Raft term: a leader claims the meter for its
// term (store.Usage.ClaimMeter) before it reads the open intervals, and
// every write checks the term under the same row lock, so a deposed leader
// that has not yet noticed (at most its leader lease) cannot write a state
// its stale FSM shows over the new leader's: its write is refused
// (store.ErrStaleMeter) and it lets go of what it held.
//
// The counters are accrued from the same intervals on the leader: an
// interval's seconds are added as it closes, and up to now at every
// scrape (Flush), so a counter only grows; a node that stops leading
// flushes and stops. The seconds between two leaders are in the record
// but not in either node's counters.
package usage
