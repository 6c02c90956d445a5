package console

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/test/processhost"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// call makes an API request with key and decodes the reply into out.
func call(t *testing.T, base, key, method, path string, body, out any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s %s", method, path, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

// upload stores a file of the tenant's through the Files API.
func upload(t *testing.T, base, key, name, content string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("file", name)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(fw, content)
	_ = mw.Close()
	req, _ := http.NewRequest("POST", base+"/v1/files", &body)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		t.Fatalf("uploading %s: %s %s", name, resp.Status, b)
	}
}

// A tenant and an operator use the console in a real browser against a
// real node and host agent (the process driver: the tool really runs).
//
// The tenant: a wrong key is refused with its reason; the right one shows
// the sessions, a title full of markup as text; on the session page a
// message makes the agent ask to run bash (always_ask), the page shows the
// pending confirmation, Approve runs it and the tool's output arrives on
// the live stream; the files page lists a file. The operator: the host, its provider and health, the
// session's sandbox and the cluster's members.
func TestConsoleInChromium(t *testing.T) {
	tab, noPageErrors := browser(t, 4*time.Minute)

	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "console-node", SandboxRuntime: "process"})
	processhost.Start(t, srv, "console-host", nil)
	key := servertest.TenantKey(t, srv, tenant.Default)
	opKey := servertest.OperatorKey(t, db)
	base := "http://" + srv.HTTPAddr()

	var ag, env, sess struct{ ID string }
	call(t, base, key, "POST", "/v1/agents", map[string]any{"name": "console-agent", "model": "fake", "tools": []any{map[string]any{
		"type": "agent_toolset_20260401", "default_config": map[string]any{"permission_policy": map[string]any{"type": "always_ask"}},
	}}}, &ag)
	call(t, base, key, "POST", "/v1/environments", map[string]any{"name": "console-env"}, &env)
	// A title a tenant chose, markup and all: the page must show it as text.
	const title = `<img src=x id=injected> & "quotes"`
	call(t, base, key, "POST", "/v1/sessions", map[string]any{"agent": ag.ID, "environment_id": env.ID, "title": title}, &sess)

	// A file of the tenant's, with a name a tenant chose.
	upload(t, base, key, "<notes>.txt", "hello from a file")

	start := time.Now()
	do(t, tab, "open the console", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("key")))

	// A key that is no key: refused, and the page says why.
	do(t, tab, "sign in with a wrong key", chromedp.SendKeys(chromedp.ID("key"), "sk-corral-wrong"), chromedp.Click(chromedp.ID("signin-button")))
	until(t, tab, "the refusal shown", `document.getElementById("signin-error").textContent.startsWith("Sign-in failed: ")`, 30*time.Second)
	if msg := text(t, tab, "#signin-error"); !strings.Contains(msg, "key") {
		t.Errorf("wrong key: %q", msg)
	}

	// The tenant's key: the sessions page, the markup title as text.
	do(t, tab, "sign in as the tenant", chromedp.SendKeys(chromedp.ID("key"), key), chromedp.Click(chromedp.ID("signin-button")),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-session="`+sess.ID+`"]`)))
	if nav := text(t, tab, "#nav"); nav != "AgentsSessionsFiles" {
		t.Errorf("a tenant's navigation: %q", nav)
	}
	if row := text(t, tab, `tr[data-session="`+sess.ID+`"]`); !strings.Contains(row, title) || !strings.Contains(row, "console-agent") {
		t.Errorf("session row %q lacks the title as text", row)
	}
	if n, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll("img, #injected").length`)); err != nil || n != 0 {
		t.Errorf("the title became markup: %d elements (%v)", n, err)
	}
	screenshot(t, tab, "sessions")

	// The agents page: the agent, its model and its toolset.
	do(t, tab, "open the agents", chromedp.Navigate(base+"/console/#/agents"), chromedp.WaitVisible(chromedp.CSS("#view table")))
	if a := text(t, tab, "#view table tbody"); !strings.Contains(a, "console-agent") || !strings.Contains(a, ag.ID) || !strings.Contains(a, "fake") || !strings.Contains(a, "agent_toolset_20260401") {
		t.Errorf("agents: %q", a)
	}

	// The files page lists the file, its name as text.
	do(t, tab, "open the files", chromedp.Navigate(base+"/console/#/files"), chromedp.WaitVisible(chromedp.CSS("#view table")))
	if f := text(t, tab, "#view table"); !strings.Contains(f, "<notes>.txt") || !strings.Contains(f, "Download") {
		t.Errorf("files: %q", f)
	}
	do(t, tab, "back to the sessions", chromedp.Navigate(base+"/console/#/sessions"), chromedp.WaitVisible(chromedp.CSS(`tr[data-session="`+sess.ID+`"]`)))

	// The session page: follow the live stream, then ask for a tool.
	do(t, tab, "open the session", chromedp.Click(chromedp.CSS(`tr[data-session="`+sess.ID+`"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#stream-state[data-live="true"]`)))
	do(t, tab, "send the message", chromedp.SetValue(chromedp.ID("message"), "!tool bash {\"command\":\"echo hi\"}\n!echo"),
		chromedp.Click(chromedp.ID("send")),
		chromedp.WaitVisible(chromedp.CSS(`#pending .pending button.approve`)))
	if p := text(t, tab, "#pending"); !strings.Contains(p, "bash wants to run") || !strings.Contains(p, `"command": "echo hi"`) {
		t.Errorf("pending confirmation: %q", p)
	}
	if calls := text(t, tab, "#tool-calls"); !strings.Contains(calls, "ask: waiting") {
		t.Errorf("tool calls before the answer: %q", calls)
	}
	until(t, tab, "the turn stops for the confirmation",
		`[...document.querySelectorAll("#events .event.session-status_idle pre")].some(e => e.textContent === "requires_action")`, 30*time.Second)
	screenshot(t, tab, "pending-confirmation")

	// Approve: the tool runs on the host and its output comes back live.
	do(t, tab, "approve", chromedp.Click(chromedp.CSS(`#pending .pending button.approve`)))
	until(t, tab, "the tool's result on the page",
		`[...document.querySelectorAll("#tool-calls pre.tool-result")].some(e => e.textContent.trim() === "hi")`, 90*time.Second)
	until(t, tab, "the pending confirmation gone", `document.getElementById("pending").textContent === "None."`, 10*time.Second)
	until(t, tab, "the agent's echo and the idle status", `document.getElementById("session-status").textContent === "idle" && `+
		`[...document.querySelectorAll("#events .event.agent-message pre")].some(e => e.textContent.includes("hi"))`, 60*time.Second)
	if calls := text(t, tab, "#tool-calls"); !strings.Contains(calls, "ask: allow") {
		t.Errorf("tool calls after approval: %q", calls)
	}
	events := text(t, tab, "#events")
	for _, want := range []string{"user.message", "agent.tool_use", "user.tool_confirmation", "allow", "agent.tool_result", "session.status_idle"} {
		if !strings.Contains(events, want) {
			t.Errorf("the event log lacks %q:\n%s", want, events)
		}
	}
	screenshot(t, tab, "session")

	// Deny: the tool does not run; the model is told the user said no.
	do(t, tab, "ask again", chromedp.SetValue(chromedp.ID("message"), "!tool bash {\"command\":\"echo never > /workspace/denied\"}\n!echo"),
		chromedp.Click(chromedp.ID("send")), chromedp.WaitVisible(chromedp.CSS(`#pending .pending button.deny`)))
	do(t, tab, "deny", chromedp.Click(chromedp.CSS(`#pending .pending button.deny`)))
	until(t, tab, "the denial's result on the page", `[...document.querySelectorAll("#tool-calls tr")].some(r => `+
		`r.textContent.includes("ask: deny") && r.querySelector("td.bad pre.tool-result")?.textContent === "the user denied this tool call")`, 60*time.Second)
	until(t, tab, "the pending confirmation gone again", `document.getElementById("pending").textContent === "None."`, 10*time.Second)
	t.Logf("tenant: signed in, approved (result seen) and denied in %v", time.Since(start).Round(time.Millisecond))

	// The operator: the same page, the fleet's half.
	start = time.Now()
	do(t, tab, "sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("key")))
	if stored, err := chromedp.Run(tab, chromedp.Evaluate[int](`sessionStorage.length`)); err != nil || stored != 0 {
		t.Errorf("after sign-out sessionStorage holds %d items (%v)", stored, err)
	}
	do(t, tab, "sign in as the operator", chromedp.SendKeys(chromedp.ID("key"), opKey), chromedp.Click(chromedp.ID("signin-button")))
	// Sign-in asks which halves the key may see before it draws the
	// navigation: wait for the operator's (and only the operator's).
	until(t, tab, "the operator's navigation", `document.getElementById("nav").textContent === "HostsSandboxesCluster"`, 30*time.Second)
	// The operator starts wherever the tab was; go to the hosts page.
	do(t, tab, "open the hosts", chromedp.Navigate(base+"/console/#/hosts"), chromedp.WaitVisible(chromedp.CSS(`tr[data-host="console-host"]`)))
	if nav := text(t, tab, "#nav"); nav != "HostsSandboxesCluster" {
		t.Errorf("an operator's navigation: %q", nav)
	}
	row := text(t, tab, `tr[data-host="console-host"]`)
	for _, want := range []string{"console-host", "ready", "yes", "process", "process: healthy", "memory_pressure: ok", "disk_pressure: ok"} {
		if !strings.Contains(row, want) {
			t.Errorf("host row lacks %q: %q", want, row)
		}
	}
	if d := text(t, tab, "#drains"); d != "None." {
		t.Errorf("drains: %q", d)
	}

	// A second host, in a pool, and a drain of the first: the drain's
	// progress bar on the hosts page (which refreshes itself), the
	// session's sandbox moved to the second host.
	processhost.Start(t, srv, "console-host-b", func(c *agent.Config) { c.Labels = map[string]string{"pool": "blue"} })
	call(t, base, opKey, "POST", "/admin/v1/hosts/console-host:drain?detach=true", nil, nil)
	until(t, tab, "the drain's progress", `(() => { const d = document.querySelector('#drains .drain[data-host="console-host"]'); `+
		`const p = d && d.querySelector("progress"); return p && p.value === 1 && p.max === 1 && d.textContent.includes("1 of 1 (moved 1"); })()`, 90*time.Second)
	if p := text(t, tab, "#pools"); !strings.Contains(p, "pool=blue") || !strings.Contains(p, "console-host-b") {
		t.Errorf("pools: %q", p)
	}
	if row := text(t, tab, `tr[data-host="console-host"]`); !strings.Contains(row, "no") || !strings.Contains(row, "draining") {
		t.Errorf("the drained host's row: %q", row)
	}
	screenshot(t, tab, "hosts")
	do(t, tab, "open the sandboxes", chromedp.Navigate(base+"/console/#/sandboxes"), chromedp.WaitVisible(chromedp.CSS("#view table")))
	if s := text(t, tab, "#view table"); !strings.Contains(s, sess.ID) || !strings.Contains(s, "console-host-b") {
		t.Errorf("sandboxes: %q", s)
	}
	do(t, tab, "open the cluster", chromedp.Navigate(base+"/console/#/cluster"), chromedp.WaitVisible(chromedp.CSS("#view table")))
	if c := text(t, tab, "#view"); !strings.Contains(c, "console-node") || !strings.Contains(c, "leader") {
		t.Errorf("cluster: %q", c)
	}
	// A tenant's page is refused to the operator, as text.
	do(t, tab, "open a tenant page", chromedp.Navigate(base+"/console/#/sessions"))
	until(t, tab, "the refusal shown", `!document.getElementById("error").hidden && document.getElementById("error").textContent.includes("GET /v1/sessions")`, 30*time.Second)
	t.Logf("operator: hosts, sandboxes, cluster and a refusal in %v; refusal: %s", time.Since(start).Round(time.Millisecond), text(t, tab, "#error"))
	noPageErrors()
}
