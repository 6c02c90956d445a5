package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
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
	// floodTurnEnv, when set, is a session's events URL: every other
	// request of the flood sends a turn there instead of the GET.
	floodTurnEnv = "CORRAL_TEST_FLOOD_TURN_URL"
)

// floodTurn is the turn the flood sends: one that needs the session's sandbox.
const floodTurn = `{"events":[{"type":"user.message","content":[{"type":"text","text":"!tool bash {\"command\":\"true\"}"}]}]}`

// floodClients clients each send a request every floodEvery.
const (
	floodClients = 4
	floodEvery   = 5 * time.Millisecond
)

// floodMain is the child: it floods url (and turnURL, if set) with key
// until its stdin closes, then prints how many requests were answered, how
// many refused with 429, how many of those named the sandbox quota, and how
// many failed otherwise.
func floodMain(url, turnURL, key string) int {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	var ok, limited, sandbox, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range floodClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(floodEvery)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				req, _ := http.NewRequest("GET", url, nil)
				if turnURL != "" && i%2 == 1 {
					req, _ = http.NewRequest("POST", turnURL, strings.NewReader(floodTurn))
					req.Header.Set("content-type", "application/json")
				}
				req.Header.Set("x-api-key", key)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
				case 429:
					limited.Add(1)
					if strings.Contains(string(body), "concurrent_sandboxes") {
						sandbox.Add(1)
					}
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
	fmt.Println(ok.Load(), limited.Load(), sandbox.Load(), failed.Load())
	return 0
}

// flood is a running flood child.
type flood struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startFlood starts the child at nice 19 and waits until it floods.
func startFlood(t *testing.T, url, turnURL, key string) *flood {
	t.Helper()
	cmd := exec.Command("nice", "-n", "19", os.Args[0])
	cmd.Env = append(os.Environ(), floodURLEnv+"="+url, floodTurnEnv+"="+turnURL, floodKeyEnv+"="+key)
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

// signal pauses (SIGSTOP) or resumes (SIGCONT) the flood.
func (f *flood) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := f.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling the flood: %v", err)
	}
}

// floodCounts are what a flood's requests got.
type floodCounts struct {
	ok, limited, sandbox, failed int64
}

// stop ends the flood and returns its counts.
func (f *flood) stop(t *testing.T) (c floodCounts) {
	t.Helper()
	f.stdin.Close()
	if !f.out.Scan() {
		t.Fatalf("the flood printed no counts: %v", f.out.Err())
	}
	if _, err := fmt.Sscan(f.out.Text(), &c.ok, &c.limited, &c.sandbox, &c.failed); err != nil {
		t.Fatalf("the flood printed %q: %v", f.out.Text(), err)
	}
	if err := f.cmd.Wait(); err != nil {
		t.Fatalf("the flood: %v", err)
	}
	return c
}
