package store

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// ID prefixes of the Managed Agents resources.
const (
	AgentIDPrefix       = "agent_"
	EnvironmentIDPrefix = "env_"
	SessionIDPrefix     = "sesn_"
	EventIDPrefix       = "sevt_"
)

// newID returns prefix followed by 26 random base32 characters (130 bits):
// unguessable and safe in a URL path.
func newID(prefix string) string { return prefix + rand.Text() }

// NewEventID returns a fresh event id. Client events and the agent loop's
// events both take theirs from here, so every event id has one shape.
func NewEventID() string { return newID(EventIDPrefix) }

// Key is a position in a list ordered by (created_at, id): the opaque page
// cursors of the public API carry one.
type Key struct {
	CreatedAt time.Time
	ID        string
}

// TimeRange bounds created_at; nil ends are open.
type TimeRange struct {
	Gt, Gte, Lt, Lte *time.Time
}

func ts(t *time.Time) pgtype.Timestamptz {
	if t == nil {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: *t, Valid: true}
}

func fromTS(t pgtype.Timestamptz) *time.Time {
	if !t.Valid {
		return nil
	}
	v := t.Time
	return &v
}

func keyTS(k *Key) (pgtype.Timestamptz, string) {
	if k == nil {
		return pgtype.Timestamptz{}, ""
	}
	return pgtype.Timestamptz{Time: k.CreatedAt, Valid: true}, k.ID
}

// pageLimit clamps a page size and returns the number of rows to ask for: one
// more than the page, to learn whether another page follows.
func pageLimit(n int) (page int, query int32) {
	if n <= 0 {
		n = 20
	}
	if n > 1000 {
		n = 1000
	}
	return n, int32(n + 1)
}

func marshalMetadata(m map[string]string) []byte {
	if m == nil {
		m = map[string]string{}
	}
	b, _ := json.Marshal(m) // a map of strings always marshals
	return b
}

func unmarshalMetadata(b []byte) (map[string]string, error) {
	m := map[string]string{}
	if len(b) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decoding stored metadata: %w", err)
	}
	return m, nil
}

// sameJSON reports whether two JSON documents are equal as values (jsonb
// reorders keys, so bytes do not compare).
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func orEmptyJSON(b json.RawMessage, empty string) []byte {
	if len(b) == 0 {
		return []byte(empty)
	}
	return b
}
