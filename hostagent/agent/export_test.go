package agent

import "corral.dev/corral/internal/tracing"

// TraceProvider is the agent's tracer provider, nil with tracing off.
func (a *Agent) TraceProvider() *tracing.Provider { return a.tracing }

// ValidateBuild is validateBuild, for the request bound tests.
var ValidateBuild = validateBuild
