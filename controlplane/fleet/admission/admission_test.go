package admission

import (
	"strings"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

func TestRules(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want errdefs.Kind // 0: allowed
	}{
		{"gvisor is known", CheckRuntime(RuntimeGVisor), 0},
		{"kata is not", CheckRuntime("kata"), errdefs.InvalidArgumentKind},
		{"fake model in process", CheckProcessRuntime("fake", RuntimeProcess, false), 0},
		{"real model in gvisor", CheckProcessRuntime("anthropic", RuntimeGVisor, false), 0},
		{"real model in process", CheckProcessRuntime("anthropic", RuntimeProcess, false), errdefs.FailedPreconditionKind},
		{"real model in process, overridden", CheckProcessRuntime("anthropic", RuntimeProcess, true), 0},
		{"real model on a gvisor host", CheckProcessHost(true, false, "h", []string{RuntimeGVisor}), 0},
		{"real model on a process host", CheckProcessHost(true, false, "h", []string{RuntimeProcess}), errdefs.FailedPreconditionKind},
		{"fake model on a process host", CheckProcessHost(false, false, "h", []string{RuntimeProcess}), 0},
		{"real model on a process host, overridden", CheckProcessHost(true, true, "h", []string{RuntimeProcess}), 0},
		{"gvisor is not trusted_only", CheckTrustedRuntime("tenant_a", RuntimeGVisor, false, false), 0},
		{"runc for a tenant not granted it", CheckTrustedRuntime("tenant_a", RuntimeRunc, true, false), errdefs.InvalidArgumentKind},
		{"runc for a tenant granted it", CheckTrustedRuntime("tenant_a", RuntimeRunc, true, true), 0},
		{"runc not trusted_only in this policy", CheckTrustedRuntime("tenant_a", RuntimeRunc, false, false), 0},
		{"process follows its own rule", CheckTrustedRuntime("tenant_a", RuntimeProcess, true, false), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err != nil && strings.Contains(tt.name, "runc") && !strings.Contains(tt.err.Error(), "runc runtime, which is trusted_only") {
				t.Errorf("the refusal does not say which runtime and why: %v", tt.err)
			}
			switch {
			case tt.want == 0 && tt.err != nil:
				t.Fatalf("refused: %v", tt.err)
			case tt.want != 0 && errdefs.KindOf(tt.err) != tt.want:
				t.Fatalf("got %v (kind %v), want kind %v", tt.err, errdefs.KindOf(tt.err), tt.want)
			}
		})
	}
}
