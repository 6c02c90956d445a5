package admission

import (
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
	} {
		t.Run(tt.name, func(t *testing.T) {
			switch {
			case tt.want == 0 && tt.err != nil:
				t.Fatalf("refused: %v", tt.err)
			case tt.want != 0 && errdefs.KindOf(tt.err) != tt.want:
				t.Fatalf("got %v (kind %v), want kind %v", tt.err, errdefs.KindOf(tt.err), tt.want)
			}
		})
	}
}
