package agent_test

import (
	"context"
	"strings"
	"testing"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/tracing"
)

// Without an endpoint the agent starts no exporter; a plaintext endpoint
// beyond loopback is refused before anything starts.
func TestAgentTracingConfig(t *testing.T) {
	e := setup(t)
	r := e.start()
	defer r.stop()
	if r.a.TraceProvider() != nil {
		t.Fatal("an agent without --otlp-endpoint has a tracer provider")
	}

	cfg := e.config()
	cfg.StateDir = t.TempDir()
	cfg.Tracing = tracing.Config{Endpoint: "collector.example:4317", Insecure: true}
	_, err := agent.New(context.Background(), cfg)
	if errdefs.KindOf(err) != errdefs.InvalidArgumentKind || !strings.Contains(err.Error(), "--otlp-insecure") {
		t.Fatalf("New with plaintext traces beyond loopback: %v, want an invalid argument naming --otlp-insecure", err)
	}
}
