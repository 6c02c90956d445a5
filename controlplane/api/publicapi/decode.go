package publicapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"

	"corral.dev/corral/internal/errdefs"
)

// MaxBodyBytes caps every request body; larger bodies get 413.
const MaxBodyBytes = 8 << 20

// readBody reads r's body under the cap.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, errdefs.TooLarge("request body is larger than %d bytes", MaxBodyBytes)
		}
		return nil, errdefs.InvalidArgument("reading request body: %v", err)
	}
	if hasEscapedNUL(b) {
		return nil, errdefs.InvalidArgument("request body: strings must not contain NUL (\\u0000)")
	}
	return b, nil
}

// hasEscapedNUL reports whether JSON text b holds the escape \u0000 (the
// only way JSON can carry NUL), which PostgreSQL cannot store in text or
// jsonb. An escaped backslash before "u0000" is not a match.
func hasEscapedNUL(b []byte) bool {
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(`u0000`))
		if j < 0 {
			return false
		}
		j += i
		n := 0
		for k := j - 1; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 1 {
			return true
		}
		i = j + 5
	}
}

// decodeBody reads r's body into v, which must be a pointer to a struct: the
// body must be one JSON object with only the fields v knows.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := readBody(w, r)
	if err != nil {
		return err
	}
	return decodeObject(b, "request body", v)
}

// decodeObject decodes b, which must hold exactly one JSON object, into v,
// rejecting unknown fields. what names b in error messages.
func decodeObject(b []byte, what string, v any) error {
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		return errdefs.InvalidArgument("%s is empty; expected a JSON object", what)
	}
	if t[0] != '{' {
		return errdefs.InvalidArgument("%s must be a JSON object, got %s", what, jsonKind(t))
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, what)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errdefs.InvalidArgument("%s: unexpected data after the JSON object", what)
	}
	return nil
}

// jsonError turns encoding/json's errors into invalid-argument errors that
// name the field.
func jsonError(err error, what string) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var kinded *errdefs.Error
	switch {
	case errors.As(err, &kinded):
		return err
	case errors.As(err, &syn):
		return errdefs.InvalidArgument("%s is not valid JSON (at byte %d): %s", what, syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.As(err, &typ):
		field := typ.Field
		switch {
		case field == "":
			field = what
		case what != "request body":
			field = what + "." + field
		}
		return errdefs.InvalidArgument("%s: expected %s, got %s", field, goKind(typ.Type), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.InvalidArgument("%s is not valid JSON: unexpected end of input", what)
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(msg, "unknown field ") {
		return errdefs.InvalidArgument("%s: %s is not a known field", what, strings.TrimPrefix(msg, "unknown field "))
	}
	return errdefs.InvalidArgument("%s: %s", what, msg)
}

func goKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a " + t.String()
}

// jsonKind names the JSON type of the value b starts with.
func jsonKind(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// field decodes a raw member (present, not null) into v, naming path in
// errors. Objects reject unknown fields.
func field(raw json.RawMessage, path string, v any) error {
	t := bytes.TrimSpace(raw)
	if len(t) > 0 && t[0] == '{' {
		if _, ok := v.(*map[string]json.RawMessage); !ok {
			if _, ok := v.(*map[string]any); !ok {
				return decodeObject(t, path, v)
			}
		}
	}
	if err := json.Unmarshal(t, v); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			p := path
			if typ.Field != "" {
				p += "." + typ.Field
			}
			return errdefs.InvalidArgument("%s: expected %s, got %s", p, goKind(typ.Type), typ.Value)
		}
		return jsonError(err, path)
	}
	return nil
}

// isNull reports whether raw is the JSON literal null.
func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// present reports whether a member was sent (null included).
func present(raw json.RawMessage) bool { return raw != nil }

// stringField decodes a required string.
func stringField(raw json.RawMessage, path string) (string, error) {
	if !present(raw) || isNull(raw) {
		return "", errdefs.InvalidArgument("%s is required", path)
	}
	var s string
	if err := field(raw, path, &s); err != nil {
		return "", err
	}
	return s, nil
}

// checkLen enforces a length in characters.
func checkLen(s, path string, min, max int) error {
	n := utf8.RuneCountInString(s)
	if !utf8.ValidString(s) {
		return errdefs.InvalidArgument("%s is not valid UTF-8", path)
	}
	switch {
	case n < min && min == 1:
		return errdefs.InvalidArgument("%s must not be empty", path)
	case n < min:
		return errdefs.InvalidArgument("%s must be at least %d characters", path, min)
	case n > max:
		return errdefs.InvalidArgument("%s must be at most %d characters (got %d)", path, max, n)
	}
	return nil
}

// Metadata limits.
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// metadataCreate decodes metadata on create: a string map within the limits.
// Absent or null is empty.
func metadataCreate(raw json.RawMessage) (map[string]string, error) {
	m := map[string]string{}
	if !present(raw) || isNull(raw) {
		return m, nil
	}
	if err := field(raw, "metadata", &m); err != nil {
		return nil, err
	}
	return m, checkMetadata(m)
}

// metadataPatch applies a metadata patch to cur: a string upserts, null
// deletes, an absent field keeps cur. When emptyDeletes, an empty string
// deletes too (the environments API). The result must fit the limits.
func metadataPatch(cur map[string]string, raw json.RawMessage, emptyDeletes bool) (map[string]string, error) {
	out := make(map[string]string, len(cur))
	for k, v := range cur {
		out[k] = v
	}
	if !present(raw) || isNull(raw) {
		return out, nil
	}
	var patch map[string]*string
	if err := field(raw, "metadata", &patch); err != nil {
		return nil, err
	}
	for k, v := range patch {
		if v == nil || (emptyDeletes && *v == "") {
			delete(out, k)
			continue
		}
		out[k] = *v
	}
	return out, checkMetadata(out)
}

func checkMetadata(m map[string]string) error {
	if len(m) > maxMetadataPairs {
		return errdefs.InvalidArgument("metadata has %d pairs; at most %d are allowed", len(m), maxMetadataPairs)
	}
	for k, v := range m {
		if err := checkLen(k, "metadata key", 1, maxMetadataKey); err != nil {
			return errdefs.InvalidArgument("metadata key %q: %s", truncate(k), strings.TrimPrefix(err.Error(), "metadata key "))
		}
		if err := checkLen(v, fmt.Sprintf("metadata[%q]", truncate(k)), 0, maxMetadataValue); err != nil {
			return err
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
