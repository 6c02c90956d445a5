package containerd

import (
	"fmt"
)

// gVisor's platforms: how the Sentry intercepts the sandbox's system
// calls. systrap is runsc's default; ptrace works everywhere and is
// slower; kvm needs /dev/kvm usable (on these machines' nested KVM runsc
// panics under it: RUNTIME-NOTES).
const (
	PlatformSystrap = "systrap"
	PlatformPtrace  = "ptrace"
	PlatformKVM     = "kvm"
)

// The runc shim runs BinaryName with runc's arguments and takes no
// runtime flags of its own, so a platform other than the default is given
// to runsc by a two-line wrapper the driver writes beside its state
// (runsc-<platform>): it runs RunscPath with --platform before the
// shim's arguments. Every runsc the shim starts for the sandbox (create,
// exec, checkpoint, restore, delete) goes through it, so a restore runs on
// the platform its checkpoint was taken on.

// runscBinary is the binary the runc shim runs for this driver's gVisor
// sandboxes: RunscPath, or its platform wrapper.
func (d *Driver) runscBinary() string {
	if d.runscWrapper != "" {
		return d.runscWrapper
	}
	return d.cfg.RunscPath
}

// writeRunscWrapper writes the platform wrapper when the configuration
// asks for a platform other than the default, and returns its path ("":
// none needed). It is written anew when it differs (another runsc path).
func writeRunscWrapper(cfg Config) (string, error) {
	if cfg.Runtime != RuntimeGVisor || cfg.GVisorPlatform == "" || cfg.GVisorPlatform == PlatformSystrap {
		return "", nil
	}
	script := fmt.Appendf(nil, "#!/bin/sh\nexec %s --platform=%s \"$@\"\n", shellQuote(cfg.RunscPath), cfg.GVisorPlatform)
	return writeScript(cfg.StateDir, "runsc-"+cfg.GVisorPlatform, script)
}
