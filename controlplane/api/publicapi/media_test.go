package publicapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A user message carries images and documents as the API has them; what
// the Messages API would not take is a 400 that says what is wrong, never
// stored.
func TestUserMessageImagesAndDocuments(t *testing.T) {
	a := setupWithEvents(t)
	agent := a.ok("POST", "/v1/agents", map[string]any{"name": "m", "model": "m"})["id"].(string)
	env := a.ok("POST", "/v1/environments", map[string]any{"name": "m"})["id"].(string)
	session := a.ok("POST", "/v1/sessions", map[string]any{"agent": agent, "environment_id": env})["id"].(string)
	send := func(block string) reply {
		return a.do("POST", "/v1/sessions/"+session+"/events", `{"events":[{"type":"user.message","content":[{"type":"text","text":"see"},`+block+`]}]}`)
	}
	png := `"iVBORw0KGgo="` // base64
	for _, ok := range []string{
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":` + png + `}}`,
		`{"type":"image","source":{"type":"url","url":"https://img.example/a.png"}}`,
		`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQ="},"title":"spec","context":"the v2 draft"}`,
		`{"type":"document","source":{"type":"text","data":"plain words"}}`,
		`{"type":"document","source":{"type":"text","media_type":"text/plain","data":"plain words"}}`,
		`{"type":"document","source":{"type":"url","url":"https://docs.example/a.pdf"}}`,
	} {
		r := send(ok)
		if r.status != http.StatusOK {
			t.Errorf("%s: %d %s", ok, r.status, r.body)
			continue
		}
		var got struct {
			Data []struct {
				Content []json.RawMessage `json:"content"`
			} `json:"data"`
		}
		if err := json.Unmarshal(r.body, &got); err != nil || len(got.Data) != 1 || len(got.Data[0].Content) != 2 {
			t.Errorf("%s: stored %s", ok, r.body)
		}
	}
	for bad, want := range map[string]string{
		`{"type":"image","source":{"type":"base64","media_type":"image/tiff","data":` + png + `}}`:  "media_type",
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"not base64!"}}`: "not base64",
		`{"type":"image","source":{"type":"base64","media_type":"image/png"}}`:                      "data is required",
		`{"type":"image"}`: "source is required",
		`{"type":"image","source":{"type":"url","url":"ftp://x.example/a"}}`:                                   "http or https",
		`{"type":"image","source":{"type":"url","url":"https://x.example/` + strings.Repeat("a", 2100) + `"}}`: "at most 2048",
		`{"type":"image","source":{"type":"text","data":"x"}}`:                                                 "for documents",
		`{"type":"image","source":{"type":"url","url":"https://x.example/a","data":"x"}}`:                      "data is not a member of a url source",
		`{"type":"image","text":"x","source":{"type":"url","url":"https://x.example/a"}}`:                      "not a member",
		`{"type":"image","title":"t","source":{"type":"url","url":"https://x.example/a"}}`:                     "document block",
		`{"type":"document","source":{"type":"base64","media_type":"image/png","data":` + png + `}}`:           "application/pdf",
		`{"type":"document","source":{"type":"text","media_type":"text/html","data":"x"}}`:                     "text/plain",
		`{"type":"document","source":{"type":"text","data":"x"},"title":"` + strings.Repeat("t", 501) + `"}`:   "at most 500",
		`{"type":"document","source":{"type":"file","file_id":"file_1"}}`:                                      "not supported",
		`{"type":"document","source":{"type":"zip","data":"x"}}`:                                               "want base64",
		`{"type":"document","source":{"type":"text","data":"x"},"citations":{"enabled":true}}`:                 "citations",
		`{"type":"text","text":"x","source":{"type":"url","url":"https://x.example/a"}}`:                       "type and text only",
	} {
		r := send(bad)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), want) {
			t.Errorf("%s: %d %s, want a 400 saying %q", bad, r.status, r.body, want)
		}
	}
	// Nothing refused was stored: the log holds the six accepted messages.
	list := a.ok("GET", "/v1/sessions/"+session+"/events", nil)
	if n := len(list["data"].([]any)); n != 6 {
		t.Errorf("the log holds %d events, want 6", n)
	}
	// Tool results stay text only (the use it names is any event of the
	// session: the check of its kind comes later).
	first := list["data"].([]any)[0].(map[string]any)["id"].(string)
	r := a.do("POST", "/v1/sessions/"+session+"/events", `{"events":[{"type":"user.custom_tool_result","custom_tool_use_id":"`+first+`","content":[{"type":"image","source":{"type":"url","url":"https://x.example/a"}}]}]}`)
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "image") {
		t.Errorf("an image in a custom tool result: %d %s", r.status, r.body)
	}
}
