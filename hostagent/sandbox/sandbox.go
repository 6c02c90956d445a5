// Package sandbox is the host agent's durable record of each sandbox it
// holds: the driver's Ref, the spec it was made from, and where it is in its
// life on this host. Records are JSON files, one per sandbox, written
// atomically, so that after a crash (kill -9) the agent finds every sandbox
// again and attaches to it instead of making a new one.
//
// A sandbox's life on the host:
//
//	           Ensure (capacity checked)
//	(none) ─────────────────────────────▶ ready ◀──────┐
//	  ▲                                    │  │        │ Ensure (workspace
//	  │ Destroy / not placed               │  │ evict  │ restored)
//	  │ after a restart                    │  ▼        │
//	  ├────────────────────────────────────┤ evicted ──┘
//	  │                                    │ (workspace kept in the
//	  │          attach after restart      │  agent's state dir)
//	  └────────── failed ◀─────────────────┘
//	             fails
//
// A ready sandbox may also be paused (Record.Paused: checkpointed and
// stopped, its processes saved): Pause sets it, Resume or its next command
// clears it.
//
// The agent keeps a record only for a sandbox the driver has created: it
// writes the record after Create returns, and a crash in between leaves a
// sandbox without a record, which the agent's reconciliation finds through
// Driver.List on the next start.
package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
)

// State is where a sandbox is in its life on the host.
type State string

// The states.
const (
	Ready   State = "ready"
	Evicted State = "evicted"
	Failed  State = "failed"
)

// Record is what the agent persists about one sandbox.
type Record struct {
	Key   string      `json:"key"`
	Ref   driver.Ref  `json:"ref"`
	Spec  driver.Spec `json:"spec"`
	State State       `json:"state"`
	// Message says why the sandbox is failed or evicted.
	Message   string    `json:"message,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	LastUsed  time.Time `json:"last_used"`
	// Archive is the directory holding an evicted sandbox's workspace.
	Archive string `json:"archive,omitempty"`
	// Request is what the sandbox's placement reserves on the host, which
	// the agent's admission check sums; zero in a record written before
	// requests were apart from limits (Spec.Limits then count).
	Request Request `json:"request,omitzero"`
	// Paused is set on a ready sandbox that is paused (Driver.Pause): it
	// holds its disk but no CPU or memory, and resumes on its next command.
	Paused bool `json:"paused,omitempty"`
	// PausedDiskBytes is the host disk a paused sandbox holds, measured
	// when it was paused (driver.DiskMeter): its disk reservation until it
	// resumes, since it cannot grow meanwhile. 0: not measured, and its
	// whole disk request counts.
	PausedDiskBytes int64 `json:"paused_disk_bytes,omitempty"`
	// Tenant is the tenant whose session the sandbox serves, from its
	// ensure: pressure relief orders sandboxes by it. Empty in a record
	// written before it was sent (such sandboxes count as one tenant's).
	Tenant string `json:"tenant,omitempty"`
	// AllowedHosts is the sandbox's egress allowlist, from its ensure:
	// with any entry Spec.NetworkNamespace is its egress network, whose
	// proxy the agent starts again after a restart.
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
}

// Request is an amount of CPU, memory and disk a sandbox's placement
// reserves (its limits are in Spec.Limits).
type Request struct {
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"`
}

// Store keeps records as files under a directory.
type Store struct{ dir string }

// OpenStore returns the store in dir, creating it (0700).
func OpenStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating sandbox record directory: %w", err)
	}
	return &Store{dir: dir}, nil
}

// fileName is a record's file name: keys are chosen by the control plane,
// so they are hashed rather than trusted as path elements.
func fileName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:12]) + ".json"
}

// Put writes r, replacing any earlier record for its key (mode 0600: the
// spec's environment may carry credentials).
func (s *Store) Put(r Record) error {
	if r.Key == "" {
		return errdefs.InvalidArgument("sandbox record without a key")
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := hostpki.WriteFileAtomic(filepath.Join(s.dir, fileName(r.Key)), b, 0o600); err != nil {
		return fmt.Errorf("saving sandbox record %s: %w", r.Key, err)
	}
	return nil
}

// Delete removes the record for key; a missing record is not an error.
func (s *Store) Delete(key string) error {
	err := os.Remove(filepath.Join(s.dir, fileName(key)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing sandbox record %s: %w", key, err)
	}
	return nil
}

// List returns every record, by key. A file that does not parse is an error:
// the agent must not silently forget a sandbox.
func (s *Store) List() ([]Record, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			return nil, err
		}
		var r Record
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("sandbox record %s: %w", e.Name(), err)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ArchiveDir is where the workspace of the sandbox for key is kept while it
// is evicted, under base.
func ArchiveDir(base, key string) string {
	return filepath.Join(base, strings.TrimSuffix(fileName(key), ".json"))
}
