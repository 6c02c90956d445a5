package tools

import (
	"fmt"
	"path"
	"strings"
)

// Workspace is where the workspace appears inside a sandbox, and the root
// of every path the file tools accept.
const Workspace = "/workspace"

// relPath turns a path the model gave (absolute under /workspace, or
// relative to it) into the workspace-relative path the sandbox takes; "."
// is the workspace itself.
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
		rest, ok := strings.CutPrefix(c, Workspace+"/")
		if !ok {
			return "", fmt.Errorf("path %s is outside the workspace: files are read and written under %s", p, Workspace)
		}
		return rest, nil
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %s is outside the workspace: files are read and written under %s", p, Workspace)
	}
	return c, nil
}

// absPath is how results name a workspace-relative path.
func absPath(rel string) string {
	if rel == "" || rel == "." {
		return Workspace
	}
	return Workspace + "/" + rel
}
