package coordinator

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/config"
)

var outOfRangeRE = regexp.MustCompile(`(\S+) (\S+) is out of range: must be within (\S+)`)

// TestCoordinatorConfigRanges holds every numeric key of the coordinator
// config, the scheduled sweep's spec with it, to the range
// docs/coordinator-config.md gives.
func TestCoordinatorConfigRanges(t *testing.T) {
	t.Parallel()
	const base = "data_dir: /var/lib/fleetcheck\ninsecure: true\n"
	const sweep = "sweep_schedule: {cron: '0 2 * * *', spec: "
	cases := []struct{ doc, yaml string }{
		{"retention_days", "retention_days: 1000000000000"},
		{"heartbeat_interval", "heartbeat_interval: 1ms"},
		{"send_queue", "send_queue: 1000000000"},
		{"batch.max_results", "batch: {max_results: 100000}"},
		{"batch.delay", "batch: {delay: 10h}"},
		{"batch.writers", "batch: {writers: 17}"},
		{"breaker.window", "breaker: {window: 1s}"},
		{"breaker.max_share", "breaker: {max_share: 1.5}"},
		{"breaker.max_count", "breaker: {max_count: -1}"},
		{"drain.slurm.timeout", "drain: {slurm: {timeout: 1h}}"},
		{"drain.kubernetes.eviction_timeout", "drain: {kubernetes: {eviction_timeout: 1s}}"},
		{"console.refresh", "console: {refresh: 10ms}"},
		{"ha.lease_ttl", "ha: {lease_ttl: 1ms}"},
		{"console.page_size", "console: {page_size: 100000}"},
		{"gossip.rejoin_interval", "gossip: {bind: 127.0.0.1, rejoin_interval: 500ms}"},
		{"gossip.probe_interval", "gossip: {bind: 127.0.0.1, probe_interval: 2m}"},
		{"gossip.suspicion_mult", "gossip: {bind: 127.0.0.1, suspicion_mult: -1}"},
		{"remediation.recur_window", "remediation: {recur_window: 1m}"},
		{"remediation.tolerance", "remediation: {tolerance: 0.95}"},
		{"remediation.action_timeout", "remediation: {action_timeout: 1s}"},
		{"remediation.settle", "remediation: {settle: 2h}"},
		{"remediation.reboot_settle", "remediation: {reboot_settle: 3h}"},
		{"remediation.verify_timeout", "remediation: {verify_timeout: 48h}"},
		{"remediation.held_retry", "remediation: {held_retry: 1s}"},
		{"remediation.parallel", "remediation: {parallel: 257}"},
		{"remediation.rma.retries", "remediation: {rma: {retries: 101}}"},
		{"remediation.rma.backoff", "remediation: {rma: {backoff: 2h}}"},
		{"remediation.rma.timeout", "remediation: {rma: {timeout: 10m}}"},
		{"remediation.rules.xid[].code", "remediation: {rules: {xid: [{code: 5000}]}}"},
		{"remediation.rules.xid[].count", "remediation: {rules: {xid: [{code: 13, count: 5000}]}}"},
		{"remediation.rules.xid[].window", "remediation: {rules: {xid: [{code: 13, window: 1s}]}}"},
		{"remediation.rules.ecc_correctable.count", "remediation: {rules: {ecc_correctable: {count: -1}}}"},
		{"remediation.rules.ecc_correctable.window", "remediation: {rules: {ecc_correctable: {window: 1000h}}}"},
		{"remediation.rules.link_flaps.flaps", "remediation: {rules: {link_flaps: {flaps: 2000}}}"},
		{"remediation.rules.link_flaps.window", "remediation: {rules: {link_flaps: {window: 1s}}}"},
		{"remediation.rules.link_flaps.stable", "remediation: {rules: {link_flaps: {stable: 200h}}}"},
		{"remediation.rules.correlate.window", "remediation: {rules: {correlate: {window: 2h}}}"},
		{"remediation.rules.correlate.min_nodes", "remediation: {rules: {correlate: {min_nodes: 1}}}"},
		{"sweep_schedule.spec.threshold", sweep + "{threshold: 1.5}}"},
		{"sweep_schedule.spec.repeat.max_repeats", sweep + "{repeat: {max_repeats: 1000}}}"},
		{"sweep_schedule.spec.repeat.band", sweep + "{threshold: 0.9, repeat: {band: 0.6}}}"},
		{"sweep_schedule.spec.repeat.band_sigmas", sweep + "{repeat: {band_sigmas: .nan}}}"},
		{"sweep_schedule.spec.budget.max_share", sweep + "{budget: {max_share: 2}}}"},
		{"sweep_schedule.spec.budget.max_nodes", sweep + "{budget: {max_nodes: -1}}}"},
		{"sweep_schedule.spec.budget.max_gpu_hours", sweep + "{budget: {max_gpu_hours: 1e9}}}"},
		{"sweep_schedule.spec.budget.node_test_time", sweep + "{budget: {node_test_time: 48h}}}"},
		{"sweep_schedule.spec.budget.cover_within_nights", sweep + "{budget: {cover_within_nights: 1000}}}"},
		{"sweep_schedule.spec.concurrency", sweep + "{concurrency: -3}}"},
		{"sweep_schedule.spec.test_timeout", sweep + "{test_timeout: 100ms}}"},
		{"sweep_schedule.spec.connect_grace", sweep + "{connect_grace: 1s}}"},
	}
	doc, err := os.ReadFile("../docs/coordinator-config.md")
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{"sweep_schedule.spec.seed": true} // any value is a seed
	for _, c := range cases {
		covered[c.doc] = true
		_, err := ParseConfig([]byte(base + c.yaml + "\n"))
		if err == nil {
			t.Errorf("%s: %q accepted", c.doc, c.yaml)
			continue
		}
		key := strings.TrimPrefix(c.doc, "sweep_schedule.spec.")
		m := outOfRangeRE.FindStringSubmatch(err.Error())
		switch {
		case !errors.Is(err, config.ErrOutOfRange):
			t.Errorf("%s: %v does not wrap ErrOutOfRange", c.doc, err)
		case m == nil || m[1] != key:
			t.Errorf("%s: %q does not say key %s, value and range", c.doc, err, key)
		default:
			i := strings.Index(string(doc), "| `"+c.doc+"`")
			if i < 0 {
				t.Errorf("%s: no row in docs/coordinator-config.md", c.doc)
				continue
			}
			if row, _, _ := strings.Cut(string(doc)[i:], "\n"); !strings.Contains(row, " "+m[3]) {
				t.Errorf("%s: the code's range is %s; the doc says %q", c.doc, m[3], row)
			}
		}
	}
	for _, k := range config.NumericKeys(Config{}) {
		if !covered[k] {
			t.Errorf("numeric key %s has no range case (and maybe no range)", k)
		}
	}
}

// TestZeroTakesTheDefault: a 0 the config takes as the default is marked
// "or 0" in docs/coordinator-config.md, so an operator reading "1..36500"
// does not think retention_days: 0 is refused (or deletes everything).
func TestZeroTakesTheDefault(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/coordinator-config.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, zero string
		isDefault func(Config) bool
	}{
		{"retention_days", "0", func(c Config) bool { return c.RetentionDays == DefaultRetentionDays }},
		{"heartbeat_interval", "0s", func(c Config) bool { return c.HeartbeatInterval == DefaultHeartbeatInterval }},
		{"send_queue", "0", func(c Config) bool { return c.SendQueue == DefaultSendQueue }},
	} {
		cfg, err := ParseConfig([]byte("data_dir: /var/lib/fleetcheck\ninsecure: true\n" + c.key + ": " + c.zero + "\n"))
		if err != nil || !c.isDefault(cfg) {
			t.Errorf("%s: 0 gave %+v, %v; want the default", c.key, cfg, err)
		}
		i := strings.Index(string(doc), "| `"+c.key+"`")
		if row, _, _ := strings.Cut(string(doc)[max(i, 0):], "\n"); i < 0 || !strings.Contains(row, ", or 0 |") {
			t.Errorf("%s: 0 takes the default, but the doc's row does not say \"or 0\": %q", c.key, row)
		}
	}
}
