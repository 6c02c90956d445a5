package publicapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
)

// The work queue of self-hosted environments, as the SDKs' environment
// workers speak it: a worker polls for an item (a session whose built-in
// tools it runs), acks it, keeps its lease with heartbeats (each names the
// last one's token, and a mismatch is a 412: another worker holds the
// item), serves the session's tool calls through the events routes, and
// stops the item when done. Items are queued when a self-hosted session is
// created and when new input reaches one with no live item (store.Work).
//
// An environment key (auth.Principal.EnvironmentID) reaches only its own
// environment's queue: another environment's is a 404, as it is to another
// tenant.

// Bounds of the work routes.
const (
	// maxPollBlock caps block_ms, as the API does: a worker polls again
	// at once, so a long poll never holds a connection long.
	maxPollBlock = 999 * time.Millisecond
	// defaultReclaim is how long a polled item waits for its ack before
	// the next poll hands it out again (reclaim_older_than_ms omitted).
	defaultReclaim = 5 * time.Second
	maxReclaimMs   = 24 * 60 * 60 * 1000
	maxWorkerID    = 256
	maxHeartbeatID = 128
	maxDesiredTTL  = 3600
	// DefaultWorkLeaseTTL is a lease's length without desired_ttl_seconds.
	DefaultWorkLeaseTTL = 120 * time.Second
)

// workResponse is the wire form of a work item.
type workResponse struct {
	Type              string            `json:"type"`
	ID                string            `json:"id"`
	EnvironmentID     string            `json:"environment_id"`
	State             string            `json:"state"`
	Data              workData          `json:"data"`
	Metadata          map[string]string `json:"metadata"`
	Secret            *string           `json:"secret"`
	CreatedAt         string            `json:"created_at"`
	AcknowledgedAt    *string           `json:"acknowledged_at"`
	StartedAt         *string           `json:"started_at"`
	LatestHeartbeatAt *string           `json:"latest_heartbeat_at"`
	StopRequestedAt   *string           `json:"stop_requested_at"`
	StoppedAt         *string           `json:"stopped_at"`
}

type workData struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

func workOut(it store.WorkItem) workResponse {
	opt := func(t *time.Time) *string {
		if t == nil {
			return nil
		}
		s := ts(*t)
		return &s
	}
	md := it.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return workResponse{
		Type: "work", ID: it.ID, EnvironmentID: it.EnvironmentID, State: it.State,
		Data: workData{Type: "session", ID: it.SessionID}, Metadata: md, CreatedAt: ts(it.CreatedAt),
		AcknowledgedAt: opt(it.AcknowledgedAt), StartedAt: opt(it.StartedAt), LatestHeartbeatAt: opt(it.LatestHeartbeat),
		StopRequestedAt: opt(it.StopRequestedAt), StoppedAt: opt(it.StoppedAt),
	}
}

// workEnvironment returns the self-hosted environment of the request's
// path, which the principal may reach: an environment key only its own
// (another is not found, as another tenant's is).
func (h *Handler) workEnvironment(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if p, _ := auth.From(r.Context()); p.EnvironmentID != "" && p.EnvironmentID != id {
		return "", errdefs.NotFound("environment %s not found", id)
	}
	env, err := h.store.Environments().Get(r.Context(), id)
	if err != nil {
		return "", err
	}
	if !selfHosted(env.Config) {
		return "", errdefs.InvalidArgument("environment %s is a cloud environment: only self_hosted environments have a work queue", id)
	}
	return id, nil
}

// queryMillis reads an integer parameter of milliseconds from 1 to max;
// absent is 0.
func queryMillis(r *http.Request, name string, max int64) (time.Duration, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > max {
		return 0, errdefs.InvalidArgument("%s: %q is not an integer from 1 to %d", name, truncate(s), max)
	}
	return time.Duration(n) * time.Millisecond, nil
}

func (h *Handler) pollWork(w http.ResponseWriter, r *http.Request) {
	envID, err := h.workEnvironment(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// block_ms is 1 to 999 by the API's words; more is held to the cap
	// rather than refused, as the API caps it.
	block, err := queryMillis(r, "block_ms", 1<<31)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	block = min(block, maxPollBlock)
	reclaim, err := queryMillis(r, "reclaim_older_than_ms", maxReclaimMs)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if reclaim == 0 {
		reclaim = defaultReclaim
	}
	worker := r.Header.Get("Anthropic-Worker-ID")
	if len(worker) > maxWorkerID || strings.IndexFunc(worker, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
		h.fail(w, r, errdefs.InvalidArgument("Anthropic-Worker-ID: want at most %d printable ASCII characters", maxWorkerID))
		return
	}
	it, err := h.store.Work().Poll(r.Context(), envID, worker, block, reclaim)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if it == nil {
		// An empty queue is a JSON null: the SDKs read it as no work.
		writeJSON(w, http.StatusOK, nil)
		return
	}
	writeJSON(w, http.StatusOK, workOut(*it))
}

// workItem is the work item of the request's path, in an environment the
// principal may reach.
func (h *Handler) workItem(r *http.Request) (envID, workID string, err error) {
	if envID, err = h.workEnvironment(r); err != nil {
		return "", "", err
	}
	return envID, r.PathValue("work_id"), nil
}

func (h *Handler) getWork(w http.ResponseWriter, r *http.Request) {
	envID, id, err := h.workItem(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	it, err := h.store.Work().Get(r.Context(), envID, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, workOut(it))
}

func (h *Handler) ackWork(w http.ResponseWriter, r *http.Request) {
	envID, id, err := h.workItem(r)
	if err == nil {
		err = emptyBody(w, r)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	it, err := h.store.Work().Ack(r.Context(), envID, id, h.workLease)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, workOut(it))
}

// emptyBody refuses a body that holds anything but an empty object.
func emptyBody(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(w, r)
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return err
	}
	var none struct{}
	return decodeObject(b, "request body", &none)
}

// heartbeatResponse is the wire form of a lease after a heartbeat.
type heartbeatResponse struct {
	Type          string `json:"type"`
	LastHeartbeat string `json:"last_heartbeat"`
	LeaseExtended bool   `json:"lease_extended"`
	State         string `json:"state"`
	TTLSeconds    int64  `json:"ttl_seconds"`
}

func (h *Handler) heartbeatWork(w http.ResponseWriter, r *http.Request) {
	envID, id, err := h.workItem(r)
	if err == nil {
		err = emptyBody(w, r)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	expected := q.Get("expected_last_heartbeat")
	if expected == "" || len(expected) > maxHeartbeatID {
		h.fail(w, r, errdefs.InvalidArgument("expected_last_heartbeat is required: %q for a lease's first heartbeat, then the last_heartbeat the previous one returned (at most %d bytes)", store.NoHeartbeat, maxHeartbeatID))
		return
	}
	ttl := h.workLease
	if s := q.Get("desired_ttl_seconds"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxDesiredTTL {
			h.fail(w, r, errdefs.InvalidArgument("desired_ttl_seconds: %q is not an integer from 1 to %d", truncate(s), maxDesiredTTL))
			return
		}
		ttl = time.Duration(n) * time.Second
	}
	lease, err := h.store.Work().Heartbeat(r.Context(), envID, id, expected, ttl)
	var lost *store.LeaseLostError
	if errors.As(err, &lost) {
		writeLeaseLost(w, r, lost)
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, heartbeatResponse{
		Type: "work_heartbeat", LastHeartbeat: lease.LastHeartbeat, LeaseExtended: lease.Extended,
		State: lease.State, TTLSeconds: int64(lease.TTL / time.Second),
	})
}

// writeLeaseLost answers a heartbeat whose expected_last_heartbeat is not
// the item's with 412 and the lease as the server has it, as the API does.
func writeLeaseLost(w http.ResponseWriter, r *http.Request, lost *store.LeaseLostError) {
	var last *string
	if lost.Current.LastHeartbeat != "" {
		last = &lost.Current.LastHeartbeat
	}
	body := map[string]any{
		"type": "error",
		"error": map[string]any{
			"type":    "invalid_request_error",
			"message": truncate(lost.Error()),
			"details": map[string]any{
				"error_code":       "heartbeat_precondition_failed",
				"error_visibility": "user_facing",
				"current_state": map[string]any{
					"state": lost.Current.State, "last_heartbeat": last, "lease_updated_at": nil,
					"lease_extended": false, "ttl_seconds": int64(lost.Current.TTL / time.Second),
				},
			},
		},
		"request_id": api.RequestID(r.Context()),
	}
	w.Header().Set("x-should-retry", "false")
	writeJSON(w, http.StatusPreconditionFailed, body)
}

func (h *Handler) stopWork(w http.ResponseWriter, r *http.Request) {
	envID, id, err := h.workItem(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var in struct {
		Force *bool `json:"force"`
	}
	if len(strings.TrimSpace(string(b))) > 0 {
		if err := decodeObject(b, "request body", &in); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	it, err := h.store.Work().Stop(r.Context(), envID, id, in.Force != nil && *in.Force)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, workOut(it))
}

func (h *Handler) updateWork(w http.ResponseWriter, r *http.Request) {
	envID, id, err := h.workItem(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var in struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := decodeObject(b, "request body", &in); err != nil {
		h.fail(w, r, err)
		return
	}
	if !present(in.Metadata) || isNull(in.Metadata) {
		h.fail(w, r, errdefs.InvalidArgument("metadata is required: an object whose string values upsert and null values delete"))
		return
	}
	var patch map[string]*string
	if err := field(in.Metadata, "metadata", &patch); err != nil {
		h.fail(w, r, err)
		return
	}
	check := map[string]string{}
	for k, v := range patch {
		if v != nil {
			check[k] = *v
		} else {
			check[k] = ""
		}
	}
	if err := checkMetadata(check); err != nil {
		h.fail(w, r, err)
		return
	}
	it, err := h.store.Work().SetMetadata(r.Context(), envID, id, patch, maxMetadataPairs)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, workOut(it))
}

func (h *Handler) listWork(w http.ResponseWriter, r *http.Request) {
	envID, err := h.workEnvironment(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	limit, err := queryLimit(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	list := "work:" + envID
	c, err := decodeCursor(q, list, "desc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var after *store.Key
	if c != nil {
		after = c.key()
	}
	items, more, err := h.store.Work().List(r.Context(), envID, limit, after)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := struct {
		Data     []workResponse `json:"data"`
		NextPage *string        `json:"next_page"`
	}{Data: []workResponse{}}
	for _, it := range items {
		out.Data = append(out.Data, workOut(it))
	}
	if more {
		last := items[len(items)-1]
		out.NextPage = keyCursor(list, "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) workStats(w http.ResponseWriter, r *http.Request) {
	envID, err := h.workEnvironment(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, err := h.store.Work().Stats(r.Context(), envID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var oldest *string
	if st.OldestQueuedAt != nil {
		s := ts(*st.OldestQueuedAt)
		oldest = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"type": "work_queue_stats", "depth": st.Depth, "pending": st.Pending,
		"oldest_queued_at": oldest, "workers_polling": st.WorkersPolling,
	})
}
