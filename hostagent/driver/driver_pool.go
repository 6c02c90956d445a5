package driver

// PoolLabel marks a sandbox made for a host's warm pool, before any session
// asked for it: its value names the pool's class. A driver that can bind
// such a sandbox to a session later (the containerd driver's Claim) drops
// the label in the same step as it sets the session's key, labels and
// environment, so a sandbox carries the label exactly while it is unclaimed.
// It is the host agent's to set; labels of an ensure never carry it.
const PoolLabel = "corral.pool"
