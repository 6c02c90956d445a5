package publicapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Skills, as the Skills API has them (anthropic-beta skills-2025-10-02):
//
//	POST   /v1/skills                                  create: multipart, parts "files" (or "files[]")
//	                                                   whose filenames are paths, and display_name
//	GET    /v1/skills                                  list, newest first (limit, page, source)
//	GET    /v1/skills/{id}                             get
//	DELETE /v1/skills/{id}                             delete, with every version
//	POST   /v1/skills/{id}/versions                    a new version: multipart "files"
//	GET    /v1/skills/{id}/versions                    list, newest first (limit, page)
//	GET    /v1/skills/{id}/versions/{version}          get ("latest" is the newest)
//	DELETE /v1/skills/{id}/versions/{version}          delete (not the last one)
//	GET    /v1/skills/{id}/versions/{version}/content  the bundle, a zip archive
//
// Only custom skills exist here: this server has no Anthropic skills, so a
// list with source=anthropic is empty. A bundle is checked whole
// (skillbundle.go) before anything is kept; its archive goes to the blob
// store (skills/<tenant>/<skill>/<version>) before its row is inserted, and
// is deleted after its row is. The whole upload is within the public API's
// body limit (MaxBodyBytes).

type skillSource struct {
	Type string `json:"type"`
}

type skillResponse struct {
	Type            string      `json:"type"`
	ID              string      `json:"id"`
	DisplayName     string      `json:"display_name"`
	LatestVersionID string      `json:"latest_version_id"`
	Source          skillSource `json:"source"`
	CreatedAt       string      `json:"created_at"`
	UpdatedAt       string      `json:"updated_at"`
}

type skillVersionResponse struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	SkillID     string `json:"skill_id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	CreatedAt   string `json:"created_at"`
}

func skillOut(s store.Skill) skillResponse {
	return skillResponse{Type: "skill", ID: s.ID, DisplayName: s.DisplayName, LatestVersionID: s.LatestVersionID,
		Source: skillSource{Type: "custom"}, CreatedAt: ts(s.CreatedAt), UpdatedAt: ts(s.UpdatedAt)}
}

func skillVersionOut(v store.SkillVersion) skillVersionResponse {
	return skillVersionResponse{Type: "skill_version", ID: v.ID, SkillID: v.SkillID, Name: v.Name, Description: v.Description, CreatedAt: ts(v.CreatedAt)}
}

// readSkillUpload reads and checks a skill upload's bundle, and its
// display_name when withName.
func readSkillUpload(r *http.Request, withName bool) (skillBundle, string, error) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return skillBundle{}, "", errdefs.InvalidArgument("the body must be multipart/form-data with the bundle's files in parts named \"files\"")
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	var b bundleBuilder
	display, haveDisplay := "", false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return skillBundle{}, "", uploadReadError(err)
		}
		switch name := part.FormName(); {
		case name == "files" || name == "files[]":
			// Part.FileName strips directories; the path is taken as sent.
			_, disp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if err != nil {
				return skillBundle{}, "", errdefs.InvalidArgument("files: a part's Content-Disposition is malformed")
			}
			// Read one byte past the room left, to tell a bundle too large.
			data, err := io.ReadAll(io.LimitReader(part, maxSkillBundleBytes-b.size+1))
			if err != nil {
				return skillBundle{}, "", uploadReadError(err)
			}
			if err := b.add(disp["filename"], data); err != nil {
				return skillBundle{}, "", err
			}
		case name == "display_name" && withName && !haveDisplay:
			v, err := io.ReadAll(io.LimitReader(part, maxSkillDisplayName+1))
			if err != nil {
				return skillBundle{}, "", uploadReadError(err)
			}
			display, haveDisplay = string(v), true
			if err := checkDisplayName(display); err != nil {
				return skillBundle{}, "", err
			}
		default:
			want := "\"files\""
			if withName {
				want = "\"files\" and \"display_name\" (once)"
			}
			return skillBundle{}, "", errdefs.InvalidArgument("%q is not a known field of a skill upload (want %s)", truncate(name), want)
		}
	}
	bundle, err := b.finish()
	return bundle, display, err
}

func checkDisplayName(s string) error {
	switch {
	case len(s) > maxSkillDisplayName:
		return errdefs.InvalidArgument("display_name: at most %d bytes", maxSkillDisplayName)
	case strings.ContainsAny(s, "\r\n") || strings.ContainsFunc(s, func(c rune) bool { return c < 0x20 || c == 0x7f }):
		return errdefs.InvalidArgument("display_name: one line of text without control characters")
	}
	return checkText(s, "display_name")
}

// checkText refuses text PostgreSQL cannot store, with a clear message.
func checkText(s, field string) error {
	if !validUTF8NoNUL(s) {
		return errdefs.InvalidArgument("%s: must be UTF-8 text without NUL", field)
	}
	return nil
}

func validUTF8NoNUL(s string) bool {
	return !strings.ContainsRune(s, 0) && strings.ToValidUTF8(s, "\ufffd") == s
}

// storeBundle puts the bundle's archive in the blob store.
func (h *Handler) storeBundle(ctx context.Context, tid tenant.ID, skillID string, b skillBundle) (store.SkillVersion, error) {
	archive, err := b.zip()
	if err != nil {
		return store.SkillVersion{}, err
	}
	id := store.NewSkillVersionID()
	v := store.SkillVersion{ID: id, SkillID: skillID, Name: b.Name, Description: b.Description, SizeBytes: b.Size,
		FileCount: len(b.Files), BlobKey: store.SkillBlobKey(string(tid), skillID, id)}
	if err := h.blobs.Put(ctx, v.BlobKey, bytes.NewReader(archive)); err != nil {
		h.deleteSkillBlobs(ctx, v)
		return store.SkillVersion{}, err // the blob store's: internal
	}
	// Each file on its own too: a sandbox is given them as uploads.
	for n, f := range b.Files {
		if err := h.blobs.Put(ctx, store.SkillFileBlobKey(string(tid), skillID, id, n), bytes.NewReader(f.Data)); err != nil {
			h.deleteSkillBlobs(ctx, v)
			return store.SkillVersion{}, err
		}
		v.Files = append(v.Files, store.SkillFile{Path: f.Path, Size: int64(len(f.Data))})
	}
	return v, nil
}

// deleteSkillBlobs removes version v's bundle and files.
func (h *Handler) deleteSkillBlobs(ctx context.Context, v store.SkillVersion) {
	prefix := strings.TrimSuffix(v.BlobKey, "/bundle.zip")
	if err := h.blobs.DeletePrefix(context.WithoutCancel(ctx), prefix); err != nil {
		h.log.Error("deleting a skill version's blobs", "prefix", prefix, "err", err)
	}
}

func (h *Handler) noSkillStore(w http.ResponseWriter, r *http.Request) bool {
	if h.blobs == nil {
		h.fail(w, r, errdefs.FailedPrecondition("this server keeps no skills (no blob store)"))
		return true
	}
	return false
}

func (h *Handler) createSkill(w http.ResponseWriter, r *http.Request) {
	if h.noSkillStore(w, r) {
		return
	}
	ctx := r.Context()
	tid, err := tenant.Required(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	bundle, display, err := readSkillUpload(r, true)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if display == "" {
		display = bundle.Name
	}
	skillID := store.NewSkillID()
	v, err := h.storeBundle(ctx, tid, skillID, bundle)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sk, _, err := h.store.Skills().Create(ctx, store.Skill{ID: skillID, Name: bundle.Name, DisplayName: display}, v)
	if err != nil {
		h.deleteSkillBlobs(ctx, v)
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, skillOut(sk))
}

func (h *Handler) getSkill(w http.ResponseWriter, r *http.Request) {
	sk, err := h.store.Skills().Get(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, skillOut(sk))
}

func (h *Handler) deleteSkill(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	vs, err := h.store.Skills().Delete(r.Context(), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if h.blobs != nil {
		for _, v := range vs {
			h.deleteSkillBlobs(r.Context(), v)
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "type": "skill_deleted"})
}

// pageQuery reads limit (1 to 1000, default 20) and page of a list.
func pageQuery(r *http.Request, list string) (int, *store.Key, error) {
	q := r.URL.Query()
	limit := 20
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return 0, nil, errdefs.InvalidArgument("limit: %q is not an integer from 1 to 1000", truncate(s))
		}
		limit = n
	}
	c, err := decodeCursor(q, list, "desc")
	if err != nil {
		return 0, nil, err
	}
	if c != nil {
		return limit, c.key(), nil
	}
	return limit, nil, nil
}

func (h *Handler) listSkills(w http.ResponseWriter, r *http.Request) {
	out := page[skillResponse]{Data: []skillResponse{}}
	switch src := r.URL.Query().Get("source"); src {
	case "", "custom":
	case "anthropic":
		writeJSON(w, http.StatusOK, out) // this server has none
		return
	default:
		h.fail(w, r, enumError("source", src, []string{"custom", "anthropic"}))
		return
	}
	limit, after, err := pageQuery(r, "skills")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sks, more, err := h.store.Skills().List(r.Context(), limit, after)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	for _, s := range sks {
		out.Data = append(out.Data, skillOut(s))
	}
	if more && len(sks) > 0 {
		last := sks[len(sks)-1]
		out.NextPage = keyCursor("skills", "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) createSkillVersion(w http.ResponseWriter, r *http.Request) {
	if h.noSkillStore(w, r) {
		return
	}
	ctx := r.Context()
	tid, err := tenant.Required(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	skillID := r.PathValue("id")
	sk, err := h.store.Skills().Get(ctx, skillID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	bundle, _, err := readSkillUpload(r, false)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if bundle.Name != sk.Name {
		h.fail(w, r, errdefs.InvalidArgument("SKILL.md: name %q is not the skill's name %q (a skill's name never changes)", bundle.Name, sk.Name))
		return
	}
	v, err := h.storeBundle(ctx, tid, skillID, bundle)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out, err := h.store.Skills().AddVersion(ctx, skillID, v)
	if err != nil {
		h.deleteSkillBlobs(ctx, v)
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, skillVersionOut(out))
}

func (h *Handler) listSkillVersions(w http.ResponseWriter, r *http.Request) {
	skillID := r.PathValue("id")
	list := "skill_versions:" + skillID
	limit, after, err := pageQuery(r, list)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	vs, more, err := h.store.Skills().Versions(r.Context(), skillID, limit, after)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[skillVersionResponse]{Data: []skillVersionResponse{}}
	for _, v := range vs {
		out.Data = append(out.Data, skillVersionOut(v))
	}
	if more && len(vs) > 0 {
		last := vs[len(vs)-1]
		out.NextPage = keyCursor(list, "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) getSkillVersion(w http.ResponseWriter, r *http.Request) {
	v, err := h.store.Skills().Version(r.Context(), r.PathValue("id"), r.PathValue("version"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, skillVersionOut(v))
}

func (h *Handler) deleteSkillVersion(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	v, err := h.store.Skills().DeleteVersion(r.Context(), r.PathValue("id"), r.PathValue("version"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if h.blobs != nil {
		h.deleteSkillBlobs(r.Context(), v)
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": v.ID, "type": "skill_version_deleted"})
}

func (h *Handler) downloadSkillVersion(w http.ResponseWriter, r *http.Request) {
	if h.noSkillStore(w, r) {
		return
	}
	v, err := h.store.Skills().Version(r.Context(), r.PathValue("id"), r.PathValue("version"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rc, err := h.blobs.Get(r.Context(), v.BlobKey)
	if err != nil {
		h.fail(w, r, errors.New("skill version "+v.ID+": its bundle is missing: "+err.Error())) // internal
		return
	}
	defer rc.Close()
	hd := w.Header()
	hd.Set("Content-Type", "application/zip")
	hd.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": v.Name + ".zip"}))
	hd.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		h.log.Warn("skill download cut short", "skill_version_id", v.ID, "err", err)
	}
}

// decodeSkills reads an agent's skills: [{type:"custom", skill_id,
// version?}]. Anthropic's own skills are refused: this server has none.
// Whether each skill exists is checked by resolveSkills, with the store.
func decodeSkills(raw json.RawMessage) ([]skill, error) {
	items, err := rawList(raw, "skills", maxSkills)
	if err != nil {
		return nil, err
	}
	out := []skill{}
	seen := map[string]bool{}
	for i, item := range items {
		var sk skill
		if err := field(item, fmt.Sprintf("skills[%d]", i), &sk); err != nil {
			return nil, err
		}
		switch sk.Type {
		case "custom":
		case "anthropic":
			return nil, errdefs.InvalidArgument("skills[%d]: this server has no Anthropic skills (type anthropic); upload the skill (POST /v1/skills) and use type custom", i)
		default:
			return nil, enumError(fmt.Sprintf("skills[%d].type", i), sk.Type, []string{"custom", "anthropic"})
		}
		if !validID(sk.SkillID) {
			return nil, errdefs.InvalidArgument("skills[%d].skill_id: %q is not the id of a skill", i, truncate(sk.SkillID))
		}
		if sk.Version != "" && sk.Version != "latest" && !validID(sk.Version) {
			return nil, errdefs.InvalidArgument("skills[%d].version: %q is not a version id or latest", i, truncate(sk.Version))
		}
		if seen[sk.SkillID] {
			return nil, errdefs.InvalidArgument("skills[%d]: skill %s is listed twice", i, sk.SkillID)
		}
		seen[sk.SkillID] = true
		out = append(out, sk)
	}
	return out, nil
}

// resolveSkills checks that every skill of c exists in the caller's
// tenant and pins each to a version: the one named, or the latest when
// none (or "latest") is. A skill that does not exist, or is another
// tenant's, is a 400 naming it.
func (h *Handler) resolveSkills(ctx context.Context, c *agentCore) error {
	for i := range c.Skills {
		sk := &c.Skills[i]
		v := sk.Version
		if v == "" {
			v = "latest"
		}
		got, err := h.store.Skills().Version(ctx, sk.SkillID, v)
		if errdefs.IsNotFound(err) {
			return errdefs.InvalidArgument("skills[%d]: %s", i, err.Error())
		}
		if err != nil {
			return err
		}
		sk.Version = got.ID
	}
	return nil
}
