package hosts_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Test timing: hosts heartbeat every 100ms and are down after 2s of
// silence (slack for a machine busy with other tests); a new leader gives
// them 3s to reconnect.
const (
	heartbeat = 100 * time.Millisecond
	hostTTL   = 2 * time.Second
	grace     = 3 * time.Second
)

// rescheduled is one OnRescheduled call.
type rescheduled struct{ tenant, key, from, to string }

// cluster is three Raft nodes on loopback, each with its host service.
type cluster struct {
	t     *testing.T
	nodes []*raftfsm.Node
	svcs  []*hosts.Service
	addrs []string // host service addresses, by node
	blobs blob.Store
	moved chan rescheduled

	// newDriver makes each host agent's driver (default: process); runtime
	// and image are what hosts offer and placements ask for.
	newDriver func(t *testing.T) driver.Driver
	runtime   string
	image     string
	resources scheduler.Resources
}

func nodeConfig(id, dir string) raftfsm.Config {
	return raftfsm.Config{
		ID: id, RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: dir,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond, ApplyTimeout: 5 * time.Second,
	}
}

func setup(t *testing.T) *cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	blobs, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, blobs: blobs, moved: make(chan rescheduled, 100), runtime: "process",
		resources: scheduler.Resources{CPUMillis: 500, MemoryMiB: 256},
		newDriver: func(t *testing.T) driver.Driver {
			d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}}
	for i := range 3 {
		cfg := nodeConfig(fmt.Sprintf("n%d", i+1), t.TempDir())
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			cfg.Join = c.nodes[0].HTTPAddr()
		}
		n, err := raftfsm.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Shutdown() })
		c.nodes = append(c.nodes, n)
		if i == 0 {
			waitfor.Cond(t, 30*time.Second, "the first node to lead", n.IsLeader)
		}
	}
	for _, n := range c.nodes {
		svc, err := hosts.New(ctx, hosts.Config{
			Node: n, HeartbeatInterval: heartbeat, HostTTL: hostTTL, LeaderGrace: grace, Blobs: blobs,
			OnRescheduled: func(_ context.Context, tenant, key, from, to string) {
				c.moved <- rescheduled{tenant, key, from, to}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		svc.Serve(l)
		t.Cleanup(svc.Close)
		c.svcs = append(c.svcs, svc)
		c.addrs = append(c.addrs, svc.Addr())
	}
	// Every node knows every node's host endpoint before hosts come.
	waitfor.Cond(t, 30*time.Second, "host endpoints replicated", func() bool {
		for _, n := range c.nodes {
			ok := true
			n.Read(func(v raftfsm.View) {
				for _, m := range c.nodes {
					ok = ok && v.HostEndpoint(m.ID()) != ""
				}
			})
			if !ok {
				return false
			}
		}
		return true
	})
	return c
}

// leader returns the index of the live node that leads.
func (c *cluster) leader() int {
	c.t.Helper()
	idx := -1
	waitfor.Cond(c.t, 30*time.Second, "a leader", func() bool {
		for i, n := range c.nodes {
			if n != nil && n.IsLeader() {
				idx = i
				return true
			}
		}
		return false
	})
	return idx
}

// kill stops node i and its host service.
func (c *cluster) kill(i int) {
	c.svcs[i].Close()
	_ = c.nodes[i].Shutdown()
	c.nodes[i], c.svcs[i] = nil, nil
}

// any returns a live node's service, preferring a follower.
func (c *cluster) any() *hosts.Service {
	l := c.leader()
	for i, s := range c.svcs {
		if s != nil && i != l {
			return s
		}
	}
	return c.svcs[l]
}

func (c *cluster) node() *raftfsm.Node {
	for _, n := range c.nodes {
		if n != nil {
			return n
		}
	}
	return nil
}

func (c *cluster) token() logging.Secret {
	c.t.Helper()
	tok, err := c.any().IssueToken(context.Background(), time.Hour)
	if err != nil {
		c.t.Fatal(err)
	}
	return logging.Secret(tok.Reveal())
}

// hostAgent is a running host agent with the process driver.
type hostAgent struct {
	id   string
	stop func()
}

// newAgent builds a host agent that lists the nodes' addresses in order.
func (c *cluster) newAgent(id string, token logging.Secret, order ...int) (*agent.Agent, error) {
	c.t.Helper()
	d := c.newDriver(c.t)
	var addrs []string
	for _, i := range order {
		addrs = append(addrs, c.addrs[i])
	}
	return agent.New(context.Background(), agent.Config{
		HostID: id, ControlPlane: strings.Join(addrs, ","), JoinToken: token, StateDir: c.t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: c.runtime,
		Capacity:       agent.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30},
		ReconnectDelay: 50 * time.Millisecond,
	})
}

// startHost joins and runs a host agent, and waits until the leader has
// its stream. The agent lists a follower first.
func (c *cluster) startHost(id string) *hostAgent {
	c.t.Helper()
	l := c.leader()
	order := []int{(l + 1) % 3, (l + 2) % 3, l}
	a, err := c.newAgent(id, c.token(), order...)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	h := &hostAgent{id: id, stop: sync.OnceFunc(func() { cancel(); wg.Wait() })}
	c.t.Cleanup(h.stop)
	c.waitConnected(id)
	return h
}

func (c *cluster) waitConnected(id string) {
	c.t.Helper()
	waitfor.Cond(c.t, 30*time.Second, "host "+id+" connected to the leader", func() bool {
		return c.svcs[c.leader()].Connected(id)
	})
}

// host reads a host from the leader, which has applied what it committed.
func (c *cluster) host(id string) scheduler.Host {
	var h scheduler.Host
	c.nodes[c.leader()].Read(func(v raftfsm.View) {
		if p, ok := v.Host(id); ok {
			h = *p
		}
	})
	return h
}

func (c *cluster) placement(key string) scheduler.Placement {
	var p scheduler.Placement
	c.nodes[c.leader()].Read(func(v raftfsm.View) { p, _ = v.Placement(key) })
	return p
}

// place places a session (on the host that fits first: h1 before h2 when
// both fit) and waits for its sandbox.
func (c *cluster) place(key string) scheduler.Placement {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.node().Place(ctx, scheduler.Request{SessionKey: key, Tenant: "t1", Runtime: c.runtime, Image: c.image,
		Resources: c.resources}); err != nil {
		c.t.Fatal(err)
	}
	p, err := c.any().WaitReady(ctx, key)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *cluster) writeFile(hostID, key, path, data string) {
	c.t.Helper()
	sb, err := c.any().Sandbox(hostID)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := sb.WriteFile(context.Background(), &pb.WriteFileRequest{Key: key, Path: path, Data: []byte(data)}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) readFile(hostID, key, path string) (string, error) {
	sb, err := c.any().Sandbox(hostID)
	if err != nil {
		return "", err
	}
	r, err := sb.ReadFile(context.Background(), &pb.ReadFileRequest{Key: key, Path: path})
	return string(r.GetData()), errdefs.FromGRPCStatus(err)
}
