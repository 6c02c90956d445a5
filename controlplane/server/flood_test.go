package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The fairness test's flood runs in a child process: this test binary,
// started with these variables set, floods instead of running tests (see
// TestMain). The child runs at the lowest CPU priority, so that the cost of
// making the flood's requests, which in production falls on the flooding
// tenant's own machines, does not count against corral; the server's cost of
// answering them, which is what fairness is about, runs at normal priority.
const (
	floodURLEnv = "CORRAL_TEST_FLOOD_URL"
	floodKeyEnv = "CORRAL_TEST_FLOOD_KEY"
)

// floodClients clients each send a request every floodEvery.
const (
	floodClients = 4
	floodEvery   = 5 * time.Millisecond
)

// floodMain is the child: it floods url with key until its stdin closes,
// then prints how many requests were answered and how many refused with
// 429.
func floodMain(url, key string) int {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	var ok, limited, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range floodClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(floodEvery)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("x-api-key", key)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
				case 429:
					limited.Add(1)
				default:
					failed.Add(1)
				}
			}
		}()
	}
	fmt.Println("flooding")
	_, _ = io.Copy(io.Discard, os.Stdin)
	close(stop)
	wg.Wait()
	fmt.Println(ok.Load(), limited.Load(), failed.Load())
	return 0
}

// flood is a running flood child.
type flood struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startFlood starts the child at nice 19 and waits until it floods.
func startFlood(t *testing.T, url, key string) *flood {
	t.Helper()
	cmd := exec.Command("nice", "-n", "19", os.Args[0])
	cmd.Env = append(os.Environ(), floodURLEnv+"="+url, floodKeyEnv+"="+key)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the flood: %v", err)
	}
	f := &flood{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !f.out.Scan() || f.out.Text() != "flooding" {
		t.Fatalf("the flood did not start: %q %v", f.out.Text(), f.out.Err())
	}
	return f
}

// stop ends the flood and returns its counts.
func (f *flood) stop(t *testing.T) (ok, limited, failed int64) {
	t.Helper()
	f.stdin.Close()
	if !f.out.Scan() {
		t.Fatalf("the flood printed no counts: %v", f.out.Err())
	}
	if _, err := fmt.Sscan(f.out.Text(), &ok, &limited, &failed); err != nil {
		t.Fatalf("the flood printed %q: %v", f.out.Text(), err)
	}
	if err := f.cmd.Wait(); err != nil {
		t.Fatalf("the flood: %v", err)
	}
	return ok, limited, failed
}
