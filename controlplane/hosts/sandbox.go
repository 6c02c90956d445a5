package hosts

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/hostpki"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// sandboxConns caches one SandboxService connection per host.
type sandboxConns struct {
	// mu guards conns.
	mu    sync.Mutex
	conns map[string]*sandboxConn // by host id
}

type sandboxConn struct {
	addr   string
	conn   *grpc.ClientConn
	client pb.SandboxServiceClient
}

func (c *sandboxConns) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, sc := range c.conns {
		sc.conn.Close()
		delete(c.conns, id)
	}
}

// Sandbox returns a SandboxService client for a host, over mutual TLS with
// this node's control-plane certificate. Connections are cached per host
// and redialled when the host registers a new address. Any node can call it.
func (s *Service) Sandbox(hostID string) (pb.SandboxServiceClient, error) {
	var (
		h  *scheduler.Host
		ok bool
	)
	addr := ""
	s.node.Read(func(v raftfsm.View) {
		if h, ok = v.Host(hostID); ok {
			addr = h.Address
		}
	})
	switch {
	case !ok:
		return nil, errdefs.NotFound("host %s", hostID)
	case addr == "":
		return nil, errdefs.FailedPrecondition("host %s has not registered a sandbox service address", hostID)
	}
	s.sandbox.mu.Lock()
	defer s.sandbox.mu.Unlock()
	if sc := s.sandbox.conns[hostID]; sc != nil {
		if sc.addr == addr {
			return sc.client, nil
		}
		sc.conn.Close()
		delete(s.sandbox.conns, hostID)
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(credentials.NewTLS(hostpki.ClientTLS(s.ca.Cert, &s.cert, hostID))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "sandbox address %s of host %s", addr, hostID)
	}
	sc := &sandboxConn{addr: addr, conn: conn, client: pb.NewSandboxServiceClient(conn)}
	s.sandbox.conns[hostID] = sc
	return sc.client, nil
}

// WaitReady waits until the session's sandbox is usable on the host it is
// placed on, and returns the placement. It asks the host itself, so any node
// can call it; the leader makes the sandbox exist. On a follower the
// placement read may lag the leader's.
func (s *Service) WaitReady(ctx context.Context, sessionKey string) (scheduler.Placement, error) {
	for {
		var (
			p  scheduler.Placement
			ok bool
		)
		s.node.Read(func(v raftfsm.View) { p, ok = v.Placement(sessionKey) })
		err := errdefs.NotFound("no placement for session %s", sessionKey)
		if ok {
			if err = s.probe(ctx, p.HostID, sessionKey); err == nil {
				return p, nil
			}
		}
		if perr := pause(ctx, 50*time.Millisecond); perr != nil {
			return scheduler.Placement{}, errdefs.Wrap(errdefs.KindOf(perr), err, "waiting for the sandbox of session %s: %v", sessionKey, perr)
		}
	}
}

// waitOn waits until the session's sandbox is usable on a given host.
func (s *Service) waitOn(ctx context.Context, hostID, sessionKey string) error {
	for {
		err := s.probe(ctx, hostID, sessionKey)
		if err == nil {
			return nil
		}
		if perr := pause(ctx, 50*time.Millisecond); perr != nil {
			return errdefs.Wrap(errdefs.KindOf(perr), err, "waiting for the sandbox of session %s on %s: %v", sessionKey, hostID, perr)
		}
	}
}

// probe asks a host whether the session's sandbox is usable.
func (s *Service) probe(ctx context.Context, hostID, sessionKey string) error {
	c, err := s.Sandbox(hostID)
	if err != nil {
		return err
	}
	_, err = c.ListFiles(ctx, &pb.ListFilesRequest{Key: sessionKey})
	return errgrpc.FromStatus(err)
}

// keyLocks are per-session locks, in this process.
type keyLocks struct {
	// mu guards m.
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	ch   chan struct{} // capacity 1: full while held
	refs int           // holders and waiters
}

// LockSandbox takes the session's sandbox lock, waiting until it is free or
// ctx ends. The tool path holds it around each tool call; Drain holds it
// while it moves the sandbox, so a sandbox moves between tool calls. It is
// Config.Locker's when set, else this process's only (see the package doc).
func (s *Service) LockSandbox(ctx context.Context, sessionKey string) (unlock func(), err error) {
	if s.cfg.Locker != nil {
		return s.cfg.Locker.LockSandbox(ctx, sessionKey)
	}
	l := &s.locks
	l.mu.Lock()
	k := l.m[sessionKey]
	if k == nil {
		k = &keyLock{ch: make(chan struct{}, 1)}
		l.m[sessionKey] = k
	}
	k.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if k.refs--; k.refs == 0 {
			delete(l.m, sessionKey)
		}
		l.mu.Unlock()
	}
	select {
	case k.ch <- struct{}{}:
	case <-ctx.Done():
		release()
		return nil, errdefs.Wrap(errdefs.KindOf(ctx.Err()), ctx.Err(), "waiting for the sandbox of session %s", sessionKey)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-k.ch
			release()
		})
	}, nil
}
