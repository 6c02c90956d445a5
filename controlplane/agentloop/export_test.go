package agentloop

import "context"

// RunCopy is Run that also returns the log as the Run's copy of it ended.
func (r *Runner) RunCopy(ctx context.Context, sessionID string) ([]Event, error) {
	var s session
	err := r.run(ctx, sessionID, &s)
	return s.log, err
}
