package agentloop

import (
	"context"
	"time"
)

// RunCopy is Run that also returns the log as the Run's copy of it ended.
func (r *Loop) RunCopy(ctx context.Context, sessionID string) ([]Event, error) {
	var s session
	err := r.run(ctx, sessionID, &s)
	return s.log, err
}

// SetBackoff replaces the pool's wait between a loop's retries. Call it
// before the first Wake.
func (p *Pool) SetBackoff(f func(n int) time.Duration) { p.backoff = f }

// Copy is a Run's copy of a session, kept between Runs as a Pool keeps it.
type Copy struct{ s session }

// RunKeeping is Run over c, which it starts from (if it still holds) and
// leaves as the Run ended.
func (r *Loop) RunKeeping(ctx context.Context, sessionID string, c *Copy) error {
	return r.run(ctx, sessionID, &c.s)
}

// CopyOf is a copy of the session read from the store now, as a Run's
// first step reads it.
func (r *Loop) CopyOf(ctx context.Context, sessionID string) (Copy, error) {
	var c Copy
	_, err := r.refresh(ctx, sessionID, &c.s)
	return c, err
}
