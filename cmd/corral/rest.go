package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Bounds on what the tenant verbs read from the server: a JSON body (one
// object or one page) and one line of an event stream. A server sending
// more is refused, not buffered.
const (
	maxBodyBytes    = 32 << 20
	maxErrorBytes   = 64 << 10
	maxSSELineBytes = 16 << 20
)

// restConn is how the tenant verbs reach the public REST API: its base URL
// and the tenant's API key, sent as x-api-key.
type restConn struct {
	url     string
	key     string
	output  string
	timeout time.Duration
	// pageSize, when set, replaces each list's page size (a hidden flag:
	// tests walk many pages with few items).
	pageSize int
	tls      clientTLS
}

func (r *restConn) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&r.url, "url", envOr("CORRAL_URL", "http://127.0.0.1:8080"), "base URL of the REST API (default $CORRAL_URL)")
	f.StringVar(&r.key, "api-key", "", "tenant API key (default $CORRAL_API_KEY); prefer the environment, flags show in ps")
	f.StringVarP(&r.output, "output", "o", "table", "output format: table or json (the API's JSON, unchanged)")
	f.DurationVar(&r.timeout, "timeout", 30*time.Second, "how long a call may take (tail follows until interrupted)")
	f.IntVar(&r.pageSize, "page-size", 0, "items asked for per page (0: the list's largest)")
	_ = f.MarkHidden("page-size")
	r.tls.register(f)
}

// client checks the flags and returns the HTTP client and base URL to use.
func (r *restConn) client() (*http.Client, string, error) {
	if r.output != "table" && r.output != "json" {
		return nil, "", fmt.Errorf("--output %q: want table or json", r.output)
	}
	if r.key == "" {
		r.key = os.Getenv("CORRAL_API_KEY")
	}
	if r.key == "" {
		return nil, "", errors.New("no API key: set $CORRAL_API_KEY (corral dev writes it to .corral/dev.env) or --api-key")
	}
	hostport, cfg, err := r.tls.config(r.url)
	if err != nil {
		return nil, "", err
	}
	base := "http://" + hostport
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // keys go to the server named, not through a proxy
	if cfg != nil {
		base = "https://" + hostport
		tr.TLSClientConfig = cfg
	}
	return &http.Client{Transport: tr}, base, nil
}

// apiError is an error the API answered with, or why none came.
type apiError struct {
	status  int
	kind    string // the API's error.type
	message string
}

func (e *apiError) Error() string {
	if e.status == http.StatusNotFound {
		return "not found"
	}
	if e.message != "" {
		return e.message
	}
	return fmt.Sprintf("HTTP %d", e.status)
}

// do sends a request and returns the body of a 2xx answer, bounded; any
// other answer is an *apiError with the API's message.
func (r *restConn) do(ctx context.Context, method, path string, query url.Values) ([]byte, error) {
	resp, err := r.send(ctx, method, path, query, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(b) > maxBodyBytes {
		return nil, fmt.Errorf("the answer is larger than %d MiB", maxBodyBytes>>20)
	}
	return b, nil
}

// send sends a request with the key and returns a 2xx response, whose body
// the caller closes; any other answer is an *apiError.
func (r *restConn) send(ctx context.Context, method, path string, query url.Values, hdr http.Header) (*http.Response, error) {
	c, base, err := r.client()
	if err != nil {
		return nil, err
	}
	u := base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("x-api-key", r.key)
	req.Header.Set("accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("asking %s: %w", base, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	ae := &apiError{status: resp.StatusCode}
	if json.Unmarshal(b, &body) == nil {
		ae.kind, ae.message = body.Error.Type, oneLine(body.Error.Message, 500)
	}
	return nil, ae
}

// page is the body of every list response the verbs read. The lists page
// with next_page, a cursor sent back as page.
type page struct {
	Data     []json.RawMessage `json:"data"`
	NextPage *string           `json:"next_page"`
}

// list follows path's pages until limit items (0: all) or the last page,
// asking for at most perPage items a call.
func (r *restConn) list(ctx context.Context, path string, query url.Values, limit, perPage int) ([]json.RawMessage, error) {
	if query == nil {
		query = url.Values{}
	}
	if r.pageSize > 0 {
		perPage = r.pageSize
	}
	var out []json.RawMessage
	// Bounded: a server whose cursors never end stops at this many pages.
	for range 100000 {
		n := perPage
		if limit > 0 {
			n = min(n, limit-len(out))
		}
		query.Set("limit", fmt.Sprint(n))
		b, err := r.do(ctx, http.MethodGet, path, query)
		if err != nil {
			return nil, err
		}
		var p page
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("reading a page of %s: %w", path, err)
		}
		out = append(out, p.Data...)
		if p.NextPage == nil || *p.NextPage == "" || len(p.Data) == 0 || (limit > 0 && len(out) >= limit) {
			if limit > 0 && len(out) > limit {
				out = out[:limit]
			}
			return out, nil
		}
		query.Set("page", *p.NextPage)
	}
	return nil, fmt.Errorf("listing %s: too many pages", path)
}

// oneLine is s on one line, cut to n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// writeJSON prints items, each the API's JSON as it came, as one array
// followed by a newline.
func writeJSON(w io.Writer, items []json.RawMessage) error {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(bytes.TrimSpace(it))
	}
	b.WriteString("]\n")
	_, err := w.Write(b.Bytes())
	return err
}
