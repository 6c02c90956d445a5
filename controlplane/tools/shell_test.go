package tools

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The bash tool's script under the real shells it meets: bash, and sh where
// an image has no bash (busybox's in the busybox image, dash on Debian).
// Each reports where the command ended, relative to the workspace it
// started in, and starts in the directory it is given.
func TestBashScriptInRealShells(t *testing.T) {
	shells := map[string][]string{"bash": {"bash"}, "busybox sh": {"busybox", "sh"}, "dash": {"dash"}}
	for name, argv := range shells {
		t.Run(name, func(t *testing.T) {
			if _, err := exec.LookPath(argv[0]); err != nil {
				// make test installs busybox (scripts/runtime) and Debian
				// always has bash and dash; under CI a missing shell fails.
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is not installed: CI needs every shell the images carry", argv[0])
				}
				t.Skipf("%s is not installed here (scripts/runtime/install.sh installs busybox)", argv[0])
			}
			ws := filepath.Join(t.TempDir(), "it's a ws")
			if err := os.MkdirAll(filepath.Join(ws, "a", "b"), 0o755); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				name, command, cwd string
				env                []string
				wantDir, wantErr   string
			}{
				{name: "stays", command: "true", wantDir: "."},
				{name: "cd beneath", command: "cd a/b", wantDir: "a/b"},
				{name: "cd outside", command: "cd /", wantDir: "/"},
				{name: "starts in cwd", command: "cd ..", cwd: "a/b", wantDir: "a"},
				{name: "exit code kept", command: "cd a; exit 3", wantDir: "a"},
				{name: "PWD set by the command", command: "cd a && PWD=/nowhere", wantDir: "a"},
				{name: "stale PWD from the environment", command: "cd b", cwd: "a", env: []string{"PWD=/"}, wantDir: "a/b"},
				{name: "cwd gone", command: "true", cwd: "gone", wantDir: ".", wantErr: "the directory gone is gone; starting in " + ws},
			} {
				t.Run(c.name, func(t *testing.T) {
					call := prepareBash(c.command, c.cwd, "", time.Second)
					cmd := exec.Command(argv[0], append(argv[1:], "-c", call.script)...)
					cmd.Dir = ws
					cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, c.env...)
					var stderr strings.Builder
					cmd.Stderr = &stderr
					out, err := cmd.Output()
					if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 3) {
						t.Fatalf("%v: %s", err, stderr.String())
					}
					if _, dir := splitCwd(out, call.marker); dir != c.wantDir {
						t.Errorf("final directory %q, want %q (stdout %q)", dir, c.wantDir, out)
					}
					if got := strings.TrimSpace(stderr.String()); !strings.Contains(got, c.wantErr) || c.wantErr == "" && got != "" {
						t.Errorf("stderr %q, want %q", got, c.wantErr)
					}
				})
			}
		})
	}
}
