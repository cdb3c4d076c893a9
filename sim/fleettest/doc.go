// Package fleettest holds the fleet's integration tests: a real
// coordinator and real agents on simulated nodes, in one process, talking
// gRPC over 127.0.0.1. They prove the promises the pieces make together —
// nothing acknowledged is lost across a coordinator restart, nothing is
// stored twice, a dead agent is marked unreachable and returns to its state,
// a cut connection costs no result, a fleet-wide check reports every node.
//
// The package has no non-test code; `go test ./sim/fleettest/` runs it.
package fleettest
