package server

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
)

// Orphaned file blobs. A Files API file's content goes into the blob store
// before its row is written (an upload, an output's publish), and its blob
// is deleted after its row (a delete, a replaced output): a node that dies
// between the two, or a blob delete that fails, leaves an object no file
// names, which nothing would ever remove and which counts against no
// quota. The leader sweeps them: every orphanInterval it lists the files
// folder, and deletes each object older than orphanGrace that no file row
// of its tenant holds (checked in batches, under the tenant's row-level
// security). The grace is far longer than any upload or publish takes
// (an output's publish is bounded to 10 minutes), so content whose row is
// still to come is never taken. Other folders (snapshots, skills,
// workspaces in transit) have owners of their own that delete by prefix.
const (
	orphanInterval = time.Hour
	orphanGrace    = time.Hour
	orphanBatch    = 500
)

// orphanSweep is the leader's sweep of orphaned file blobs.
type orphanSweep struct {
	blobs    blob.Store
	files    store.Files
	isLeader func() bool
	log      *slog.Logger
}

// orphans is the node's sweep of orphaned file blobs.
func (s *Server) orphans() *orphanSweep {
	return &orphanSweep{blobs: s.blobs, files: s.store.Files(), isLeader: s.raft.IsLeader, log: s.log}
}

// run sweeps every orphanInterval while this node leads, until ctx ends.
func (o *orphanSweep) run(ctx context.Context) {
	t := time.NewTicker(orphanInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !o.isLeader() {
			continue
		}
		n, err := o.sweep(ctx, time.Now().Add(-orphanGrace))
		switch {
		case err != nil:
			o.log.Warn("sweeping orphaned file blobs", "removed", n, "err", err)
		case n > 0:
			o.log.Info("orphaned file blobs removed", "removed", n)
		}
	}
}

// sweep deletes the file blobs modified before cutoff that no file row
// holds, and returns how many it deleted.
func (o *orphanSweep) sweep(ctx context.Context, cutoff time.Time) (int, error) {
	removed := 0
	pending := map[tenant.ID][]string{}
	flush := func(t tenant.ID) error {
		keys := pending[t]
		delete(pending, t)
		if len(keys) == 0 {
			return nil
		}
		held, err := o.files.Referenced(tenant.With(ctx, t), keys)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if held[k] {
				continue
			}
			if err := o.blobs.Delete(ctx, k); err != nil {
				return err
			}
			removed++
		}
		return nil
	}
	err := o.blobs.List(ctx, "files", func(obj blob.Object) error {
		if !obj.Modified.Before(cutoff) {
			return nil
		}
		// files/<tenant>/<file id>: store.FileBlobKey.
		parts := strings.Split(obj.Key, "/")
		if len(parts) != 3 {
			return nil // not a file's: not this sweep's to judge
		}
		t := tenant.ID(parts[1])
		if t.Validate() != nil || obj.Key != store.FileBlobKey(string(t), parts[2]) {
			return nil
		}
		if pending[t] = append(pending[t], obj.Key); len(pending[t]) >= orphanBatch {
			return flush(t)
		}
		return nil
	})
	if err != nil {
		return removed, err
	}
	for _, t := range slices.Sorted(maps.Keys(pending)) {
		if err := flush(t); err != nil {
			return removed, err
		}
	}
	return removed, nil
}
