package publicapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Files, as the Files API has them (anthropic-beta files-api-2025-04-14):
//
//	POST   /v1/files              upload: multipart/form-data, one part "file"
//	GET    /v1/files              list, newest first (limit; page, or after_id
//	                              or before_id; scope_id; ids[])
//	GET    /v1/files/{id}         metadata
//	GET    /v1/files/{id}/content the content, streamed from the blob store
//	DELETE /v1/files/{id}         delete {id, type:"file_deleted"}
//
// The content goes to the blob store (files/<tenant>/<file id>) as it is
// read, never whole in memory, and the metadata row is inserted only after
// the blob is complete: an upload that fails or is cut off leaves no row,
// and its blob is deleted (a node that dies between the two leaves the
// blob behind; nothing sweeps it yet). A delete removes the row first, so
// the file disappears for every reader at once, then the blob.
//
// Limits: a file is at most Options.FileMaxBytes (default
// DefaultFileMaxBytes; larger: 413), and a tenant's files together at
// most its quota's file_storage_mib (over: 429 that names the quota,
// marked not to retry). The whole request body may be the file limit plus
// FileUploadOverhead for the multipart framing (api.HandlerOptions), and
// it may take UploadReadTimeout to arrive rather than the server's
// ReadTimeout. Filenames are metadata only, but bounded: 1 to
// maxFilename bytes of UTF-8 without control characters, path separators,
// "." or "..".

// DefaultFileMaxBytes is the largest file an upload takes unless the
// server is configured otherwise: 500 MiB, the Files API's limit.
const DefaultFileMaxBytes = 500 << 20

// FileUploadOverhead is how much larger than a file its upload's body may
// be: the multipart boundaries and part headers.
const FileUploadOverhead = 64 << 10

// UploadReadTimeout bounds the reading of an upload's body (500 MiB at
// 300 KB/s), which the server's ReadTimeout of a minute would cut short.
const UploadReadTimeout = 30 * time.Minute

const (
	maxFilename  = 255
	maxListFiles = 1000
	maxListIDs   = 100
)

type fileScope struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

type fileResponse struct {
	Type         string     `json:"type"`
	ID           string     `json:"id"`
	Filename     string     `json:"filename"`
	MimeType     string     `json:"mime_type"`
	SizeBytes    int64      `json:"size_bytes"`
	CreatedAt    string     `json:"created_at"`
	Downloadable bool       `json:"downloadable"`
	ExpiresAt    *string    `json:"expires_at"`
	Scope        *fileScope `json:"scope"`
}

// filePage is the files list: the Files API's first_id, last_id and
// has_more, and the managed-agents SDKs' next_page cursor.
type filePage struct {
	Data     []fileResponse `json:"data"`
	FirstID  *string        `json:"first_id"`
	LastID   *string        `json:"last_id"`
	HasMore  bool           `json:"has_more"`
	NextPage *string        `json:"next_page"`
}

func fileOut(f store.File) fileResponse {
	out := fileResponse{Type: "file", ID: f.ID, Filename: f.Filename, MimeType: f.MimeType, SizeBytes: f.SizeBytes,
		CreatedAt: ts(f.CreatedAt), Downloadable: f.Downloadable}
	if f.ScopeID != "" {
		out.Scope = &fileScope{Type: "session", ID: f.ScopeID}
	}
	return out
}

// errFileTooLarge and errOverQuota end the reading of a file part at its
// bound.
var (
	errFileTooLarge = errors.New("file too large")
	errOverQuota    = errors.New("over quota")
)

// boundedPart reads a file part for the blob store: at most max bytes
// (then fails with over), counting them and keeping the first 512 for
// sniffing. Errors of the request body itself are kept in err, so that
// they are told from the blob store's.
type boundedPart struct {
	r    io.Reader
	max  int64
	over error
	n    int64
	head []byte
	err  error
}

func (b *boundedPart) Read(p []byte) (int, error) {
	if b.n > b.max {
		return 0, b.over
	}
	if rest := b.max + 1 - b.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	// Fill p: a multipart part reads a few KiB at a time, and the blob
	// store writes what each read returns.
	n, err := io.ReadFull(b.r, p)
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	b.n += int64(n)
	if len(b.head) < 512 {
		b.head = append(b.head, p[:min(n, 512-len(b.head))]...)
	}
	if b.n > b.max {
		return n, b.over
	}
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (h *Handler) uploadFile(w http.ResponseWriter, r *http.Request) {
	if h.blobs == nil {
		h.fail(w, r, errdefs.FailedPrecondition("this server keeps no files (no blob store)"))
		return
	}
	ctx := r.Context()
	tid, err := tenant.Required(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		h.fail(w, r, errdefs.InvalidArgument("the body must be multipart/form-data with the file in a part named \"file\""))
		return
	}
	// The server's ReadTimeout is for small bodies.
	if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(UploadReadTimeout)); err != nil {
		h.log.Warn("upload keeps the server's read timeout", "request_id", api.RequestID(ctx), "err", err)
	}
	quota, err := h.fileQuota(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	used, err := h.store.Files().Used(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// multipart reads through a 4 KiB buffer: large reads of the
	// connection underneath it.
	mr := multipart.NewReader(bufio.NewReaderSize(r.Body, 256<<10), params["boundary"])
	var f *store.File
	defer func() {
		if f != nil { // not recorded: the blob goes
			h.deleteBlob(ctx, f.BlobKey)
		}
	}()
	// Every part but one file is refused at once, so this reads at most
	// two parts' headers.
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			h.fail(w, r, uploadReadError(err))
			return
		}
		name := part.FormName()
		switch {
		case name == "file" && f != nil:
			h.fail(w, r, errdefs.InvalidArgument("file: an upload carries one file"))
			return
		case name == "file":
			got, err := h.storePart(ctx, tid, part, quota, used)
			if got != nil {
				f = got
			}
			if err != nil {
				h.fail(w, r, err)
				return
			}
		case name == "expires_in_seconds":
			h.fail(w, r, refuse("file.expires_in_seconds", "expires_in_seconds"))
			return
		default:
			h.fail(w, r, errdefs.InvalidArgument("%q is not a known field of an upload (want \"file\")", truncate(name)))
			return
		}
	}
	if f == nil {
		h.fail(w, r, errdefs.InvalidArgument("file is required: a multipart part named \"file\" with a filename"))
		return
	}
	out, err := h.store.Files().Create(ctx, *f, quota)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	f = nil
	writeJSON(w, http.StatusOK, fileOut(out))
}

// storePart checks the file part's name and streams its content to the
// blob store, bounded by the file limit and the tenant's room (quota less
// used; a quota of 0 is none). It returns the file to record once its
// blob is complete, and whatever it stored even when it fails, for the
// caller to delete.
func (h *Handler) storePart(ctx context.Context, tid tenant.ID, part *multipart.Part, quota, used int64) (*store.File, error) {
	// Part.FileName strips directories; the name is checked as sent.
	_, disp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return nil, errdefs.InvalidArgument("file: the part's Content-Disposition is malformed")
	}
	name, ok := disp["filename"]
	if !ok {
		return nil, errdefs.InvalidArgument("file: the part has no filename")
	}
	if err := checkFilename(name); err != nil {
		return nil, err
	}
	limit, over := h.fileMax, errFileTooLarge
	if room := quota - used; quota > 0 && room < limit {
		limit, over = max(room, 0), errOverQuota
	}
	id := store.NewFileID()
	f := &store.File{ID: id, Filename: name, Downloadable: true, BlobKey: store.FileBlobKey(string(tid), id)}
	body := &boundedPart{r: part, max: limit, over: over}
	err = h.blobs.Put(ctx, f.BlobKey, body)
	switch {
	case body.n > limit && over == errFileTooLarge:
		return f, errdefs.TooLarge("file: larger than the limit of %d bytes", h.fileMax)
	case body.n > limit:
		return f, errdefs.ResourceExhausted("tenant %s: quota file_storage_mib exceeded (%d bytes stored, the file is larger than the %d bytes left, limit %d bytes); delete files first",
			tid, used, limit, quota)
	case body.err != nil:
		return f, uploadReadError(body.err)
	case err != nil:
		return f, err // the blob store's: internal
	}
	f.SizeBytes = body.n
	f.MimeType = partType(part.Header.Get("Content-Type"), body.head)
	return f, nil
}

// uploadReadError is a failure to read the request body: 413 at the body
// cap, else 400 (the client's bytes were cut off or malformed).
func uploadReadError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return errdefs.TooLarge("request body is larger than %d bytes", tooBig.Limit)
	}
	return errdefs.InvalidArgument("reading the upload: %v", err)
}

// partType is the part's Content-Type, unless it is absent, malformed or
// the generic application/octet-stream (what the SDKs send for a reader
// they know nothing of): then the content's, sniffed from its head.
func partType(header string, head []byte) string {
	if t, params, err := mime.ParseMediaType(header); err == nil && t != "application/octet-stream" {
		if f := mime.FormatMediaType(t, params); f != "" && len(f) <= 255 {
			return f
		}
		if f := mime.FormatMediaType(t, nil); f != "" {
			return f // parameters too long to keep
		}
	}
	return http.DetectContentType(head)
}

// checkFilename bounds a filename: it is only metadata, but it comes back
// in every listing and in the download's Content-Disposition.
func checkFilename(name string) error {
	switch {
	case name == "":
		return errdefs.InvalidArgument("file: the filename must not be empty")
	case len(name) > maxFilename:
		return errdefs.InvalidArgument("file: the filename must be at most %d bytes (got %d)", maxFilename, len(name))
	case !utf8.ValidString(name):
		return errdefs.InvalidArgument("file: the filename is not valid UTF-8")
	case name == "." || name == "..":
		return errdefs.InvalidArgument("file: the filename must not be %q", name)
	}
	for _, c := range name {
		switch {
		case c == '/' || c == '\\':
			return errdefs.InvalidArgument("file: the filename must not contain %q: it names a file, not a path", c)
		case unicode.IsControl(c):
			return errdefs.InvalidArgument("file: the filename must not contain control characters")
		}
	}
	return nil
}

func (h *Handler) deleteBlob(ctx context.Context, key string) {
	if err := h.blobs.Delete(context.WithoutCancel(ctx), key); err != nil {
		h.log.Error("deleting a file's blob", "key", key, "err", err)
	}
}

func (h *Handler) getFile(w http.ResponseWriter, r *http.Request) {
	f, err := h.store.Files().Get(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fileOut(f))
}

func (h *Handler) downloadFile(w http.ResponseWriter, r *http.Request) {
	if h.blobs == nil {
		h.fail(w, r, errdefs.FailedPrecondition("this server keeps no files (no blob store)"))
		return
	}
	f, err := h.store.Files().Get(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !f.Downloadable {
		h.fail(w, r, errdefs.PermissionDenied("file %s cannot be downloaded", f.ID))
		return
	}
	rc, err := h.blobs.Get(r.Context(), f.BlobKey)
	if err != nil {
		// The row says the content exists: its absence is ours, not
		// the caller's.
		h.fail(w, r, fmt.Errorf("file %s: its content is missing: %v", f.ID, err)) // %v: no kind, an internal error
		return
	}
	defer rc.Close()
	hd := w.Header()
	hd.Set("Content-Type", f.MimeType)
	hd.Set("Content-Length", strconv.FormatInt(f.SizeBytes, 10))
	hd.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": f.Filename}))
	hd.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	// Large reads: a blob store's reader may pay per call (the S3
	// client's reads each go through its request goroutine), and the
	// response writer's own copy would read 32 KiB at a time. Hiding its
	// ReadFrom makes the copy use this buffer.
	buf := make([]byte, downloadBuffer)
	if n, err := io.CopyBuffer(struct{ io.Writer }{w}, io.LimitReader(rc, f.SizeBytes), buf); err != nil || n != f.SizeBytes {
		// The status is sent; the short body tells the client.
		h.log.Warn("file download cut short", "file_id", f.ID, "sent", n, "size", f.SizeBytes, "err", err)
	}
}

// downloadBuffer is the copy buffer of a file download.
const downloadBuffer = 512 << 10

func (h *Handler) deleteFile(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	f, err := h.store.Files().Delete(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if h.blobs != nil {
		h.deleteBlob(r.Context(), f.BlobKey)
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": f.ID, "type": "file_deleted"})
}

func (h *Handler) listFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var opts store.FileListOptions
	opts.Limit = 20
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListFiles {
			h.fail(w, r, errdefs.InvalidArgument("limit: %q is not an integer from 1 to %d", truncate(s), maxListFiles))
			return
		}
		opts.Limit = n
	}
	list := "files"
	if s := q.Get("scope_id"); s != "" {
		if !validID(s) {
			h.fail(w, r, errdefs.InvalidArgument("scope_id: %q is not the id of a session", truncate(s)))
			return
		}
		opts.ScopeID, list = s, "files:"+s
	}
	opts.IDs = queryList(q, "ids")
	if len(opts.IDs) > maxListIDs {
		h.fail(w, r, errdefs.InvalidArgument("ids: at most %d (got %d)", maxListIDs, len(opts.IDs)))
		return
	}
	for _, id := range opts.IDs {
		if !validID(id) {
			h.fail(w, r, errdefs.InvalidArgument("ids: %q is not the id of a file", truncate(id)))
			return
		}
	}
	set := 0
	for _, p := range []string{"page", "after_id", "before_id"} {
		if q.Get(p) != "" {
			set++
		}
	}
	if set > 1 {
		h.fail(w, r, errdefs.InvalidArgument("page, after_id and before_id are exclusive: send at most one"))
		return
	}
	c, err := decodeCursor(q, list, "desc")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if c != nil {
		opts.After = c.key()
	}
	for p, dst := range map[string]**store.Key{"after_id": &opts.After, "before_id": &opts.Before} {
		id := q.Get(p)
		if id == "" {
			continue
		}
		if !validID(id) {
			h.fail(w, r, errdefs.InvalidArgument("%s: %q is not the id of a file", p, truncate(id)))
			return
		}
		f, err := h.store.Files().Get(r.Context(), id)
		if errdefs.IsNotFound(err) {
			err = errdefs.InvalidArgument("%s: no file %s", p, id)
		}
		if err != nil {
			h.fail(w, r, err)
			return
		}
		*dst = &store.Key{CreatedAt: f.CreatedAt, ID: f.ID}
	}
	fs, more, err := h.store.Files().List(r.Context(), opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := filePage{Data: []fileResponse{}, HasMore: more}
	for _, f := range fs {
		out.Data = append(out.Data, fileOut(f))
	}
	if len(fs) > 0 {
		first, last := fs[0], fs[len(fs)-1]
		out.FirstID, out.LastID = &first.ID, &last.ID
		if more && opts.Before == nil {
			out.NextPage = keyCursor(list, "desc", false, last.CreatedAt, last.ID)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
