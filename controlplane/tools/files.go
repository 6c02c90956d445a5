package tools

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"unicode/utf8"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// Limits of the file tools.
const (
	// ReadMaxLines is how many lines read returns without a view_range.
	ReadMaxLines = 2000
	// ReadMaxLineBytes cuts longer lines.
	ReadMaxLineBytes = 2000
	// MaxFileBytes bounds what read and edit load and write and edit store:
	// the host refuses to read a larger file (from its size, before reading
	// it), and read and edit answer with a tool error. 10 MiB: the most a
	// write can make, so what the tools wrote they can read back; about
	// twice what read shows at most (ReadMaxLines of ReadMaxLineBytes);
	// and well below the host protocol's message limit (64 MiB).
	MaxFileBytes = 10 << 20
)

type readInput struct {
	FilePath  string `json:"file_path"`
	ViewRange []int  `json:"view_range"`
}

type writeInput struct {
	FilePath string  `json:"file_path"`
	Content  *string `json:"content"`
}

type editInput struct {
	FilePath   string  `json:"file_path"`
	OldString  *string `json:"old_string"`
	NewString  *string `json:"new_string"`
	ReplaceAll bool    `json:"replace_all"`
}

// fileError turns a sandbox error about one file into a tool result the
// model can act on, and passes anything else (the sandbox is unreachable)
// through: see hostError.
func fileError(tool, p string, err error) (string, bool, error) {
	if errdefs.IsNotFound(err) && !isSandboxErr(err) {
		return fmt.Sprintf("%s: %s does not exist", tool, p), true, nil
	}
	return hostError(tool+": "+p, err)
}

// tooLarge is the error of a file over MaxFileBytes that a sandbox
// returned anyway (the host refuses one itself).
func tooLarge(n int) error {
	return errdefs.TooLarge("the file is %d bytes; reads are limited to %d (%d MiB)", n, MaxFileBytes, MaxFileBytes>>20)
}

// numberLines formats lines first..last (1-based, inclusive) cat -n style:
// the line number right-aligned in six columns, a tab, the line.
func numberLines(content string, first, last int) string {
	lines := strings.SplitAfter(content, "\n")
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1]
	}
	var b strings.Builder
	for i := first; i <= last && i <= len(lines); i++ {
		line := strings.TrimRight(lines[i-1], "\n")
		line = strings.TrimSuffix(line, "\r")
		if len(line) > ReadMaxLineBytes {
			line = textcut.Prefix(line, ReadMaxLineBytes) + " [line cut]"
		}
		fmt.Fprintf(&b, "%6d\t%s\n", i, line)
	}
	return b.String()
}

// countLines is the number of lines numberLines sees.
func countLines(content string) int {
	if content == "" {
		return 0
	}
	n := strings.Count(content, "\n")
	if !strings.HasSuffix(content, "\n") {
		n++
	}
	return n
}

// viewWindow checks view_range against a file of n lines and returns the
// lines to show; [start, -1] reads to the end.
func viewWindow(vr []int, n int) (first, last int, err error) {
	if vr == nil {
		return 1, min(n, ReadMaxLines), nil
	}
	if len(vr) != 2 {
		return 0, 0, fmt.Errorf("view_range must be [start_line, end_line], got %d numbers", len(vr))
	}
	first, last = vr[0], vr[1]
	if last == -1 {
		last = n
		if n == 0 && first == 1 {
			return 1, 0, nil
		}
	}
	if first < 1 || last < first {
		return 0, 0, fmt.Errorf("view_range [%d, %d] is not a range of lines (1-based, end >= start, or -1 for the end)", vr[0], vr[1])
	}
	if first > n && !(n == 0 && first == 1) {
		return 0, 0, fmt.Errorf("view_range starts at line %d but the file has %d lines", first, n)
	}
	return first, min(last, n), nil
}

func (r *Toolset) runRead(ctx context.Context, sb Sandbox, in readInput) (string, bool, error) {
	rel, err := relPath(in.FilePath)
	if err != nil {
		return "", false, inputError("read: %v", err)
	}
	if in.ViewRange != nil && len(in.ViewRange) != 2 {
		return "", false, inputError("read: view_range must be [start_line, end_line], got %d numbers", len(in.ViewRange))
	}
	data, err := sb.ReadFile(ctx, rel)
	if err == nil && len(data) > MaxFileBytes {
		err = tooLarge(len(data))
	}
	if err != nil {
		return fileError("read", absPath(rel), err)
	}
	if bytes.IndexByte(data, 0) >= 0 || !utf8.Valid(data) {
		return fmt.Sprintf("read: %s is a binary file (%d bytes); use bash to inspect it", absPath(rel), len(data)), true, nil
	}
	content := string(data)
	n := countLines(content)
	first, last, err := viewWindow(in.ViewRange, n)
	if err != nil {
		return "", false, inputError("read: %v", err)
	}
	if n == 0 {
		return fmt.Sprintf("(%s is empty)", absPath(rel)), false, nil
	}
	out := numberLines(content, first, last)
	if in.ViewRange == nil && n > last {
		out += fmt.Sprintf("[showing lines 1-%d of %d; use view_range to see more]\n", last, n)
	}
	return out, false, nil
}

func (r *Toolset) runWrite(ctx context.Context, sb Sandbox, in writeInput) (string, bool, error) {
	rel, err := relPath(in.FilePath)
	if err != nil {
		return "", false, inputError("write: %v", err)
	}
	if in.Content == nil {
		return "", false, inputError("write: content is required")
	}
	if rel == "." {
		return "", false, inputError("write: %s is the workspace directory, not a file", Workspace)
	}
	if len(*in.Content) > MaxFileBytes {
		return "", false, inputError("write: content is %d bytes, over the limit of %d", len(*in.Content), MaxFileBytes)
	}
	if err := sb.WriteFile(ctx, rel, []byte(*in.Content), 0); err != nil {
		return fileError("write", absPath(rel), err)
	}
	return fmt.Sprintf("Wrote %d bytes to %s", len(*in.Content), absPath(rel)), false, nil
}

// applyEdit replaces old with new in content: exactly one occurrence, or
// every one with all. The error says what to do instead.
func applyEdit(content, old, new string, all bool) (string, int, error) {
	if old == "" {
		return "", 0, fmt.Errorf("old_string is empty; give the exact text to replace")
	}
	if old == new {
		return "", 0, fmt.Errorf("old_string and new_string are the same; nothing would change")
	}
	n := strings.Count(content, old)
	switch {
	case n == 0:
		return "", 0, fmt.Errorf("old_string was not found in the file (it must match exactly, whitespace included)")
	case n > 1 && !all:
		return "", 0, fmt.Errorf("old_string occurs %d times; include more surrounding text to make it unique, or set replace_all to replace every occurrence", n)
	}
	if all {
		return strings.ReplaceAll(content, old, new), n, nil
	}
	return strings.Replace(content, old, new, 1), 1, nil
}

func (r *Toolset) runEdit(ctx context.Context, sb Sandbox, in editInput) (string, bool, error) {
	rel, err := relPath(in.FilePath)
	if err != nil {
		return "", false, inputError("edit: %v", err)
	}
	if in.OldString == nil || in.NewString == nil {
		return "", false, inputError("edit: old_string and new_string are required")
	}
	data, err := sb.ReadFile(ctx, rel)
	if err == nil && len(data) > MaxFileBytes {
		err = tooLarge(len(data))
	}
	if err != nil {
		return fileError("edit", absPath(rel), err)
	}
	out, n, err := applyEdit(string(data), *in.OldString, *in.NewString, in.ReplaceAll)
	if err != nil {
		return fmt.Sprintf("edit: %s: %v", absPath(rel), err), true, nil
	}
	if len(out) > MaxFileBytes {
		return fmt.Sprintf("edit: %s would grow to %d bytes, over the limit of %d", absPath(rel), len(out), MaxFileBytes), true, nil
	}
	mode, err := fileMode(ctx, sb, rel)
	if err != nil {
		return fileError("edit", absPath(rel), err)
	}
	if err := sb.WriteFile(ctx, rel, []byte(out), mode); err != nil {
		return fileError("edit", absPath(rel), err)
	}
	if n == 1 {
		return fmt.Sprintf("Replaced 1 occurrence in %s", absPath(rel)), false, nil
	}
	return fmt.Sprintf("Replaced %d occurrences in %s", n, absPath(rel)), false, nil
}

// fileMode returns rel's permission bits, so an edit keeps them.
func fileMode(ctx context.Context, sb Sandbox, rel string) (fs.FileMode, error) {
	dir := path.Dir(rel)
	if dir == "." {
		dir = ""
	}
	files, err := sb.ListFiles(ctx, dir)
	if err != nil {
		return 0, err
	}
	for _, f := range files {
		if f.Path == rel {
			return f.Mode.Perm(), nil
		}
	}
	return 0, nil
}
