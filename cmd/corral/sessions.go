package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// The tenant verbs (sessions, agents) speak the public REST API with the
// tenant's key: what a tenant sees, the CLI shows. Only where a session
// runs (runner node, sandbox host and provider) comes from the admin API,
// with an operator key: the tenant API does not carry fleet internals.

// session is the part of a session object the table shows.
type sessionView struct {
	ID     string  `json:"id"`
	Title  *string `json:"title"`
	Status string  `json:"status"`
	Agent  struct {
		ID      string `json:"id"`
		Name    string `json:"name"`
		Version int64  `json:"version"`
	} `json:"agent"`
	EnvironmentID string            `json:"environment_id"`
	Metadata      map[string]string `json:"metadata"`
	Stats         struct {
		ActiveSeconds   float64 `json:"active_seconds"`
		DurationSeconds float64 `json:"duration_seconds"`
	} `json:"stats"`
	Usage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
	CreatedAt  string  `json:"created_at"`
	UpdatedAt  string  `json:"updated_at"`
	ArchivedAt *string `json:"archived_at"`
}

// event is the part of an event the table shows.
type eventView struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	ProcessedAt string          `json:"processed_at"`
	Content     json.RawMessage `json:"content"`
	Name        string          `json:"name"`
	Input       json.RawMessage `json:"input"`
	IsError     *bool           `json:"is_error"`
	StopReason  json.RawMessage `json:"stop_reason"`
	Error       json.RawMessage `json:"error"`
}

// summary is one line saying what e carries: its text, the tool and its
// input, or its error.
func (e eventView) summary() string {
	var parts []string
	if e.Name != "" {
		parts = append(parts, e.Name)
	}
	if len(e.Input) > 0 && string(e.Input) != "null" {
		parts = append(parts, string(e.Input))
	}
	var blocks []struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(e.Content, &blocks) == nil {
		for _, b := range blocks {
			if b.Text != "" {
				parts = append(parts, b.Text)
			}
		}
	}
	if e.IsError != nil && *e.IsError {
		parts = append(parts, "(error)")
	}
	if len(e.StopReason) > 0 && string(e.StopReason) != "null" {
		var sr struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(e.StopReason, &sr) == nil && sr.Type != "" {
			parts = append(parts, "stop: "+sr.Type)
		}
	}
	if len(e.Error) > 0 && string(e.Error) != "null" {
		var er struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(e.Error, &er) == nil && er.Message != "" {
			parts = append(parts, er.Message)
		}
	}
	return oneLine(strings.Join(parts, " "), 120)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sessionsCommand() *cobra.Command {
	var r restConn
	cmd := &cobra.Command{Use: "sessions", Short: "List, show, follow and delete sessions (REST API; a tenant key)"}
	r.register(cmd)

	var limit int
	var agentID string
	var archived bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List sessions, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			q := url.Values{}
			if agentID != "" {
				q.Set("agent_id", agentID)
			}
			if archived {
				q.Set("include_archived", "true")
			}
			items, err := r.list(ctx, "/v1/sessions", q, limit, 100)
			if err != nil {
				return fmt.Errorf("listing sessions: %w", err)
			}
			if r.output == "json" {
				return writeJSON(cmd.OutOrStdout(), items)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tSTATUS\tAGENT\tTITLE\tCREATED")
			for _, raw := range items {
				var s sessionView
				if err := json.Unmarshal(raw, &s); err != nil {
					return fmt.Errorf("listing sessions: %w", err)
				}
				title := ""
				if s.Title != nil {
					title = oneLine(*s.Title, 40)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.Status, orDash(s.Agent.ID), orDash(title), s.CreatedAt)
			}
			return w.Flush()
		},
	}
	ls.Flags().IntVar(&limit, "limit", 0, "list at most this many (0: all)")
	ls.Flags().StringVar(&agentID, "agent", "", "only sessions of this agent")
	ls.Flags().BoolVar(&archived, "include-archived", false, "list archived sessions too")

	var admin adminFlags
	get := &cobra.Command{
		Use:   "get SESSION",
		Short: "Show a session, and where it runs (runner node, sandbox host and provider; with an operator key)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			b, err := r.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(args[0]), nil)
			if err != nil {
				return fmt.Errorf("session %s: %w", args[0], err)
			}
			if r.output == "json" {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", bytes.TrimSpace(b))
				return err
			}
			var s sessionView
			if err := json.Unmarshal(b, &s); err != nil {
				return fmt.Errorf("session %s: %w", args[0], err)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			title := "-"
			if s.Title != nil {
				title = oneLine(*s.Title, 200)
			}
			fmt.Fprintf(w, "ID:\t%s\n", s.ID)
			fmt.Fprintf(w, "Title:\t%s\n", title)
			fmt.Fprintf(w, "Status:\t%s\n", s.Status)
			fmt.Fprintf(w, "Agent:\t%s (%s, version %d)\n", s.Agent.ID, s.Agent.Name, s.Agent.Version)
			fmt.Fprintf(w, "Environment:\t%s\n", orDash(s.EnvironmentID))
			for _, k := range slices.Sorted(maps.Keys(s.Metadata)) {
				fmt.Fprintf(w, "Metadata:\t%s=%s\n", k, oneLine(s.Metadata[k], 200))
			}
			fmt.Fprintf(w, "Active:\t%.1fs of %.1fs\n", s.Stats.ActiveSeconds, s.Stats.DurationSeconds)
			fmt.Fprintf(w, "Tokens:\t%d in, %d out\n", s.Usage.InputTokens, s.Usage.OutputTokens)
			fmt.Fprintf(w, "Created:\t%s\n", s.CreatedAt)
			fmt.Fprintf(w, "Updated:\t%s\n", s.UpdatedAt)
			if s.ArchivedAt != nil {
				fmt.Fprintf(w, "Archived:\t%s\n", *s.ArchivedAt)
			}
			admin.tls = r.tls
			runner, host, provider := where(ctx, &admin, s.ID)
			fmt.Fprintf(w, "Runner node:\t%s\n", runner)
			fmt.Fprintf(w, "Sandbox host:\t%s\n", host)
			fmt.Fprintf(w, "Sandbox provider:\t%s\n", provider)
			return w.Flush()
		},
	}
	get.Flags().StringVar(&admin.addr, "admin-addr", envOr("CORRAL_GRPC_ADDR", envOr("CORRAL_ADMIN_ADDR", "127.0.0.1:8090")), "gRPC address of the admin API, asked where the session runs (default $CORRAL_GRPC_ADDR)")

	var eventsLimit int
	events := &cobra.Command{
		Use:   "events SESSION",
		Short: "List a session's events, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			items, err := r.list(ctx, "/v1/sessions/"+url.PathEscape(args[0])+"/events", nil, eventsLimit, 200)
			if err != nil {
				return fmt.Errorf("session %s: %w", args[0], err)
			}
			if r.output == "json" {
				return writeJSON(cmd.OutOrStdout(), items)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTYPE\tPROCESSED\tSUMMARY")
			for _, raw := range items {
				var e eventView
				if err := json.Unmarshal(raw, &e); err != nil {
					return fmt.Errorf("session %s: %w", args[0], err)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", e.ID, e.Type, orDash(e.ProcessedAt), orDash(e.summary()))
			}
			return w.Flush()
		},
	}
	events.Flags().IntVar(&eventsLimit, "limit", 0, "list at most this many (0: all)")

	tail := &cobra.Command{
		Use:   "tail SESSION",
		Short: "Follow a session's live event stream until interrupted or the session is deleted",
		Long: "Follow a session's live event stream: events appended from now on, one a line\n" +
			"(with --output json, each event's JSON as the API sent it). A dropped stream is\n" +
			"resumed from the last event seen (Last-Event-ID), so nothing is missed or repeated.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return r.tail(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0])
		},
	}

	del := &cobra.Command{
		Use:   "delete SESSION",
		Short: "Delete a session, its events and its sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			b, err := r.do(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(args[0]), nil)
			if err != nil {
				return fmt.Errorf("deleting session %s: %w", args[0], err)
			}
			if r.output == "json" {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", bytes.TrimSpace(b))
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(ls, get, events, tail, del)
	return cmd
}

// needsOperator is what the placement lines say without an operator key.
const needsOperator = "(needs an operator key)"

// where asks the admin API which node runs session id's loop and which host
// and provider run its sandbox. Without $CORRAL_OPERATOR_KEY it says so;
// an error asking is shown in place of the answer, the rest of the session
// still printed.
func where(ctx context.Context, a *adminFlags, id string) (runner, host, provider string) {
	a.apiKey = os.Getenv("CORRAL_OPERATOR_KEY")
	if a.apiKey == "" {
		return needsOperator, needsOperator, needsOperator
	}
	var resp *adminv1.ListSandboxesResponse
	err := a.call(ctx, 10*time.Second, func(ctx context.Context, c *grpc.ClientConn) error {
		var err error
		resp, err = adminv1.NewSandboxesServiceClient(c).ListSandboxes(ctx, &adminv1.ListSandboxesRequest{SessionId: id})
		return err
	})
	if err != nil {
		why := "(" + callErr("asking the admin API", err).Error() + ")"
		return why, why, why
	}
	runner = "(none assigned)"
	if resp.GetRunnerNodeId() != "" {
		runner = resp.GetRunnerNodeId()
	}
	if len(resp.GetSandboxes()) == 0 {
		return runner, "(no sandbox)", "(no sandbox)"
	}
	sb := resp.GetSandboxes()[0]
	host = sb.GetHostId()
	if !sb.GetReady() {
		host += " (starting)"
	}
	provider = orDash(sb.GetProvider())
	if sb.GetRuntime() != "" && sb.GetRuntime() != sb.GetProvider() {
		provider += " (runtime " + sb.GetRuntime() + ")"
	}
	return runner, host, provider
}

// tail follows session id's event stream, printing each event as it comes,
// until ctx ends or the session is deleted. A stream that drops is resumed
// with Last-Event-ID; a run of failed reconnects, bounded, ends it.
func (r *restConn) tail(ctx context.Context, out, errOut io.Writer, id string) error {
	const maxRetries = 8
	lastID := ""
	retries := 0
	for {
		hdr := http.Header{"Accept": {"text/event-stream"}}
		if lastID != "" {
			hdr.Set("Last-Event-ID", lastID)
		}
		resp, err := r.send(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/events/stream", nil, hdr)
		var ae *apiError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &ae) && ae.status/100 == 4 && ae.status != http.StatusTooManyRequests:
			// Not found, no permission, a bad Last-Event-ID: asking
			// again gets the same answer.
			return fmt.Errorf("session %s: %w", id, err)
		case err != nil:
			retries++
			if retries > maxRetries {
				return fmt.Errorf("following session %s: %w", id, err)
			}
			fmt.Fprintf(errOut, "corral: stream of %s: %s; reconnecting\n", id, oneLine(err.Error(), 200))
		default:
			// Said on stderr, so a reader (or a test) knows that events
			// appended from now on will be shown.
			if lastID == "" {
				fmt.Fprintf(errOut, "corral: following session %s\n", id)
			} else {
				fmt.Fprintf(errOut, "corral: following session %s after %s\n", id, lastID)
			}
			n, done, serr := r.readStream(resp.Body, out, &lastID)
			resp.Body.Close()
			if done || ctx.Err() != nil {
				return nil
			}
			if serr != nil && errors.Is(serr, errLineTooLong) {
				return fmt.Errorf("following session %s: %w", id, serr)
			}
			if n > 0 {
				retries = 0
			}
			retries++
			if retries > maxRetries {
				return fmt.Errorf("following session %s: the stream keeps ending", id)
			}
			fmt.Fprintf(errOut, "corral: stream of %s ended; resuming after %s\n", id, orDash(lastID))
		}
		// Back off before asking again: 100ms doubling to 5s. A timer
		// here, not a signal: the server's coming back announces nothing.
		delay := min(100*time.Millisecond<<(retries-1), 5*time.Second)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

var errLineTooLong = fmt.Errorf("an event stream line is longer than %d MiB", maxSSELineBytes>>20)

// readStream prints the events of one SSE stream and keeps the last event
// id in *lastID. It returns how many events it printed and whether the
// stream ended for good (the session deleted).
func (r *restConn) readStream(body io.Reader, out io.Writer, lastID *string) (n int, done bool, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELineBytes)
	var id, typ string
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			// End of a frame: pings and previews (event_start,
			// event_delta) are not events of the log.
			if len(data) > 0 && typ != "ping" && typ != "event_start" && typ != "event_delta" {
				if err := r.printEvent(out, data); err != nil {
					return n, false, err
				}
				n++
				if id != "" {
					*lastID = id
				}
				if typ == "session.deleted" {
					return n, true, nil
				}
			}
			id, typ, data = "", "", data[:0]
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "id":
			id = string(value)
		case "event":
			typ = string(value)
		case "data":
			if len(data) > 0 {
				data = append(data, '\n')
			}
			if len(data)+len(value) > maxSSELineBytes {
				return n, false, errLineTooLong
			}
			data = append(data, value...)
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return n, false, errLineTooLong
	}
	return n, false, sc.Err()
}

// printEvent prints one event of a stream: its JSON with --output json, a
// line of the table's columns otherwise.
func (r *restConn) printEvent(out io.Writer, data []byte) error {
	if r.output == "json" {
		_, err := fmt.Fprintf(out, "%s\n", data)
		return err
	}
	var e eventView
	if err := json.Unmarshal(data, &e); err != nil {
		return fmt.Errorf("reading an event: %w", err)
	}
	_, err := fmt.Fprintf(out, "%s  %s  %s  %s\n", orDash(e.ProcessedAt), e.Type, e.ID, orDash(e.summary()))
	return err
}
