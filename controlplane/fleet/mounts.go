package fleet

// A session's mounts: its file resources and its memory stores, staged
// into its sandbox, and its outputs, published from it. The memory stores
// (read_only) go the same way as the files, into their own read-only
// mount (tools.Memory), one file per memory named by the version that
// holds its content: a memory changed through the API is staged anew
// before the next tool call.
//
//	SandboxFor (every tool call) ── Mounts.Resources (one read of the
//	  session row) ── none, and none since this node last synced this
//	  sandbox (host and sandbox id)? nothing more
//	  └─ SyncUploads (the host removes what is no longer listed, names
//	     what it lacks: usually nothing) ── StageUpload each missing file,
//	     streamed from the blob store in 1 MiB chunks (never whole in
//	     memory)
//
//	  └─ SyncEgressSecrets (a session that names vaults): the secrets of
//	     its environment_variable credentials to the host's egress proxy,
//	     in memory there only; the host stages the proxy's CA bundle; the
//	     sandbox's commands get each placeholder and the bundle's path
//	     (sandbox.env), never a secret
//
// So a resource added or deleted through the API shows (or is gone)
// before the session's next tool call, on whatever node runs it, and a
// sandbox placed anew (a move, a lost host, a new node) gets every file
// again. A tool call racing a move may run once on the new host before
// its files are staged there; the next call stages them.
//
//	PublishOutputs (the runner commits the session idle) ── the session's
//	  placement: none, or not ready? nothing (no sandbox is made to look)
//	  └─ ExportOutputs, with the outputs already published (path, size,
//	     SHA-256): the host sends only what changed ── each file streamed
//	     into the blob store, hashed on the way ── Mounts.Publish: a new
//	     Files API file scoped to the session, replacing the one of the
//	     same path (its row in the same transaction, its blob after)
//
// Publishing is repeatable: the same path with the same content keeps its
// file (and id); changed content replaces it with a new file, so a
// session lists one file per path, its latest content. An output the
// agent removes stays published.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/textcut"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Mounts is what the fleet needs of sessions' files (PostgreSQL and the
// Files API's records; ctx carries the session's tenant).
type Mounts interface {
	// Resources returns what the session mounts: one read of its records
	// at every tool call.
	Resources(ctx context.Context, sessionID string) (SessionMounts, error)
	// File returns where file id's content is in the blob store, and its
	// size; kind not found for a file deleted since it was mounted.
	File(ctx context.Context, fileID string) (blobKey string, size int64, err error)
	// Outputs returns the session's published outputs.
	Outputs(ctx context.Context, sessionID string) ([]Output, error)
	// NewOutput returns the id and blob key of a new file.
	NewOutput(ctx context.Context) (fileID, blobKey string, err error)
	// MemoryContent returns the content of memory version versionID of
	// store storeID.
	MemoryContent(ctx context.Context, storeID, versionID string) ([]byte, error)
	// CommitMemory saves the changes a tool step made to the session's
	// read_write store storeID, as the session, and returns those not
	// applied as made (conflicts with another writer, refusals).
	CommitMemory(ctx context.Context, sessionID, storeID string, changes []MemoryChange) ([]MemoryConflict, error)
	// EgressCredentials returns the session's environment_variable
	// credentials, and whether it names any vault at all (a sandbox
	// given credentials before is then told again, perhaps of none).
	EgressCredentials(ctx context.Context, sessionID string) (creds []EgressCredential, vaults bool, err error)
	// Publish records output o of the session, its content already at
	// o.BlobKey, replacing file replaces ("" for none) in the same step;
	// it returns the blob key of the file replaced ("" for none), which
	// the caller deletes. Past the tenant's file storage quota it fails
	// with kind resource exhausted.
	Publish(ctx context.Context, sessionID string, o Output, replaces string) (string, error)
}

// EgressCredential is an environment_variable credential of a session:
// its sandbox's commands get SecretName=Placeholder; the secret goes to
// the sandbox's host, for its egress proxy, and nowhere else.
type EgressCredential struct {
	SecretName   string
	Placeholder  string
	Secret       logging.Secret
	AllowedHosts []string
}

// MaxEgressCredentials bounds the environment_variable credentials a
// sandbox takes (the host's bound, egress.MaxCredentials).
const MaxEgressCredentials = 64

// caBundleVars point a sandbox's tools at the egress CA bundle: OpenSSL
// (and Python's ssl) and curl, Python requests, Node.js (added to its
// roots) and git.
var caBundleVars = []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"}

// SessionMounts are what a session's sandbox shows of its records.
type SessionMounts struct {
	// Files are its file resources, its skills' files among them.
	Files []Resource
	// Memory are its memory stores as its sandbox shows them beneath
	// tools.Memory, one file per memory.
	Memory []MemoryMount
	// Vaults: the session names vaults (EgressCredentials has something
	// to read).
	Vaults bool
}

// Resource is a file mounted in a session's sandbox.
type Resource struct {
	// MountPath is where the sandbox sees it (tools.UploadPath holds).
	MountPath string
	FileID    string
}

// MemoryMount is a memory store mounted in a session's sandbox.
type MemoryMount struct {
	StoreID string
	// Dir is its directory beneath tools.Memory: one path component.
	Dir string
	// Writable: read_write, the session's changes are committed after
	// each tool step (memorycommit.go).
	Writable bool
	Files    []MemoryFile
}

// MemoryFile is a memory mounted in a session's sandbox.
type MemoryFile struct {
	// Path is relative to tools.Memory: the store's directory, then the
	// memory's path.
	Path      string
	VersionID string
	// SHA256 (hex) and Size of its content.
	SHA256 string
	Size   int64
}

// MemoryChange is a memory a tool step changed in a read_write store.
type MemoryChange struct {
	// Path is the memory's ("/a/b.md").
	Path string
	// Content is nil when the step removed the file.
	Content *string
	// BaseSHA256 is the content_sha256 the sandbox was shown at Path ("":
	// none).
	BaseSHA256 string
}

// MemoryConflict is a change not applied as the session made it.
type MemoryConflict struct {
	Path, Reason string
	// KeptAt is the memory path the session's content went to instead
	// ("": nowhere); Reason names it.
	KeptAt string
}

// Output is a published output of a session.
type Output struct {
	FileID string
	// Path is relative to tools.Outputs; it is the file's filename.
	Path     string
	Size     int64
	SHA256   string // hex
	MimeType string
	BlobKey  string
}

// Bounds of a publish: what one idle collects.
const (
	MaxOutputFiles = 1000
	MaxOutputBytes = 1 << 30
	outputTimeout  = 10 * time.Minute
	mountTimeout   = 10 * time.Minute
	stageChunk     = 1 << 20
)

// mountState is what this node staged into a session's sandbox.
type mountState struct {
	hostID, sandboxID string
	digest            string
}

// mount stages the session's file resources into its sandbox sb, unless
// it has none and this node synced this sandbox already. Like the tool
// calls it waits out a mover's fence and follows a moved sandbox.
func (f *Fleet) mount(ctx context.Context, sb *sandbox) error {
	if f.cfg.Mounts == nil {
		return nil
	}
	sessionID := sb.sessionID
	sm, err := f.cfg.Mounts.Resources(ctx, sessionID)
	if err != nil {
		return fmt.Errorf("reading the session's resources: %w", err)
	}
	rs, mems := sm.Files, sm.Memory
	want := make([]*pb.Upload, 0, len(rs))
	for _, r := range rs {
		rel, err := tools.UploadPath(r.MountPath)
		if err != nil { // the API checked it: a stored row says otherwise
			return fmt.Errorf("resource file %s: %w", r.FileID, err)
		}
		want = append(want, &pb.Upload{Path: rel, FileId: r.FileID})
	}
	slices.SortFunc(want, func(a, b *pb.Upload) int { return strings.Compare(a.Path, b.Path) })
	var wantMem []*pb.Upload
	var writable []string
	var rw []MemoryMount
	stores := map[string]string{} // upload path -> store
	for _, m := range mems {
		if m.Writable {
			writable = append(writable, m.Dir)
			rw = append(rw, m)
		}
		for _, mf := range m.Files {
			u := &pb.Upload{Path: mf.Path, FileId: mf.VersionID}
			if m.Writable {
				u.Sha256 = mf.SHA256
			}
			wantMem = append(wantMem, u)
			stores[mf.Path] = m.StoreID
		}
	}
	h := sha256.New()
	for _, u := range want {
		fmt.Fprintf(h, "%s\x00%s\x00", u.Path, u.FileId)
	}
	fmt.Fprintf(h, "memory\x00")
	for _, u := range wantMem {
		fmt.Fprintf(h, "%s\x00%s\x00", u.Path, u.FileId)
	}
	fmt.Fprintf(h, "writable\x00%s", strings.Join(writable, "\x00"))
	var creds []EgressCredential
	vaults := false
	if sm.Vaults { // most sessions name none: no second read for them
		if creds, vaults, err = f.cfg.Mounts.EgressCredentials(ctx, sessionID); err != nil {
			return fmt.Errorf("reading the session's credentials: %w", err)
		}
	}
	if len(creds) > MaxEgressCredentials {
		return errdefs.FailedPrecondition("the session's vaults hold %d environment_variable credentials (one per variable); a sandbox takes at most %d: archive some; the call did not run", len(creds), MaxEgressCredentials)
	}
	p, _, _ := f.placement(sessionID)
	st := mountState{hostID: p.HostID, sandboxID: p.SandboxID, digest: hex.EncodeToString(h.Sum(nil))}
	f.mu.Lock()
	done := f.mounted[sessionID] == st
	f.mu.Unlock()
	if done && len(want) == 0 && len(wantMem) == 0 && len(writable) == 0 && !vaults {
		// Nothing to show, and nothing left from before in this sandbox.
		return nil
	}
	// Files to show: the host is asked at every call, since it may have
	// made the sandbox anew under the same placement (an eviction under
	// pressure, then an ensure) with empty uploads; its answer is cheap
	// when nothing is missing.
	ctx, cancel := context.WithTimeout(ctx, mountTimeout)
	defer cancel()
	err = sb.call(ctx, "mounting the session's files", true, func(ctx context.Context, c pb.SandboxServiceClient) error {
		if err := f.syncUploads(ctx, sessionID, c, want); err != nil {
			return err
		}
		if err := f.syncMemory(ctx, sessionID, c, wantMem, writable, stores); err != nil {
			return err
		}
		if !vaults {
			return nil
		}
		env, err := f.syncEgress(ctx, sessionID, c, creds)
		sb.env, sb.egressNote = env, ""
		if errors.Is(err, errNoEgressNetwork) {
			sb.egressNote, err = noEgressNote(creds), nil
		}
		return err
	})
	if err != nil {
		return f.mountFailed(sessionID, sb.hostID, err)
	}
	sb.memory = rw
	if sb.hostID == st.hostID { // not moved meanwhile
		f.mu.Lock()
		f.mounted[sessionID] = st
		f.mu.Unlock()
	}
	return nil
}

// syncEgress gives the sandbox's host the session's credentials (none:
// it forgets those it had) and returns what the sandbox's commands get:
// each credential's variable set to its placeholder, and the variables
// that point tools at the CA bundle the host staged. The secrets travel
// in this call only, over the host's mutual TLS; the placement and every
// Raft command know nothing of them. A sandbox without an egress network
// (its environment allows no hosts) gets no credentials: nothing could
// carry them.
func (f *Fleet) syncEgress(ctx context.Context, sessionID string, c pb.SandboxServiceClient, creds []EgressCredential) (map[string]string, error) {
	req := &pb.SyncEgressSecretsRequest{Key: sessionID}
	for _, cr := range creds {
		req.Secrets = append(req.Secrets, &pb.EgressSecret{Placeholder: cr.Placeholder, Value: cr.Secret.Reveal(), AllowedHosts: cr.AllowedHosts})
	}
	resp, err := c.SyncEgressSecrets(ctx, req)
	switch k := errdefs.KindOf(errgrpc.FromStatus(err)); {
	case err == nil:
	case k == errdefs.UnimplementedKind && len(creds) == 0:
		return nil, nil // an older host holds none to forget
	case k == errdefs.FailedPreconditionKind:
		f.log.Debug("a session's credentials are not injected: its sandbox has no egress network", "session_id", sessionID)
		if len(creds) > 0 {
			return nil, errNoEgressNetwork
		}
		return nil, nil
	default:
		return nil, err
	}
	if len(creds) == 0 {
		return nil, nil
	}
	bundle := tools.Uploads + "/" + resp.GetCaBundlePath()
	if _, err := tools.UploadPath(bundle); err != nil {
		return nil, fmt.Errorf("the host named the CA bundle %q: %w", textcut.Prefix(resp.GetCaBundlePath(), 64), err)
	}
	env := make(map[string]string, len(creds)+len(caBundleVars))
	for _, k := range caBundleVars {
		env[k] = bundle
	}
	for _, cr := range creds {
		env[cr.SecretName] = cr.Placeholder
	}
	return env, nil
}

// errNoEgressNetwork: the session has credentials and its sandbox no
// egress network to carry them.
var errNoEgressNetwork = errors.New("no egress network")

// noEgressNote tells the model why its credentials' variables are unset:
// never silently absent.
func noEgressNote(creds []EgressCredential) string {
	names := make([]string, 0, len(creds))
	for _, cr := range creds {
		names = append(names, cr.SecretName)
	}
	slices.Sort(names)
	return fmt.Sprintf("Note: this session's vault credentials (%s) are not available: its environment allows no network, so nothing could carry them. They need limited networking with their hosts in allowed_hosts.", textcut.Prefix(strings.Join(names, ", "), 512))
}

// errFileGone marks a resource whose file was deleted since it was
// mounted.
type errFileGone struct{ error }

// syncUploads has the host drop the uploads not wanted and stages the
// wanted ones it lacks. It can run again whole.
func (f *Fleet) syncUploads(ctx context.Context, sessionID string, c pb.SandboxServiceClient, want []*pb.Upload) error {
	resp, err := c.SyncUploads(ctx, &pb.SyncUploadsRequest{Key: sessionID, Uploads: want})
	if err != nil {
		if errdefs.KindOf(errgrpc.FromStatus(err)) == errdefs.UnimplementedKind && len(want) == 0 {
			return nil // a sandbox without mounts has none to clear
		}
		return err
	}
	for _, missing := range resp.GetMissing() {
		i := slices.IndexFunc(want, func(u *pb.Upload) bool { return u.Path == missing })
		if i < 0 {
			return fmt.Errorf("the host named %q missing, which was not asked for", missing)
		}
		var gone errFileGone
		if err := f.stage(ctx, sessionID, c, want[i]); errors.As(err, &gone) {
			f.log.Warn("a session's resource names a file deleted since; it is not mounted", "session_id", sessionID, "file_id", want[i].FileId)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// syncMemory has the host show the session's memory stores as wantMem
// lists them, staging the memories it lacks (their content from the
// store, at most store.MaxMemoryBytes each), the directories of writable
// (read_write stores) the sandbox's to change.
func (f *Fleet) syncMemory(ctx context.Context, sessionID string, c pb.SandboxServiceClient, want []*pb.Upload, writable []string, stores map[string]string) error {
	resp, err := c.SyncUploads(ctx, &pb.SyncUploadsRequest{Key: sessionID, Uploads: want, Area: "memory", Writable: writable})
	if err != nil {
		if errdefs.KindOf(errgrpc.FromStatus(err)) == errdefs.UnimplementedKind && len(want) == 0 && len(writable) == 0 {
			return nil // no memory mount, and nothing to show in one
		}
		return err
	}
	for _, missing := range resp.GetMissing() {
		i := slices.IndexFunc(want, func(u *pb.Upload) bool { return u.Path == missing })
		if i < 0 {
			return fmt.Errorf("the host named %q missing, which was not asked for", missing)
		}
		b, err := f.cfg.Mounts.MemoryContent(ctx, stores[missing], want[i].FileId)
		if errdefs.IsNotFound(err) {
			continue // changed or deleted since: the next call shows what is there
		}
		if err != nil {
			return err
		}
		st, err := c.StageUpload(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&pb.StageUploadRequest{Key: sessionID, Upload: want[i], Size: int64(len(b)), Data: b, Area: "memory"}); err != nil {
			_, err = st.CloseAndRecv()
			return err
		}
		if _, err := st.CloseAndRecv(); err != nil {
			return err
		}
	}
	return nil
}

// mountFailed logs why the session's files could not be mounted and
// returns what the session is told.
func (f *Fleet) mountFailed(sessionID, hostID string, err error) error {
	f.log.Warn("mounting a session's files in its sandbox", "session_id", sessionID, "host_id", hostID, "err", err)
	if k := errdefs.KindOf(err); k == errdefs.UnimplementedKind {
		return errdefs.FailedPrecondition("this session's sandbox cannot mount files (its host's runtime has no session mounts); the call did not run")
	}
	return errdefs.Unavailable("the session's files could not be mounted in its sandbox; the call did not run (it may be tried again)")
}

// stage streams one file from the blob store into the sandbox's uploads.
func (f *Fleet) stage(ctx context.Context, sessionID string, c pb.SandboxServiceClient, u *pb.Upload) error {
	if f.cfg.Blobs == nil {
		return errdefs.FailedPrecondition("mounting files needs a blob store")
	}
	key, size, err := f.cfg.Mounts.File(ctx, u.FileId)
	if errdefs.IsNotFound(err) {
		return errFileGone{err}
	}
	if err != nil {
		return err
	}
	rc, err := f.cfg.Blobs.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("file %s: its content: %v", u.FileId, err) // %v: not the blob store's kind
	}
	defer rc.Close()
	st, err := c.StageUpload(ctx)
	if err != nil {
		return err
	}
	first := &pb.StageUploadRequest{Key: sessionID, Upload: u, Size: size}
	buf := make([]byte, stageChunk)
	sent := int64(0)
	for {
		n, rerr := io.ReadFull(rc, buf[:min(int64(stageChunk), max(size-sent, 0)+1)])
		if sent+int64(n) > size {
			return fmt.Errorf("file %s: its content is longer than its %d bytes", u.FileId, size)
		}
		msg := &pb.StageUploadRequest{Data: buf[:n]}
		if first != nil { // the first message names the file
			msg = first
			msg.Data = buf[:n]
			first = nil
		}
		if err := st.Send(msg); err != nil {
			_, err = st.CloseAndRecv() // the host's reason
			return err
		}
		sent += int64(n)
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("file %s: reading its content: %v", u.FileId, rerr)
		}
	}
	if sent != size {
		return fmt.Errorf("file %s: its content is %d bytes, not %d", u.FileId, sent, size)
	}
	_, err = st.CloseAndRecv()
	return err
}

// PublishOutputs publishes the files the session's sandbox holds beneath
// tools.Outputs to the Files API (ctx carries the session's tenant): at
// the session's idle, before the idle is committed, so that a client that
// sees the session idle finds them. A session without a ready sandbox
// has nothing to publish, and gets no sandbox for it. What the host left
// out (not regular files, past the bounds) is returned as LeftOut, for the
// session to be told.
func (f *Fleet) PublishOutputs(ctx context.Context, sessionID string) (LeftOut, error) {
	if f.cfg.Mounts == nil || f.cfg.Blobs == nil {
		return LeftOut{}, nil
	}
	p, addr, ok := f.placement(sessionID)
	if !ok || !p.Ready || addr == "" {
		return LeftOut{}, nil
	}
	c, err := f.client(p.HostID, addr)
	if err != nil {
		return LeftOut{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, outputTimeout)
	defer cancel()
	known, err := f.cfg.Mounts.Outputs(ctx, sessionID)
	if err != nil {
		return LeftOut{}, err
	}
	byPath := map[string]Output{}
	req := &pb.ExportOutputsRequest{Key: sessionID, MaxFiles: MaxOutputFiles, MaxBytes: MaxOutputBytes}
	for _, o := range known {
		byPath[o.Path] = o
		req.Known = append(req.Known, &pb.KnownOutput{Path: o.Path, Size: o.Size, Sha256: o.SHA256})
	}
	st, err := c.ExportOutputs(ctx, req)
	if err != nil {
		return LeftOut{}, errgrpc.FromStatus(err)
	}
	in := &outputStream{st: st}
	published, kept := 0, 0
	files, sent := 0, int64(0)
	for {
		m, err := in.next()
		if err != nil {
			return LeftOut{}, fmt.Errorf("outputs of %s on %s: %w", sessionID, p.HostID, err)
		}
		switch {
		case m.GetDone() != nil:
			d := m.GetDone()
			if d.Skipped > 0 {
				f.log.Info("outputs left out of a session's publish", "session_id", sessionID, "skipped", d.Skipped, "reasons", d.Reasons)
			}
			f.log.Debug("session outputs published", "session_id", sessionID, "published", published, "unchanged", kept)
			return leftOut(d), nil
		case m.GetFile() != nil:
			of := m.GetFile()
			if err := checkOutputPath(of.Path); err != nil || of.Size < 0 || of.Size > MaxOutputBytes {
				return LeftOut{}, fmt.Errorf("outputs of %s on %s: the host sent %q (%d bytes): %v", sessionID, p.HostID, of.Path, of.Size, err)
			}
			// The host bounds what it sends; so does this side.
			if files++; files > MaxOutputFiles || !of.Unchanged && sent+of.Size > MaxOutputBytes {
				return LeftOut{}, fmt.Errorf("outputs of %s on %s: the host sent more than %d files or %d bytes", sessionID, p.HostID, MaxOutputFiles, MaxOutputBytes)
			}
			if !of.Unchanged {
				sent += of.Size
			}
			old, had := byPath[of.Path]
			if of.Unchanged {
				if !had || old.Size != of.Size {
					return LeftOut{}, fmt.Errorf("outputs of %s on %s: %q unchanged, but nothing of its size was published", sessionID, p.HostID, of.Path)
				}
				kept++
				continue
			}
			o, err := f.publishOne(ctx, sessionID, of, in, old, had)
			if err != nil {
				return LeftOut{}, err
			}
			byPath[o.Path] = o
			published++
		default:
			return LeftOut{}, fmt.Errorf("outputs of %s on %s: content before its file", sessionID, p.HostID)
		}
	}
}

// LeftOut is what a publish of outputs left out: how many entries, and
// the reasons of the first few (the host's, each cut to maxLeftOutReason
// bytes).
type LeftOut struct {
	Count   int64
	Reasons []string
}

// Bounds of what LeftOut carries to the session.
const (
	maxLeftOutReasons = 5
	maxLeftOutReason  = 256
)

func leftOut(d *pb.OutputsDone) LeftOut {
	l := LeftOut{Count: d.Skipped}
	for _, r := range d.Reasons {
		if len(l.Reasons) == maxLeftOutReasons {
			break
		}
		l.Reasons = append(l.Reasons, textcut.Prefix(r, maxLeftOutReason))
	}
	return l
}

// publishOne streams one output's content into the blob store and
// records it, replacing old (when had) unless the content is the same.
func (f *Fleet) publishOne(ctx context.Context, sessionID string, of *pb.OutputFile, in *outputStream, old Output, had bool) (Output, error) {
	id, key, err := f.cfg.Mounts.NewOutput(ctx)
	if err != nil {
		return Output{}, err
	}
	body := &outputBody{in: in, left: of.Size, h: sha256.New()}
	if err := f.cfg.Blobs.Put(ctx, key, body); err != nil || body.err != nil || body.left != 0 {
		_ = f.cfg.Blobs.Delete(context.WithoutCancel(ctx), key)
		if body.err != nil {
			err = body.err
		}
		return Output{}, fmt.Errorf("output %s of %s: %w", of.Path, sessionID, err)
	}
	o := Output{FileID: id, Path: of.Path, Size: of.Size, SHA256: hex.EncodeToString(body.h.Sum(nil)), BlobKey: key, MimeType: outputType(of.Path, body.head)}
	if had && old.SHA256 == o.SHA256 && old.Size == o.Size {
		// The host sends a file whole when only its size matched or the
		// host could not tell: the same bytes keep their file.
		_ = f.cfg.Blobs.Delete(context.WithoutCancel(ctx), key)
		return old, nil
	}
	replaces := ""
	if had {
		replaces = old.FileID
	}
	gone, err := f.cfg.Mounts.Publish(ctx, sessionID, o, replaces)
	if err != nil {
		_ = f.cfg.Blobs.Delete(context.WithoutCancel(ctx), key)
		return Output{}, fmt.Errorf("output %s of %s: %w", of.Path, sessionID, err)
	}
	if gone != "" {
		if err := f.cfg.Blobs.Delete(context.WithoutCancel(ctx), gone); err != nil {
			f.log.Warn("removing the content of a replaced output", "session_id", sessionID, "blob", gone, "err", err)
		}
	}
	return o, nil
}

// checkOutputPath checks an output's path as the host sent it: relative
// to the outputs, clean, bounded, valid UTF-8 without control characters.
func checkOutputPath(p string) error {
	switch {
	case p == "" || len(p) > tools.MaxMountPath:
		return errors.New("want 1 to 1024 bytes")
	case !utf8.ValidString(p) || strings.ContainsFunc(p, func(c rune) bool { return c == '\\' || unicode.IsControl(c) }):
		return errors.New("not valid UTF-8, or a control character or backslash")
	case path.IsAbs(p) || path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../"):
		return errors.New("not a clean relative path")
	}
	return nil
}

// outputType is an output's media type: by its extension, else sniffed.
func outputType(p string, head []byte) string {
	if t := mime.TypeByExtension(path.Ext(p)); t != "" {
		return t
	}
	return http.DetectContentType(head)
}

// outputStream reads an ExportOutputs stream.
type outputStream struct {
	st pb.SandboxService_ExportOutputsClient
}

func (s *outputStream) next() (*pb.ExportOutputsResponse, error) {
	m, err := s.st.Recv()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("the stream ended before its end")
	}
	return m, errgrpc.FromStatus(err)
}

// outputBody reads one file's content off the stream: exactly left bytes,
// hashing them and keeping their head for sniffing.
type outputBody struct {
	in   *outputStream
	left int64
	buf  []byte
	h    hash.Hash
	head []byte
	err  error // the stream's, told from the blob store's
}

func (b *outputBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	for len(b.buf) == 0 {
		m, err := b.in.next()
		if err != nil {
			b.err = err
			return 0, err
		}
		d, ok := m.GetMsg().(*pb.ExportOutputsResponse_Data)
		switch {
		case !ok:
			b.err = errors.New("the host sent less content than the file's size")
			return 0, b.err
		case int64(len(d.Data)) > b.left:
			b.err = errors.New("the host sent more content than the file's size")
			return 0, b.err
		}
		b.buf = d.Data
	}
	n := copy(p, b.buf)
	b.buf, b.left = b.buf[n:], b.left-int64(n)
	b.h.Write(p[:n])
	if len(b.head) < 512 {
		b.head = append(b.head, p[:min(n, 512-len(b.head))]...)
	}
	return n, nil
}
