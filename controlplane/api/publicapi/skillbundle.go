package publicapi

import (
	"archive/zip"
	"bytes"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"corral.dev/corral/internal/errdefs"
)

// A skill bundle is the files of one upload, all under one top directory
// with a SKILL.md at its root, whose YAML front matter names the skill
// and describes it. The bounds below are checked before anything is kept;
// the bundle is then stored as a zip archive whose entries sit under the
// skill's name (what the sandbox mounts and a download returns).
const (
	maxSkillBundleBytes = MaxBodyBytes - FileUploadOverhead // all files together
	maxSkillFiles       = 500
	maxSkillPath        = 255 // bytes, of a file's path
	maxSkillDepth       = 14  // directories deep (with .skills/<name>/, the 16 an upload may be)
	maxSkillName        = 64
	maxSkillDescription = 1024
	maxSkillFrontMatter = 16 << 10
	maxSkillDisplayName = 255
)

// skillFile is one file of a bundle, its path relative to the top
// directory.
type skillFile struct {
	Path string
	Data []byte
}

// skillBundle is a checked bundle.
type skillBundle struct {
	Name        string
	Description string
	Files       []skillFile
	Size        int64
}

// checkSkillPath checks one uploaded file's path and splits off its top
// directory.
func checkSkillPath(p string) (top, rest string, err error) {
	switch {
	case p == "":
		return "", "", errdefs.InvalidArgument("files: a file has no filename (want a path such as my-skill/SKILL.md)")
	case len(p) > maxSkillPath:
		return "", "", errdefs.InvalidArgument("files: a path is longer than %d bytes", maxSkillPath)
	case !utf8.ValidString(p):
		return "", "", errdefs.InvalidArgument("files: a path is not valid UTF-8")
	case strings.HasPrefix(p, "/"):
		return "", "", errdefs.InvalidArgument("files: %q is absolute; paths are relative to the bundle's top directory", truncate(p))
	case strings.Contains(p, "\\"):
		return "", "", errdefs.InvalidArgument("files: %q contains a backslash; separate directories with /", truncate(p))
	}
	for _, c := range p {
		if unicode.IsControl(c) {
			return "", "", errdefs.InvalidArgument("files: a path contains control characters")
		}
	}
	parts := strings.Split(p, "/")
	for _, s := range parts {
		switch s {
		case "", ".", "..":
			return "", "", errdefs.InvalidArgument("files: %q is not a clean path (no empty, . or .. elements)", truncate(p))
		}
	}
	if len(parts) < 2 {
		return "", "", errdefs.InvalidArgument("files: %q is not in a directory; every file must be under the bundle's top directory (my-skill/SKILL.md)", truncate(p))
	}
	if len(parts) > maxSkillDepth+1 {
		return "", "", errdefs.InvalidArgument("files: %q is more than %d directories deep", truncate(p), maxSkillDepth)
	}
	return parts[0], path.Join(parts[1:]...), nil
}

// bundleBuilder collects an upload's files, checking each as it comes.
type bundleBuilder struct {
	top   string
	files []skillFile
	seen  map[string]bool
	size  int64
}

// add checks file p and keeps it.
func (b *bundleBuilder) add(p string, data []byte) error {
	top, rest, err := checkSkillPath(p)
	if err != nil {
		return err
	}
	if b.top == "" {
		b.top, b.seen = top, map[string]bool{}
	}
	if top != b.top {
		return errdefs.InvalidArgument("files: %q and %q are in different top directories; a bundle has one", truncate(b.top), truncate(top))
	}
	if len(b.files) >= maxSkillFiles {
		return errdefs.InvalidArgument("files: at most %d files in a bundle", maxSkillFiles)
	}
	if b.seen[rest] {
		return errdefs.InvalidArgument("files: %q is uploaded twice", truncate(p))
	}
	b.size += int64(len(data))
	if b.size > maxSkillBundleBytes {
		return errdefs.TooLarge("files: the bundle is larger than %d bytes", maxSkillBundleBytes)
	}
	b.seen[rest] = true
	b.files = append(b.files, skillFile{Path: rest, Data: data})
	return nil
}

// finish checks the whole bundle: its SKILL.md and a file that is not also
// a directory.
func (b *bundleBuilder) finish() (skillBundle, error) {
	if len(b.files) == 0 {
		return skillBundle{}, errdefs.InvalidArgument("files is required: the bundle's files, as multipart parts named \"files\" whose filenames are paths (my-skill/SKILL.md)")
	}
	for _, f := range b.files {
		for d := path.Dir(f.Path); d != "."; d = path.Dir(d) {
			if b.seen[d] {
				return skillBundle{}, errdefs.InvalidArgument("files: %q is both a file and a directory", truncate(d))
			}
		}
	}
	var md []byte
	for _, f := range b.files {
		if f.Path == "SKILL.md" {
			md = f.Data
		}
	}
	if md == nil {
		return skillBundle{}, errdefs.InvalidArgument("files: no SKILL.md at the root of the top directory %q", truncate(b.top))
	}
	name, desc, err := skillFrontMatter(md)
	if err != nil {
		return skillBundle{}, err
	}
	return skillBundle{Name: name, Description: desc, Files: b.files, Size: b.size}, nil
}

// skillFrontMatter reads SKILL.md's YAML front matter: the block between a
// first line "---" and the next line "---", with name and description.
func skillFrontMatter(md []byte) (name, description string, err error) {
	md = bytes.TrimPrefix(md, []byte("\ufeff"))
	s := strings.ReplaceAll(string(md[:min(len(md), maxSkillFrontMatter+8)]), "\r\n", "\n")
	if !strings.HasPrefix(s, "---\n") {
		return "", "", errdefs.InvalidArgument("SKILL.md: must start with YAML front matter (a line \"---\", name: and description:, a line \"---\")")
	}
	body, _, ok := strings.Cut(s[4:], "\n---")
	if !ok || len(body) > maxSkillFrontMatter {
		return "", "", errdefs.InvalidArgument("SKILL.md: the front matter has no closing \"---\" line within %d bytes", maxSkillFrontMatter)
	}
	var fm struct {
		Name        any `yaml:"name"`
		Description any `yaml:"description"`
	}
	if err := yaml.Unmarshal([]byte(body), &fm); err != nil {
		return "", "", errdefs.InvalidArgument("SKILL.md: the front matter is not YAML: %s", truncate(err.Error()))
	}
	name, _ = fm.Name.(string)
	description, _ = fm.Description.(string)
	description = strings.TrimSpace(description)
	switch {
	case name == "":
		return "", "", errdefs.InvalidArgument("SKILL.md: the front matter needs name: a string")
	case len(name) > maxSkillName:
		return "", "", errdefs.InvalidArgument("SKILL.md: name must be at most %d characters (got %d)", maxSkillName, len(name))
	case strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-") != "":
		return "", "", errdefs.InvalidArgument("SKILL.md: name %q may hold only lowercase letters, digits and hyphens", truncate(name))
	case strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-"):
		return "", "", errdefs.InvalidArgument("SKILL.md: name %q must not start or end with a hyphen", name)
	case description == "":
		return "", "", errdefs.InvalidArgument("SKILL.md: the front matter needs description: a non-empty string")
	case len(description) > maxSkillDescription:
		return "", "", errdefs.InvalidArgument("SKILL.md: description must be at most %d bytes (got %d)", maxSkillDescription, len(description))
	case !utf8.ValidString(description) || strings.ContainsAny(description, "<>"):
		return "", "", errdefs.InvalidArgument("SKILL.md: description must be UTF-8 text without XML tags (< or >)")
	}
	for _, c := range description {
		if unicode.IsControl(c) && c != '\n' && c != '\t' {
			return "", "", errdefs.InvalidArgument("SKILL.md: description must not contain control characters")
		}
	}
	return name, description, nil
}

// zip writes the bundle as an archive whose entries are under its name,
// regular files only (mode 0644), so what is unpacked is what was checked.
func (b skillBundle) zip() ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range b.Files {
		h := &zip.FileHeader{Name: b.Name + "/" + f.Path, Method: zip.Deflate}
		h.SetMode(0o644)
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
