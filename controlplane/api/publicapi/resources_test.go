package publicapi

import (
	"fmt"
	"strings"
	"testing"
)

// The resources routes, field for field: created with the session
// (default mount path), added, listed in pages, got, refused updates and
// deletes; collisions, bounds and other tenants' files refused; an
// archived session's resources do not change.
func TestSessionResources(t *testing.T) {
	a := setup(t, nil)
	agentID, envID := fixtures(t, a)
	up := a.upload("", csvPart("data.csv", "a,b\n1,2\n"))
	if up.status != 200 {
		t.Fatalf("upload: %d %s", up.status, up.body)
	}
	fileID := up.json(t)["id"].(string)
	other := a.upload("tenant_b", csvPart("b.csv", "b\n")).json(t)["id"].(string)

	s := a.ok("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID,
		"resources": []any{map[string]any{"type": "file", "file_id": fileID}}})
	sid := s["id"].(string)
	rs := s["resources"].([]any)
	first := rs[0].(map[string]any)
	if len(rs) != 1 || first["type"] != "file" || first["file_id"] != fileID || first["mount_path"] != "/mnt/session/uploads/"+fileID ||
		!strings.HasPrefix(first["id"].(string), "sesrsc_") || first["created_at"] == nil || first["updated_at"] == nil || len(first) != 6 {
		t.Fatalf("created with %v", rs)
	}
	base := "/v1/sessions/" + sid + "/resources"

	// Adds: collisions and other tenants' files are refused.
	for _, tc := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"type": "file", "file_id": fileID}, "collides"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads/" + fileID + "/x"}, "collides"},
		{map[string]any{"type": "file", "file_id": other}, "no file " + other},
		{map[string]any{"type": "github_repository", "url": "https://github.com/a/b"}, "egress"},
		{map[string]any{"type": "memory_store", "memory_store_id": "memstore_1"}, "memory stores"},
		{map[string]any{"type": "file", "file_id": fileID, "url": "https://x"}, "not a field of a file resource"},
		{map[string]any{"type": "file"}, "file_id is required"},
		{map[string]any{"type": "folder", "file_id": fileID}, "type"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads"}, "not beneath"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/outputs/x"}, "not beneath"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads/a\nb"}, "control characters"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads/.skills/x/SKILL.md"}, "where the session's skills are"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": ".skills"}, "where the session's skills are"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads/.corral/ca-bundle.pem"}, "reserved"},
		{map[string]any{"type": "file", "file_id": fileID, "mount_path": ".corral"}, "reserved"},
	} {
		if msg := a.fail(400, "POST", base, tc.body); !strings.Contains(msg, tc.want) {
			t.Errorf("add %v: %q, want %q", tc.body, msg, tc.want)
		}
	}
	rel := a.ok("POST", base, map[string]any{"type": "file", "file_id": fileID, "mount_path": "rel/data.csv"})
	if rel["mount_path"] != "/mnt/session/uploads/rel/data.csv" {
		t.Fatalf("a relative mount path is reported as %v", rel["mount_path"])
	}
	a.ok("DELETE", base+"/"+rel["id"].(string), nil)
	var added []string
	for i := range 3 {
		r := a.ok("POST", base, map[string]any{"type": "file", "file_id": fileID, "mount_path": fmt.Sprintf("/mnt/session/uploads/copy/%d.csv", i)})
		added = append(added, r["id"].(string))
	}
	if got := a.ok("GET", "/v1/sessions/"+sid, nil)["resources"].([]any); len(got) != 4 {
		t.Fatalf("the session has %d resources, want 4", len(got))
	}

	// Pages of two, oldest first.
	var ids []string
	page := ""
	for range 5 {
		l := a.ok("GET", base+"?limit=2"+page, nil)
		for _, r := range l["data"].([]any) {
			ids = append(ids, r.(map[string]any)["id"].(string))
		}
		if l["next_page"] == nil {
			break
		}
		page = "&page=" + l["next_page"].(string)
	}
	if want := append([]string{first["id"].(string)}, added...); fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Fatalf("listed %v, want %v", ids, want)
	}

	if got := a.ok("GET", base+"/"+added[1], nil); got["mount_path"] != "/mnt/session/uploads/copy/1.csv" {
		t.Fatalf("get %v", got)
	}
	if msg := a.fail(400, "POST", base+"/"+added[1], map[string]any{"authorization_token": "x"}); !strings.Contains(msg, "only a github_repository") {
		t.Errorf("update: %q", msg)
	}
	if got := a.ok("DELETE", base+"/"+added[1], nil); got["id"] != added[1] || got["type"] != "session_resource_deleted" {
		t.Fatalf("delete %v", got)
	}
	for _, m := range []string{"GET", "DELETE"} {
		a.fail(404, m, base+"/"+added[1], nil)
	}
	a.fail(404, "GET", base+"/sesrsc_missing", nil)

	// Tenant B: 404 on every route of A's session.
	for _, r := range []struct{ method, path string }{{"GET", base}, {"POST", base}, {"GET", base + "/" + added[0]}, {"DELETE", base + "/" + added[0]}} {
		resp := a.do(r.method, r.path, map[string]any{"type": "file", "file_id": other}, "X-Test-Tenant", "tenant_b")
		if resp.status != 404 {
			t.Errorf("tenant B %s %s: %d %s", r.method, r.path, resp.status, resp.body)
		}
	}

	// At most 100 resources.
	many := make([]any, 101)
	for i := range many {
		many[i] = map[string]any{"type": "file", "file_id": fileID, "mount_path": fmt.Sprintf("/mnt/session/uploads/%d", i)}
	}
	if msg := a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "resources": many}); !strings.Contains(msg, "at most 100") {
		t.Errorf("101 resources: %q", msg)
	}
	if msg := a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{
		map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads/x"},
		map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads/x"},
	}}); !strings.Contains(msg, "collides") {
		t.Errorf("two resources at one path: %q", msg)
	}

	// Archived: the resources stay as they are.
	a.ok("POST", "/v1/sessions/"+sid+"/archive", nil)
	if msg := a.fail(409, "POST", base, map[string]any{"type": "file", "file_id": fileID, "mount_path": "/mnt/session/uploads/late"}); !strings.Contains(msg, "archived") {
		t.Errorf("adding to an archived session: %q", msg)
	}
}
