// Package e2e runs the real fleetcheck binary as separate processes — a
// coordinator and agents on simulated nodes (`host: {mode: sim}`), mutual
// TLS on 127.0.0.1 with certificates from `fleetcheck certs` — drives every
// campaign through the CLI, and kills the coordinator (SIGKILL, restarted
// on the same data directory and port) and agents in the middle of each.
// After each campaign it checks what must hold across those kills: the
// campaign completes or stops with a stated reason, no node is skipped
// while its agent reconnects, no node is upgraded twice, and every result
// an agent saw acknowledged is stored exactly once.
//
// The tests sit behind the e2e build tag so that `go test ./...` stays
// fast: `make e2e` runs the full suite, `make e2e-short` (-short) the part
// CI runs, in about three minutes on two cores.
//
// chaos_test.go (build tags e2e and chaos: make chaos, make chaos-short) is
// the HA suite: three coordinators over one PostgreSQL and 16 agents listing
// them all, campaigns under a seeded schedule of kill -9, SIGSTOP and
// database restarts (docs/ha.md, The chaos suite).
package e2e
