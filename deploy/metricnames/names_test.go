package metricnames

import (
	"os"
	"sort"
	"strings"
	"testing"
)

// TestDocsListEveryMetric: docs/metrics.md names every fleetcheck_ metric
// an exporter describes, so a new series cannot ship undocumented.
func TestDocsListEveryMetric(t *testing.T) {
	t.Parallel()
	n, err := Exported()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for name := range n.Families {
		if strings.HasPrefix(name, "fleetcheck_") && !strings.Contains(string(doc), "`"+name+"`") {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/metrics.md does not list %v", missing)
	}
}

func TestKnown(t *testing.T) {
	t.Parallel()
	n, err := Exported()
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]bool{
		"fleetcheck_nodes":              true,
		"fleetcheck_node_state":         true,
		"fleetcheck_campaign_nodes":     true,
		"fleetcheck_build_info":         true,
		"up":                            true,
		"process_resident_memory_bytes": true,
		"fleetcheck_store_commit_duration_seconds_bucket": true,
		"fleetcheck_check_duration_seconds_count":         true,
		"fleetcheck_agent_pass_duration_seconds_sum":      true,
		"fleetcheck_nodes_bucket":                         false, // a gauge has no buckets
		"fleetcheck_node":                                 false,
		"fleetcheck_gpu_temperature":                      false,
	} {
		if got := n.Known(series); got != want {
			t.Errorf("Known(%s) = %v, want %v", series, got, want)
		}
	}
}
