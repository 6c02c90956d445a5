package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// A session create is safe to repeat (issue 18, item 5): the SDK's own
// retry of a create whose response was lost gets the session the first
// attempt made, not a second one; an Idempotency-Key gets its session
// again, and refuses a different request; two creates that are not
// repeats make two sessions.
func TestSessionCreateIsSafeToRepeat(t *testing.T) {
	client := setup(t)
	ctx := context.Background()
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "once", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"}})
	if err != nil {
		t.Fatal(err)
	}
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "once"})
	if err != nil {
		t.Fatal(err)
	}
	params := func(title string) anthropic.BetaSessionNewParams {
		return anthropic.BetaSessionNewParams{
			Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: env.ID, Title: anthropic.String(title),
		}
	}
	count := func() int {
		n := 0
		it := client.Beta.Sessions.ListAutoPaging(ctx, anthropic.BetaSessionListParams{})
		for it.Next() {
			n++
		}
		if it.Err() != nil {
			t.Fatal(it.Err())
		}
		return n
	}

	// The first attempt makes its session, and its response is lost: the
	// client sees a 503 and retries.
	var made string
	attempts := 0
	lose := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		attempts++
		res, err := next(r)
		if err != nil || attempts > 1 {
			return res, err
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var s struct{ ID string }
		if err := json.Unmarshal(b, &s); err != nil || s.ID == "" {
			t.Errorf("the first attempt: %d %s", res.StatusCode, b)
		}
		made = s.ID
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(bytes.NewReader([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"lost"}}`))), Request: r}, nil
	})
	s, err := client.Beta.Sessions.New(ctx, params("retried"), lose, option.WithMaxRetries(2))
	if err != nil {
		t.Fatalf("Sessions.New with a lost response: %v", err)
	}
	decodedCleanly(t, "Sessions.New retried", s)
	if attempts != 2 || s.ID != made {
		t.Fatalf("after %d attempts the SDK got session %s; the first attempt made %s", attempts, s.ID, made)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d sessions after a retried create, want 1", n)
	}

	// The same request again, not a retry: a second session.
	again, err := client.Beta.Sessions.New(ctx, params("retried"))
	if err != nil || again.ID == s.ID {
		t.Fatalf("a second, deliberate create: %v (id %s, first %s)", err, again.ID, s.ID)
	}

	// An idempotency key: the same session, however often; a different
	// body under it is a 409.
	key := option.WithHeader("Idempotency-Key", "create-7f3a")
	k1, err := client.Beta.Sessions.New(ctx, params("keyed"), key)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := client.Beta.Sessions.New(ctx, params("keyed"), key)
	if err != nil || k2.ID != k1.ID {
		t.Fatalf("the same key again: %v (id %s, first %s)", err, k2.ID, k1.ID)
	}
	decodedCleanly(t, "Sessions.New keyed again", k2)
	_, err = client.Beta.Sessions.New(ctx, params("other"), key)
	apiError(t, err, http.StatusConflict)
	_, err = client.Beta.Sessions.New(ctx, params("bad key"), option.WithHeader("Idempotency-Key", "has space"))
	apiError(t, err, http.StatusBadRequest)
	if n := count(); n != 3 {
		t.Fatalf("%d sessions, want 3 (the retried one, the deliberate second, the keyed one)", n)
	}
}
