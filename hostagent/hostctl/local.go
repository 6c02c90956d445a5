package hostctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errhttp"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The local control API lets the `corral hostctl` verbs reach a running
// `corral hostctl serve` through a unix socket in its directory: JSON over
// HTTP, for a person at a terminal. SandboxService calls do not go through
// it: the verbs dial the host directly with the control-plane certificate.

// HostView is what GET /hosts returns per host.
type HostView struct {
	ID             string            `json:"id"`
	Connected      bool              `json:"connected"`
	SandboxAddress string            `json:"sandbox_address"`
	Runtimes       []string          `json:"runtimes"`
	Images         []string          `json:"images"`
	Labels         map[string]string `json:"labels,omitempty"`
	Used           json.RawMessage   `json:"used,omitempty"`
	Placed         []string          `json:"placed"`
	Sandboxes      []json.RawMessage `json:"sandboxes"`
	Conditions     []json.RawMessage `json:"conditions"`
	Evictions      []json.RawMessage `json:"evictions"`
}

// EnsureRequest is the body of POST /ensure.
type EnsureRequest struct {
	Host    string            `json:"host"`
	Key     string            `json:"key"`
	Image   string            `json:"image"`
	Runtime string            `json:"runtime"`
	Env     map[string]string `json:"env,omitempty"`
}

// DestroyRequest is the body of POST /destroy.
type DestroyRequest struct {
	Host string `json:"host"`
	Key  string `json:"key"`
}

type apiError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

func rawList[T proto.Message](ms []T) []json.RawMessage {
	out := []json.RawMessage{}
	for _, m := range ms {
		b, _ := protojson.Marshal(m)
		out = append(out, b)
	}
	return out
}

// LocalHandler serves the local control API for c.
func LocalHandler(c *Controller) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(errhttp.Status(err))
			v = apiError{Kind: errdefs.KindOf(err).String(), Message: err.Error()}
		}
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /hosts", func(w http.ResponseWriter, r *http.Request) {
		var out []HostView
		for _, h := range c.Hosts() {
			v := HostView{ID: h.ID, Connected: h.Connected, Placed: h.Placed, Evictions: rawList(h.Evictions)}
			if h.Register != nil {
				v.SandboxAddress, v.Runtimes, v.Images, v.Labels = h.Register.SandboxAddress, h.Register.Runtimes, h.Register.Images, h.Register.Labels
			}
			if h.Last != nil {
				v.Sandboxes, v.Conditions = rawList(h.Last.Sandboxes), rawList(h.Last.Conditions)
				if h.Last.Used != nil {
					v.Used, _ = protojson.Marshal(h.Last.Used)
				}
			}
			out = append(out, v)
		}
		reply(w, out, nil)
	})
	mux.HandleFunc("POST /ensure", func(w http.ResponseWriter, r *http.Request) {
		var req EnsureRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			reply(w, nil, errdefs.InvalidArgument("ensure: %v", err))
			return
		}
		st, err := c.Ensure(r.Context(), req.Host, &pb.EnsureSandbox{Key: req.Key, Image: req.Image, Runtime: req.Runtime, Env: req.Env})
		if err != nil {
			reply(w, nil, err)
			return
		}
		b, _ := protojson.Marshal(st)
		reply(w, json.RawMessage(b), nil)
	})
	mux.HandleFunc("POST /destroy", func(w http.ResponseWriter, r *http.Request) {
		var req DestroyRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			reply(w, nil, errdefs.InvalidArgument("destroy: %v", err))
			return
		}
		reply(w, map[string]string{}, c.Destroy(r.Context(), req.Host, req.Key))
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		tok, err := c.IssueToken(time.Hour)
		if err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, map[string]string{"token": tok.Reveal()}, nil)
	})
	return mux
}

// LocalClient calls a serving controller's local control API.
type LocalClient struct{ hc *http.Client }

// NewLocalClient returns a client for the socket at path.
func NewLocalClient(path string) (*LocalClient, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "no `corral hostctl serve` socket at %s", path)
	}
	return &LocalClient{hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}}, nil
}

func (l *LocalClient) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://hostctl"+path, rd)
	if err != nil {
		return err
	}
	resp, err := l.hc.Do(req)
	if err != nil {
		return errdefs.Wrap(errdefs.UnavailableKind, err, "calling hostctl serve")
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e apiError
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			return fmt.Errorf("hostctl serve: %s: %s", resp.Status, bytes.TrimSpace(b))
		}
		return &errdefs.Error{Kind: kindNamed(e.Kind), Msg: e.Message}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// Hosts lists the hosts the controller knows.
func (l *LocalClient) Hosts(ctx context.Context) ([]HostView, error) {
	var out []HostView
	return out, l.call(ctx, http.MethodGet, "/hosts", nil, &out)
}

// Host returns one host, or an error of kind not found.
func (l *LocalClient) Host(ctx context.Context, id string) (HostView, error) {
	hs, err := l.Hosts(ctx)
	if err != nil {
		return HostView{}, err
	}
	for _, h := range hs {
		if h.ID == id {
			return h, nil
		}
	}
	return HostView{}, errdefs.NotFound("host %q has never connected", id)
}

// Ensure places a sandbox and returns its status as JSON.
func (l *LocalClient) Ensure(ctx context.Context, req EnsureRequest) (json.RawMessage, error) {
	var out json.RawMessage
	return out, l.call(ctx, http.MethodPost, "/ensure", req, &out)
}

// Destroy removes a sandbox.
func (l *LocalClient) Destroy(ctx context.Context, host, key string) error {
	return l.call(ctx, http.MethodPost, "/destroy", DestroyRequest{Host: host, Key: key}, nil)
}

// Token issues a new one-time join token.
func (l *LocalClient) Token(ctx context.Context) (string, error) {
	var out map[string]string
	if err := l.call(ctx, http.MethodPost, "/token", nil, &out); err != nil {
		return "", err
	}
	if out["token"] == "" {
		return "", errors.New("hostctl serve returned no token")
	}
	return out["token"], nil
}
