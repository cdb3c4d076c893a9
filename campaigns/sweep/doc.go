// Package sweep is the nightly slow-node sweep: a resumable campaign that
// finds nodes, and leaf-to-leaf paths, whose NCCL all_reduce bus bandwidth
// is more than a threshold (default 30 %) below baseline, and says which
// side is at fault. See README.md for the design and the figures.
//
// Rounds (a round is one batch of tests that run at the same time; a
// repeat wave re-measures what was too close to call):
//
//  1. intra-node: every selected node runs single-node all_reduce, judged
//     against its baseline (node scope, SKU fallback). Slow twice:
//     gpu-side. Slow once, fine on repeat: transient.
//  2. inter-node: nodes that passed (or had no single-node baseline) run
//     2-node all_reduce in disjoint pairs within their SKU. With leaf
//     labels the pairs cross leaf switches, spread over as many
//     leaf-to-leaf paths as there are pairs, so uplinks are exercised.
//  3. localisation: each member of a slow pair runs again with a
//     reference (a node that passed) on its own leaf, so the test crosses
//     no leaf-to-leaf path; at the same time two references run across the
//     slow pair's path. A member slow again is network-side; a slow probe
//     with both members fine is a link; nothing slow again is transient.
//     Nodes left without a round-2 result run against a reference too.
//
// Isolated faults are decided within these three rounds plus repeats,
// whatever the fleet size. Every transition (a wave planned, a test
// started, a test finished, a drain asked for) is written to the Store
// before it is acted on, and planning and verdicts are functions of what
// is stored: Engine.Run on an interrupted sweep continues it, re-runs only
// tests that were started and not finished, and never a finished one.
//
// Wiring: the coordinator implements kit.Fleet and calls New with the
// kit.Deps every campaign engine takes (its database: the engine opens an
// SQLStore on it; optionally a drain.Adapter and a kit.Breaker) and
// Options with a BaselineSource (FinderSource over its baselines store), calls Resume at start, Sweep (or Start then Run) from
// the CLI and its schedule, and Status, Report and List for the CLI.
package sweep
