// Package ib holds the ib.* checks, which judge a node's RDMA fabric
// side: ib.ports (port state and rate) and ib.counters (error counters and
// their rise between runs).
//
// Metric names follow the report contract: dotted, lowercase, unit in the
// last word. Per-port metrics are "ib.<hca>.port<n>.<what>_<unit>", e.g.
// ib.mlx5_0.port1.rate_gbps, because the finding component "mlx5_0/1" is
// not dotted-friendly. HCA names are lowercased and anything outside
// [a-z0-9_] becomes "_".
package ib

import (
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
)

// Finding codes. They are stable: dashboards and drain reasons key on them.
const (
	CodePortDown          = "IB_PORT_DOWN"
	CodePortLogicalDown   = "IB_PORT_LOGICAL_DOWN"
	CodePortStateUnknown  = "IB_PORT_STATE_UNKNOWN"
	CodeRateLow           = "IB_RATE_LOW"
	CodeRateUnknown       = "IB_RATE_UNKNOWN"
	CodeRateBelowSiblings = "IB_RATE_BELOW_SIBLINGS"
	CodePortsMissing      = "IB_PORTS_MISSING"
	CodeSysfsUnreadable   = "IB_SYSFS_UNREADABLE"
	CodeCounterRising     = "IB_COUNTER_RISING"
	CodeCounterTotal      = "IB_COUNTER_TOTAL"
	CodeCounterUnreadable = "IB_COUNTER_UNREADABLE"
)

const (
	linkLayerInfiniBand = "InfiniBand"
	stateActive         = "ACTIVE"
	physLinkUp          = "LinkUp"
	// hwPrefix marks hw_counters names in limits and in checks.State.
	hwPrefix = "hw."
	// maxErrorFindingsPerHCA keeps one broken adapter from flooding a report.
	maxErrorFindingsPerHCA = 5
)

// conf returns the input's config, or the defaults when there is none.
func conf(in checks.Input) *config.Config {
	if in.Config != nil {
		return in.Config
	}
	return config.Defaults()
}

// portMetric names a per-port metric: ib.<hca>.port<n>.<what>.
func portMetric(hca string, port int, what string) string {
	return "ib." + metricWord(hca) + ".port" + strconv.Itoa(port) + "." + what
}

// metricWord lowercases s and replaces anything outside [a-z0-9_] with "_".
func metricWord(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}
