package publicapi

import (
	"encoding/json"
	"strings"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

// FuzzDecodeEvents feeds arbitrary bodies to the client event decoder. It
// may not panic; a rejection is a client error; an accepted event comes out
// as a JSON object with a fresh id and the type it was sent with.
func FuzzDecodeEvents(f *testing.F) {
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `{"type":"user.message"}`,
		`{"type":"user.message","content":[{"type":"text","text":"hi"}]}`,
		`{"type":"user.message","content":[{"type":"image","source":{"type":"url","url":"u"}}]}`,
		`{"type":"user.interrupt","session_thread_id":"sthr_1"}`,
		`{"type":"user.tool_confirmation","tool_use_id":"sevt_1","result":"deny","deny_message":"no"}`,
		`{"type":"user.tool_confirmation","tool_use_id":"sevt_1","result":"allow","deny_message":"no"}`,
		`{"type":"user.custom_tool_result","custom_tool_use_id":"sevt_1","content":[{"type":"search_result","source":"s"}],"is_error":true}`,
		`{"type":"user.custom_tool_result","custom_tool_use_id":"sevt_1","content":[{"type":"text","text":"r"}]}`,
		`{"type":"user.message","content":[{"type":"text","text":"hi"}],"tool_use_id":"sevt_1","session_thread_id":null}`,
		`{"type":"system.message","content":[{"type":"text","text":"x"}]}`,
		`{"type":"user.message","content":[{"type":"text","text":"\u0000"}],"id":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		exists := func(id string) error {
			if strings.HasPrefix(id, "sevt_") {
				return nil
			}
			return errdefs.NotFound("event %s", id)
		}
		e, err := validateClientEvent(b, "event", exists)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("%v is %v, not a client error", err, errdefs.KindOf(err))
			}
			return
		}
		var out map[string]any
		if err := json.Unmarshal(e.Body, &out); err != nil {
			t.Fatalf("accepted event is not JSON: %s", e.Body)
		}
		if out["id"] != e.ID || !strings.HasPrefix(e.ID, "sevt_") || out["type"] != e.Type {
			t.Fatalf("accepted event %s (id %s type %s)", e.Body, e.ID, e.Type)
		}
	})
}
