// Package admission holds the fleet's pure rules for who may have which
// sandbox: the runtimes, and a real model's refusal of the process runtime,
// which isolates nothing. It reaches no database, Raft or gRPC package.
package admission

import (
	"slices"

	"corral.dev/corral/internal/errdefs"
)

// The runtimes a session's sandbox can ask for.
const (
	RuntimeGVisor  = "gvisor"
	RuntimeRunc    = "runc"
	RuntimeProcess = "process"
)

// Runtimes lists them, the default first.
var Runtimes = []string{RuntimeGVisor, RuntimeRunc, RuntimeProcess}

// CheckRuntime refuses a runtime corral does not know.
func CheckRuntime(runtime string) error {
	if !slices.Contains(Runtimes, runtime) {
		return errdefs.InvalidArgument("unknown sandbox runtime %q: want gvisor, runc or process", runtime)
	}
	return nil
}

// CheckProcessRuntime refuses a real model's tool calls (model is not
// "fake") in the process runtime, which isolates nothing, unless the unsafe
// override is set. Its error is errdefs.FailedPrecondition.
func CheckProcessRuntime(model, runtime string, override bool) error {
	if model == "fake" || model == "" || runtime != RuntimeProcess || override {
		return nil
	}
	return errdefs.FailedPrecondition("refusing to run a real model (%s) with the process runtime: its sandboxes isolate nothing, so the model's commands would run on the host as this user; use gvisor, or set --unsafe-allow-process-runtime-with-real-model if you accept that", model)
}

// CheckProcessHost refuses a real model's sandbox on a host that runs the
// process runtime (hostRuntimes), unless the unsafe override is set.
func CheckProcessHost(realModel, override bool, hostID string, hostRuntimes []string) error {
	if !realModel || override || !slices.Contains(hostRuntimes, RuntimeProcess) {
		return nil
	}
	return errdefs.FailedPrecondition("refusing to place a real model's session on host %s, which runs the process runtime and isolates nothing (set --unsafe-allow-process-runtime-with-real-model to allow it)", hostID)
}
