package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"corral.dev/corral/internal/tracing"
)

// otlpFlags are the trace exporter's flags, shared by `corral server` and
// `corral host`: off unless --otlp-endpoint; TLS unless --otlp-insecure,
// which only a loopback collector takes (tracing.Config.Validate).
func otlpFlags(cmd *cobra.Command, c *tracing.Config) {
	f := cmd.Flags()
	f.StringVar(&c.Endpoint, "otlp-endpoint", os.Getenv("CORRAL_OTLP_ENDPOINT"), "host:port of an OTLP/gRPC collector to export traces to (default: off, no exporter)")
	f.BoolVar(&c.Insecure, "otlp-insecure", false, "export traces in plaintext, to a loopback --otlp-endpoint only (default: TLS)")
	f.StringVar(&c.CAFile, "otlp-ca", os.Getenv("CORRAL_OTLP_CA"), "PEM file of the CA that signed the collector's certificate, instead of the system's roots")
	f.Float64Var(&c.SampleRatio, "otlp-sample-ratio", 1, "fraction of new traces sampled, in (0, 1]; a span whose parent was sampled follows it")
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		// The config's zero ratio means "all": refuse it here, where it
		// can only have been asked for.
		if c.SampleRatio == 0 {
			return fmt.Errorf("--otlp-sample-ratio 0 would sample nothing: leave --otlp-endpoint unset to turn traces off")
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}
