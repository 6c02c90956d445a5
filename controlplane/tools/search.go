package tools

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"corral.dev/corral/internal/textcut"
)

// Limits of glob and grep, which walk the workspace through ListFiles and
// read files through ReadFile, the same way in every image.
const (
	// MaxWalkEntries bounds the entries one glob or grep looks at.
	MaxWalkEntries = 20000
	// GlobMaxResults is how many paths glob returns.
	GlobMaxResults = 100
	// GrepMaxFileBytes: larger files are skipped.
	GrepMaxFileBytes = 5 << 20
	// GrepDefaultLimit is the output lines grep returns without head_limit.
	GrepDefaultLimit = 250
	// GrepMaxLimit is the most head_limit may ask: with lines cut at
	// ReadMaxLineBytes, a result stays within a few MiB.
	GrepMaxLimit = 2000
)

type globInput struct {
	Pattern string `json:"pattern"`
	Path    string `json:"path"`
}

type grepInput struct {
	Pattern         string `json:"pattern"`
	Path            string `json:"path"`
	Glob            string `json:"glob"`
	OutputMode      string `json:"output_mode"`
	CaseInsensitive bool   `json:"case_insensitive"`
	HeadLimit       *int   `json:"head_limit"`
}

// matchGlob reports whether name (slash-separated, relative to the search
// root) matches pattern: path.Match per segment, and "**" for any number of
// segments, none included.
func matchGlob(pattern, name string) (bool, error) {
	return matchSegments(strings.Split(pattern, "/"), strings.Split(name, "/"))
}

func matchSegments(pat, name []string) (bool, error) {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if ok, err := matchSegments(pat[1:], name[i:]); ok || err != nil {
					return ok, err
				}
			}
			return false, nil
		}
		if len(name) == 0 {
			return false, nil
		}
		ok, err := path.Match(pat[0], name[0])
		if err != nil || !ok {
			return false, err
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0, nil
}

// walk lists the tree under root (workspace-relative, "." for all of it)
// down to maxDepth levels (-1: no limit), skipping .git. It stops after
// MaxWalkEntries entries and says so.
func walk(ctx context.Context, sb Sandbox, root string, maxDepth int) (files []FileInfo, capped bool, err error) {
	type dir struct {
		rel   string
		depth int
	}
	queue := []dir{{root, 1}}
	seen := 0
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		arg := d.rel
		if arg == "." {
			arg = ""
		}
		entries, err := sb.ListFiles(ctx, arg)
		if err != nil {
			return nil, false, err
		}
		for _, e := range entries {
			if seen++; seen > MaxWalkEntries {
				return files, true, nil
			}
			if e.Mode.IsDir() {
				if path.Base(e.Path) != ".git" && (maxDepth < 0 || d.depth < maxDepth) {
					queue = append(queue, dir{e.Path, d.depth + 1})
				}
				continue
			}
			if e.Mode.IsRegular() {
				files = append(files, e)
			}
		}
	}
	return files, false, nil
}

// under is name relative to root ("." is the workspace; a mount's names
// are absolute, as root is).
func under(root, name string) string {
	if root == "." {
		return name
	}
	return strings.TrimPrefix(name, root+"/")
}

func (r *Toolset) runGlob(ctx context.Context, sb Sandbox, in globInput) (string, bool, error) {
	if in.Pattern == "" {
		return "", false, inputError("glob: pattern is required")
	}
	root := "."
	if in.Path != "" {
		var err error
		if root, err = relPath(in.Path); err != nil {
			return "", false, inputError("glob: %v", err)
		}
	}
	pattern := in.Pattern
	if path.IsAbs(pattern) {
		// An absolute pattern names its own root.
		rel, err := relPath(pattern)
		if err != nil {
			return "", false, inputError("glob: %v", err)
		}
		root, pattern = ".", rel
		if m := mountOf(rel); m != "" { // beneath a mount: walk that
			root, pattern = m, strings.TrimPrefix(rel, m+"/")
		}
	}
	if _, err := matchGlob(pattern, "x"); err != nil {
		return "", false, inputError("glob: pattern %q: %v", in.Pattern, err)
	}
	depth := -1
	if !slices.Contains(strings.Split(pattern, "/"), "**") {
		depth = strings.Count(pattern, "/") + 1
	}
	files, capped, err := walk(ctx, sb, root, depth)
	if err != nil {
		return fileError("glob", absPath(root), err)
	}
	var hits []FileInfo
	for _, f := range files {
		if ok, _ := matchGlob(pattern, under(root, f.Path)); ok {
			hits = append(hits, f)
		}
	}
	slices.SortStableFunc(hits, func(a, b FileInfo) int {
		if c := b.ModTime.Compare(a.ModTime); c != 0 {
			return c
		}
		return strings.Compare(a.Path, b.Path)
	})
	var b strings.Builder
	if len(hits) == 0 {
		b.WriteString("No files found\n")
	}
	for i, f := range hits {
		if i == GlobMaxResults {
			fmt.Fprintf(&b, "[%d more files not shown; narrow the pattern]\n", len(hits)-GlobMaxResults)
			break
		}
		b.WriteString(absPath(f.Path) + "\n")
	}
	if capped {
		fmt.Fprintf(&b, "[stopped after %d entries; give a narrower path]\n", MaxWalkEntries)
	}
	return b.String(), false, nil
}

// grepFiles returns the files grep searches: the one file root names, or
// the files under it that match glob.
func grepFiles(ctx context.Context, sb Sandbox, root, glob string) ([]FileInfo, bool, error) {
	if root != "." {
		parent := path.Dir(root)
		if parent == "." {
			parent = ""
		}
		entries, err := sb.ListFiles(ctx, parent)
		if err != nil {
			return nil, false, err
		}
		for _, e := range entries {
			if e.Path == root && e.Mode.IsRegular() {
				return []FileInfo{e}, false, nil
			}
		}
	}
	files, capped, err := walk(ctx, sb, root, -1)
	if err != nil || glob == "" {
		return files, capped, err
	}
	kept := files[:0]
	for _, f := range files {
		name := path.Base(f.Path)
		if strings.Contains(glob, "/") {
			name = under(root, f.Path)
		}
		if ok, _ := matchGlob(glob, name); ok {
			kept = append(kept, f)
		}
	}
	return kept, capped, nil
}

func (r *Toolset) runGrep(ctx context.Context, sb Sandbox, in grepInput) (string, bool, error) {
	if in.Pattern == "" {
		return "", false, inputError("grep: pattern is required")
	}
	expr := in.Pattern
	if in.CaseInsensitive {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return "", false, inputError("grep: pattern %q is not a valid regular expression (RE2 syntax): %v", in.Pattern, err)
	}
	mode := in.OutputMode
	switch mode {
	case "":
		mode = "files_with_matches"
	case "files_with_matches", "content", "count":
	default:
		return "", false, inputError("grep: output_mode must be content, files_with_matches or count, got %q", in.OutputMode)
	}
	if in.Glob != "" {
		if _, err := matchGlob(in.Glob, "x"); err != nil {
			return "", false, inputError("grep: glob %q: %v", in.Glob, err)
		}
	}
	limit := GrepDefaultLimit
	if in.HeadLimit != nil {
		if *in.HeadLimit <= 0 || *in.HeadLimit > GrepMaxLimit {
			return "", false, inputError("grep: head_limit must be from 1 to %d, got %d", GrepMaxLimit, *in.HeadLimit)
		}
		limit = *in.HeadLimit
	}
	root := "."
	if in.Path != "" {
		if root, err = relPath(in.Path); err != nil {
			return "", false, inputError("grep: %v", err)
		}
	}
	files, capped, err := grepFiles(ctx, sb, root, in.Glob)
	if err != nil {
		return fileError("grep", absPath(root), err)
	}
	// Only the lines shown are kept (each cut at ReadMaxLineBytes); the rest
	// are counted: a search over many large files holds one file at a time.
	var lines []string
	total := 0
	keep := func(l string) {
		if total++; total <= limit {
			lines = append(lines, cutLine(l))
		}
	}
	skipped := 0
	for _, f := range files {
		if f.Size > GrepMaxFileBytes {
			skipped++
			continue
		}
		data, err := sb.ReadFile(ctx, f.Path)
		if err != nil {
			if _, _, err := fileError("grep", absPath(f.Path), err); err != nil {
				return "", false, err
			}
			skipped++ // gone or unreadable since the listing
			continue
		}
		if bytes.IndexByte(data, 0) >= 0 {
			continue // binary
		}
		n := 0
		for i, line := range strings.Split(string(data), "\n") {
			if !re.MatchString(line) {
				continue
			}
			n++
			if mode == "content" {
				keep(fmt.Sprintf("%s:%d:%s", absPath(f.Path), i+1, line))
			}
		}
		switch {
		case n == 0:
		case mode == "files_with_matches":
			keep(absPath(f.Path))
		case mode == "count":
			keep(fmt.Sprintf("%s:%d", absPath(f.Path), n))
		}
	}
	var b strings.Builder
	if total == 0 {
		b.WriteString("No matches found\n")
	}
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	if total > limit {
		fmt.Fprintf(&b, "[%d more lines not shown; raise head_limit or narrow the search]\n", total-limit)
	}
	if skipped > 0 {
		fmt.Fprintf(&b, "[%d files over %d bytes or unreadable were skipped]\n", skipped, GrepMaxFileBytes)
	}
	if capped {
		fmt.Fprintf(&b, "[stopped after %d entries; give a narrower path]\n", MaxWalkEntries)
	}
	return b.String(), false, nil
}

// cutLine cuts a result line at ReadMaxLineBytes, on a character boundary.
func cutLine(l string) string {
	if len(l) <= ReadMaxLineBytes {
		return l
	}
	return textcut.Prefix(l, ReadMaxLineBytes) + " [line cut]"
}
