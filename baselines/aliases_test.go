package baselines

import "testing"

// TestRenamedMetricFindsOldBaseline: a baseline stored under a metric's
// name from before the unit-suffix renames (gpu3.nvlink.speed_gbytes_per_sec)
// is found when the check now reports gpu3.nvlink.speed_gbps; a baseline
// under the new name wins.
func TestRenamedMetricFindsOldBaseline(t *testing.T) {
	t.Parallel()
	old := at("gpu3.nvlink.speed_gbytes_per_sec", NodeScope("n"), Stack{}, 477, 1)
	res, err := Resolve(t.Context(), Static{old}, "gpu3.nvlink.speed_gbps", "n", "", Stack{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Baseline == nil || res.Baseline.Value != 477 {
		t.Fatalf("old-name baseline not found: %+v", res)
	}
	cur := at("gpu3.nvlink.speed_gbps", NodeScope("n"), Stack{}, 480, 1)
	res, err = Resolve(t.Context(), Static{old, cur}, "gpu3.nvlink.speed_gbps", "n", "", Stack{})
	if err != nil || res.Baseline == nil || res.Baseline.Value != 480 {
		t.Fatalf("new-name baseline should win: %+v %v", res, err)
	}
	for metric, want := range map[string]string{
		"xid.event_count":           "xid.events",
		"gpu12.pcie.width_lanes":    "gpu12.pcie.width",
		"gpu0.process_count":        "gpu0.processes",
		"nccl.allreduce.busbw_gbps": "",
		"gpux.pcie.width_lanes":     "",
	} {
		got := OldMetricNames(metric)
		if (want == "") != (len(got) == 0) || (want != "" && got[0] != want) {
			t.Errorf("OldMetricNames(%s) = %v, want %q", metric, got, want)
		}
	}
}
