// Package version reports which build of corral is running.
package version

import "runtime/debug"

// Version is set at link time with -ldflags "-X corral.dev/corral/internal/version.Version=v1.2.3".
// When unset it falls back to the module version or VCS revision of the build.
var Version = ""

// String returns the version of this binary, never empty.
func String() string {
	if Version != "" {
		return Version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "devel-" + s.Value[:12]
		}
	}
	return "devel"
}
