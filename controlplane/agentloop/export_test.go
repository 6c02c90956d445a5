package agentloop

import (
	"context"
	"time"
)

// RunCopy is Run that also returns the log as the Run's copy of it ended.
func (r *Runner) RunCopy(ctx context.Context, sessionID string) ([]Event, error) {
	var s session
	err := r.run(ctx, sessionID, &s)
	return s.log, err
}

// SetBackoff replaces the pool's wait between a loop's retries. Call it
// before the first Wake.
func (p *Pool) SetBackoff(f func(n int) time.Duration) { p.backoff = f }
