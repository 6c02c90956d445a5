package integration

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
)

// machine is a "machine" of the fleet test: a network namespace with its
// own address on the test's LAN, and a directory standing in for its
// filesystem. The modules render absolute paths (/etc/corral/...,
// /var/lib/corral/server); on a machine they are rewritten beneath root,
// and every other path (the corral binary, containerd's socket, the
// shared blob directory) is the real one.
type machine struct {
	name string
	ns   *netns
	ip   string
	root string
}

// machinePaths are the rendered directories each machine has of its own.
var machinePaths = []string{"/etc/corral", "/etc/systemd/system", "/var/lib/corral/server", "/var/lib/corral/host"}

// path is p on the machine.
func (m *machine) path(p string) string {
	for _, prefix := range machinePaths {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return m.root + p
		}
	}
	return p
}

// rewrite is a rendered word (an argument, an environment value) on the
// machine: each machine path in it moved beneath root.
func (m *machine) rewrite(word string) string {
	for _, prefix := range machinePaths {
		if strings.HasPrefix(word, prefix+"/") || word == prefix {
			return m.root + word
		}
	}
	return word
}

// newLAN makes a namespace holding a bridge, the switch the machines are
// plugged into.
func newLAN(t *testing.T, tag string) *netns {
	t.Helper()
	lan := newNetns(t, "crf-lan-"+tag)
	ipCmd(t, "-n", lan.name, "link", "add", "br0", "type", "bridge")
	ipCmd(t, "-n", lan.name, "link", "set", "br0", "up")
	return lan
}

// newMachine makes machine i: its namespace, a veth plugged into the LAN
// with ip, and a relay to PostgreSQL on its loopback (the database the
// fleet is deployed over lives outside it, on pgAddr).
func newMachine(t *testing.T, lan *netns, tag string, i int, name, ip, pgAddr string) *machine {
	t.Helper()
	m := &machine{name: name, ns: newNetns(t, fmt.Sprintf("crf-%d-%s", i, tag)), ip: ip, root: t.TempDir()}
	inside, outside := fmt.Sprintf("crf%s%d", tag, i), fmt.Sprintf("crf%sp%d", tag, i)
	ipCmd(t, "link", "add", inside, "netns", m.ns.name, "type", "veth", "peer", "name", outside, "netns", lan.name)
	ipCmd(t, "-n", m.ns.name, "addr", "add", ip+"/24", "dev", inside)
	ipCmd(t, "-n", m.ns.name, "link", "set", inside, "up")
	ipCmd(t, "-n", lan.name, "link", "set", outside, "master", "br0")
	ipCmd(t, "-n", lan.name, "link", "set", outside, "up")
	m.ns.forward(t, pgAddr)
	return m
}

// renderedFile is one file a module renders for a machine.
type renderedFile struct {
	Path, Mode, Owner, Content string
}

// renderedMachine is a machine's part of the modules' outputs.
type renderedMachine struct {
	Address       string
	Bootstrap     bool
	Ready         bool
	ExecArgs      []string `json:"exec_args"`
	UnitName      string   `json:"unit_name"`
	Unit          string
	Files         []renderedFile
	InstallScript string `json:"install_script"`
	CloudInit     string `json:"cloud_init"`
}

// fleetOutputs are the example's outputs that the test uses.
type fleetOutputs struct {
	ControlPlane     map[string]renderedMachine
	Hosts            map[string]renderedMachine
	NodeTokenCommand string
	FirstNode        string
}

// applyFleet applies the example in dir with vars and reads its outputs.
func applyFleet(t *testing.T, dir string, vars map[string]any) fleetOutputs {
	t.Helper()
	b, err := json.Marshal(vars)
	if err != nil {
		t.Fatal(err)
	}
	varFile := filepath.Join(dir, "test.tfvars.json")
	if err := os.WriteFile(varFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := terraform(t, dir, "apply", "-auto-approve", "-no-color", "-var-file="+varFile); err != nil {
		t.Fatalf("terraform apply: %v\n%s", err, out)
	}
	cmd := exec.Command("terraform", "-chdir="+dir, "output", "-json", "-no-color")
	cmd.Env = append(os.Environ(), "TF_IN_AUTOMATION=1", "TF_INPUT=0", "CHECKPOINT_DISABLE=1")
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("terraform output: %v", err)
	}
	var outs map[string]struct{ Value json.RawMessage }
	if err := json.Unmarshal(raw, &outs); err != nil {
		t.Fatalf("terraform output -json: %v", err)
	}
	var o fleetOutputs
	for name, dst := range map[string]any{"control_plane": &o.ControlPlane, "hosts": &o.Hosts,
		"node_token_command": &o.NodeTokenCommand, "first_node": &o.FirstNode} {
		if err := json.Unmarshal(outs[name].Value, dst); err != nil {
			t.Fatalf("output %s: %v", name, err)
		}
	}
	return o
}

// unitDirectives reads a systemd unit's directives of the [Service]
// section, continuation lines joined.
func unitDirectives(t *testing.T, unit string) map[string][]string {
	t.Helper()
	d := map[string][]string{}
	section, pending := "", ""
	sc := bufio.NewScanner(strings.NewReader(unit))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasSuffix(line, `\`) {
			pending += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		line, pending = pending+line, ""
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("unit line %q is not a directive", line)
			}
			d[k] = append(d[k], v)
		}
	}
	return d
}

// install does on m what the machine's install script does, short of
// systemd: it writes the rendered files (mode as rendered; owners are
// root here) and makes the unit's StateDirectory.
func (m *machine) install(t *testing.T, r renderedMachine) {
	t.Helper()
	for _, f := range r.Files {
		var mode uint32
		if _, err := fmt.Sscanf(f.Mode, "%o", &mode); err != nil {
			t.Fatalf("%s: mode %q", f.Path, f.Mode)
		}
		p := m.path(f.Path)
		if p == f.Path {
			t.Fatalf("the module renders %s, outside the machine's own directories %v", f.Path, machinePaths)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.Content), os.FileMode(mode)); err != nil {
			t.Fatal(err)
		}
		// The install script writes this very content (base64, quoted).
		if !strings.Contains(r.InstallScript, f.Path+" "+f.Mode+" "+f.Owner+" '") {
			t.Errorf("%s's install script does not write %s", m.name, f.Path)
		}
	}
	for _, sd := range unitDirectives(t, r.Unit)["StateDirectory"] {
		if err := os.MkdirAll(m.path("/var/lib/"+sd), 0o700); err != nil {
			t.Fatal(err)
		}
	}
}

// systemdPath is the PATH systemd gives a service.
const systemdPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// command is the unit's ExecStart on m, with the environment the unit
// gives it (EnvironmentFile= and Environment=) and nothing else.
func (m *machine) command(t *testing.T, unit string) []string {
	t.Helper()
	d := unitDirectives(t, unit)
	if len(d["ExecStart"]) != 1 {
		t.Fatalf("%s's unit has %d ExecStart lines", m.name, len(d["ExecStart"]))
	}
	env := []string{systemdPath}
	for _, ef := range d["EnvironmentFile"] {
		b, err := os.ReadFile(m.path(strings.TrimPrefix(ef, "-")))
		if err != nil && !strings.HasPrefix(ef, "-") {
			t.Fatalf("%s's environment file: %v", m.name, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				k, v, _ := strings.Cut(line, "=")
				env = append(env, k+"="+m.rewrite(v))
			}
		}
	}
	for _, e := range d["Environment"] {
		for _, kv := range strings.Fields(e) {
			k, v, _ := strings.Cut(kv, "=")
			env = append(env, k+"="+m.rewrite(v))
		}
	}
	// The modules refuse words that would need quoting, so the line
	// splits on spaces.
	var argv []string
	for _, w := range strings.Fields(d["ExecStart"][0]) {
		if strings.ContainsAny(w, `"'\$%`) {
			t.Fatalf("%s's ExecStart has a word needing systemd's quoting or specifiers: %q", m.name, w)
		}
		argv = append(argv, m.rewrite(w))
	}
	return append([]string{"env", "-i"}, append(env, argv...)...)
}

// run starts argv inside m's namespace, in its own process group, killed
// with the group when the test ends.
func (m *machine) run(t *testing.T, name string, argv []string) *proc {
	t.Helper()
	args := append([]string{"netns", "exec", m.ns.name}, argv...)
	p := &proc{name: name, cmd: exec.Command("ip", args...), stdout: &watched{}, stderr: &watched{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, lastLines(p.stderr.String(), 30))
		}
	})
	return p
}

// stop ends p's process group with SIGTERM, as systemctl stop does, and
// waits for it.
func stop(t *testing.T, p *proc) {
	t.Helper()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop within 30s of SIGTERM", p.name)
	}
}

// awaitLog waits for substr in p's stderr, failing if p exits first.
func awaitLog(t *testing.T, p *proc, substr string, d time.Duration) {
	t.Helper()
	select {
	case <-p.stderr.when(substr, 1):
	case <-p.done:
		t.Fatalf("%s exited before logging %q:\n%s", p.name, substr, lastLines(p.stderr.String(), 30))
	case <-time.After(d):
		t.Fatalf("%s did not log %q within %v:\n%s", p.name, substr, d, lastLines(p.stderr.String(), 30))
	}
}

// exec runs argv to its end inside m's namespace (a CLI verb), with env
// added, and returns its stdout.
func (m *machine) exec(t *testing.T, env []string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", m.ns.name}, argv...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("on %s: %s: %v\n%s", m.name, strings.Join(argv, " "), err, stderr.String())
	}
	return string(out)
}

// issueFor writes a server certificate for ip, signed by ca.
func (ca *testCA) issueFor(t *testing.T, ip, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "corral node " + ip},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	replaceFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	replaceFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

func requireTerraform(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("terraform"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("terraform CLI not found; CI machines have it at /usr/local/bin/terraform")
		}
		t.Skip("terraform CLI not installed: the module tests render and apply the modules with it")
	}
}

// TestTerraformFleet is issue 20's fleet test. It applies
// examples/fleet (the control-plane and host-pool modules over an
// existing PostgreSQL) with plain terraform, and runs what it renders on
// five "machines" made of network namespaces on one LAN (a bridge), each
// with its own address and its own /etc/corral and /var/lib/corral: the
// rendered files are written there and each unit's ExecStart runs with
// the unit's environment. Three applies bring the fleet up, as an
// operator's would: cp-1 bootstraps; node join tokens minted with the
// rendered node_token_command let cp-2 and cp-3 join (a TLS cluster); host
// join tokens let two gVisor hosts join; then a session runs a tool end
// to end through the public API of another node.
func TestTerraformFleet(t *testing.T) {
	requireTerraform(t)
	requireGVisor(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	subnet := fmt.Sprintf("10.%d.%d", 200+int(b[0])%50, b[1])

	db := pgtest.New(t)
	opKey := operatorKey(t, db)
	u, err := url.Parse(db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	lan := newLAN(t, tag)
	machines := map[string]*machine{}
	var cpNodes, hostList []map[string]any
	for i, name := range []string{"cp-1", "cp-2", "cp-3", "host-1", "host-2"} {
		ip := fmt.Sprintf("%s.%d", subnet, 11+i)
		machines[name] = newMachine(t, lan, tag, i, name, ip, u.Host)
		if strings.HasPrefix(name, "cp-") {
			cpNodes = append(cpNodes, map[string]any{"name": name, "address": ip})
		} else {
			hostList = append(hostList, map[string]any{"name": name, "address": ip, "labels": map[string]string{"zone": fmt.Sprintf("z%d", i)}})
		}
	}

	// The operator's side: a copy of deploy/terraform, the seal key, each
	// node's certificate for its address, a shared blob directory.
	root := t.TempDir()
	copyTree(t, "../../deploy/terraform", root)
	example := filepath.Join(root, "examples", "fleet")
	tlsDir := filepath.Join(root, "tls")
	os.MkdirAll(tlsDir, 0o700)
	ca := newTestCA(t, "fleet test CA")
	caFile := filepath.Join(root, "ca.pem")
	ca.writeCert(t, caFile)
	for _, n := range cpNodes {
		ca.issueFor(t, n["address"].(string), filepath.Join(tlsDir, n["name"].(string)+".crt"), filepath.Join(tlsDir, n["name"].(string)+".key"))
	}
	blobDir := t.TempDir()
	vars := map[string]any{
		"control_plane_nodes": cpNodes, "hosts": hostList,
		"app_database_url": db.AppURL, "owner_database_url": db.OwnerURL,
		"seal_key_file": testSealKey, "tls_dir": tlsDir, "blob_dir": blobDir, "binary_path": corralBin,
		"host_runtime": "gvisor", "manage_containerd": false, "containerd_address": containerdAddress(),
		"runsc_path": "/var/cache/corral/bin/runsc", "images": []string{},
		// One sandbox for the session, not a warm pool on each host.
		"host_extra_args": []string{"--no-warm-pools"},
	}
	if out, err := terraform(t, example, "init", "-no-color"); err != nil {
		t.Fatalf("terraform init: %v\n%s", err, out)
	}

	// Apply 1: only the first node is ready; the others' install scripts
	// refuse until they have a token.
	start := time.Now()
	o := applyFleet(t, example, vars)
	if o.FirstNode != "cp-1" || !o.ControlPlane["cp-1"].Bootstrap || !o.ControlPlane["cp-1"].Ready {
		t.Fatalf("first apply: first node %q, cp-1 %+v", o.FirstNode, o.ControlPlane["cp-1"].ExecArgs)
	}
	for _, name := range []string{"cp-2", "cp-3", "host-1", "host-2"} {
		r := o.ControlPlane[name]
		if strings.HasPrefix(name, "host-") {
			r = o.Hosts[name]
		}
		if r.Ready || r.Bootstrap {
			t.Fatalf("first apply: %s is ready (%v) or bootstraps (%v) without a token", name, r.Ready, r.Bootstrap)
		}
		if !strings.Contains(r.InstallScript, "no join token") && !strings.Contains(r.InstallScript, "no node join token") {
			t.Fatalf("%s's install script does not refuse a first start without a token:\n%s", name, r.InstallScript)
		}
	}
	checkRendered(t, o)

	cp1 := machines["cp-1"]
	cp1.install(t, o.ControlPlane["cp-1"])
	nodes := map[string]*proc{}
	nodes["cp-1"] = cp1.run(t, "cp-1", cp1.command(t, o.ControlPlane["cp-1"].Unit))
	awaitLog(t, nodes["cp-1"], "corral server listening", time.Minute)

	// Apply 2: node join tokens, minted on cp-1 with the rendered command.
	tokens := map[string]string{}
	for _, name := range []string{"cp-2", "cp-3"} {
		var argv []string
		for _, w := range strings.Fields(o.NodeTokenCommand) {
			argv = append(argv, cp1.rewrite(w))
		}
		tokens[name] = strings.TrimSpace(cp1.exec(t, nil, argv...))
	}
	vars["node_join_tokens"] = tokens
	o = applyFleet(t, example, vars)
	tlsCLI := []string{"--tls-ca", caFile}
	members := func() string {
		return cp1.exec(t, nil, append([]string{corralBin, "cluster", "members", "--server", "https://" + cp1.ip + ":8090"}, tlsCLI...)...)
	}
	for _, name := range []string{"cp-2", "cp-3"} {
		r := o.ControlPlane[name]
		if !r.Ready || !strings.Contains(strings.Join(r.ExecArgs, " "), "--join "+cp1.ip+":8301") {
			t.Fatalf("second apply: %s ready %v, args %v", name, r.Ready, r.ExecArgs)
		}
		m := machines[name]
		m.install(t, r)
		nodes[name] = m.run(t, name, m.command(t, r.Unit))
		awaitLog(t, nodes[name], "corral server listening", time.Minute)
	}
	waitfor.State(t, time.Minute, "three members, over TLS", func() (bool, string) {
		out := members()
		return strings.Contains(out, "cp-1") && strings.Contains(out, "cp-2") && strings.Contains(out, "cp-3"), out
	})
	t.Logf("three control-plane nodes formed a TLS cluster %v after the first apply:\n%s", time.Since(start).Round(time.Millisecond), members())

	// Apply 3: host join tokens from the admin API; the cluster is formed,
	// so the first node stops bootstrapping and the node tokens go.
	hostTokens := map[string]string{}
	opEnv := []string{"CORRAL_OPERATOR_KEY=" + opKey}
	for _, name := range []string{"host-1", "host-2"} {
		hostTokens[name] = strings.TrimSpace(cp1.exec(t, opEnv, append([]string{corralBin, "hosts", "token", "--ttl", "10m", "--server", "https://" + cp1.ip + ":8090"}, tlsCLI...)...))
	}
	delete(vars, "node_join_tokens")
	vars["host_join_tokens"], vars["cluster_formed"] = hostTokens, true
	o = applyFleet(t, example, vars)
	if args := strings.Join(o.ControlPlane["cp-1"].ExecArgs, " "); o.ControlPlane["cp-1"].Bootstrap || strings.Contains(args, "--bootstrap") ||
		!strings.Contains(args, "--join "+machines["cp-2"].ip+":8301") {
		t.Fatalf("cluster formed: cp-1 still bootstraps: %s", args)
	}
	checkRendered(t, o)
	// cp-1 restarts from the new rendering: it has Raft state, so --join
	// is not used and it takes its place again without a token.
	stop(t, nodes["cp-1"])
	cp1.install(t, o.ControlPlane["cp-1"])
	nodes["cp-1"] = cp1.run(t, "cp-1 (cluster formed)", cp1.command(t, o.ControlPlane["cp-1"].Unit))
	awaitLog(t, nodes["cp-1"], "corral server listening", time.Minute)
	waitfor.State(t, time.Minute, "cp-1 back among three members with a leader", func() (bool, string) {
		out := members()
		names, leaders := 0, 0
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 5 && strings.HasPrefix(f[0], "cp-") {
				names++
				if f[4] == "true" {
					leaders++
				}
			}
		}
		return names == 3 && leaders == 1, out
	})
	var hosts []*proc
	for _, name := range []string{"host-1", "host-2"} {
		r := o.Hosts[name]
		if !r.Ready || r.Unit == "" {
			t.Fatalf("third apply: %s not ready", name)
		}
		m := machines[name]
		m.install(t, r)
		// Sandboxes outlive their agents: whatever happens, the ones this
		// host made are destroyed after it stopped.
		containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
			StateDir: filepath.Join(m.path("/var/lib/corral/host"), "containerd")})
		h := m.run(t, name, m.command(t, r.Unit))
		awaitLog(t, h, "registered with the control plane", 2*time.Minute)
		hosts = append(hosts, h)
	}
	ls := cp1.exec(t, opEnv, append([]string{corralBin, "hosts", "ls", "--server", "https://" + cp1.ip + ":8090"}, tlsCLI...)...)
	// Each host reports the pool and its own zone, as rendered.
	pools := map[string]string{}
	for _, line := range strings.Split(ls, "\n") {
		if f := strings.Fields(line); len(f) > 8 && strings.HasPrefix(f[0], "host-") {
			pools[f[0]] = f[7] + "/" + f[8]
		}
	}
	if pools["host-1"] != "general/z3" || pools["host-2"] != "general/z4" {
		t.Fatalf("hosts ls after the hosts joined: pool/zone %v, want general/z3 and general/z4:\n%s", pools, ls)
	}

	// A tenant and its key, through the admin API over TLS.
	admin := func(args ...string) map[string]any {
		t.Helper()
		out := cp1.exec(t, opEnv, append(append([]string{corralBin, "admin", "--grpc-addr", cp1.ip + ":8090"}, tlsCLI...), args...)...)
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("corral admin %s printed %q: %v", strings.Join(args, " "), out, err)
		}
		return v
	}
	admin("create-tenant", "--tenant", "tenant_fleet", "--name", "Fleet")
	secret, _ := admin("create-key", "--tenant", "tenant_fleet", "--name", "sdk")["secret"].(string)
	if secret == "" {
		t.Fatal("create-key printed no secret")
	}

	// The official SDK, on cp-3's public API: its connections are dialed
	// from inside cp-2's machine, and trust the fleet's CA.
	via := machines["cp-2"]
	transport := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.pool(), MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := via.ns.do(func() (err error) { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
			return c, err
		},
	}
	t.Cleanup(transport.CloseIdleConnections)
	client := anthropic.NewClient(option.WithBaseURL("https://"+machines["cp-3"].ip+":8080"), option.WithAPIKey(secret),
		option.WithHTTPClient(&http.Client{Transport: transport}), option.WithRequestTimeout(2*time.Minute), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "fleet", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}}})
	if err != nil {
		t.Fatalf("Agents.New: %v", err)
	}
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "fleet"})
	if err != nil {
		t.Fatalf("Environments.New: %v", err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: env.ID,
	})
	if err != nil {
		t.Fatalf("Sessions.New: %v", err)
	}
	// The session and its sandbox go while the hosts still run.
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if _, err := client.Beta.Sessions.Delete(dctx, sess.ID, anthropic.BetaSessionDeleteParams{}); err != nil {
			t.Errorf("deleting the session: %v", err)
			return
		}
		waitfor.Cond(t, time.Minute, "the session's sandbox to be destroyed", func() bool {
			for _, h := range hosts {
				for _, line := range strings.Split(h.stderr.String(), "\n") {
					if strings.Contains(line, "sandbox destroyed") && strings.Contains(line, sess.ID) {
						return true
					}
				}
			}
			return false
		})
		if ids := sessionContainers(t, sess.ID); len(ids) != 0 {
			t.Errorf("the session's containers %v outlived it", ids)
		}
	})
	stream := client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer stream.Close()
	turn := time.Now()
	if _, err := client.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{{
		OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{{
			OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: `!tool bash {"command":"echo hi"}` + "\n!echo"}}}},
	}}}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	var results []string
	var types []string
	for stream.Next() {
		e := stream.Current()
		types = append(types, e.Type)
		if e.Type == "agent.tool_result" {
			var b strings.Builder
			for _, c := range e.AsAgentToolResult().Content {
				b.WriteString(c.Text)
			}
			results = append(results, b.String())
		}
		if e.Type == "session.status_idle" {
			break
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("the stream: %v (after %v)", err, types)
	}
	if len(results) != 1 || strings.TrimSpace(results[0]) != "hi" {
		t.Fatalf("tool results %q, events %v", results, types)
	}
	sandboxes := cp1.exec(t, opEnv, append([]string{corralBin, "sandboxes", "ls", "--server", "https://" + cp1.ip + ":8090"}, tlsCLI...)...)
	var on string
	for _, line := range strings.Split(sandboxes, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == sess.ID {
			on = f[2]
		}
	}
	if on != "host-1" && on != "host-2" {
		t.Fatalf("the session's sandbox is on %q:\n%s", on, sandboxes)
	}
	t.Logf("bash echo hi ran in a gVisor sandbox on %s, sent through cp-3, in %v; the fleet was up %v after the first apply",
		on, time.Since(turn).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// checkRendered checks what every machine's rendering says beyond what
// the run shows: systemd accepts each unit (systemd-analyze verify, where
// installed), each install script parses, and each cloud-init document
// carries its install script.
func checkRendered(t *testing.T, o fleetOutputs) {
	t.Helper()
	dir := t.TempDir()
	var units []string
	all := map[string]renderedMachine{}
	for k, v := range o.ControlPlane {
		all[k] = v
	}
	for k, v := range o.Hosts {
		all[k] = v
	}
	for name, r := range all {
		script := filepath.Join(dir, name+".sh")
		if err := os.WriteFile(script, []byte(r.InstallScript), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("sh", "-n", script).CombinedOutput(); err != nil {
			t.Fatalf("%s's install script: %v\n%s", name, err, out)
		}
		if !strings.HasPrefix(r.CloudInit, "#cloud-config\n") || !strings.Contains(r.CloudInit, "/root/corral-install.sh") {
			t.Fatalf("%s's cloud-init:\n%s", name, r.CloudInit)
		}
		for _, f := range r.Files {
			if strings.HasSuffix(f.Path, ".service") {
				sub := filepath.Join(dir, name)
				os.MkdirAll(sub, 0o755)
				p := filepath.Join(sub, filepath.Base(f.Path))
				if err := os.WriteFile(p, []byte(f.Content), 0o644); err != nil {
					t.Fatal(err)
				}
				units = append(units, p)
			}
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Logf("systemd-analyze not installed: the units are not verified")
		return
	}
	for _, u := range units {
		if out, err := exec.Command("systemd-analyze", "verify", u).CombinedOutput(); err != nil {
			t.Fatalf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
	}
}
