package publicapi

import (
	"bytes"
	"fmt"
	"io/fs"
	"mime/multipart"
	"net"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"

	"corral.dev/corral/internal/waitfor"
)

// part is one part of a multipart upload.
type part struct {
	name, filename, contentType string
	// noFilename sends the part without a filename parameter.
	noFilename bool
	body       []byte
}

func multipartBody(t testing.TB, parts ...part) (body []byte, contentType string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		// Quoted as the SDKs quote them: backslash and quote escaped,
		// nothing else.
		esc := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
		disp := `form-data; name="` + esc.Replace(p.name) + `"`
		if !p.noFilename {
			disp += `; filename="` + esc.Replace(p.filename) + `"`
		}
		h.Set("Content-Disposition", disp)
		if p.contentType != "" {
			h.Set("Content-Type", p.contentType)
		}
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write(p.body)
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), mw.FormDataContentType()
}

// upload sends parts to POST /v1/files, as tenant (or the default tenant).
func (a *testAPI) upload(tenantID string, parts ...part) reply {
	a.t.Helper()
	body, ct := multipartBody(a.t, parts...)
	hdr := []string{"Content-Type", ct}
	if tenantID != "" {
		hdr = append(hdr, "X-Test-Tenant", tenantID)
	}
	return a.do("POST", "/v1/files", body, hdr...)
}

func csvPart(name, content string) part {
	return part{name: "file", filename: name, contentType: "text/csv", body: []byte(content)}
}

// blobs lists the files in the blob store (including a Put's temporary
// files), relative to its directory.
func (a *testAPI) blobs() []string {
	a.t.Helper()
	var out []string
	err := filepath.WalkDir(a.blobDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(a.blobDir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		a.t.Fatal(err)
	}
	return out
}

// The file shapes, field for field as the SDK reads them: upload, get,
// list, download byte for byte, delete (row and blob), then 404 on every
// route.
func TestFileLifecycle(t *testing.T) {
	a := setup(t, nil)
	const content = "id,name\n1,ada\n2,grace\n"
	up := a.upload("", csvPart("people.csv", content))
	if up.status != 200 {
		t.Fatalf("upload: %d %s", up.status, up.body)
	}
	f := up.json(t)
	id, _ := f["id"].(string)
	if !strings.HasPrefix(id, "file_") || f["type"] != "file" || f["filename"] != "people.csv" || f["mime_type"] != "text/csv" ||
		f["size_bytes"] != float64(len(content)) || f["downloadable"] != true || f["expires_at"] != nil || f["scope"] != nil ||
		f["created_at"] == nil || len(f) != 9 {
		t.Fatalf("uploaded file = %v", f)
	}
	if b := a.blobs(); len(b) != 1 || b[0] != "files/tenant_default/"+id {
		t.Fatalf("blobs = %v", b)
	}
	if got := a.ok("GET", "/v1/files/"+id, nil); fmt.Sprint(got) != fmt.Sprint(f) {
		t.Fatalf("get = %v, want %v", got, f)
	}
	l := a.ok("GET", "/v1/files", nil)
	if d := l["data"].([]any); len(d) != 1 || d[0].(map[string]any)["id"] != id || l["first_id"] != id || l["last_id"] != id ||
		l["has_more"] != false || l["next_page"] != nil {
		t.Fatalf("list = %v", l)
	}

	dl := a.do("GET", "/v1/files/"+id+"/content", nil)
	if dl.status != 200 || string(dl.body) != content || dl.header.Get("Content-Type") != "text/csv" ||
		dl.header.Get("Content-Length") != fmt.Sprint(len(content)) || dl.header.Get("Content-Disposition") != `attachment; filename=people.csv` {
		t.Fatalf("download: %d %v %q", dl.status, dl.header, dl.body)
	}

	// Tenant B sees none of it, on any route.
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/files/" + id}, {"GET", "/v1/files/" + id + "/content"}, {"DELETE", "/v1/files/" + id},
	} {
		a.fail(404, r.method, r.path, nil, "X-Test-Tenant", "tenant_b")
	}
	if l := a.ok("GET", "/v1/files", nil, "X-Test-Tenant", "tenant_b"); len(l["data"].([]any)) != 0 || l["first_id"] != nil {
		t.Fatalf("tenant B lists %v", l)
	}
	a.fail(400, "GET", "/v1/files?after_id="+id, nil, "X-Test-Tenant", "tenant_b")

	if d := a.ok("DELETE", "/v1/files/"+id, nil); d["id"] != id || d["type"] != "file_deleted" || len(d) != 2 {
		t.Fatalf("delete = %v", d)
	}
	if b := a.blobs(); len(b) != 0 {
		t.Fatalf("blobs after delete = %v", b)
	}
	a.fail(404, "GET", "/v1/files/"+id, nil)
	a.fail(404, "GET", "/v1/files/"+id+"/content", nil)
	a.fail(404, "DELETE", "/v1/files/"+id, nil)
}

// The mime type is the part's Content-Type, else (absent, or the SDKs'
// generic application/octet-stream) sniffed from the content; a filename
// with quotes and non-ASCII letters comes back as sent, and downloads with
// an RFC 2231 Content-Disposition.
func TestFileTypesAndNames(t *testing.T) {
	a := setup(t, nil)
	png := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 32)...)
	for _, c := range []struct {
		p    part
		want string
	}{
		{part{name: "file", filename: "a.png", contentType: "application/octet-stream", body: png}, "image/png"},
		{part{name: "file", filename: "notes", body: []byte("plain words")}, "text/plain; charset=utf-8"},
		{part{name: "file", filename: "x.json", contentType: "application/json; charset=utf-8", body: []byte(`{}`)}, "application/json; charset=utf-8"},
		{part{name: "file", filename: "empty", body: nil}, "text/plain; charset=utf-8"},
	} {
		f := a.upload("", c.p)
		if f.status != 200 || f.json(t)["mime_type"] != c.want {
			t.Errorf("%s: %d %s; want mime_type %s", c.p.filename, f.status, f.body, c.want)
		}
	}
	const name = `résumé "final".txt`
	f := a.upload("", part{name: "file", filename: name, body: []byte("x")})
	if f.status != 200 || f.json(t)["filename"] != name {
		t.Fatalf("upload of %q: %d %s", name, f.status, f.body)
	}
	dl := a.do("GET", "/v1/files/"+f.json(t)["id"].(string)+"/content", nil)
	if d := dl.header.Get("Content-Disposition"); d != `attachment; filename*=utf-8''r%C3%A9sum%C3%A9%20%22final%22.txt` {
		t.Fatalf("Content-Disposition = %s", d)
	}
}

// What an upload refuses, each with a 4xx that says why, leaving neither
// a row nor a blob.
func TestFileUploadRefusals(t *testing.T) {
	a := setup(t, nil)
	ok := []byte("fine")
	for _, c := range []struct {
		what   string
		parts  []part
		status int
		want   string
	}{
		{"no file part", nil, 400, "file is required"},
		{"no filename", []part{{name: "file", noFilename: true, body: ok}}, 400, "has no filename"},
		{"empty filename", []part{{name: "file", filename: "", body: ok}}, 400, "must not be empty"},
		{"a path", []part{{name: "file", filename: "dir/a.csv", body: ok}}, 400, `must not contain '/'`},
		{"a windows path", []part{{name: "file", filename: `dir\a.csv`, body: ok}}, 400, `must not contain '\\'`},
		{"dot dot", []part{{name: "file", filename: "..", body: ok}}, 400, `must not be ".."`},
		{"control character", []part{{name: "file", filename: "a\tb", body: ok}}, 400, "control characters"},
		{"C1 control character", []part{{name: "file", filename: "a\u0085b", body: ok}}, 400, "control characters"},
		{"control character in the header", []part{{name: "file", filename: "a\x01b", body: ok}}, 400, "malformed MIME header"},
		{"long filename", []part{{name: "file", filename: strings.Repeat("n", 256), body: ok}}, 400, "at most 255 bytes"},
		{"invalid UTF-8", []part{{name: "file", filename: "a\xffb", body: ok}}, 400, "not valid UTF-8"},
		{"two files", []part{csvPart("a.csv", "a"), csvPart("b.csv", "b")}, 400, "one file"},
		{"an unknown field", []part{csvPart("a.csv", "a"), {name: "purpose", noFilename: true, body: []byte("x")}}, 400, `"purpose" is not a known field`},
		{"expires_in_seconds", []part{csvPart("a.csv", "a"), {name: "expires_in_seconds", noFilename: true, body: []byte("60")}}, 400, "expires_in_seconds is not supported"},
		{"over the file limit", []part{csvPart("big.csv", strings.Repeat("x", testFileMax+1))}, 413, fmt.Sprintf("larger than the limit of %d bytes", testFileMax)},
	} {
		r := a.upload("", c.parts...)
		if r.status != c.status || !strings.Contains(r.errMsg(t), c.want) {
			t.Errorf("%s: %d %s; want %d with %q", c.what, r.status, r.body, c.status, c.want)
		}
	}
	// A file of exactly the limit is taken.
	if r := a.upload("", csvPart("max.csv", strings.Repeat("x", testFileMax))); r.status != 200 {
		t.Fatalf("a file of the limit: %d %s", r.status, r.body)
	}
	a.do("DELETE", "/v1/files/"+firstFile(t, a), nil)
	if msg := a.fail(400, "POST", "/v1/files", map[string]any{"file": "x"}); !strings.Contains(msg, "multipart/form-data") {
		t.Fatalf("a JSON body: %s", msg)
	}
	// A body larger than the upload cap is refused before it is read.
	big := bytes.Repeat([]byte("x"), testFileMax+FileUploadOverhead+1)
	if r := a.do("POST", "/v1/files", big, "Content-Type", "multipart/form-data; boundary=b"); r.status != 413 {
		t.Fatalf("an oversized body: %d %s", r.status, r.body)
	}
	// Every other route keeps the public API's cap.
	if r := a.do("POST", "/v1/agents", bytes.Repeat([]byte(" "), MaxBodyBytes+1)); r.status != 413 {
		t.Fatalf("an oversized agent: %d", r.status)
	}
	if l := a.ok("GET", "/v1/files", nil)["data"].([]any); len(l) != 0 {
		t.Fatalf("refused uploads left rows: %v", l)
	}
	if b := a.blobs(); len(b) != 0 {
		t.Fatalf("refused uploads left blobs: %v", b)
	}
}

func firstFile(t *testing.T, a *testAPI) string {
	t.Helper()
	return a.ok("GET", "/v1/files?limit=1", nil)["data"].([]any)[0].(map[string]any)["id"].(string)
}

// The tenant's files together stay within its quota: the upload that
// would pass it is a 429 that names the quota and says not to retry, it
// leaves nothing behind, and another tenant is not held back.
func TestFileQuotaRefusal(t *testing.T) {
	a := setup(t, nil)
	chunk := strings.Repeat("q", 60<<10)
	for i := range 2 {
		if r := a.upload("", csvPart(fmt.Sprint(i), chunk)); r.status != 200 {
			t.Fatalf("upload %d: %d %s", i, r.status, r.body)
		}
	}
	r := a.upload("", csvPart("third", chunk)) // 180 KiB > 160 KiB
	if r.status != 429 || !strings.Contains(r.errMsg(t), "quota file_storage_mib exceeded") || r.header.Get("x-should-retry") != "false" {
		t.Fatalf("over quota: %d %v %s", r.status, r.header, r.body)
	}
	if b := a.blobs(); len(b) != 2 {
		t.Fatalf("blobs after the refusal = %v", b)
	}
	// What still fits is taken.
	if r := a.upload("", csvPart("small", strings.Repeat("q", 40<<10))); r.status != 200 {
		t.Fatalf("a file that fits: %d %s", r.status, r.body)
	}
	if r := a.upload("tenant_b", csvPart("b", chunk)); r.status != 200 {
		t.Fatalf("tenant B: %d %s", r.status, r.body)
	}
	// Deleting frees room.
	a.ok("DELETE", "/v1/files/"+firstFile(t, a), nil)
	if r := a.upload("", csvPart("again", strings.Repeat("q", 40<<10))); r.status != 200 {
		t.Fatalf("after a delete: %d %s", r.status, r.body)
	}
}

// An upload cut off mid-body leaves no row, and its blob's temporary file
// is removed.
func TestFileUploadAborted(t *testing.T) {
	a := setup(t, nil)
	body, ct := multipartBody(t, csvPart("cut.csv", strings.Repeat("c", 32<<10)))
	u, _ := url.Parse(a.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/files HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", u.Host, ct, len(body))
	if _, err := conn.Write(body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	// The handler has begun storing: a temporary file exists. Then the
	// client goes.
	waitfor.Cond(t, 10*time.Second, "the upload to reach the blob store", func() bool { return len(a.blobs()) == 1 })
	conn.Close()
	waitfor.Cond(t, 10*time.Second, "the cut-off upload's temporary blob to go", func() bool { return len(a.blobs()) == 0 })
	if l := a.ok("GET", "/v1/files", nil)["data"].([]any); len(l) != 0 {
		t.Fatalf("a cut-off upload left a row: %v", l)
	}
}

// Listing: newest first in pages (page cursors, after_id and before_id
// with first_id, last_id and has_more), by scope_id and by ids.
func TestFileList(t *testing.T) {
	a := setup(t, nil)
	var ids []string // oldest first
	for i := range 5 {
		r := a.upload("", csvPart(fmt.Sprintf("f%d.csv", i), "x"))
		if r.status != 200 {
			t.Fatal(r.status, string(r.body))
		}
		ids = append(ids, r.json(t)["id"].(string))
	}
	page := func(q string) (got []string, m map[string]any) {
		t.Helper()
		m = a.ok("GET", "/v1/files"+q, nil)
		for _, f := range m["data"].([]any) {
			got = append(got, f.(map[string]any)["id"].(string))
		}
		return got, m
	}
	want := func(what string, got []string, want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s = %v, want %v", what, got, want)
		}
	}
	p1, m := page("?limit=2")
	want("page 1", p1, ids[4], ids[3])
	if m["has_more"] != true || m["first_id"] != ids[4] || m["last_id"] != ids[3] || m["next_page"] == nil {
		t.Fatalf("page 1 = %v", m)
	}
	p2, m := page("?limit=2&page=" + m["next_page"].(string))
	want("page 2", p2, ids[2], ids[1])
	p3, m := page("?limit=2&page=" + m["next_page"].(string))
	want("page 3", p3, ids[0])
	if m["has_more"] != false || m["next_page"] != nil {
		t.Fatalf("page 3 = %v", m)
	}
	got, m := page("?limit=2&after_id=" + ids[3])
	want("after_id", got, ids[2], ids[1])
	if m["has_more"] != true {
		t.Fatalf("after_id page = %v", m)
	}
	got, m = page("?limit=2&before_id=" + ids[1])
	want("before_id", got, ids[3], ids[2])
	if m["has_more"] != true || m["next_page"] != nil {
		t.Fatalf("before_id page = %v", m)
	}
	got, m = page("?limit=2&before_id=" + ids[3])
	want("before_id near the start", got, ids[4])
	if m["has_more"] != false {
		t.Fatalf("before_id page = %v", m)
	}
	got, _ = page("?ids[]=" + ids[0] + "&ids[]=" + ids[2])
	want("ids", got, ids[2], ids[0])

	// A session's outputs (written here as the outputs step will).
	a.sql(`INSERT INTO files (tenant_id, id, filename, mime_type, size_bytes, downloadable, scope_id, blob_key)
		VALUES ('tenant_default', 'file_out1', 'out.txt', 'text/plain', 1, true, 'sesn_1', 'files/tenant_default/file_out1')`)
	got, m = page("?scope_id=sesn_1")
	want("scope_id", got, "file_out1")
	if s := m["data"].([]any)[0].(map[string]any)["scope"].(map[string]any); s["type"] != "session" || s["id"] != "sesn_1" {
		t.Fatalf("scope = %v", s)
	}
	_, m = page("?scope_id=sesn_1&limit=1")
	if m["next_page"] != nil {
		t.Fatalf("one output, limit 1: %v", m)
	}
	got, _ = page("?scope_id=sesn_2")
	want("another scope", got)

	for q, msg := range map[string]string{
		"?limit=0":               "limit",
		"?limit=1001":            "limit",
		"?after_id=file_nothing": "after_id: no file",
		"?before_id=" + ids[0] + "&after_id=" + ids[1]: "exclusive",
		"?scope_id=a%2Fb": "scope_id",
		"?ids[]=a%2Fb":    "ids",
		"?page=bogus":     "page",
	} {
		if got := a.fail(400, "GET", "/v1/files"+q, nil); !strings.Contains(got, msg) {
			t.Errorf("%s: %q, want %q", q, got, msg)
		}
	}
	// A cursor of one scope is not a cursor of another.
	_, m = page("?limit=2")
	a.fail(400, "GET", "/v1/files?scope_id=sesn_1&page="+m["next_page"].(string), nil)
}

// A file whose blob has gone (an operator's mistake) is an internal
// error on download, not an empty body.
func TestFileContentMissing(t *testing.T) {
	a := setup(t, nil)
	id := a.upload("", csvPart("a.csv", "abc")).json(t)["id"].(string)
	for _, b := range a.blobs() {
		if err := os.Remove(filepath.Join(a.blobDir, filepath.FromSlash(b))); err != nil {
			t.Fatal(err)
		}
	}
	r := a.do("GET", "/v1/files/"+id+"/content", nil)
	if r.status != 500 || strings.Contains(string(r.body), "files/") {
		t.Fatalf("download of a file without content: %d %s", r.status, r.body)
	}
}

// FuzzFileMetadata: whatever a part's filename and Content-Type, the
// checks never panic, an accepted filename has no control character or
// separator and fits its bound, and the mime type fits in 255 bytes.
func FuzzFileMetadata(f *testing.F) {
	for _, s := range []string{"a.csv", "", "..", "a/b", "a\\b", "é\u0085", strings.Repeat("x", 300), "\xff"} {
		f.Add(s, "text/csv; charset=utf-8", []byte("id,name\n"))
	}
	f.Add("x", `text/plain; a="`+strings.Repeat("v", 400)+`"`, []byte{0x89, 'P', 'N', 'G'})
	f.Add("x", "application/octet-stream", []byte("%PDF-1.7"))
	f.Fuzz(func(t *testing.T, name, contentType string, head []byte) {
		if checkFilename(name) == nil {
			if name == "" || len(name) > maxFilename || strings.ContainsAny(name, "/\\") || strings.IndexFunc(name, unicode.IsControl) >= 0 {
				t.Fatalf("accepted filename %q", name)
			}
		}
		if mt := partType(contentType, head); mt == "" || len(mt) > 255 {
			t.Fatalf("mime type %q of %q", mt, contentType)
		}
	})
}
