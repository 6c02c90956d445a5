package agent

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"corral.dev/corral/hostagent/driver"
)

// HostResources measures this machine: its CPUs, its memory (MemTotal in
// /proc/meminfo) and the size of the filesystem holding dir.
func HostResources(dir string) (Resources, error) {
	mem, err := meminfo()
	if err != nil {
		return Resources{}, err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return Resources{}, fmt.Errorf("measuring disk of %s: %w", dir, err)
	}
	return Resources{
		CPUMillis:   int64(runtime.NumCPU()) * 1000,
		MemoryBytes: mem["MemTotal"],
		DiskBytes:   int64(st.Blocks) * st.Bsize,
	}, nil
}

// HostPressure reports memory pressure when MemAvailable falls below
// memFraction of MemTotal, and disk pressure when the free space of dir's
// filesystem falls below diskFraction of its size.
func HostPressure(dir string, memFraction, diskFraction float64) PressureFunc {
	return func(context.Context) (Pressure, error) {
		mem, err := meminfo()
		if err != nil {
			return Pressure{}, err
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			return Pressure{}, fmt.Errorf("measuring disk of %s: %w", dir, err)
		}
		return Pressure{
			Memory: float64(mem["MemAvailable"]) < memFraction*float64(mem["MemTotal"]),
			Disk:   float64(st.Bavail) < diskFraction*float64(st.Blocks),
		}, nil
	}
}

// HostUsage measures the memory in use (MemTotal - MemAvailable) and the
// space used on dir's filesystem.
func HostUsage(dir string) func(context.Context) (Resources, error) {
	return func(context.Context) (Resources, error) {
		mem, err := meminfo()
		if err != nil {
			return Resources{}, err
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			return Resources{}, fmt.Errorf("measuring disk of %s: %w", dir, err)
		}
		return Resources{
			MemoryBytes: mem["MemTotal"] - mem["MemAvailable"],
			DiskBytes:   int64(st.Blocks-st.Bfree) * st.Bsize,
		}, nil
	}
}

// meminfo reads /proc/meminfo, in bytes.
func meminfo() (map[string]int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n *= 1024
		}
		out[name] = n
	}
	if out["MemTotal"] == 0 {
		return nil, fmt.Errorf("/proc/meminfo has no MemTotal")
	}
	return out, sc.Err()
}

// CanaryKey is the key of the canary sandbox. It is never placed, so a
// canary left behind by a crash is removed as a leftover.
const CanaryKey = "corral-canary"

// runCanary creates a sandbox from image, runs command in it and removes
// it: with gVisor it proves that runsc can still boot a sandbox here (a
// provider's canary, providers.go).
func runCanary(ctx context.Context, d driver.Driver, image string, command []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ref, err := d.Create(ctx, driver.Spec{Key: CanaryKey, Image: image})
	if err != nil {
		return fmt.Errorf("canary: creating sandbox: %w", err)
	}
	defer d.Destroy(context.WithoutCancel(ctx), ref)
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		return fmt.Errorf("canary: attaching: %w", err)
	}
	res, err := sb.Exec(ctx, driver.ExecRequest{Command: command, Timeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("canary: exec: %w", err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("canary: %v exited %d: %s", command, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}
