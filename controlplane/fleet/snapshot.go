package fleet

// Workspace snapshots: a session's workspace is never lost beyond its last
// turn. After every turn that may have changed it (a command ran, a file
// was written) and, while a command runs, every SnapshotInterval, the fleet
// has the host export the workspace into the blob store: the first time
// whole, then as increments (the files whose ctime is at or after the last
// snapshot's taken_at, on the host's own clock; the others listed without
// content, so deletions show). A chain belongs to one sandbox and is at
// most maxIncrements long: then, or on another sandbox, the next snapshot
// is whole and the older ones go.
//
// A session whose sandbox is placed anew with an empty workspace (its host
// was lost, it was evicted, a drain moved it without its files) gets the
// chain composed into one archive, newest content first, imported before
// its first tool call; that call's result says what was restored and from
// when. The composed archive is kept as the new sandbox's first snapshot.

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Snapshot is one workspace snapshot of a session in the blob store.
type Snapshot struct {
	Seq     int64
	BlobKey string
	// Full: a whole copy; else an increment over the one before.
	Full bool
	// Origin says what took it (the Origin constants).
	Origin string
	// HostID and SandboxID are the sandbox it was taken of.
	HostID, SandboxID string
	// TakenAt is the host's clock when its listing began: the next
	// increment's since.
	TakenAt time.Time
	// Files and Bytes count the regular files whose content it holds.
	Files, Bytes int64
	// CreatedAt is when it was recorded (the store's clock).
	CreatedAt time.Time
}

// Snapshots records the sessions' workspace snapshots (PostgreSQL; ctx
// carries the session's tenant).
type Snapshots interface {
	// List returns the session's snapshots, oldest first.
	List(ctx context.Context, sessionID string) ([]Snapshot, error)
	Add(ctx context.Context, sessionID string, s Snapshot) error
	// DropBefore forgets the session's snapshots older than seq.
	DropBefore(ctx context.Context, sessionID string, seq int64) error
}

// The origins of snapshots.
const (
	OriginTurn     = "turn"     // the end of a turn that changed the workspace
	OriginRunning  = "running"  // a long command, every SnapshotInterval
	OriginEvicted  = "evicted"  // what the host kept of a sandbox it evicted under pressure
	OriginReleased = "released" // the workspace of a sandbox an operator or a drain's deadline evicted
	OriginRestored = "restored" // a restore's composed copy
)

// Bounds of snapshots.
const (
	// maxIncrements bounds a chain: a restore reads every snapshot of it.
	maxIncrements = 8
	// maxSnapshotEntries bounds the files a restore composes (it keeps
	// their names in memory).
	maxSnapshotEntries = 1_000_000
	// snapshotTimeout bounds one snapshot or restore.
	snapshotTimeout = 10 * time.Minute
	// turnSnapshotWait is how long a turn's end waits for its snapshot;
	// turnSnapshotTimeout bounds that snapshot.
	turnSnapshotWait    = 5 * time.Second
	turnSnapshotTimeout = 10 * time.Minute
)

// The PAX records of entries without content (the host agent's export
// writes them): an increment's file whose content is in an earlier
// snapshot, and a file left out for the snapshot's budget.
const (
	// UnchangedRecord "list": the entry's content is the NUL-separated
	// names of files whose content is in an earlier snapshot ("1", on an
	// entry of its own name with no content, says the same of one file).
	UnchangedRecord = "CORRAL.unchanged"
	SkippedRecord   = "CORRAL.skipped"
)

// maxUnchangedList bounds one list entry of unchanged names (the host
// writes at most 256 KiB and a name).
const maxUnchangedList = 1 << 20

// snapshotPrefix is the blob folder of a session's snapshots.
func snapshotPrefix(sessionID string) string {
	sum := sha256.Sum256([]byte(sessionID))
	return "snapshots/" + hex.EncodeToString(sum[:12])
}

func snapshotKey(sessionID string, seq int64) string {
	return snapshotPrefix(sessionID) + "/" + strconv.FormatInt(seq, 10) + ".tar"
}

// snapshotter is the fleet's snapshot state on this node.
type snapshotter struct {
	mu sync.Mutex
	// changed are the sessions whose workspace may have changed since
	// their last snapshot on this node.
	changed map[string]bool
	// locks serialise one session's snapshots and restores.
	locks map[string]*sync.Mutex
	// queued are the turns' snapshots waiting for their session's lock.
	queued map[string]chan struct{}
}

func (s *snapshotter) lock(sessionID string) func() {
	s.mu.Lock()
	if s.locks == nil {
		s.locks = map[string]*sync.Mutex{}
	}
	l := s.locks[sessionID]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[sessionID] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// markChanged notes that the session's workspace may have changed.
func (f *Fleet) markChanged(sessionID string) {
	f.snaps.mu.Lock()
	if f.snaps.changed == nil {
		f.snaps.changed = map[string]bool{}
	}
	f.snaps.changed[sessionID] = true
	f.snaps.mu.Unlock()
}

// takeChanged reports, and clears, whether the session's workspace may
// have changed.
func (f *Fleet) takeChanged(sessionID string) bool {
	f.snaps.mu.Lock()
	defer f.snaps.mu.Unlock()
	ok := f.snaps.changed[sessionID]
	delete(f.snaps.changed, sessionID)
	return ok
}

// SnapshotIfChanged snapshots the session's workspace if a tool call on
// this node may have changed it since the last snapshot: the end of a
// turn (ctx carries the session's tenant). It waits for the snapshot at
// most turnSnapshotWait, so that the turn ends with its files kept; a
// bigger workspace's snapshot goes on after the turn has ended (the
// session's next snapshot or restore waits for it). A failure is logged
// and the workspace stays marked, for the next turn.
func (f *Fleet) SnapshotIfChanged(ctx context.Context, sessionID string) {
	if f.cfg.Snapshots == nil || !f.takeChanged(sessionID) {
		return
	}
	done := f.queueSnapshot(ctx, sessionID)
	t := time.NewTimer(turnSnapshotWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		f.log.Info("a workspace snapshot outlasts its turn; it goes on after the turn", "session_id", sessionID, "waited", turnSnapshotWait)
	}
}

// queueSnapshot starts a turn's snapshot of the session, or joins the one
// already waiting for the session's lock (it has not listed the workspace
// yet, so it takes this turn's changes too): however many turns end while
// a big snapshot runs, at most one more waits behind it. The returned
// channel is closed when that snapshot is over.
func (f *Fleet) queueSnapshot(ctx context.Context, sessionID string) <-chan struct{} {
	f.snaps.mu.Lock()
	defer f.snaps.mu.Unlock()
	if f.snaps.queued == nil {
		f.snaps.queued = map[string]chan struct{}{}
	}
	if done, ok := f.snaps.queued[sessionID]; ok {
		return done
	}
	done := make(chan struct{})
	f.snaps.queued[sessionID] = done
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), turnSnapshotTimeout)
	stop := context.AfterFunc(f.ctx, cancel) // the fleet closing ends it
	go func() {
		defer close(done)
		defer stop()
		defer cancel()
		_, err := f.snapshot(ctx, sessionID, OriginTurn, func() {
			f.snaps.mu.Lock()
			delete(f.snaps.queued, sessionID) // it lists from now on: later changes need another
			f.snaps.mu.Unlock()
		})
		if err != nil {
			f.markChanged(sessionID)
			f.log.Warn("snapshotting a session's workspace (tried again after its next turn)", "session_id", sessionID, "err", err)
		}
	}()
	return done
}

// Snapshot exports the session's workspace into the blob store, as an
// increment of its sandbox's chain or whole, and records it.
func (f *Fleet) Snapshot(ctx context.Context, sessionID, origin string) (Snapshot, error) {
	return f.snapshot(ctx, sessionID, origin, func() {})
}

// snapshot is Snapshot; locked is called once it holds the session's
// lock, before it lists anything.
func (f *Fleet) snapshot(ctx context.Context, sessionID, origin string, locked func()) (Snapshot, error) {
	if f.cfg.Snapshots == nil || f.cfg.Blobs == nil {
		return Snapshot{}, errdefs.FailedPrecondition("workspace snapshots need a blob store and a snapshot record")
	}
	if _, err := tenant.Required(ctx); err != nil {
		return Snapshot{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	defer f.snaps.lock(sessionID)()
	locked()
	p, _, ok := f.placement(sessionID)
	if !ok || !p.Ready {
		return Snapshot{}, errdefs.FailedPrecondition("session %s has no ready sandbox to snapshot", sessionID)
	}
	return f.take(ctx, p, origin, false)
}

// take exports the workspace of p's sandbox (or what its host kept of an
// evicted one) into the blob store and records it as the session's
// newest snapshot: an increment of its chain where the chain is this
// sandbox's and not too long, unless whole. The caller holds the
// session's lock.
func (f *Fleet) take(ctx context.Context, p scheduler.Placement, origin string, whole bool) (Snapshot, error) {
	chain, err := f.cfg.Snapshots.List(ctx, p.SessionID)
	if err != nil {
		return Snapshot{}, err
	}
	next := Snapshot{Seq: 1, Full: true, Origin: origin, HostID: p.HostID, SandboxID: p.SandboxID}
	var since *timestamppb.Timestamp
	if n := len(chain); n > 0 {
		last := chain[n-1]
		next.Seq = last.Seq + 1
		if !whole && last.HostID == p.HostID && last.SandboxID == p.SandboxID && increments(chain) < maxIncrements {
			next.Full = false
			since = timestamppb.New(last.TakenAt)
		}
	}
	next.BlobKey = snapshotKey(p.SessionID, next.Seq)
	info, err := f.export(ctx, p.HostID, &pb.ExportWorkspaceRequest{Key: p.SessionID, Since: since, MaxBytes: snapshotBudget(p)}, next.BlobKey)
	if err != nil {
		_ = f.cfg.Blobs.Delete(context.WithoutCancel(ctx), next.BlobKey)
		return Snapshot{}, fmt.Errorf("snapshotting the workspace of %s on %s: %w", p.SessionID, p.HostID, err)
	}
	next.TakenAt, next.Files, next.Bytes = info.takenAt, info.files, info.bytes
	if info.skipped > 0 {
		f.log.Warn("files too large for the workspace snapshot were left out", "session_id", p.SessionID, "skipped", info.skipped, "budget", snapshotBudget(p))
	}
	if err := f.record(ctx, p.SessionID, next, chain); err != nil {
		return Snapshot{}, err
	}
	f.log.Debug("workspace snapshot", "session_id", p.SessionID, "seq", next.Seq, "full", next.Full, "origin", origin, "files", next.Files, "bytes", next.Bytes)
	return next, nil
}

// defaultSnapshotBudget bounds a snapshot's content where the sandbox has
// no disk limit.
const defaultSnapshotBudget = 4 << 30

// snapshotBudget is the content a snapshot of p's workspace may hold: its
// disk limit (a sparse file can claim more than the disk holds).
func snapshotBudget(p scheduler.Placement) int64 {
	if d := p.LimitsOrRequest().DiskMiB; d > 0 {
		return d << 20
	}
	return defaultSnapshotBudget
}

// increments counts the snapshots after the chain's last whole one.
func increments(chain []Snapshot) int {
	n := 0
	for i := len(chain) - 1; i >= 0 && !chain[i].Full; i-- {
		n++
	}
	return n
}

// record adds s to the session's chain; a whole snapshot ends the chain
// before it, whose blobs go.
func (f *Fleet) record(ctx context.Context, sessionID string, s Snapshot, chain []Snapshot) error {
	if err := f.cfg.Snapshots.Add(ctx, sessionID, s); err != nil {
		_ = f.cfg.Blobs.Delete(context.WithoutCancel(ctx), s.BlobKey)
		return err
	}
	if !s.Full || len(chain) == 0 {
		return nil
	}
	if err := f.cfg.Snapshots.DropBefore(ctx, sessionID, s.Seq); err != nil {
		f.log.Warn("forgetting a session's older snapshots", "session_id", sessionID, "err", err)
		return nil // the chain still starts at s; the old rows are only clutter
	}
	for _, old := range chain {
		if err := f.cfg.Blobs.Delete(ctx, old.BlobKey); err != nil {
			f.log.Warn("removing an older snapshot", "blob", old.BlobKey, "err", err)
		}
	}
	return nil
}

// exportInfo is what a host says of an export.
type exportInfo struct {
	takenAt               time.Time
	files, bytes, skipped int64
}

// export streams a sandbox's workspace from its host into the blob store
// under key (a snapshot, or a drain's workspace).
func (f *Fleet) export(ctx context.Context, hostID string, req *pb.ExportWorkspaceRequest, key string) (exportInfo, error) {
	var info exportInfo
	c, err := f.hostClient(hostID)
	if err != nil {
		return info, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ExportWorkspace(ctx, req)
	if err != nil {
		return info, errgrpc.FromStatus(err)
	}
	err = f.cfg.Blobs.Put(ctx, key, &chunkReader{recv: func() ([]byte, error) {
		m, err := st.Recv()
		if err != nil && !errors.Is(err, io.EOF) {
			err = errgrpc.FromStatus(err)
		}
		if t := m.GetTakenAt(); t != nil {
			info.takenAt = t.AsTime()
		}
		if m.GetFiles() != 0 || m.GetBytes() != 0 || m.GetSkipped() != 0 {
			info.files, info.bytes, info.skipped = m.GetFiles(), m.GetBytes(), m.GetSkipped()
		}
		return m.GetData(), err
	}})
	// A host that does not say when it took it (an older agent) leaves
	// takenAt zero: the next increment over it is then whole.
	return info, err
}

// Restored is what a restore brought back into a new sandbox.
type Restored struct {
	// From is the newest snapshot restored.
	From Snapshot
	// Files and Bytes are the regular files written; Missing counts the
	// files of the snapshot whose content no snapshot held.
	Files, Bytes, Missing int64
}

// restore brings the session's last snapshot into its new sandbox p,
// when p is not the sandbox the chain was taken of, no drain moved the
// workspace with it, and its workspace is empty; nil: nothing to do.
func (f *Fleet) restore(ctx context.Context, sessionID string, p scheduler.Placement, c pb.SandboxServiceClient) (*Restored, error) {
	if f.cfg.Snapshots == nil || f.cfg.Blobs == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	defer f.snaps.lock(sessionID)()
	chain, err := f.cfg.Snapshots.List(ctx, sessionID)
	if err != nil || len(chain) == 0 {
		return nil, err
	}
	last := chain[len(chain)-1]
	if last.HostID == p.HostID && last.SandboxID == p.SandboxID || p.Moved == scheduler.MovedLive || p.Moved == scheduler.MovedWorkspace {
		return nil, nil // its own chain, or a drain brought its workspace (even an empty one)
	}
	ls, err := c.ListFiles(ctx, &pb.ListFilesRequest{Key: sessionID})
	if err != nil {
		return nil, errgrpc.FromStatus(err)
	}
	if len(ls.GetFiles()) > 0 {
		return nil, nil
	}
	key := snapshotKey(sessionID, last.Seq+1)
	r := &Restored{From: last}
	pr, pw := io.Pipe()
	go func() {
		files, bytes, missing, err := f.compose(ctx, chain, pw)
		r.Files, r.Bytes, r.Missing = files, bytes, missing
		pw.CloseWithError(err)
	}()
	if err := f.cfg.Blobs.Put(ctx, key, pr); err != nil {
		pr.CloseWithError(err)
		return nil, fmt.Errorf("composing the snapshots of %s: %w", sessionID, err)
	}
	done, err := f.importSnapshot(ctx, p.HostID, sessionID, key)
	if err != nil {
		_ = f.cfg.Blobs.Delete(context.WithoutCancel(ctx), key)
		return nil, fmt.Errorf("restoring the workspace of %s on %s: %w", sessionID, p.HostID, err)
	}
	base := Snapshot{Seq: last.Seq + 1, BlobKey: key, Full: true, Origin: OriginRestored, HostID: p.HostID, SandboxID: p.SandboxID,
		TakenAt: done, Files: r.Files, Bytes: r.Bytes}
	if err := f.record(ctx, sessionID, base, chain); err != nil {
		f.log.Warn("recording a restored workspace as its sandbox's first snapshot", "session_id", sessionID, "err", err)
	}
	f.log.Info("workspace restored from its snapshot", "session_id", sessionID, "host_id", p.HostID,
		"snapshot", last.Seq, "taken", last.CreatedAt, "files", r.Files, "bytes", r.Bytes, "missing", r.Missing)
	return r, nil
}

// compose writes the chain as one plain archive: each file of the newest
// snapshot with the newest content any snapshot of the chain holds for it.
// It reads each snapshot once, newest first, keeping the names still
// wanted.
func (f *Fleet) compose(ctx context.Context, chain []Snapshot, w io.Writer) (files, bytes, missing int64, err error) {
	start := len(chain) - 1
	for start > 0 && !chain[start].Full {
		start--
	}
	tw := tar.NewWriter(w)
	want := map[string]struct{}{} // the newest snapshot's files whose content is older
	var left int64                // the newest snapshot's files left out for its budget
	for i := len(chain) - 1; i >= start; i-- {
		newest := i == len(chain)-1
		err := f.readSnapshot(ctx, chain[i].BlobKey, func(hdr *tar.Header, r io.Reader) error {
			_, unchanged := hdr.PAXRecords[UnchangedRecord]
			_, skipped := hdr.PAXRecords[SkippedRecord]
			switch {
			case skipped && newest:
				left++
				return nil
			case skipped:
				return nil // a newer snapshot names the file, or it is gone
			case hdr.Typeflag == tar.TypeDir && newest:
				return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: hdr.Name, Mode: hdr.Mode, ModTime: hdr.ModTime})
			case hdr.Typeflag != tar.TypeReg:
				return nil
			case newest && unchanged:
				names := []string{hdr.Name}
				if hdr.PAXRecords[UnchangedRecord] == "list" {
					if hdr.Size > maxUnchangedList {
						return errdefs.TooLarge("a list of unchanged files of %d bytes", hdr.Size)
					}
					b, err := io.ReadAll(io.LimitReader(r, maxUnchangedList))
					if err != nil {
						return err
					}
					names = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
				}
				for _, n := range names {
					if len(want) >= maxSnapshotEntries {
						return errdefs.TooLarge("the workspace has more than %d files", maxSnapshotEntries)
					}
					want[n] = struct{}{} // its mode and time come with its content: changing them changes its ctime
				}
				return nil
			case unchanged:
				return nil
			case !newest:
				if _, ok := want[hdr.Name]; !ok {
					return nil // gone, or newer content already written
				}
				delete(want, hdr.Name)
				hdr = &tar.Header{Typeflag: tar.TypeReg, Name: hdr.Name, Mode: hdr.Mode, ModTime: hdr.ModTime, Size: hdr.Size}
			default:
				hdr = &tar.Header{Typeflag: tar.TypeReg, Name: hdr.Name, Mode: hdr.Mode, ModTime: hdr.ModTime, Size: hdr.Size}
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			n, err := io.Copy(tw, r)
			files++
			bytes += n
			return err
		})
		if err != nil {
			return files, bytes, 0, fmt.Errorf("reading snapshot %d: %w", chain[i].Seq, err)
		}
		if len(want) == 0 && !newest {
			break
		}
	}
	return files, bytes, int64(len(want)) + left, tw.Close()
}

// readSnapshot calls fn with each entry of the snapshot under key.
func (f *Fleet) readSnapshot(ctx context.Context, key string, fn func(hdr *tar.Header, r io.Reader) error) error {
	rc, err := f.cfg.Blobs.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(hdr, tr); err != nil {
			return err
		}
	}
}

// importSnapshot streams the blob under key into the session's workspace
// on hostID (a snapshot, or a drain's workspace) and returns the host's
// clock once it was written.
func (f *Fleet) importSnapshot(ctx context.Context, hostID, sessionID, key string) (time.Time, error) {
	c, err := f.hostClient(hostID)
	if err != nil {
		return time.Time{}, err
	}
	rc, err := f.cfg.Blobs.Get(ctx, key)
	if err != nil {
		return time.Time{}, err
	}
	defer rc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ImportWorkspace(ctx)
	if err != nil {
		return time.Time{}, errgrpc.FromStatus(err)
	}
	if err := st.Send(&pb.ImportWorkspaceRequest{Key: sessionID}); err != nil && !errors.Is(err, io.EOF) {
		return time.Time{}, errgrpc.FromStatus(err)
	}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := rc.Read(buf)
		if n > 0 {
			if err := st.Send(&pb.ImportWorkspaceRequest{Data: buf[:n]}); err != nil {
				break // the server ended the call; CloseAndRecv says why
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return time.Time{}, rerr
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return time.Time{}, errgrpc.FromStatus(err)
	}
	if resp.GetDoneAt() == nil {
		return time.Time{}, nil // an older agent: the next increment is whole
	}
	return resp.DoneAt.AsTime(), nil
}

// restoredNotice is the note the first tool result after a restore
// starts with.
func restoredNotice(r *Restored, lost bool) string {
	why := "its previous sandbox was moved without its files"
	switch {
	case lost:
		why = "its previous sandbox was lost with its host"
	case r.From.Origin == OriginEvicted:
		why = "its previous sandbox was evicted from its host, which was short of memory or disk"
	case r.From.Origin == OriginReleased:
		why = "its previous sandbox was evicted from its host by an operator or at the end of a drain"
	}
	msg := fmt.Sprintf("Note: this session's sandbox was replaced by a new one (%s). Its workspace was restored from the snapshot taken at %s (%d files, %d bytes); changes made after that are gone, no process of the old sandbox is running, and the shell starts again in /workspace.",
		why, r.From.CreatedAt.UTC().Format(time.RFC3339), r.Files, r.Bytes)
	if r.Missing > 0 {
		msg += fmt.Sprintf(" %d files could not be restored: they were too large for the snapshot (its budget is the workspace's disk limit).", r.Missing)
	}
	return msg
}

// ReleaseEvicted releases the placement of a sandbox its host evicted
// (hosts.Config.OnEvicted, on the leader): first the workspace the host
// kept is taken as the session's snapshot, so nothing of it is lost; the
// session's next tool call gets a new sandbox with it.
func (f *Fleet) ReleaseEvicted(ctx context.Context, hostID, sessionID string) {
	p, _, ok := f.placement(sessionID)
	if !ok || p.HostID != hostID {
		return
	}
	f.keepBeforeRelease(ctx, p, OriginEvicted)
	if _, err := f.Release(ctx, sessionID); err != nil && !errdefs.IsNotFound(err) {
		f.log.Warn("releasing an evicted sandbox's placement (tried again at the host's next report)", "session_id", sessionID, "err", err)
		return
	}
	f.log.Info("evicted sandbox released", "session_id", sessionID, "host_id", hostID)
}

// keepBeforeRelease takes the workspace of a sandbox about to be released
// (evicted) as the session's newest snapshot, whole, at most
// releaseSnapshotTimeout; a failure is logged and the last snapshot
// stands.
func (f *Fleet) keepBeforeRelease(ctx context.Context, p scheduler.Placement, origin string) {
	if f.cfg.Snapshots == nil || f.cfg.Blobs == nil || p.Tenant == "" || !strings.HasPrefix(p.SessionID, SessionIDPrefix) {
		return
	}
	ctx, cancel := context.WithTimeout(tenant.With(ctx, tenant.ID(p.Tenant)), releaseSnapshotTimeout)
	defer cancel()
	if err := f.snapshotWhole(ctx, p, origin); err != nil {
		f.log.Warn("keeping an evicted sandbox's workspace; its last snapshot stands", "session_id", p.SessionID, "host_id", p.HostID, "err", err)
	}
}

// releaseSnapshotTimeout bounds the snapshot taken before an eviction.
const releaseSnapshotTimeout = 2 * time.Minute

// snapshotWhole takes the sandbox's workspace (or what its host kept of an
// evicted one) as the session's newest snapshot, whole.
func (f *Fleet) snapshotWhole(ctx context.Context, p scheduler.Placement, origin string) error {
	defer f.snaps.lock(p.SessionID)()
	_, err := f.take(ctx, p, origin, true)
	return err
}

// dropSnapshots removes a deleted session's snapshots from the blob store
// (their records went with the session).
func (f *Fleet) dropSnapshots(ctx context.Context, sessionID string) {
	f.snaps.mu.Lock()
	delete(f.snaps.locks, sessionID) // a snapshot still running keeps its own
	delete(f.snaps.changed, sessionID)
	f.snaps.mu.Unlock()
	if f.cfg.Blobs == nil || f.cfg.Snapshots == nil {
		return
	}
	if err := f.cfg.Blobs.DeletePrefix(ctx, snapshotPrefix(sessionID)); err != nil {
		f.log.Warn("removing a deleted session's workspace snapshots", "session_id", sessionID, "err", err)
	}
}

// snapshotWhile snapshots the session's workspace every SnapshotInterval
// until the returned stop is called: a long command's work is kept as it
// goes.
func (f *Fleet) snapshotWhile(ctx context.Context, sessionID string) (stop func()) {
	if f.cfg.Snapshots == nil || f.cfg.SnapshotInterval < 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(f.cfg.SnapshotInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := f.Snapshot(ctx, sessionID, OriginRunning); err != nil && ctx.Err() == nil {
				f.log.Warn("snapshotting a running command's workspace", "session_id", sessionID, "err", err)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
