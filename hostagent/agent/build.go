package agent

import (
	"bytes"
	"context"
	"errors"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/containerd/containerd/v2/pkg/reference"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/allowlist"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Environment package builds (BuildImage): the request is checked here,
// the build runs in the driver (driver.ImageBuilder: a gVisor build
// sandbox, containerd's diff), its output streams back as log lines, and
// its egress network is the one sessions get, with the request's allowed
// hosts and audit id. One build runs at a time on a host; another is
// refused with ResourceExhausted (the control plane retries or places it
// elsewhere) rather than queued behind a build that may take its whole
// timeout.
//
//	BuildImage ─► validate ─► cached? (an image named ref: its digest) ─► build slot
//	  ─► driver: marker dir ─► Network(id): egress.Setup(id, allowlist, audit_id)
//	  ─► build sandbox ─► steps (files, command; log lines) ─► stop ─► diff ─► config,
//	     manifest, image record ─► unpack ─► sandbox removed
//	  ─► egress network removed ─► result

// Bounds of a build request.
const (
	maxBuildRefBytes  = 255
	maxBuildSteps     = 16
	maxStepFiles      = 16
	maxStepFileBytes  = 64 << 10
	maxStepNameBytes  = 64
	maxBuildLineBytes = 4 << 10
	maxBuildLogBytes  = 1 << 20
	// defaultBuildTimeout is a build's when the request sets none.
	defaultBuildTimeout = 30 * time.Minute
)

// validImageName checks an image name a build makes or an import brings:
// non-empty, at most 255 bytes, no whitespace, a reference containerd
// parses back to itself.
func validImageName(what, ref string) error {
	switch {
	case ref == "":
		return errdefs.InvalidArgument("%s: an image name is required", what)
	case len(ref) > maxBuildRefBytes:
		return errdefs.InvalidArgument("%s: the image name is %d bytes, over %d", what, len(ref), maxBuildRefBytes)
	case strings.ContainsFunc(ref, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return errdefs.InvalidArgument("%s: the image name %q has whitespace", what, ref)
	}
	spec, err := reference.Parse(ref)
	if err != nil || spec.String() != ref {
		return errdefs.InvalidArgument("%s: %q is not an image reference (host/path[:tag])", what, ref)
	}
	return nil
}

// validateBuild checks a build request against its bounds.
func validateBuild(req *pb.BuildImageRequest) error {
	if err := validImageName("build", req.Ref); err != nil {
		return err
	}
	if req.BaseImage == "" {
		return errdefs.InvalidArgument("build %s: a base image is required", req.Ref)
	}
	if n := len(req.Steps); n == 0 || n > maxBuildSteps {
		return errdefs.InvalidArgument("build %s: %d steps; a build has 1 to %d", req.Ref, n, maxBuildSteps)
	}
	for i, s := range req.Steps {
		if s.Name == "" || len(s.Name) > maxStepNameBytes || strings.ContainsFunc(s.Name, unicode.IsSpace) {
			return errdefs.InvalidArgument("build %s: step %d needs a name of 1 to %d bytes without whitespace", req.Ref, i, maxStepNameBytes)
		}
		if len(s.Command) == 0 || s.Command[0] == "" {
			return errdefs.InvalidArgument("build %s: step %s has no command", req.Ref, s.Name)
		}
		for k := range s.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return errdefs.InvalidArgument("build %s: step %s: bad environment variable name %q", req.Ref, s.Name, k)
			}
		}
		if len(s.Files) > maxStepFiles {
			return errdefs.InvalidArgument("build %s: step %s has %d files, over %d", req.Ref, s.Name, len(s.Files), maxStepFiles)
		}
		for p, data := range s.Files {
			if !path.IsAbs(p) || path.Clean(p) != p || p == "/" || strings.Contains(p, "\x00") || slices.Contains(strings.Split(p, "/"), "..") {
				return errdefs.InvalidArgument("build %s: step %s: file path %q must be absolute and clean", req.Ref, s.Name, p)
			}
			if len(data) > maxStepFileBytes {
				return errdefs.InvalidArgument("build %s: step %s: file %s is %d bytes, over %d", req.Ref, s.Name, p, len(data), maxStepFileBytes)
			}
		}
	}
	for _, h := range req.AllowedHosts {
		if h == allowlist.AnyName {
			return errdefs.InvalidArgument("build %s: a build's allowed hosts are named, never %q", req.Ref, h)
		}
	}
	if _, err := egress.ParseAllowlist(req.AllowedHosts); err != nil {
		return errdefs.InvalidArgument("build %s: allowed_hosts: %v", req.Ref, err)
	}
	if l := req.Limits; l.GetCpuMillis() < 0 || l.GetMemoryBytes() < 0 || l.GetPids() < 0 || l.GetDiskBytes() < 0 {
		return errdefs.InvalidArgument("build %s: negative limits", req.Ref)
	}
	if req.Timeout != nil && (req.Timeout.CheckValid() != nil || req.Timeout.AsDuration() < 0) {
		return errdefs.InvalidArgument("build %s: bad timeout", req.Ref)
	}
	return nil
}

// builder is the driver that builds and moves images here: the gvisor
// runtime's, since a build runs in a gVisor sandbox, else the first of
// the host's drivers that can; Unimplemented when none can.
func (a *Agent) builder() (driver.ImageBuilder, error) {
	if d, err := a.driverOf("gvisor"); err == nil {
		if b, ok := d.(driver.ImageBuilder); ok {
			return b, nil
		}
	}
	for _, d := range a.drivers() {
		if b, ok := d.(driver.ImageBuilder); ok {
			return b, nil
		}
	}
	return nil, errdefs.Unimplemented("host %s cannot build or move images (its drivers: %s)", a.cfg.HostID, a.driverNames())
}

// BuildImage serves SandboxService.BuildImage (see the comment at the top).
func (s *sandboxServer) BuildImage(req *pb.BuildImageRequest, stream pb.SandboxService_BuildImageServer) error {
	if err := validateBuild(req); err != nil {
		return err
	}
	a := s.a
	b, err := a.builder()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	if img, err := b.Image(ctx, req.Ref); err == nil {
		return stream.Send(&pb.BuildImageResponse{Msg: &pb.BuildImageResponse_Result{Result: &pb.BuildImageResult{
			Image: req.Ref, Digest: img.Digest, LayerBytes: img.LayerBytes, Cached: true}}})
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	select {
	case a.builds <- struct{}{}:
		defer func() { <-a.builds }()
	default:
		return errdefs.ResourceExhausted("host %s is running another image build; try again when it is done", a.cfg.HostID)
	}
	timeout := defaultBuildTimeout
	if d := req.Timeout.AsDuration(); req.Timeout != nil && d > 0 {
		timeout = d
	}
	bctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	log := newBuildLog(bctx, func(line string) error {
		return stream.Send(&pb.BuildImageResponse{Msg: &pb.BuildImageResponse_Log{Log: line}})
	})
	spec := driver.BuildSpec{Ref: req.Ref, BaseImage: req.BaseImage, Limits: limitsFromPB(req.Limits), Output: log}
	for _, st := range req.Steps {
		spec.Steps = append(spec.Steps, driver.BuildStep{Name: st.Name, Command: st.Command, Env: st.Env, Files: st.Files})
	}
	var network *egress.Network
	var networkID string
	if len(req.AllowedHosts) > 0 {
		allow, _ := egress.ParseAllowlist(req.AllowedHosts) // validated
		spec.Network = func(ctx context.Context, id string) (string, map[string]string, error) {
			session := req.AuditId
			if session == "" {
				session = id
			}
			networkID = id
			n, err := egress.Setup(ctx, id, a.egressConfig(req.Tenant, session, allow))
			if err != nil {
				return "", nil, err
			}
			network = n
			return n.Namespace(), n.Env(), nil
		}
	}
	start := time.Now()
	a.log.Info("building image", "ref", req.Ref, "base_image", req.BaseImage, "steps", len(req.Steps), "tenant", req.Tenant, "audit_id", req.AuditId)
	built, err := b.BuildImage(bctx, spec)
	// The build sandbox is gone (BuildImage removed it): its network can go.
	if network != nil {
		if cerr := network.Close(context.WithoutCancel(ctx)); cerr != nil {
			a.log.Warn("removing a build's egress network", "ref", req.Ref, "err", cerr)
		}
	} else if networkID != "" {
		_ = egress.Remove(context.WithoutCancel(ctx), networkID)
	}
	// Every line is sent (or dropped) before the result.
	dropped := log.close()
	if err != nil {
		if errors.Is(bctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			err = errdefs.Wrap(errdefs.DeadlineExceededKind, err, "build %s timed out after %s", req.Ref, timeout)
		}
		a.log.Warn("image build failed", "ref", req.Ref, "duration", time.Since(start), "err", err)
		return err
	}
	a.log.Info("built image", "ref", req.Ref, "digest", built.Digest, "layer_bytes", built.LayerBytes, "duration", time.Since(start), "log_lines_dropped", dropped)
	return stream.Send(&pb.BuildImageResponse{Msg: &pb.BuildImageResponse_Result{Result: &pb.BuildImageResult{
		Image: req.Ref, Digest: built.Digest, LayerBytes: built.LayerBytes, LogLinesDropped: dropped,
	}}})
}

// egressConfig is the egress proxy configuration of a sandbox (or a
// build) of tenant whose connections are recorded under session.
func (a *Agent) egressConfig(tenant, session string, allow egress.Allowlist) egress.Config {
	c := a.cfg.Egress
	return egress.Config{Tenant: tenant, Session: session, Allow: allow, AllowCIDRs: c.AllowCIDRs,
		MaxConns: c.MaxConns, MaxBytes: c.MaxBytes, BytesPerSecond: c.BytesPerSecond,
		Resolver: c.Resolver, Audit: a.nets.audit, Logger: a.log, CA: a.nets.ca, UpstreamRoots: c.UpstreamRoots}
}

// buildLog turns a build's output into log lines: split on \n, each cut
// to maxBuildLineBytes, at most maxBuildLogBytes sent in all, the lines
// past that counted in dropped. It holds at most one line and a bounded
// queue of them: a slow reader slows the build (its output waits), but
// never past the build's end (ctx), and a gone one drops the rest.
type buildLog struct {
	ctx   context.Context // the build's: a line that cannot be queued by its end is dropped
	queue chan string
	done  chan struct{} // closed when the sender has sent, or dropped, every queued line

	// mu guards the fields below (the driver writes from one goroutine at
	// a time; close takes it too).
	mu      sync.Mutex
	line    []byte
	queued  int // bytes
	dropped int64
	closed  bool

	// sendErr is the sender's first failed send (it then drops), and
	// unsent what it dropped; the sender's own, read after done.
	sendErr error
	unsent  int64
}

// buildLogQueue is how many lines wait for the sender at most.
const buildLogQueue = 256

// newBuildLog starts a build log whose lines go to send, one at a time.
func newBuildLog(ctx context.Context, send func(string) error) *buildLog {
	l := &buildLog{ctx: ctx, queue: make(chan string, buildLogQueue), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for line := range l.queue {
			if l.sendErr == nil {
				l.sendErr = send(line)
			}
			if l.sendErr != nil {
				l.unsent++
			}
		}
	}()
	return l
}

func (l *buildLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := maxBuildLineBytes - len(l.line); room > 0 {
			l.line = append(l.line, chunk[:min(room, len(chunk))]...)
		}
		if i < 0 {
			break
		}
		l.emit()
		p = p[i+1:]
	}
	return n, nil
}

// emit queues the current line, or counts it. Called with mu held.
func (l *buildLog) emit() {
	line := strings.ToValidUTF8(strings.TrimRight(string(l.line), "\r"), "\uFFFD")
	l.line = l.line[:0]
	if l.closed || l.queued+len(line) > maxBuildLogBytes {
		l.dropped++
		return
	}
	select {
	case l.queue <- line:
		l.queued += len(line)
	case <-l.ctx.Done():
		l.dropped++
	}
}

// close queues a last line that had no newline, waits until the sender
// is done, and returns how many lines were dropped in all.
func (l *buildLog) close() int64 {
	l.mu.Lock()
	if len(l.line) > 0 {
		l.emit()
	}
	if !l.closed {
		l.closed = true
		close(l.queue)
	}
	dropped := l.dropped
	l.mu.Unlock()
	<-l.done
	return dropped + l.unsent
}
