package fleet

// A read_write memory store, after each tool step: the step may have
// changed, added or removed files in the store's directory, and those
// changes become memory versions written by the session.
//
//	Toolset.Run ── the tool ran in the sandbox ── AfterStep
//	  └─ for each read_write store this call's mount showed:
//	     ExportOutputs(memory_dir) with what the mount showed (path, size,
//	     SHA-256): the host sends only files that differ ── changes against
//	     that base (a file gone is a removal, unless the host left entries
//	     out) ── Mounts.CommitMemory: one transaction under the store's lock,
//	     each change applied only while the memory still has its base
//
// A change whose memory another writer changed meanwhile is a conflict:
// the other writer's content stays at the path and the session's is kept
// beside it (store.MemoryStores.Commit); the tool result tells the model,
// and the next call's mount shows both. What could not be read or saved
// stays in the sandbox and is tried again after the next step, since the
// next mount shows the store as it is and the files the session changed
// still differ from it. A tool call that never reached the sandbox (a
// bad input) reads nothing back.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/textcut"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Bounds of one step's read-back, per store: the store's own bounds
// (store.MaxMemoriesPerStore memories, store.MaxCommitBytes a commit).
const (
	maxMemoryFiles       = 2_000 + 100
	maxMemoryCommitBytes = 4 << 20
	maxMemoryNotes       = 10
)

var _ tools.Stepper = (*sandbox)(nil)

// AfterStep implements tools.Stepper: it commits the step's changes to
// the session's read_write stores and returns what the model must be told
// of them, and of credentials its sandbox cannot have ("" when there is
// nothing to tell).
func (s *sandbox) AfterStep(ctx context.Context) string {
	var notes []string
	for _, m := range s.memory {
		notes = append(notes, s.commitStore(ctx, m)...)
	}
	var out []string
	if s.egressNote != "" {
		out = append(out, s.egressNote)
	}
	if len(notes) > maxMemoryNotes {
		notes = append(notes[:maxMemoryNotes], fmt.Sprintf("(and %d more)", len(notes)-maxMemoryNotes))
	}
	if len(notes) > 0 {
		out = append(out, "Memory: "+strings.Join(notes, "\n"))
	}
	return strings.Join(out, "\n\n")
}

// commitStore reads one store's changes back and commits them.
func (s *sandbox) commitStore(ctx context.Context, m MemoryMount) []string {
	where := tools.Memory + "/" + m.Dir
	changes, left, err := s.memoryChanges(ctx, m)
	if err != nil {
		s.f.log.Warn("reading a session's memory writes back", "session_id", s.sessionID, "store_id", m.StoreID, "err", err)
		return []string{fmt.Sprintf("the changes in %s could not be read back this time; they stay in the sandbox and are saved after the next tool call", where)}
	}
	var notes []string
	if left != "" {
		notes = append(notes, fmt.Sprintf("some entries in %s are not memories and were left out (%s); no memory was removed this time", where, left))
	}
	if len(changes) == 0 {
		return notes
	}
	var conflicts []MemoryConflict
	for _, batch := range commitBatches(changes) {
		var cs []MemoryConflict
		if cs, err = s.f.cfg.Mounts.CommitMemory(ctx, s.sessionID, m.StoreID, batch); err != nil {
			break
		}
		conflicts = append(conflicts, cs...)
	}
	if err != nil {
		s.f.log.Warn("committing a session's memory writes", "session_id", s.sessionID, "store_id", m.StoreID, "err", err)
		msg := "they could not be saved this time; they stay in the sandbox and are saved after the next tool call"
		switch errdefs.KindOf(err) {
		case errdefs.ResourceExhaustedKind, errdefs.TooLargeKind:
			msg = "they were not saved: " + textcut.Prefix(err.Error(), 300)
		case errdefs.NotFoundKind, errdefs.FailedPreconditionKind:
			msg = "they were not saved: the memory store is archived or gone"
		}
		return append(notes, fmt.Sprintf("changes in %s: %s", where, msg))
	}
	for _, c := range conflicts {
		reason := c.Reason
		if c.KeptAt != "" { // the model knows the mount's paths, not the store's
			reason = strings.ReplaceAll(reason, " "+c.KeptAt, " "+where+c.KeptAt)
		}
		notes = append(notes, fmt.Sprintf("%s%s: %s", where, c.Path, textcut.Prefix(reason, 600)))
	}
	return notes
}

// Bounds of one commit: the store's (store.MaxCommitChanges,
// store.MaxCommitBytes). A step's changes past them are committed in
// several, each atomic by itself.
const (
	maxCommitChanges = 100
	maxCommitBytes   = 4 << 20
)

// commitBatches splits changes into commits within the store's bounds
// (one change is at most maxMemoryCommitBytes, which is maxCommitBytes).
func commitBatches(changes []MemoryChange) [][]MemoryChange {
	var out [][]MemoryChange
	var cur []MemoryChange
	size := 0
	for _, c := range changes {
		n := 0
		if c.Content != nil {
			n = len(*c.Content)
		}
		if len(cur) == maxCommitChanges || len(cur) > 0 && size+n > maxCommitBytes {
			out, cur, size = append(out, cur), nil, 0
		}
		cur, size = append(cur, c), size+n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// memoryChanges reads what the step changed in store m: its files that
// differ from what the mount showed, and, when the host left nothing out,
// the files it showed that are gone. left is why entries were left out.
func (s *sandbox) memoryChanges(ctx context.Context, m MemoryMount) (changes []MemoryChange, left string, err error) {
	base := map[string]MemoryFile{} // path beneath the store's directory
	req := &pb.ExportOutputsRequest{Key: s.sessionID, MemoryDir: m.Dir, MaxFiles: maxMemoryFiles, MaxBytes: maxMemoryCommitBytes}
	for _, f := range m.Files {
		rel, ok := strings.CutPrefix(f.Path, m.Dir+"/")
		if !ok {
			return nil, "", fmt.Errorf("memory %s is not beneath its store's directory %s", f.Path, m.Dir)
		}
		base[rel] = f
		req.Known = append(req.Known, &pb.KnownOutput{Path: rel, Size: f.Size, Sha256: f.SHA256})
	}
	seen := map[string]bool{}
	err = s.call(ctx, "reading the session's memory writes", true, func(ctx context.Context, c pb.SandboxServiceClient) error {
		changes, left, seen = nil, "", map[string]bool{}
		st, err := c.ExportOutputs(ctx, req)
		if err != nil {
			return err
		}
		in := &outputStream{st: st}
		sent := int64(0)
		for {
			msg, err := in.next()
			if err != nil {
				return err
			}
			if d := msg.GetDone(); d != nil {
				if d.Skipped > 0 {
					l := leftOut(d)
					left = fmt.Sprintf("%d: %s", l.Count, strings.Join(l.Reasons, "; "))
				}
				return nil
			}
			of := msg.GetFile()
			if of == nil {
				return fmt.Errorf("content before its file")
			}
			if err := checkOutputPath(of.Path); err != nil {
				return fmt.Errorf("the host sent %q: %v", of.Path, err)
			}
			if len(seen) >= maxMemoryFiles || !of.Unchanged && (of.Size < 0 || sent+of.Size > maxMemoryCommitBytes) {
				return fmt.Errorf("the host sent more than %d files or %d bytes", maxMemoryFiles, maxMemoryCommitBytes)
			}
			seen[of.Path] = true
			if of.Unchanged {
				if _, ok := base[of.Path]; !ok {
					return fmt.Errorf("%q unchanged, but the mount did not show it", of.Path)
				}
				continue
			}
			sent += of.Size
			body := make([]byte, 0, of.Size)
			for int64(len(body)) < of.Size {
				msg, err := in.next()
				if err != nil {
					return err
				}
				d, ok := msg.GetMsg().(*pb.ExportOutputsResponse_Data)
				if !ok || int64(len(body)+len(d.Data)) > of.Size {
					return fmt.Errorf("%q: the host sent other than its %d bytes", of.Path, of.Size)
				}
				body = append(body, d.Data...)
			}
			// Content that is not UTF-8 text is refused by the commit.
			content := string(body)
			changes = append(changes, MemoryChange{Path: "/" + of.Path, Content: &content, BaseSHA256: base[of.Path].SHA256})
		}
	})
	if err != nil {
		return nil, "", errgrpc.FromStatus(err)
	}
	if left == "" {
		for _, rel := range slices.Sorted(maps.Keys(base)) {
			if !seen[rel] {
				changes = append(changes, MemoryChange{Path: "/" + rel, BaseSHA256: base[rel].SHA256})
			}
		}
	}
	return changes, left, nil
}
