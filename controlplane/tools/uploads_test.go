package tools

import (
	"strings"
	"testing"
)

func TestUploadPath(t *testing.T) {
	for _, tc := range []struct {
		in, rel, err string
	}{
		{in: "/mnt/session/uploads/a.csv", rel: "a.csv"},
		{in: "/mnt/session/uploads/dir/sub/a b.csv", rel: "dir/sub/a b.csv"},
		{in: "/mnt/session/uploads/données.csv", rel: "données.csv"},
		{in: "", err: "required"},
		{in: "a.csv", err: "absolute"},
		{in: "/mnt/session/uploads", err: "not beneath"},
		{in: "/mnt/session/uploads/", err: "clean"},
		{in: "/mnt/session/uploadsx/a", err: "not beneath"},
		{in: "/mnt/session/outputs/a", err: "not beneath"},
		{in: "/workspace/a", err: "not beneath"},
		{in: "/mnt/session/uploads/../outputs/a", err: "clean"},
		{in: "/mnt/session/uploads/./a", err: "clean"},
		{in: "/mnt/session/uploads//a", err: "clean"},
		{in: "/mnt/session/uploads/a/", err: "clean"},
		{in: "/mnt/session/uploads/a\\b", err: "backslashes"},
		{in: "/mnt/session/uploads/a\tb", err: "control"},
		{in: "/mnt/session/uploads/a\x00b", err: "control"},
		{in: "/mnt/session/uploads/\xff", err: "UTF-8"},
		{in: "/mnt/session/uploads/" + strings.Repeat("x", 256), err: "component"},
		{in: "/mnt/session/uploads/" + strings.Repeat("d/", 16) + "f", err: "deep"},
		{in: "/mnt/session/uploads/" + strings.Repeat("d/", 15) + "f", rel: strings.Repeat("d/", 15) + "f"},
		{in: "/mnt/session/uploads/" + strings.Repeat("x", 1100), err: "1024"},
	} {
		rel, err := UploadPath(tc.in)
		switch {
		case tc.err == "" && (err != nil || rel != tc.rel):
			t.Errorf("UploadPath(%q) = %q, %v; want %q", tc.in, rel, err, tc.rel)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("UploadPath(%q) = %q, %v; want an error with %q", tc.in, rel, err, tc.err)
		}
	}
}
