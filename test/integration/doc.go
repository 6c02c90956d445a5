// Package integration tests corral end to end, as users and operators meet
// it: the real binary, a real PostgreSQL, and (in later suites) real
// containerd with runsc and several control-plane nodes.
package integration
