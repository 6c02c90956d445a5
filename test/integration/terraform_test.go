package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// terraform runs the CLI in dir with no CLI config and no input.
func terraform(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("terraform", append([]string{"-chdir=" + dir}, args...)...)
	cmd.Env = append(os.Environ(), "TF_IN_AUTOMATION=1", "TF_INPUT=0", "NO_COLOR=1", "CHECKPOINT_DISABLE=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTerraformNodeModule(t *testing.T) {
	if _, err := exec.LookPath("terraform"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("terraform CLI not found; CI machines have it at /usr/local/bin/terraform")
		}
		t.Skip("terraform CLI not installed")
	}
	root := t.TempDir()
	copyTree(t, "../../deploy/terraform", root)
	example := filepath.Join(root, "examples", "three-nodes")
	if out, err := terraform(t, example, "init", "-backend=false", "-no-color"); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	if out, err := terraform(t, example, "validate", "-no-color"); err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	out, err := terraform(t, example, "plan", "-no-color",
		"-var", "app_database_url=postgres://corral_app:pw@db/corral",
		"-var", "owner_database_url=postgres://corral_owner:pw@db/corral")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	for _, node := range []string{"cp-1", "cp-2", "cp-3"} {
		if !strings.Contains(out, "ExecStart=/usr/local/bin/corral server --node-id "+node+" ") {
			t.Errorf("plan lacks the unit of %s:\n%s", node, out)
		}
	}
	if strings.Contains(out, "pw@db") {
		t.Error("plan printed a database URL; it is sensitive")
	}

	// Every flag the unit passes is one the real binary accepts.
	help, err := exec.Command(corralBin, "server", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("corral server --help: %v", err)
	}
	unit, err := os.ReadFile("../../deploy/terraform/modules/corral-node/corral-server.service.tftpl")
	if err != nil {
		t.Fatal(err)
	}
	flags := regexp.MustCompile(`--[a-z-]+`).FindAllString(string(unit), -1)
	if len(flags) < 4 {
		t.Fatalf("found only %v in the unit template", flags)
	}
	for _, f := range flags {
		if !strings.Contains(string(help), f+" ") {
			t.Errorf("the unit passes %s, which `corral server` does not accept", f)
		}
	}

	// A bad node id is refused by the module's validation.
	bad := filepath.Join(root, "bad")
	os.MkdirAll(bad, 0o755)
	os.WriteFile(filepath.Join(bad, "main.tf"), []byte(`module "n" {
  source       = "../modules/corral-node"
  node_id      = "Bad_ID"
  database_url = "postgres://x"
}
`), 0o644)
	if out, err := terraform(t, bad, "init", "-backend=false", "-no-color"); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	if out, err := terraform(t, bad, "plan", "-no-color"); err == nil || !strings.Contains(out, "node_id must be") {
		t.Fatalf("plan with a bad node id: err %v\n%s", err, out)
	}
}
