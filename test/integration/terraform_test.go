package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"corral.dev/corral/internal/seal"
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

// TestTerraformModules checks the fleet modules without machines: the
// example validates and plans without printing a secret; every flag the
// rendered units pass is one the real binary accepts; systemd accepts the
// units, the private containerd's included; and bad inputs are refused
// by the modules' validation, each with its message. TestTerraformFleet
// runs what they render.
func TestTerraformModules(t *testing.T) {
	requireTerraform(t)
	root := t.TempDir()
	copyTree(t, "../../deploy/terraform", root)
	example := filepath.Join(root, "examples", "fleet")
	if _, err := seal.Create(filepath.Join(example, "seal.key")); err != nil {
		t.Fatal(err)
	}
	if out, err := terraform(t, example, "init", "-no-color"); err != nil {
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
	if strings.Contains(out, "pw@db") {
		t.Errorf("plan printed a database URL; it is sensitive:\n%s", out)
	}

	// The units the example renders with its defaults (a private
	// containerd on each host), the binaries pointed at real files so
	// that systemd-analyze can check them.
	containerdBin := "/var/cache/corral/bin/containerd"
	if _, err := os.Stat(containerdBin); err != nil {
		containerdBin = corralBin // verify checks only that it is executable
	}
	o := applyFleet(t, example, map[string]any{
		"app_database_url": "postgres://corral_app:pw@db/corral", "owner_database_url": "postgres://corral_owner:pw@db/corral",
		"binary_path": corralBin, "containerd_binary": containerdBin, "runsc_path": corralBin,
	})
	checkRendered(t, o)
	// The rendering is deterministic: a plan after the apply changes nothing.
	if out, err := terraform(t, example, "plan", "-detailed-exitcode", "-no-color", "-var-file="+filepath.Join(example, "test.tfvars.json")); err != nil {
		t.Fatalf("a plan after the apply: %v (exit status 2: changes)\n%s", err, out)
	}
	if len(o.Hosts["host-1"].Files) != 4 {
		t.Fatalf("host-1 renders %d files, want its environment, containerd's config and unit, and its unit", len(o.Hosts["host-1"].Files))
	}
	for verb, machines := range map[string]map[string]renderedMachine{"server": o.ControlPlane, "host": o.Hosts} {
		help, err := exec.Command(corralBin, verb, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("corral %s --help: %v", verb, err)
		}
		for name, r := range machines {
			if r.ExecArgs[0] != verb {
				t.Fatalf("%s runs corral %s", name, r.ExecArgs[0])
			}
			for _, a := range r.ExecArgs[1:] {
				flag, _, _ := strings.Cut(a, "=")
				if strings.HasPrefix(flag, "--") && !regexp.MustCompile(`\s`+regexp.QuoteMeta(flag)+`\s`).Match(help) {
					t.Errorf("%s's unit passes %s, which `corral %s` does not accept", name, flag, verb)
				}
			}
		}
	}

	// Five nodes: the first bootstraps and the others join through it;
	// once formed, the first joins through the second.
	five := []map[string]any{}
	for i := range 5 {
		five = append(five, map[string]any{"name": fmt.Sprintf("cp-%d", i+1), "address": fmt.Sprintf("10.0.0.%d", 11+i)})
	}
	for _, formed := range []bool{false, true} {
		o = applyFleet(t, example, map[string]any{
			"app_database_url": "postgres://corral_app:pw@db/corral", "owner_database_url": "postgres://corral_owner:pw@db/corral",
			"control_plane_nodes": five, "cluster_formed": formed,
		})
		for i := range 5 {
			name := fmt.Sprintf("cp-%d", i+1)
			args := strings.Join(o.ControlPlane[name].ExecArgs, " ")
			want := "--join 10.0.0.11:8301"
			switch {
			case i == 0 && !formed:
				want = "--bootstrap"
			case i == 0:
				want = "--join 10.0.0.12:8301"
			}
			if !strings.Contains(args, want) || strings.Count(args, "--join")+strings.Count(args, "--bootstrap") != 1 ||
				!strings.Contains(args, fmt.Sprintf("--raft-addr 10.0.0.%d:8300", 11+i)) {
				t.Fatalf("five nodes, formed %v: %s runs %s, want %s", formed, name, args, want)
			}
		}
	}

	// Bad inputs: each refused at plan with the module's message.
	const cp = `module "cp" {
  source       = "../modules/control-plane"
  database_url = "postgres://x@db/corral"
  seal_key     = "0000000000000000000000000000000000000000000000000000000000000000"
  blob_dir     = "/mnt/blobs"
  nodes        = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }, { name = "c", address = "10.0.0.3" }]
`
	const hp = `module "hp" {
  source        = "../modules/host-pool"
  control_plane = ["10.0.0.1:8443"]
  hosts         = [{ name = "h", address = "10.0.1.1" }]
`
	tests := []struct {
		name, module, extra, want string
	}{
		{"four nodes", cp, `nodes = [for i in range(4) : { name = "n${i}", address = "10.0.0.${i}" }]`, "nodes must list 3 or 5 nodes"},
		{"a node name that is no DNS label", cp, `nodes = [{ name = "A_1", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }, { name = "c", address = "10.0.0.3" }]`, "each node name must be a DNS label"},
		{"two nodes on one address", cp, `nodes = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.1" }, { name = "c", address = "10.0.0.3" }]`, "node names and addresses must be unique"},
		{"a data dir outside /var/lib", cp, `data_dir = "/srv/corral"`, "data_dir must be an absolute path beneath /var/lib"},
		{"no shared blob store", cp, `blob_dir = ""`, "set exactly one of blob_dir"},
		{"both blob stores", cp, `blob_s3 = { endpoint = "s3:9000", bucket = "b", access_key = "a", secret_key = "s" }`, "set exactly one of blob_dir"},
		{"a database URL with a space", cp, `database_url = "postgres://x y@db/corral"`, "database_url must be a postgres:// URL without spaces"},
		{"a seal key that is not one", cp, `seal_key = "hunter2"`, "seal_key must be a seal key file"},
		{"a node join token that is not one", cp, `node_join_tokens = { b = "secret" }`, "each node join token must be"},
		{"an extra argument with a space", cp, `extra_args = ["--model anthropic"]`, "each extra argument must be one word"},
		{"a low port", cp, `ports = { http = 80 }`, "ports must be five different integers"},
		{"process runtime unacknowledged", hp, `runtime = "process"`, "set allow_untrusted_process_runtime = true"},
		{"process beside gvisor unacknowledged", hp, `runtime = "gvisor,process"`, "set allow_untrusted_process_runtime = true"},
		{"a runtime listed twice", hp, `runtime = "gvisor,runc,gvisor"`, "each once"},
		{"an unknown runtime in a list", hp, `runtime = "gvisor,kata"`, "runtime must be gvisor, runc or process"},
		{"a host join token that is not one", hp, `join_tokens = { h = "corralnode1.x.y" }`, "each join token must be one printed by `corral hosts token`"},
		{"a label with a comma", hp, `labels = { zone = "a,b" }`, "label keys must be"},
		{"a state dir outside /var/lib", hp, `state_dir = "/tmp/host"`, "state_dir must be an absolute path beneath /var/lib"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(root, fmt.Sprintf("bad-%d", i))
			os.MkdirAll(dir, 0o755)
			// A second argument of one name would be a duplicate: the
			// case's replaces the module's default of that name.
			name, _, _ := strings.Cut(tt.extra, " ")
			var lines []string
			for _, l := range strings.Split(tt.module, "\n") {
				if f := strings.Fields(l); len(f) > 0 && f[0] == name {
					continue
				}
				lines = append(lines, l)
			}
			main := strings.Join(lines, "\n") + "  " + tt.extra + "\n}\n"
			if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte(main), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := terraform(t, dir, "init", "-backend=false", "-no-color"); err != nil {
				t.Fatalf("init: %v\n%s", err, out)
			}
			out, err := terraform(t, dir, "plan", "-no-color")
			if err == nil || !strings.Contains(strings.Join(strings.Fields(out), " "), tt.want) {
				t.Fatalf("plan: err %v, want an error saying %q:\n%s", err, tt.want, out)
			}
		})
	}
}
