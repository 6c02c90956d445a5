package containerd

// Benchmarks of the driver against the raw containerd client doing the same
// work in the same run (same image, same runtime, same machine), so the
// reported ratios are the driver's overhead:
//
//	go test -run '^$' -bench . ./hostagent/driver/containerd/

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/spawn/spawntest"
)

// shellSpawnerOnly, as an option's SpawnBinary, keeps a pausable
// benchDriver on the shell spawner (others get the compiled one).
const shellSpawnerOnly = "shell"

func benchDriver(b *testing.B, opts ...func(*Config)) *Driver {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("containerd sandboxes need root")
	}
	if _, err := os.Stat(socketPath(address())); err != nil {
		b.Skipf("no containerd at %s: %v", address(), err)
	}
	cfg := Config{Address: address(), StateDir: b.TempDir()}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case cfg.SpawnBinary == shellSpawnerOnly:
		cfg.SpawnBinary = ""
	case (cfg.Runtime == "" || cfg.Runtime == RuntimeGVisor) && cfg.SpawnBinary == "":
		cfg.SpawnBinary = spawntest.Binary(b)
	}
	sweep(b, cfg)
	d, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// rawSandbox is what a client does by hand: container, task, start.
func rawStart(ctx context.Context, d *Driver, id string) (client.Container, client.Task, error) {
	img, err := d.client.GetImage(ctx, busybox)
	if err != nil {
		return nil, nil, err
	}
	c, err := d.client.NewContainer(ctx, id,
		client.WithSnapshotter(d.cfg.Snapshotter),
		client.WithNewSnapshot(id, img),
		client.WithRuntime("io.containerd.runc.v2", &options.Options{BinaryName: d.cfg.RunscPath}),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("/bin/sh", "-c", initScript)))
	if err != nil {
		return nil, nil, err
	}
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		return c, nil, err
	}
	return c, task, task.Start(ctx)
}

func rawExec(ctx context.Context, task client.Task, args ...string) error {
	spec, err := task.Spec(ctx)
	if err != nil {
		return err
	}
	pspec := *spec.Process
	pspec.Args = args
	p, err := task.Exec(ctx, strings.TrimPrefix(newID(), "corral-"), &pspec, cio.NewCreator(cio.WithStreams(nil, io.Discard, io.Discard)))
	if err != nil {
		return err
	}
	exited, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	st := <-exited
	p.IO().Wait()
	if _, err := p.Delete(ctx); err != nil {
		return err
	}
	return st.Error()
}

func rawRemove(ctx context.Context, c client.Container, task client.Task) {
	if task != nil {
		exited, err := task.Wait(ctx)
		if err == nil {
			_ = task.Kill(ctx, syscall.SIGKILL)
			<-exited
		}
		_, _ = task.Delete(ctx)
	}
	if c != nil {
		_ = c.Delete(ctx, client.WithSnapshotCleanup)
	}
}

const (
	coldSamples = 15
	execSamples = 50
)

func quantiles(b *testing.B, prefix string, ds []time.Duration) time.Duration {
	slices.Sort(ds)
	p50 := ds[len(ds)/2]
	p99 := ds[(len(ds)*99)/100]
	b.ReportMetric(float64(p50.Microseconds())/1000, prefix+"-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, prefix+"-p99-ms")
	return p50
}

// BenchmarkColdStartVsRaw: create a gVisor sandbox and run its first
// command, through the driver and through the raw client, alternately.
func BenchmarkColdStartVsRaw(b *testing.B) {
	d := benchDriver(b)
	ctx := d.ns(context.Background())
	var viaDriver, raw []time.Duration
	// At least coldSamples, whatever b.N, so the quantiles mean something.
	for i := range max(b.N, coldSamples) {
		start := time.Now()
		c, task, err := rawStart(ctx, d, newID())
		if err == nil {
			err = rawExec(ctx, task, "true")
		}
		raw = append(raw, time.Since(start))
		rawRemove(ctx, c, task)
		if err != nil {
			b.Fatalf("raw: %v", err)
		}

		start = time.Now()
		ref, err := d.Create(ctx, driver.Spec{Key: fmt.Sprintf("bench-%d", i), Image: busybox})
		if err != nil {
			b.Fatal(err)
		}
		sb, err := d.Attach(ctx, ref)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		viaDriver = append(viaDriver, time.Since(start))
		if err := d.Destroy(ctx, ref); err != nil {
			b.Fatal(err)
		}
	}
	r := quantiles(b, "raw", raw)
	c := quantiles(b, "corral", viaDriver)
	b.ReportMetric(float64(c)/float64(r), "ratio-p50")
}

// BenchmarkExecVsRaw: one command in a running gVisor sandbox, through the
// driver (its command server) and as a raw task exec (runsc exec through
// containerd), alternately.
func BenchmarkExecVsRaw(b *testing.B) {
	d := benchDriver(b)
	ctx := d.ns(context.Background())
	ref, err := d.Create(ctx, driver.Spec{Key: "bench-exec", Image: busybox})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Destroy(context.Background(), ref) })
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		b.Fatal(err)
	}
	c, err := d.client.LoadContainer(ctx, ref.ID)
	if err != nil {
		b.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	// The first command runs as an exec of its own; the sandbox's command
	// server (serve.go) starts after it and runs the rest.
	if _, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
		b.Fatal(err)
	}
	awaitServer(b, d, ref.ID)
	var viaDriver, raw []time.Duration
	for range max(b.N, execSamples) {
		start := time.Now()
		if err := rawExec(ctx, task, "true"); err != nil {
			b.Fatal(err)
		}
		raw = append(raw, time.Since(start))
		start = time.Now()
		if _, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		viaDriver = append(viaDriver, time.Since(start))
	}
	r := quantiles(b, "raw", raw)
	v := quantiles(b, "corral", viaDriver)
	b.ReportMetric(float64(v)/float64(r), "ratio-p50")
}

// BenchmarkIdleSandboxMemory: host memory held by idle gVisor sandboxes
// that have run a command (and so keep a command server): each one's
// cgroup (Sentry, gofer, its page cache that is in use) plus its shim
// process's own memory, and how many more would fit in the memory
// available now.
func BenchmarkIdleSandboxMemory(b *testing.B) {
	d := benchDriver(b)
	ctx := d.ns(context.Background())
	const n = 10
	var refs []driver.Ref
	b.Cleanup(func() {
		for _, ref := range refs {
			_ = d.Destroy(context.Background(), ref)
		}
	})
	for i := range n {
		ref, err := d.Create(ctx, driver.Spec{Key: fmt.Sprintf("bench-idle-%d", i), Image: busybox})
		if err != nil {
			b.Fatal(err)
		}
		refs = append(refs, ref)
		sb, err := d.Attach(ctx, ref)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		// An idle sandbox that has run a command keeps its command
		// server (serve.go), which its first command starts.
		awaitServer(b, d, ref.ID)
	}
	var total int64
	for _, ref := range refs {
		total += sandboxMemory(b, d, ref.ID)
	}
	per := float64(total) / n
	b.ReportMetric(per/(1<<20), "MB/idle-sandbox")
	b.ReportMetric(float64(memAvailable(b))/per, "idle-sandboxes-fit")
}

// sandboxMemory is the memory cgroup's usage less its inactive file cache,
// plus the anonymous RSS of the sandbox's shim (its file pages, the shim
// binary, are shared by every shim on the host).
func sandboxMemory(b *testing.B, d *Driver, id string) int64 {
	dir := "/sys/fs/cgroup/memory/" + d.cfg.Namespace + "/" + id
	usage := readInt(b, dir+"/memory.usage_in_bytes")
	stat, err := os.ReadFile(dir + "/memory.stat")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(stat), "\n") {
		var v int64
		if _, err := fmt.Sscanf(line, "total_inactive_file %d", &v); err == nil {
			usage -= v
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		cmd, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), "containerd-shim") || !strings.Contains(string(cmd), "-id\x00"+id+"\x00") {
			continue
		}
		status, _ := os.ReadFile("/proc/" + p.Name() + "/status")
		for _, line := range strings.Split(string(status), "\n") {
			var kb int64
			if _, err := fmt.Sscanf(line, "RssAnon: %d kB", &kb); err == nil {
				usage += kb << 10
			}
		}
	}
	return usage
}

func memAvailable(b testing.TB) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		var kb int64
		if _, err := fmt.Sscanf(s.Text(), "MemAvailable: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// BenchmarkResumeFromCheckpoint: an idle gVisor sandbox of the Debian
// image, with a python3 process it started left running, is paused and
// then resumed and answers its next command (Resume + Exec through the
// driver), against the raw restore of the same checkpoint in the same
// run: the containerd client creating the task from the image path (the
// runc shim runs `runsc restore`) and one raw task exec. Both start from a
// checkpoint the driver's Pause made; the checkpoint itself is not timed.
// Each side then runs one more command, timed apart (exec-warm): the first
// command's time less it is what a fresh restore adds to a command, and
// corral's warm command less the raw one is what the spawn relay
// (spawn.go) costs any command: with the compiled spawner and with the
// shell's, in the same run.
func BenchmarkResumeFromCheckpoint(b *testing.B) {
	b.Run("spawner=compiled", func(b *testing.B) { benchResume(b, "") })
	b.Run("spawner=shell", func(b *testing.B) { benchResume(b, shellSpawnerOnly) })
}

func benchResume(b *testing.B, spawnBinary string) {
	d := benchDriver(b, func(c *Config) { c.Pausable, c.SpawnBinary = true, spawnBinary })
	ctx := d.ns(context.Background())
	ref, err := d.Create(ctx, driver.Spec{Key: "bench-resume", Image: debian})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Destroy(context.Background(), ref) })
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		b.Fatal(err)
	}
	res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c",
		`python3 -c 'import json, sqlite3, time; print("ready", flush=True); time.sleep(1e9)' >py.out 2>&1 &
i=0; until grep -q ready py.out; do i=$((i+1)); [ $i -gt 300 ] && exit 1; sleep 0.05; done`}})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("starting python3: %+v, %v", res, err)
	}
	c, err := d.client.LoadContainer(ctx, ref.ID)
	if err != nil {
		b.Fatal(err)
	}
	dir := checkpointDir(d.cfg.StateDir, ref.ID)
	var viaDriver, resumeOnly, raw, rawOnly, warm, rawWarm []time.Duration
	for range max(b.N, coldSamples) {
		if err := d.Pause(ctx, ref); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		task, err := c.NewTask(ctx, cio.NullIO, client.WithRestoreImagePath(dir), d.withRunscBinary)
		if err == nil {
			if err = task.Start(ctx); err == nil {
				rawOnly = append(rawOnly, time.Since(start))
				err = rawExec(ctx, task, "true")
			}
		}
		raw = append(raw, time.Since(start))
		if err != nil {
			b.Fatalf("raw restore: %v", err)
		}
		start = time.Now()
		if err := rawExec(ctx, task, "true"); err != nil {
			b.Fatalf("raw exec: %v", err)
		}
		rawWarm = append(rawWarm, time.Since(start))
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}

		if err := d.Pause(ctx, ref); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		if err := d.Resume(ctx, ref); err != nil {
			b.Fatal(err)
		}
		resumeOnly = append(resumeOnly, time.Since(start))
		if _, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		viaDriver = append(viaDriver, time.Since(start))
		start = time.Now()
		if _, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		warm = append(warm, time.Since(start))
	}
	// The python3 process lived through every pause.
	if res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c", `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f" | grep -q '^python3 -c import json' && exit 0; done; exit 1`}}); err != nil || res.ExitCode != 0 {
		b.Errorf("python3 did not survive the pauses: %+v, %v", res, err)
	}
	r := quantiles(b, "raw-restore", raw)
	v := quantiles(b, "corral-resume", viaDriver)
	// The restores alone, before their exec.
	quantiles(b, "corral-resume-call", resumeOnly)
	quantiles(b, "raw-restore-call", rawOnly)
	quantiles(b, "corral-exec-warm", warm)
	quantiles(b, "raw-exec-warm", rawWarm)
	b.ReportMetric(float64(v)/float64(r), "ratio-p50")
}
