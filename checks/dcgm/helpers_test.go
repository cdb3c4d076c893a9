package dcgm

import (
	"math"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// runCheck goes through checks.Run so source gating, defaults and sorting
// are exercised as in production.
func runCheck(t *testing.T, c checks.Check, s *snapshot.Snapshot, cfg *config.Config) report.CheckResult {
	t.Helper()
	out := checks.Run([]checks.Check{c}, checks.Input{Snap: s, Config: cfg})
	if len(out) != 1 {
		t.Fatalf("%d results", len(out))
	}
	r := out[0]
	for k, v := range r.Metrics {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("metric %s = %v", k, v)
		}
		if k != strings.ToLower(k) {
			t.Errorf("metric %s not lowercase", k)
		}
	}
	for _, f := range r.Findings {
		if f.Component == "" || f.Code == "" || f.Message == "" || f.Action == "" {
			t.Errorf("incomplete finding %+v", f)
		}
		if f.Code != strings.ToUpper(f.Code) {
			t.Errorf("code %q not upper-snake", f.Code)
		}
	}
	return r
}
