package server

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/textcut"
	"corral.dev/corral/internal/tracing"
	"corral.dev/corral/internal/version"
)

// A node's traces (Config.Tracing) follow one turn from the request that
// brought its input to the host's exec (see package tracing): the HTTP
// handler's span, the loop's steps (agentloop.Loop.Tracer, started under
// the wake's span context), and here decorators around the loop's ports
// (model, tools) whose spans the host protocol's stats handler continues
// on the host. Off, none of it is installed.
//
// Spans name the model and the tool, and carry tenant and session ids;
// never a prompt, a tool's input or output, or an error's text.

// tracerName is the instrumentation scope of the node's spans.
const tracerName = "corral.dev/corral/controlplane/server"

// Generative AI attributes (OpenTelemetry's gen_ai conventions, still in
// development, so not in the semconv package this module uses).
const (
	genAIOperation    = attribute.Key("gen_ai.operation.name")
	genAIProvider     = attribute.Key("gen_ai.provider.name")
	genAIRequestModel = attribute.Key("gen_ai.request.model")
	genAIFinish       = attribute.Key("gen_ai.response.finish_reasons")
	genAIInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	genAIOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	genAIToolName     = attribute.Key("gen_ai.tool.name")
	genAIToolCallID   = attribute.Key("gen_ai.tool.call.id")
	toolOutcome       = attribute.Key("corral.tool.outcome")
)

// maxModelNameBytes bounds a model's name in a span (an agent names it).
const maxModelNameBytes = 128

// startTracing starts the node's tracer provider, or none when tracing is
// off.
func (s *Server) startTracing(ctx context.Context) (err error) {
	c := s.cfg.Tracing
	c.ServiceName, c.NodeID, c.Version, c.Logger = "corral-server", s.cfg.NodeID, version.String(), s.log
	if s.tracing, err = tracing.Start(ctx, c); err != nil {
		return err
	}
	if s.tracing != nil {
		s.log.Info("exporting traces", "otlp_endpoint", c.Endpoint, "sample_ratio", c.SampleRatio)
	}
	return nil
}

// tracedModel makes a span of each model request.
type tracedModel struct {
	next     model.Client
	provider string // gen_ai.provider.name: the node's model client
	tracer   trace.Tracer
}

var _ model.Client = tracedModel{}

// Generate implements model.Client.
func (c tracedModel) Generate(ctx context.Context, req model.Request, onDelta model.DeltaFunc) (model.Response, error) {
	name := textcut.Prefix(req.Model, maxModelNameBytes)
	t, _ := tenant.From(ctx)
	ctx, span := c.tracer.Start(ctx, "chat "+name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		genAIOperation.String("chat"), genAIProvider.String(c.provider), genAIRequestModel.String(name),
		tracing.TenantKey.String(string(t))))
	defer span.End()
	resp, err := c.next.Generate(ctx, req, onDelta)
	if err != nil {
		span.SetStatus(codes.Error, "model request failed")
		return resp, err
	}
	span.SetAttributes(genAIInputTokens.Int64(resp.Usage.InputTokens), genAIOutputTokens.Int64(resp.Usage.OutputTokens),
		genAIFinish.StringSlice([]string{textcut.Prefix(resp.StopReason, 64)}))
	return resp, nil
}

// tracedTools makes a span of each built-in tool call (each try: the loop
// retries a transient failure). The sandbox's calls to its host are its
// children.
type tracedTools struct {
	next interface {
		agentloop.Toolbox
		agentloop.ToolCanceler
	}
	tracer trace.Tracer
}

var (
	_ agentloop.Toolbox      = tracedTools{}
	_ agentloop.ToolCanceler = tracedTools{}
)

// Run implements agentloop.Toolbox.
func (t tracedTools) Run(ctx context.Context, sessionID string, call agentloop.ToolCall) (agentloop.ToolResult, error) {
	// Built-in tool names are ours; bound them anyway.
	name := textcut.Prefix(call.Name, 64)
	tn, _ := tenant.From(ctx)
	ctx, span := t.tracer.Start(ctx, "execute_tool "+name, trace.WithAttributes(
		genAIOperation.String("execute_tool"), genAIToolName.String(name), genAIToolCallID.String(call.EventID),
		tracing.SessionIDKey.String(sessionID), tracing.TenantKey.String(string(tn))))
	defer span.End()
	res, err := t.next.Run(ctx, sessionID, call)
	outcome := "ok"
	switch {
	case err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled)):
		outcome = "canceled"
	case err != nil:
		outcome = "failed"
	case res.IsError:
		outcome = "error"
	}
	span.SetAttributes(toolOutcome.String(outcome))
	if outcome != "ok" {
		span.SetStatus(codes.Error, outcome)
	}
	return res, err
}

// CancelTool implements agentloop.ToolCanceler.
func (t tracedTools) CancelTool(ctx context.Context, sessionID string, call agentloop.ToolCall) error {
	return t.next.CancelTool(ctx, sessionID, call)
}
