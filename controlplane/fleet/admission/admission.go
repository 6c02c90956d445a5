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

// CheckTrustedRuntime refuses a tenant's session a runtime that its policy
// marks trusted_only (runc shares the host's kernel) unless the tenant's
// policy grants it (granted: quotas.yaml trusted_runtimes lists it for the
// tenant), whichever model the session runs. The process runtime is for
// development only and follows CheckProcessRuntime instead. Its error is
// errdefs.InvalidArgument (400), naming the runtime and why.
func CheckTrustedRuntime(tenantID, runtime string, trustedOnly, granted bool) error {
	if !trustedOnly || granted || runtime == RuntimeProcess {
		return nil
	}
	return errdefs.InvalidArgument("this fleet runs sessions' sandboxes with the %s runtime, which is trusted_only (it shares the host's kernel, so it is for trusted work only), and the policy of tenant %s does not grant it (trusted_runtimes in policy/quotas.yaml): ask the operator to grant %s to this tenant or to run the fleet on gvisor", runtime, tenantID, runtime)
}
