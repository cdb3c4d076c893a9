// Package baselines keeps stored reference values for metrics and judges
// measurements against them: the "more than 30 % below its baseline" rule
// that finds slow nodes. It compares numbers and stores them; it knows
// nothing of checks, agents or transport.
//
// # Keys
//
// A baseline is keyed by metric, scope and stack (Key). Versions of one
// key are kept: setting a new value adds a version, and the latest one
// counts.
//
//   - Metric: a report metric name. Single-node all_reduce_perf bus
//     bandwidth at the largest message size is nccl.allreduce.busbw_gbps,
//     what the nccl.allreduce check reports. A 2-node all_reduce (16 ranks
//     on two 8-GPU nodes) is nccl.allreduce2.busbw_gbps, under a link:
//     scope for one pair and a sku: scope for the fleet's figure. The
//     2-node metric has its own name rather than sharing the 1-node one,
//     because a sku: scope holds both figures and the name is what tells
//     them apart; the scope says whose figure it is, the name what was
//     measured, in every scope alike.
//   - Scope: node:NAME, sku:SKU (GPU model, memory, count, intra-node and
//     RDMA interconnect; see SKUFromInventory) or link:A|B (a pair of
//     nodes, names sorted).
//   - Stack: driver, NCCL and RDMA stack versions; empty fields are
//     unknown. Baselines from a stack that differs in a known field are
//     used only when no baseline agrees with the measurement's stack, and
//     Compare then warns.
//
// # Comparing
//
// Deviation is the shortfall in the bad direction as a fraction of the
// baseline: (baseline − measured) / baseline when higher is better,
// (measured − baseline) / baseline when lower is better; negative means
// better. Above the threshold (DefaultThreshold 0.30, or the baseline's
// own, or the caller's) the verdict is Fail; exactly at it, Pass (a 1e-9
// tolerance absorbs float rounding). No baseline, a baseline without
// samples or with a value that is not a positive number, or a measurement
// that is NaN, infinite or negative is Inconclusive, never Pass.
//
// The spread of a baseline's samples is their median absolute deviation
// (MAD). A deviation within NoiseSigmas robust standard deviations
// (1.4826 × MAD / median, at least DefaultMinNoise) of the threshold is
// NearThreshold: the verdict could flip on a repeat, so measure again.
//
// # Resolving
//
// Resolve looks for a measurement's baseline at the node, then its SKU,
// then its SKU without the network part (SKUBase: single-node figures do
// not depend on the network). A baseline under the measurement's stack at
// any of these wins; one from another stack is taken only when none
// agrees. ResolveLink does the same for a pair: link, then SKU.
//
// # Storage
//
// Store keeps baselines in SQLite tables of its own (baselines, and
// baselines_schema_version), created with CREATE TABLE IF NOT EXISTS in a
// database its owner opened, so it sits beside the owner's own migrations.
//
// # File format
//
// Export and Import use readable YAML, so SKU baselines can live in a
// repository (and the shipped references under reference/ are in it):
//
//	format: 1
//	baselines:
//	  - metric: nccl.allreduce.busbw_gbps     # required
//	    scope: node:gpu-017                   # required
//	    stack: {driver: 550.54.15, nccl: 2.21.5, rdma_stack: MLNX_OFED 23.10-1.1.9.0}
//	    direction: higher                     # default: from the metric's unit
//	    value: 478.2                          # the samples' median; default: that median
//	    threshold: 0.25                       # 0 or absent: 0.30
//	    samples:                              # absent: one sample, value
//	      count: 5                            # > len(values) needs median, mad, min, max
//	      median: 478.2
//	      mad: 1.1
//	      min: 470.1
//	      max: 481
//	      values: [470.1, 477, 478.2, 479.9, 481]
//	    version: 3                            # written by Export; only orders one key's entries
//	    taken_at: 2026-01-02T03:04:05Z        # or a date; absent: import time
//	    who: alice                            # absent: the importer
//	    from_run: run-20260102-0304
//	    note: acceptance run after the NVLink tray swap
//
// Import rejects unknown fields, merge keys, a second YAML document and
// the same key twice (unless each copy has its own version), and names
// every bad entry by position, line, metric and scope. Importing an entry equal to its key's latest
// version (value, direction, threshold, samples) stores nothing.
package baselines
