package devstack

import (
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/policy"
)

// WarmPools are the warm pool classes a host of runtime keeps, from the
// policy in policyDir (the embedded policy when ""): each pool of the
// runtime, with the runtime profile's limits, which are the limits the
// control plane's placements of that runtime carry (so that their ensures
// claim from the pool).
func WarmPools(policyDir, runtime string) ([]agent.PoolClass, error) {
	var (
		p   *policy.Policy
		err error
	)
	if policyDir == "" {
		p, err = policy.Load()
	} else {
		p, err = policy.LoadDir(policyDir)
	}
	if err != nil {
		return nil, err
	}
	prof := p.Runtimes[runtime]
	var out []agent.PoolClass
	for _, pl := range p.PoolsOf(runtime) {
		out = append(out, agent.PoolClass{Runtime: runtime, Image: pl.Image, Min: pl.Min, Max: pl.Max, Limits: driver.Limits{
			CPUMillis: int64(prof.CPUMillis), MemoryBytes: int64(prof.MemoryMiB) << 20,
			Pids: int64(prof.Pids), DiskBytes: int64(prof.DiskMiB) << 20,
		}})
	}
	return out, nil
}
