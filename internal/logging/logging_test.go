package logging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestSecretNeverPrints(t *testing.T) {
	const value = "sk-live-very-secret"
	s := Secret(value)
	var buf bytes.Buffer
	for _, format := range []string{"text", "json"} {
		buf.Reset()
		log, err := New(&buf, Options{Format: format})
		if err != nil {
			t.Fatal(err)
		}
		log.Info("issued key", "api_key", s)
		if strings.Contains(buf.String(), value) {
			t.Fatalf("%s handler leaked the secret: %s", format, buf.String())
		}
		if !strings.Contains(buf.String(), "[redacted]") {
			t.Fatalf("%s handler did not mark the redaction: %s", format, buf.String())
		}
	}
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %s %#v", s, s, s)} {
		if strings.Contains(out, value) {
			t.Fatalf("fmt leaked the secret: %s", out)
		}
	}
	b, _ := json.Marshal(struct{ K Secret }{s})
	if strings.Contains(string(b), value) {
		t.Fatalf("json leaked the secret: %s", b)
	}
	if s.Reveal() != value {
		t.Fatal("Reveal lost the value")
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, Options{Level: "loud"}); err == nil {
		t.Fatal("want error for unknown level")
	}
	if _, err := New(&bytes.Buffer{}, Options{Format: "xml"}); err == nil {
		t.Fatal("want error for unknown format")
	}
}
