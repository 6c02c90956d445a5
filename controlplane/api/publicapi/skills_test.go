package publicapi

import (
	"archive/zip"
	"bytes"
	"io"
	"strings"
	"testing"
)

const testSkillMD = "---\nname: csv-tools\ndescription: Reads CSV files.\n---\n# CSV tools\nUse awk.\n"

func skillPart(path, content string) part {
	return part{name: "files", filename: path, contentType: "text/markdown", body: []byte(content)}
}

func (a *testAPI) uploadSkill(path, tenantID string, parts ...part) reply {
	a.t.Helper()
	body, ct := multipartBody(a.t, parts...)
	hdr := []string{"Content-Type", ct}
	if tenantID != "" {
		hdr = append(hdr, "X-Test-Tenant", tenantID)
	}
	return a.do("POST", path, body, hdr...)
}

func TestSkillFrontMatter(t *testing.T) {
	for _, c := range []struct {
		name, md, want string
	}{
		{"ok", testSkillMD, ""},
		{"crlf", strings.ReplaceAll(testSkillMD, "\n", "\r\n"), ""},
		{"no front matter", "# hi\n", "must start with YAML front matter"},
		{"unclosed", "---\nname: a\ndescription: b\n", "no closing"},
		{"no name", "---\ndescription: b\n---\n", "needs name"},
		{"name not a string", "---\nname: [a]\ndescription: b\n---\n", "needs name"},
		{"upper case", "---\nname: Abc\ndescription: b\n---\n", "lowercase letters, digits and hyphens"},
		{"slash", "---\nname: a/b\ndescription: b\n---\n", "lowercase letters"},
		{"long name", "---\nname: " + strings.Repeat("a", 65) + "\ndescription: b\n---\n", "at most 64"},
		{"hyphen edge", "---\nname: -a\ndescription: b\n---\n", "hyphen"},
		{"no description", "---\nname: a\n---\n", "needs description"},
		{"long description", "---\nname: a\ndescription: " + strings.Repeat("d", 1025) + "\n---\n", "at most 1024"},
		{"xml", "---\nname: a\ndescription: <b>x</b>\n---\n", "XML"},
		{"not yaml", "---\nname: [a\n---\n", "not YAML"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := skillFrontMatter([]byte(c.md))
			switch {
			case c.want == "" && err != nil:
				t.Fatal(err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

func TestSkillBundlePaths(t *testing.T) {
	md := []byte(testSkillMD)
	for _, c := range []struct {
		name  string
		paths []string
		want  string
	}{
		{"ok", []string{"s/SKILL.md", "s/scripts/run.sh"}, ""},
		{"no SKILL.md", []string{"s/README.md"}, "no SKILL.md"},
		{"SKILL.md too deep", []string{"s/sub/SKILL.md"}, "no SKILL.md"},
		{"dotdot", []string{"s/SKILL.md", "s/../x"}, "not a clean path"},
		{"absolute", []string{"/s/SKILL.md"}, "absolute"},
		{"backslash", []string{"s\\SKILL.md"}, "backslash"},
		{"top level file", []string{"SKILL.md"}, "not in a directory"},
		{"two tops", []string{"s/SKILL.md", "t/x"}, "different top directories"},
		{"twice", []string{"s/SKILL.md", "s/SKILL.md"}, "twice"},
		{"file and dir", []string{"s/SKILL.md", "s/a", "s/a/b"}, "both a file and a directory"},
		{"deep", []string{"s/SKILL.md", "s/" + strings.Repeat("d/", 16) + "f"}, "directories deep"},
		{"long", []string{"s/SKILL.md", "s/" + strings.Repeat("x", 300)}, "longer than"},
		{"control", []string{"s/SKILL.md", "s/a\x01"}, "control"},
		{"empty name", []string{""}, "no filename"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bundleBuilder
			var err error
			for _, p := range c.paths {
				if err = b.add(p, md); err != nil {
					break
				}
			}
			if err == nil {
				_, err = b.finish()
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatal(err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	t.Run("file count", func(t *testing.T) {
		var b bundleBuilder
		var err error
		for i := 0; i <= maxSkillFiles && err == nil; i++ {
			err = b.add("s/f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('0'+i/26%10))+string(rune('a'+i/260)), nil)
		}
		if err == nil || !strings.Contains(err.Error(), "at most") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("size", func(t *testing.T) {
		var b bundleBuilder
		if err := b.add("s/big", make([]byte, maxSkillBundleBytes+1)); err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("err = %v", err)
		}
	})
}

func FuzzSkillFrontMatter(f *testing.F) {
	f.Add([]byte(testSkillMD))
	f.Add([]byte("---\nname: a\ndescription: |\n  multi\n  line\n---\n"))
	f.Add([]byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, md []byte) {
		name, desc, err := skillFrontMatter(md)
		if err != nil {
			return
		}
		if name == "" || len(name) > maxSkillName || desc == "" || len(desc) > maxSkillDescription {
			t.Fatalf("accepted name %q description %q", name, desc)
		}
	})
}

// The skill routes as the SDK uses them: create, get, list, a version,
// download, an agent naming it (and one naming a missing or another
// tenant's skill), delete.
func TestSkillLifecycle(t *testing.T) {
	a := setup(t, nil)
	r := a.uploadSkill("/v1/skills", "", skillPart("csv/SKILL.md", testSkillMD), skillPart("csv/bin/run.sh", "#!/bin/sh\necho hi\n"),
		part{name: "display_name", noFilename: true, body: []byte("CSV tools")})
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	sk := r.json(t)
	id := sk["id"].(string)
	if sk["type"] != "skill" || sk["display_name"] != "CSV tools" || sk["source"].(map[string]any)["type"] != "custom" || sk["latest_version_id"] == "" {
		t.Fatalf("skill = %v", sk)
	}
	v1 := sk["latest_version_id"].(string)
	got := a.ok("GET", "/v1/skills/"+id, nil)
	if got["id"] != id {
		t.Fatalf("get = %v", got)
	}
	list := a.ok("GET", "/v1/skills?limit=1", nil)
	if d := list["data"].([]any); len(d) != 1 {
		t.Fatalf("list = %v", list)
	}
	if d := a.ok("GET", "/v1/skills?source=anthropic", nil)["data"].([]any); len(d) != 0 {
		t.Fatalf("anthropic list = %v", d)
	}
	ver := a.ok("GET", "/v1/skills/"+id+"/versions/latest", nil)
	if ver["name"] != "csv-tools" || ver["description"] != "Reads CSV files." || ver["id"] != v1 || ver["skill_id"] != id {
		t.Fatalf("version = %v", ver)
	}
	// A second version; its name must stay the skill's.
	bad := a.uploadSkill("/v1/skills/"+id+"/versions", "", skillPart("x/SKILL.md", strings.Replace(testSkillMD, "csv-tools", "other", 1)))
	if bad.status != 400 || !strings.Contains(string(bad.body), "never changes") {
		t.Fatalf("renamed version: %d %s", bad.status, bad.body)
	}
	r = a.uploadSkill("/v1/skills/"+id+"/versions", "", skillPart("csv/SKILL.md", testSkillMD+"v2\n"))
	if r.status != 200 {
		t.Fatalf("version: %d %s", r.status, r.body)
	}
	v2 := r.json(t)["id"].(string)
	if got := a.ok("GET", "/v1/skills/"+id, nil)["latest_version_id"]; got != v2 {
		t.Fatalf("latest = %v, want %s", got, v2)
	}
	if d := a.ok("GET", "/v1/skills/"+id+"/versions", nil)["data"].([]any); len(d) != 2 {
		t.Fatalf("versions = %v", d)
	}
	// The download is a zip of the bundle under the skill's name.
	dl := a.do("GET", "/v1/skills/"+id+"/versions/"+v1+"/content", nil)
	if dl.status != 200 {
		t.Fatalf("download: %d %s", dl.status, dl.body)
	}
	zr, err := zip.NewReader(bytes.NewReader(dl.body), int64(len(dl.body)))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range zr.File {
		rc, _ := f.Open()
		b, _ := io.ReadAll(rc)
		rc.Close()
		files[f.Name] = string(b)
	}
	if files["csv-tools/SKILL.md"] != testSkillMD || files["csv-tools/bin/run.sh"] == "" || len(files) != 2 {
		t.Fatalf("archive = %v", files)
	}

	// Agents: a custom skill is pinned to its latest version; a missing
	// one, another tenant's, and Anthropic's are refused.
	ag := a.ok("POST", "/v1/agents", map[string]any{"name": "a", "model": "m", "skills": []any{map[string]any{"type": "custom", "skill_id": id}}})
	sks := ag["skills"].([]any)
	if len(sks) != 1 || sks[0].(map[string]any)["version"] != v2 {
		t.Fatalf("agent skills = %v", sks)
	}
	if msg := a.fail(400, "POST", "/v1/agents", map[string]any{"name": "a", "model": "m", "skills": []any{map[string]any{"type": "custom", "skill_id": "skill_nope"}}}); !strings.Contains(msg, "skill skill_nope not found") {
		t.Fatalf("missing: %s", msg)
	}
	if msg := a.fail(400, "POST", "/v1/agents", map[string]any{"name": "a", "model": "m", "skills": []any{map[string]any{"type": "anthropic", "skill_id": "pdf"}}}); !strings.Contains(msg, "no Anthropic skills") {
		t.Fatalf("anthropic: %s", msg)
	}
	other := a.do("POST", "/v1/agents", map[string]any{"name": "a", "model": "m", "skills": []any{map[string]any{"type": "custom", "skill_id": id}}}, "X-Test-Tenant", "tenant_b")
	if other.status != 400 {
		t.Fatalf("tenant b naming a's skill: %d %s", other.status, other.body)
	}
	for _, p := range []string{"/v1/skills/" + id, "/v1/skills/" + id + "/versions", "/v1/skills/" + id + "/versions/" + v1, "/v1/skills/" + id + "/versions/" + v1 + "/content"} {
		if r := a.do("GET", p, nil, "X-Test-Tenant", "tenant_b"); r.status != 404 {
			t.Fatalf("tenant b GET %s: %d %s", p, r.status, r.body)
		}
	}

	// Deleting: a version, not the last; then the skill with its blobs.
	a.ok("DELETE", "/v1/skills/"+id+"/versions/"+v2, nil)
	if got := a.ok("GET", "/v1/skills/"+id, nil)["latest_version_id"]; got != v1 {
		t.Fatalf("latest after delete = %v", got)
	}
	if msg := a.fail(409, "DELETE", "/v1/skills/"+id+"/versions/"+v1, nil); !strings.Contains(msg, "delete the skill instead") {
		t.Fatalf("last version: %s", msg)
	}
	a.ok("DELETE", "/v1/skills/"+id, nil)
	a.fail(404, "GET", "/v1/skills/"+id, nil)
	for _, b := range a.blobs() {
		if strings.HasPrefix(b, "skills/") {
			t.Fatalf("blob left: %s", b)
		}
	}
}

func TestSkillUploadRefusals(t *testing.T) {
	a := setup(t, nil)
	for _, c := range []struct {
		name  string
		parts []part
		want  string
	}{
		{"no files", []part{{name: "display_name", noFilename: true, body: []byte("x")}}, "files is required"},
		{"no SKILL.md", []part{skillPart("s/README.md", "x")}, "no SKILL.md"},
		{"bad front matter", []part{skillPart("s/SKILL.md", "# nothing")}, "front matter"},
		{"dotdot", []part{skillPart("s/SKILL.md", testSkillMD), skillPart("s/../../etc/passwd", "x")}, "clean path"},
		{"unknown field", []part{{name: "file", filename: "s/SKILL.md", body: []byte(testSkillMD)}}, "not a known field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := a.uploadSkill("/v1/skills", "", c.parts...)
			if r.status != 400 || !strings.Contains(string(r.body), c.want) {
				t.Fatalf("%d %s, want 400 %q", r.status, r.body, c.want)
			}
		})
	}
	if r := a.do("POST", "/v1/skills", `{"files":[]}`); r.status != 400 {
		t.Fatalf("json body: %d %s", r.status, r.body)
	}
	if n := len(a.blobs()); n != 0 {
		t.Fatalf("%d blobs left by refused uploads", n)
	}
}
