package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Ports handed out but not yet bound (a cluster's addresses, picked before
// its nodes start) are never handed out again.
func TestAddrNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		addr, err := Addr("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
	}
}

func TestAddrIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	seen := map[string]bool{}
	for range 20 {
		addr, err := Addr("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if port < low || port > high {
			t.Fatalf("port %d is outside %d-%d", port, low, high)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the port handed out is not free: %v", err)
		}
		defer l.Close() // held: the next picks must avoid it
		if seen[addr] {
			t.Fatalf("%s handed out twice while held", addr)
		}
		seen[addr] = true
	}
}
