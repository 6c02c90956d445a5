// Command corral-spawn is the compiled spawner of a pausable gVisor
// sandbox, bind-mounted into it by the containerd driver
// (Config.SpawnBinary): `corral-spawn init <nproc>` is the sandbox's init,
// `corral-spawn relay ...` what the driver execs for each command, and
// `corral-spawn start ...` the step a relay starts its command through when
// init does not answer, `corral-spawn serve ...` the command server the
// driver keeps in a sandbox to run commands without an exec each, and
// `corral-spawn version` the versions of those
// interfaces, which the driver checks. Package hostagent/spawn holds the
// logic.
package main

import (
	"fmt"
	"os"

	"corral.dev/corral/hostagent/spawn"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: corral-spawn init|relay|start|serve|version ...")
		os.Exit(2)
	}
	switch args := os.Args[2:]; os.Args[1] {
	case "init":
		os.Exit(spawn.Init(args))
	case "relay":
		os.Exit(spawn.Relay(args, os.Stdin, os.Stdout, os.Stderr))
	case "start":
		os.Exit(spawn.Start(args))
	case "serve":
		os.Exit(spawn.Serve(args, os.Stdin, os.Stdout))
	case "version":
		fmt.Println(spawn.Interface())
	default:
		fmt.Fprintf(os.Stderr, "corral-spawn: unknown mode %q: want init, relay, start, serve or version\n", os.Args[1])
		os.Exit(2)
	}
}
