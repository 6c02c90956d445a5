// Package freeport finds a TCP port on loopback for a process that will
// listen on it later (a child server told its address on the command line).
//
// The usual trick, listening on port 0 and closing, hands out a port from
// the kernel's ephemeral range, which the kernel goes on handing out to
// every other :0 listener and outgoing connection on the machine: under a
// parallel test run another process takes it before the child binds
// ("address already in use"). A port below the ephemeral range is never
// given out by the kernel, so only another caller of this package could
// pick the same one, at random among thousands.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// Range is the ports picked from: below Linux's default ephemeral range
// (32768-60999) and above the registered services most machines run.
const (
	low  = 20000
	high = 32767
)

// given holds every port this process handed out: a caller picks several
// before its children bind any (a cluster's nodes), and two random picks
// among some 12,000 ports collide often enough to matter (about 1 in 100
// for 15 picks), so a port goes out at most once per process.
var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// Addr returns host:port for a port on host that nothing listened on a
// moment ago and that this process has not handed out before, picked at
// random below the ephemeral range.
func Addr(host string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 256 {
		port := low + rand.IntN(high-low+1)
		if given[port] {
			continue
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken
		}
		l.Close()
		given[port] = true
		return addr, nil
	}
	return "", fmt.Errorf("no free port on %s between %d and %d after 256 tries", host, low, high)
}

// Port is Addr's port.
func Port(host string) (int, error) {
	addr, err := Addr(host)
	if err != nil {
		return 0, err
	}
	_, p, _ := net.SplitHostPort(addr)
	return strconv.Atoi(p)
}
