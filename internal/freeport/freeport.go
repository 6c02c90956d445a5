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
)

// Range is the ports picked from: below Linux's default ephemeral range
// (32768-60999) and above the registered services most machines run.
const (
	low  = 20000
	high = 32767
)

// Addr returns host:port for a port on host that nothing listened on a
// moment ago, picked at random below the ephemeral range.
func Addr(host string) (string, error) {
	for range 64 {
		addr := net.JoinHostPort(host, strconv.Itoa(low+rand.IntN(high-low+1)))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken
		}
		l.Close()
		return addr, nil
	}
	return "", fmt.Errorf("no free port on %s between %d and %d after 64 tries", host, low, high)
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
