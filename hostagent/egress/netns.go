package egress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The addresses of every sandbox's veth pair. Each pair lives between two
// namespaces of its own, so every sandbox can use the same ones.
const (
	ProxyIP   = "10.87.0.1"
	SandboxIP = "10.87.0.2"
	ProxyPort = 3128
	prefixLen = 30
)

// netnsDir is where `ip netns` keeps named namespaces.
const netnsDir = "/var/run/netns"

// Network is one sandbox's network: its namespace (the sandbox joins it)
// holding one end of a veth pair, the proxy's namespace holding the other
// end and nothing else, and the proxy listening there. The sandbox's only
// route is the pair's /30, and the only listener it can reach is the
// proxy's: no firewall rule is needed to keep it from the host's own
// services or from other sandboxes, because none of them is in either
// namespace. The proxy dials out from the host agent's own namespace.
type Network struct {
	name  string
	proxy *Proxy
}

// names are the two namespaces of a sandbox key: a hash, so any key fits
// and the same key always finds the same namespaces (Destroy after a
// restart).
func names(key string) (sandboxNS, proxyNS string) {
	h := sha256.Sum256([]byte(key))
	base := "corral-eg-" + hex.EncodeToString(h[:6])
	return base + "-s", base + "-p"
}

// Setup makes key's network and starts its proxy with cfg. Whatever an
// earlier Setup of the same key left is removed first.
func Setup(ctx context.Context, key string, cfg Config) (*Network, error) {
	if cfg.Allow.Empty() {
		return nil, errors.New("egress: an empty allowlist is no network, not a proxy")
	}
	if cfg.Audit == nil {
		return nil, errors.New("egress: an audit queue is required")
	}
	Remove(ctx, key)
	sns, pns := names(key)
	steps := [][]string{
		{"netns", "add", sns},
		{"netns", "add", pns},
		{"link", "add", "eth0", "netns", sns, "type", "veth", "peer", "name", "eth0", "netns", pns},
		{"-n", sns, "addr", "add", SandboxIP + "/" + strconv.Itoa(prefixLen), "dev", "eth0"},
		{"-n", pns, "addr", "add", ProxyIP + "/" + strconv.Itoa(prefixLen), "dev", "eth0"},
		{"-n", sns, "link", "set", "lo", "up"},
		{"-n", sns, "link", "set", "eth0", "up"},
		{"-n", pns, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			Remove(context.WithoutCancel(ctx), key)
			return nil, err
		}
	}
	l, err := listenIn(filepath.Join(netnsDir, pns), net.JoinHostPort(ProxyIP, strconv.Itoa(ProxyPort)))
	if err != nil {
		Remove(context.WithoutCancel(ctx), key)
		return nil, fmt.Errorf("egress: listening in %s: %w", pns, err)
	}
	return &Network{name: key, proxy: Serve(l, cfg)}, nil
}

// Namespace is the path of the namespace the sandbox joins.
func (n *Network) Namespace() string {
	s, _ := names(n.name)
	return filepath.Join(netnsDir, s)
}

// Proxy is the network's proxy.
func (n *Network) Proxy() *Proxy { return n.proxy }

// Env is what the sandbox's processes need to use the proxy: both spellings
// of the proxy variables (curl reads the lower case ones, others the upper).
func (n *Network) Env() map[string]string {
	u := "http://" + net.JoinHostPort(ProxyIP, strconv.Itoa(ProxyPort))
	return map[string]string{"http_proxy": u, "https_proxy": u, "HTTP_PROXY": u, "HTTPS_PROXY": u}
}

// Close stops the proxy and removes both namespaces (the veth pair goes
// with them). The sandbox must be gone first: a namespace a process is
// still in outlives its name.
func (n *Network) Close(ctx context.Context) error {
	n.proxy.Close()
	return Remove(ctx, n.name)
}

// Remove deletes key's namespaces, if any.
func Remove(ctx context.Context, key string) error {
	var errs []error
	for _, ns := range func() []string { s, p := names(key); return []string{s, p} }() {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); err != nil {
			continue
		}
		errs = append(errs, ip(ctx, "netns", "del", ns))
	}
	return errors.Join(errs...)
}

func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// listenIn opens a TCP listener inside the namespace at path. A socket
// belongs to the namespace it was made in, whatever thread later uses it,
// so one locked thread enters the namespace, listens and comes back. If it
// cannot come back it stays locked, and Go ends the thread with its
// goroutine.
func listenIn(path, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer self.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("entering the namespace: %w", err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			if l != nil {
				l.Close()
			}
			done <- result{err: fmt.Errorf("leaving the namespace: %w", err)}
			return // the thread stays locked and dies
		}
		runtime.UnlockOSThread()
		done <- result{l, err}
	}()
	r := <-done
	return r.l, r.err
}

// Reopen starts the proxy again in key's existing network: after the host
// agent restarted, its sandboxes are still in their namespaces, but the
// proxies went with the old process.
func Reopen(key string, cfg Config) (*Network, error) {
	if cfg.Allow.Empty() || cfg.Audit == nil {
		return nil, errors.New("egress: an allowlist and an audit queue are required")
	}
	sns, pns := names(key)
	for _, ns := range []string{sns, pns} {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); err != nil {
			return nil, fmt.Errorf("egress: the network of %s is gone: %w", key, err)
		}
	}
	l, err := listenIn(filepath.Join(netnsDir, pns), net.JoinHostPort(ProxyIP, strconv.Itoa(ProxyPort)))
	if err != nil {
		return nil, fmt.Errorf("egress: listening in %s: %w", pns, err)
	}
	return &Network{name: key, proxy: Serve(l, cfg)}, nil
}

// Namespaces are the paths of key's two namespaces (which may not exist).
func Namespaces(key string) (sandbox, proxy string) {
	s, p := names(key)
	return filepath.Join(netnsDir, s), filepath.Join(netnsDir, p)
}
