package containerd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// A gVisor platform other than the default reaches runsc: the sandbox's
// runsc processes on the host run with --platform=ptrace, and the sandbox
// works on it.
func TestGVisorPlatformReachesRunsc(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor, GVisorPlatform: PlatformPtrace})
	ref, sb := create(t, d, driver.Spec{})
	if res := run(t, sb, "echo on-ptrace"); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "on-ptrace" {
		t.Fatalf("exec: %+v", res)
	}
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(ref.ID)) || !bytes.Contains(b, []byte("runsc")) {
			continue
		}
		found = append(found, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
	}
	if len(found) == 0 {
		t.Fatalf("no runsc process of %s on the host", ref.ID)
	}
	for _, cmd := range found {
		if !strings.Contains(cmd, "--platform=ptrace") {
			t.Errorf("a runsc process of the sandbox without --platform=ptrace: %s", cmd)
		}
	}
}

// Platforms are checked before anything starts.
func TestGVisorPlatformValidated(t *testing.T) {
	for name, c := range map[string]Config{
		"unknown":        {Runtime: RuntimeGVisor, GVisorPlatform: "vmx"},
		"the runsc shim": {Runtime: RuntimeGVisor, GVisorShim: ShimRunsc, GVisorPlatform: PlatformPtrace},
		"runc":           {Runtime: RuntimeRunc, GVisorPlatform: PlatformKVM},
	} {
		c.RunscPath, c.StateDir = "/bin/true", t.TempDir()
		c.setDefaults()
		if err := c.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := Config{Runtime: RuntimeGVisor, GVisorPlatform: PlatformPtrace, RunscPath: "/bin/true", StateDir: t.TempDir()}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("ptrace: %v", err)
	}
	p, err := writeRunscWrapper(c)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); !strings.Contains(string(b), "exec '/bin/true' --platform=ptrace \"$@\"") {
		t.Fatalf("wrapper %s: %s", p, b)
	}
}
