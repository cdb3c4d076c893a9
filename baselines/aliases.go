package baselines

// metricAliases maps a report metric's current name to the names it had
// before (issue 10 put the unit in every metric's last word), so that a
// baseline stored under an old name is still found under the new one.
// Values are unchanged by the renames; only the names moved.
var metricAliases = map[string][]string{
	"dcgm.tests_failed_count":    {"dcgm.tests_failed"},
	"dcgm.tests_passed_count":    {"dcgm.tests_passed"},
	"dcgm.tests_warned_count":    {"dcgm.tests_warned"},
	"dcgm.tests_skipped_count":   {"dcgm.tests_skipped"},
	"fabric.gpu_count":           {"fabric.gpus"},
	"fabric.ready_gpu_count":     {"fabric.ready_gpus"},
	"nvlink.active_link_count":   {"nvlink.active_links"},
	"nvlink.inactive_link_count": {"nvlink.inactive_links"},
	"sxid.event_count":           {"sxid.events"},
	"sxid.fatal_event_count":     {"sxid.fatal_events"},
	"sxid.new_event_count":       {"sxid.new_events"},
	"xid.event_count":            {"xid.events"},
	"xid.new_event_count":        {"xid.new_events"},
	"xid.fell_off_bus_count":     {"xid.fell_off_bus_events"},
	"xid.ignored_count":          {"xid.ignored_events"},
	"xid.before_reset_count":     {"xid.before_reset_events"},
	"xid.outside_lookback_count": {"xid.outside_lookback_events"},
	"xid.dropped_count":          {"xid.dropped_events"},
	"gpu.peermem.loaded_flag":    {"gpu.peermem.loaded_count"},
}

// perGPUAliases are the same for gpu<i>.<rest> metrics.
var perGPUAliases = map[string]string{
	"nvlink.speed_gbps":                 "nvlink.speed_gbytes_per_sec",
	"nvlink.active_link_count":          "nvlink.active_links",
	"nvlink.inactive_link_count":        "nvlink.inactive_links",
	"pcie.link_gen":                     "pcie.gen",
	"pcie.width_lanes":                  "pcie.width",
	"pcie.replay_count":                 "pcie.replays",
	"process_count":                     "processes",
	"ecc.volatile_uncorrectable_count":  "ecc.volatile_uncorrectable",
	"ecc.volatile_correctable_count":    "ecc.volatile_correctable",
	"ecc.aggregate_uncorrectable_count": "ecc.aggregate_uncorrectable",
	"ecc.aggregate_correctable_count":   "ecc.aggregate_correctable",
	"remapped_rows.correctable_count":   "remapped_rows.correctable",
	"remapped_rows.uncorrectable_count": "remapped_rows.uncorrectable",
	"remapped_rows.pending_flag":        "remapped_rows.pending",
	"remapped_rows.failure_flag":        "remapped_rows.failure",
	"retired_pages.single_bit_count":    "retired_pages.single_bit",
	"retired_pages.double_bit_count":    "retired_pages.double_bit",
}

// OldMetricNames lists the names metric had before a rename, newest
// first; nil when it was never renamed.
func OldMetricNames(metric string) []string {
	if old, ok := metricAliases[metric]; ok {
		return old
	}
	// gpu<i>.<rest>
	if len(metric) > 4 && metric[:3] == "gpu" {
		i := 3
		for i < len(metric) && metric[i] >= '0' && metric[i] <= '9' {
			i++
		}
		if i > 3 && i < len(metric) && metric[i] == '.' {
			if old, ok := perGPUAliases[metric[i+1:]]; ok {
				return []string{metric[:i+1] + old}
			}
		}
	}
	return nil
}
