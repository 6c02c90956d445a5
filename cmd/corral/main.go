// Command corral is the one binary of corral: control-plane node, host agent,
// the all-in-one development stack, the operator's verbs (admin API, gRPC)
// and the tenant's (sessions, agents: the public REST API). main only maps
// flags onto each daemon's config and runs it; every daemon is a library.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		// One line, whatever the error carries.
		fmt.Fprintf(os.Stderr, "corral: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		stop()
		os.Exit(1)
	}
}
