package console

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromiumPath is where Debian's chromium package puts the browser;
// CORRAL_CHROMIUM names another.
const chromiumPath = "/usr/bin/chromium"

// browser starts a headless Chromium for the test and returns a tab's
// context (every action bounded by timeout) and a func that fails the test
// on the page errors seen so far: uncaught exceptions, and what the browser
// logs as a JavaScript or security error (a Content-Security-Policy
// violation among them). Without Chromium the test skips, except under CI.
func browser(t *testing.T, timeout time.Duration) (context.Context, func()) {
	tab, errs := startBrowser(t, timeout)
	return tab, func() {
		t.Helper()
		if p := errs.all(); len(p) > 0 {
			t.Fatalf("the page reported errors:\n%s", strings.Join(p, "\n"))
		}
	}
}

// pageErrors collects what a tab reports as errors.
type pageErrors struct {
	mu sync.Mutex
	// seen is closed and replaced at each new error (a broadcast).
	seen chan struct{}
	msgs []string
}

func (p *pageErrors) note(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, s)
	close(p.seen)
	p.seen = make(chan struct{})
}

func (p *pageErrors) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.msgs)
}

// waitFor waits up to d for an error containing want and returns it.
func (p *pageErrors) waitFor(want string, d time.Duration) (string, bool) {
	deadline := time.After(d)
	for {
		p.mu.Lock()
		seen := p.seen
		for _, m := range p.msgs {
			if strings.Contains(m, want) {
				p.mu.Unlock()
				return m, true
			}
		}
		p.mu.Unlock()
		select {
		case <-seen:
		case <-deadline:
			return "", false
		}
	}
}

// startBrowser is browser, returning the page's errors as they come.
func startBrowser(t *testing.T, timeout time.Duration) (context.Context, *pageErrors) {
	t.Helper()
	path := os.Getenv("CORRAL_CHROMIUM")
	if path == "" {
		path = chromiumPath
	}
	if _, err := exec.LookPath(path); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so Chromium must be here (make chromium installs it): %v", err)
		}
		t.Skipf("no Chromium at %s (make chromium installs Debian's package): %v", path, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	if os.Geteuid() == 0 {
		// Chromium refuses to run as root with its sandbox on; the page
		// is our own, served from loopback.
		opts = append(opts, chromedp.NoSandbox)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tab, cancelTab := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancelTab(); cancelAlloc(); cancel() })
	// Start the browser now, so that the subscriptions below have a tab.
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}

	errs := &pageErrors{seen: make(chan struct{})}
	note := errs.note
	exceptions := chromedp.Events(tab, runtime.ExceptionThrown)
	entries := chromedp.Events(tab, log.EntryAdded)
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev, err := range exceptions {
			if err != nil {
				return
			}
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				msg += " " + d.Exception.Description
			}
			note("uncaught exception: " + msg)
		}
	})
	wg.Go(func() {
		for ev, err := range entries {
			if err != nil {
				return
			}
			e := ev.Entry
			// A refused request (the operator probe with a tenant key)
			// is logged as a network error: that is the page working.
			if e.Level == log.EntryLevelError && (e.Source == log.EntrySourceJavascript || e.Source == log.EntrySourceSecurity) {
				note(string(e.Source) + ": " + e.Text)
			}
		}
	})
	t.Cleanup(func() { cancelTab(); wg.Wait() })
	return tab, errs
}

// screenshot saves the whole page as name.png in the test's artifact
// directory.
func screenshot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(t.ArtifactDir(), name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", p, len(png))
}

// do runs steps and fails the test, naming what, on an error.
func do(t *testing.T, tab context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(tab, steps...); err != nil {
		screenshot(t, tab, "failed")
		t.Fatalf("%s: %v", what, err)
	}
}

// text returns the text of the first element sel (CSS) finds, read in
// one evaluation: pages that refresh themselves replace their nodes, so a
// node found in one call may be gone by the next.
func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	q, _ := json.Marshal(sel)
	s, err := chromedp.Run(tab, chromedp.Evaluate[*string](`document.querySelector(`+string(q)+`)?.textContent ?? null`))
	if err != nil || s == nil {
		screenshot(t, tab, "failed")
		t.Fatalf("text of %s: no such element (%v)", sel, err)
	}
	return *s
}

// until waits, up to d, for the JavaScript condition to hold on the page.
func until(t *testing.T, tab context.Context, what, cond string, d time.Duration) {
	t.Helper()
	if _, err := chromedp.Run(tab, chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingTimeout(d), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		screenshot(t, tab, "failed")
		body, _ := chromedp.Run(tab, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("%s: %v\npage text:\n%s", what, err, body)
	}
}
