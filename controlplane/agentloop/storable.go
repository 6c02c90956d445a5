package agentloop

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"corral.dev/corral/controlplane/model"
)

// What a model writes is stored in PostgreSQL, which cannot store a NUL
// character in text or JSON, nor text that is not valid UTF-8 (a lone
// UTF-16 surrogate in a JSON escape among it). A model's text is stored
// with such characters replaced (U+FFFD); a tool call whose input holds
// them is stored with them replaced too and answered at once, in the same
// commit, with an error result: it is never run, since what would run is not
// what the model asked. Without this the step's commit fails every time it
// is tried, and the session's loop gives up.

// ErrUnstorable is the error of a tool input that CheckStorable refuses.
var ErrUnstorable = errors.New("the tool input holds a NUL character or text that is not valid UTF-8, which corral cannot store; the call was not run (to write such bytes, use bash, e.g. printf '\\0')")

// CheckStorable reports whether raw, a JSON text, can be stored as it is:
// valid UTF-8, with no escaped NUL (\u0000) and no lone surrogate escape in
// any string, keys included.
func CheckStorable(raw []byte) error {
	if !utf8.Valid(raw) || bytes.IndexByte(raw, 0) >= 0 {
		return ErrUnstorable
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' || i+1 >= len(raw) {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // an escaped character: \\ or \" among them
			continue
		}
		r, ok := hex4(raw, i+2)
		switch {
		case !ok:
			return ErrUnstorable
		case r == 0:
			return ErrUnstorable
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := hex4(raw, i+8)
			if !ok || i+7 >= len(raw) || raw[i+6] != '\\' || raw[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
				return ErrUnstorable
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return ErrUnstorable
		default:
			i += 5
		}
	}
	return nil
}

// hex4 reads four hex digits at raw[i:].
func hex4(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(raw[i:i+4]), 16, 32)
	return rune(v), err == nil
}

// storableJSON returns raw with what CheckStorable refuses replaced: it is
// decoded (which replaces invalid UTF-8 and lone surrogates with U+FFFD),
// NULs in strings and keys are replaced, and it is encoded again. A raw that
// is not JSON at all becomes an empty object.
func storableJSON(raw []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(bytes.ToValidUTF8(raw, []byte("\uFFFD"))))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []byte("{}")
	}
	out, err := json.Marshal(storableValue(v))
	if err != nil {
		return []byte("{}")
	}
	return out
}

func storableValue(v any) any {
	switch v := v.(type) {
	case string:
		return storableText(v)
	case []any:
		for i := range v {
			v[i] = storableValue(v[i])
		}
		return v
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[storableText(k)] = storableValue(e)
		}
		return out
	}
	return v
}

// storableText is s with NULs and invalid UTF-8 replaced by U+FFFD.
func storableText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// storableBlocks is blocks with their text made storable (a command's
// output may hold NULs).
func storableBlocks(blocks []model.Block) []model.Block {
	copied := false
	for i := range blocks {
		if t := storableText(blocks[i].Text); t != blocks[i].Text {
			if !copied {
				blocks, copied = append([]model.Block(nil), blocks...), true
			}
			blocks[i].Text = t
		}
	}
	return blocks
}
