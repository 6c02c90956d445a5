package tools

import (
	"fmt"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Workspace is where the workspace appears inside a sandbox, and the root
// of every path the file tools accept.
const Workspace = "/workspace"

// relPath turns a path the model gave into the path the sandbox takes:
// beneath /workspace (absolute, or relative to it), the workspace-relative
// path ("." is the workspace itself); beneath one of the session's mounts
// (Mounts), the clean absolute path, which the host resolves in that
// mount (read-only ones refuse writes).
func relPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("a path is required")
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q contains a NUL byte", p)
	}
	if path.IsAbs(p) {
		c := path.Clean(p)
		if c == Workspace {
			return ".", nil
		}
		if rest, ok := strings.CutPrefix(c, Workspace+"/"); ok {
			return rest, nil
		}
		if mountOf(c) != "" {
			return c, nil
		}
		return "", fmt.Errorf("path %s is outside the workspace and the session's mounts: files are read and written under %s (and %s, %s, %s)", p, Workspace, Outputs, Memory, Uploads)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %s is outside the workspace: files are read and written under %s", p, Workspace)
	}
	return c, nil
}

// Mounts are the session's directories beside the workspace that the
// file tools reach: Uploads (read-only), Outputs, and Memory (a
// read_write store's directory is writable, the rest read-only).
var Mounts = []string{Uploads, Outputs, Memory}

// mountOf returns the mount a clean absolute path is in ("": none).
func mountOf(c string) string {
	for _, m := range Mounts {
		if c == m || strings.HasPrefix(c, m+"/") {
			return m
		}
	}
	return ""
}

// absPath is how results name a path relPath returned.
func absPath(rel string) string {
	if rel == "" || rel == "." {
		return Workspace
	}
	if path.IsAbs(rel) {
		return rel
	}
	return Workspace + "/" + rel
}

// Where a session's mounted files and its outputs appear inside its
// sandbox. The host stages a session's file resources beneath Uploads,
// read-only to the sandbox; what the agent writes beneath Outputs is
// published to the Files API when the session goes idle.
//
// A session's skills are staged as uploads too, one directory per skill
// name beneath Skills; no file resource may be mounted there, nor beneath
// Reserved, where the host stages what it gives the sandbox itself (the
// egress proxy's CA bundle).
const (
	Uploads = "/mnt/session/uploads"
	Outputs = "/mnt/session/outputs"
	// Memory holds the session's memory stores, one directory each.
	Memory   = "/mnt/memory"
	Skills   = Uploads + "/.skills"
	Reserved = Uploads + "/.corral"
)

// Bounds of a mount path: its bytes, a component's bytes, its depth.
const (
	MaxMountPath      = 1024
	maxMountComponent = 255
	maxMountDepth     = 16
)

// UploadPath checks the mount path of a file resource and returns it
// relative to Uploads: absolute, clean (no "." or ".." components, no
// doubled or trailing slash), strictly beneath Uploads, valid UTF-8
// without control characters or backslashes, and bounded (MaxMountPath
// bytes, 255 a component, 16 components beneath Uploads). Files are
// mounted only beneath Uploads, a directory the sandbox cannot write: a
// file anywhere else could be replaced by the sandbox's user.
func UploadPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("a mount path is required")
	case len(p) > MaxMountPath:
		return "", fmt.Errorf("mount path is %d bytes; at most %d are allowed", len(p), MaxMountPath)
	case !utf8.ValidString(p):
		return "", fmt.Errorf("mount path is not valid UTF-8")
	case !path.IsAbs(p):
		return "", fmt.Errorf("mount path %q must be absolute, beneath %s", p, Uploads)
	case path.Clean(p) != p:
		return "", fmt.Errorf("mount path %q must be clean: no \".\" or \"..\" components, doubled or trailing slashes", p)
	}
	rel, ok := strings.CutPrefix(p, Uploads+"/")
	if !ok {
		return "", fmt.Errorf("mount path %q is not beneath %s: files are mounted read-only there only", p, Uploads)
	}
	parts := strings.Split(rel, "/")
	if len(parts) > maxMountDepth {
		return "", fmt.Errorf("mount path %q is %d directories deep beneath %s; at most %d", p, len(parts), Uploads, maxMountDepth)
	}
	for _, part := range parts {
		if len(part) > maxMountComponent {
			return "", fmt.Errorf("mount path %q has a component of %d bytes; at most %d", p, len(part), maxMountComponent)
		}
	}
	for _, c := range p {
		if c == '\\' || unicode.IsControl(c) {
			return "", fmt.Errorf("mount path %q must not contain control characters or backslashes", p)
		}
	}
	return rel, nil
}
