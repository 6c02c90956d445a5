// Package envbuild turns an environment's packages into a build: the
// operator's package mirrors (--package-mirror), the checks a package list
// passes before corral accepts it, the content key a build is cached by,
// and the steps a host runs in its build sandbox (hostagent's BuildImage).
// It is pure: the fleet runs builds (controlplane/fleet/build.go), the
// store records them.
//
// An environment's packages are installed once per content: the key is
// the SHA-256 of the tenant, the base image, the package lists and the
// mirrors they come from. Sessions created while an environment has those
// packages run the image that build made; an update that changes them
// makes a new key, and so a new build, for new sessions only.
//
//	environment create/update ─▶ build row (pending) ─▶ leader's builder
//	session create: pins the key        │                  │ BuildImage on a gVisor host
//	tool call: waits for ready ◀────────┴── ready/failed ◀─┘ (steps from Plan; egress: mirrors only)
package envbuild
