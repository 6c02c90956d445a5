package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// uploadFile uploads content as name through the Files API and returns
// the file's id.
func (s *session) uploadFile(name, content string) string {
	s.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	w, err := mw.CreateFormFile("file", name)
	if err != nil {
		s.t.Fatal(err)
	}
	_, _ = io.WriteString(w, content)
	_ = mw.Close()
	resp, err := s.c.Post(s.base+"/v1/files", mw.FormDataContentType(), &body)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var f struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil || resp.StatusCode != http.StatusOK {
		s.t.Fatalf("upload: %d %v", resp.StatusCode, err)
	}
	return f.ID
}

// mountFile adds file id to the session at mount.
func (s *session) mountFile(id, mount string) {
	s.t.Helper()
	postJSON(s.t, s.c, s.base+"/v1/sessions/"+s.id+"/resources", map[string]any{"type": "file", "file_id": id, "mount_path": mount})
}

// outputs lists the session's published outputs by filename.
func (s *session) outputs() map[string]int64 {
	s.t.Helper()
	resp, err := s.c.Get(s.base + "/v1/files?scope_id=" + s.id)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct {
		Data []struct {
			Filename  string `json:"filename"`
			SizeBytes int64  `json:"size_bytes"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != http.StatusOK {
		s.t.Fatalf("listing outputs: %d %v", resp.StatusCode, err)
	}
	out := map[string]int64{}
	for _, f := range page.Data {
		out[f.Filename] = f.SizeBytes
	}
	return out
}

// A session's files follow its sandbox: a resource added while the
// sandbox is paused is there once the next call resumes it, and after a
// drain moves the sandbox live to another host, the next call finds every
// file there too (staged anew on that host). Outputs written on the new
// host are published at the idle.
func TestMountsFollowPauseAndLiveMove(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: 300 * time.Millisecond})
	startGVisorHostAs(t, srv, "mount-a", containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}, agent.Resources{})
	startGVisorHostAs(t, srv, "mount-b", containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}, agent.Resources{})
	s := newToolSession(t, srv)
	s.mountFile(s.uploadFile("a.txt", "alpha\n"), "/mnt/session/uploads/a.txt")
	if out := s.bash("cat /mnt/session/uploads/a.txt"); strings.TrimSpace(out) != "alpha" {
		t.Fatalf("first turn: %q", out)
	}

	waitPlacement(t, srv, s.id, time.Minute, "the idle session's sandbox to be paused", func(p scheduler.Placement, v raftfsm.View) bool {
		return p.Paused()
	})
	s.mountFile(s.uploadFile("b.txt", "beta\n"), "/mnt/session/uploads/more/b.txt")
	if out := s.bash("cat /mnt/session/uploads/a.txt /mnt/session/uploads/more/b.txt"); strings.TrimSpace(out) != "alpha\nbeta" {
		t.Fatalf("after the resume: %q", out)
	}

	from, _, _ := placement(srv, s.id)
	last, msgs := drainHost(t, srv, servertest.OperatorKey(t, db), from, time.Minute)
	if last.GetMoved() != 1 {
		t.Fatalf("drain: last progress %v, messages %q", last, msgs)
	}
	if to, _, _ := placement(srv, s.id); to == from {
		t.Fatalf("the session is still on %s", from)
	}
	out := s.bash("cat /mnt/session/uploads/a.txt /mnt/session/uploads/more/b.txt && stat -c '%U %a' /mnt/session/uploads/more/b.txt && echo moved > /mnt/session/outputs/o.txt")
	if !strings.Contains(out, "alpha\nbeta") || !strings.Contains(out, "root 444") {
		t.Fatalf("after the live move: %q", out)
	}
	if got := s.outputs(); len(got) != 1 || got["o.txt"] != 6 {
		t.Fatalf("outputs after the move: %v", got)
	}
}

// Under the process runtime (development, tests) a session's files are
// beside its workspace, at ../uploads, and what it writes to ../outputs is
// published at the idle: the same staging and publishing, without a
// sandbox to enforce anything.
func TestMountsUnderTheProcessRuntime(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: "process"})
	startHost(t, srv, "h1")
	s := newToolSession(t, srv)
	s.mountFile(s.uploadFile("in.txt", "input\n"), "/mnt/session/uploads/dir/in.txt")
	if out := s.bash("cat ../uploads/dir/in.txt && tr a-z A-Z < ../uploads/dir/in.txt > ../outputs/out.txt"); strings.TrimSpace(out) != "input" {
		t.Fatalf("reading the mounted file: %q", out)
	}
	if got := s.outputs(); len(got) != 1 || got["out.txt"] != 6 {
		t.Fatalf("outputs: %v", got)
	}
}

// An idle whose outputs are not all published tells the session, with a
// session.error before its session.status_idle naming what was left out
// and why; what could be published is.
func TestOutputsLeftOutAreTold(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: "process"})
	startHost(t, srv, "h1")
	s := newToolSession(t, srv)
	evs := s.turn(`!tool bash {"command":"echo ok > ../outputs/ok.txt && ln -s /etc/hostname ../outputs/link && echo done"}`)
	var msg string
	errAt, idleAt := -1, -1
	for i, e := range evs {
		switch e["type"] {
		case "session.error":
			errAt = i
			if body, ok := e["error"].(map[string]any); ok {
				msg, _ = body["message"].(string)
			}
		case "session.status_idle":
			idleAt = i
		}
	}
	if errAt < 0 || idleAt < errAt {
		t.Fatalf("no session.error before the idle (error at %d, idle at %d): %v", errAt, idleAt, evs)
	}
	if !strings.Contains(msg, "1 entry under /mnt/session/outputs was not published") || !strings.Contains(msg, "link: not a regular file") {
		t.Errorf("the session.error says %q", msg)
	}
	if got := s.outputs(); len(got) != 1 || got["ok.txt"] != 3 {
		t.Errorf("outputs: %v", got)
	}
	// A publish that leaves nothing out says nothing.
	s.bash("rm ../outputs/link")
	for _, e := range s.turn(`!tool bash {"command":"true"}`) {
		if e["type"] == "session.error" {
			t.Errorf("a complete publish was told as an error: %v", e)
		}
	}
}
