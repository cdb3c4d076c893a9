package agent

import (
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/config"
)

var outOfRangeRE = regexp.MustCompile(`(\S+) (\S+) is out of range: must be within (\S+)`)

// TestAgentConfigRanges holds every numeric key of the agent's own
// sections to the range docs/config.md's Ranges table gives (the checks:
// section is config's TestNodeConfigRanges; host: is checked by its own
// section, below).
func TestAgentConfigRanges(t *testing.T) {
	t.Parallel()
	const base = "node: gpu-001\ncoordinator: 127.0.0.1:7443\ninsecure: true\n"
	const act = "actions: {fault: {command: [/bin/true], revert: undo}, undo: {command: [/bin/true]}, a: {command: [/bin/true], "
	const multi = "multi_node: {launcher_command: [mpirun, -H, '{hosts}'], allowed_peers: 'gpu-[0-9]+', "
	cases := []struct{ doc, yaml string }{
		{"coordinators", "coordinators: [" + manyCoordinators(17) + "]"},
		{"interval", "interval: 48h"},
		{"pass_timeout", "pass_timeout: 500ms"},
		{"work.default_timeout", "work: {default_timeout: 49h, max_timeout: 49h}"},
		{"work.max_timeout", "work: {max_timeout: 72h}"},
		{"work.max_concurrent", "work: {max_concurrent: 1000}"},
		{"spool.max_results", "spool: {max_results: 0}"},
		{"spool.max_bytes", "spool: {max_bytes: 1TiB}"},
		{"reconnect.initial", "reconnect: {initial: 1ms}"},
		{"reconnect.max", "reconnect: {max: 2h}"},
		{"reconnect.hello_timeout", "reconnect: {hello_timeout: 100ms}"},
		{"actions.*.timeout", act + "timeout: 200h}}"},
		{"actions.*.revert_after_default", "actions: {fault: {command: [/bin/true], revert: undo, revert_after_default: 100ms}, undo: {command: [/bin/true]}}"},
		{"actions.*.revert_after_max", "actions: {fault: {command: [/bin/true], revert: undo, revert_after_max: 9000h}, undo: {command: [/bin/true]}}"},
		{"multi_node.procs_per_node", multi + "procs_per_node: 1000}"},
		{"multi_node.slots_per_node", multi + "slots_per_node: -1}"},
		{"multi_node.max_nodes", multi + "max_nodes: 1}"},
		{"multi_node.timeout", multi + "timeout: 500ms}"},
		{"multi_node.min_busbw_gbps", multi + "min_busbw_gbps: -1}"},
		{"multi_node.baseline_gbps", multi + "baseline_gbps: .nan}"},
		{"gossip.rejoin_interval", "gossip: {bind: 127.0.0.1, rejoin_interval: 2h}"},
		{"gossip.probe_interval", "gossip: {bind: 127.0.0.1, probe_interval: 10ms}"},
		{"gossip.suspicion_mult", "gossip: {bind: 127.0.0.1, suspicion_mult: 1000}"},
	}
	doc, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.doc] = true
		_, err := ParseConfig([]byte(base + c.yaml + "\n"))
		if err == nil {
			t.Errorf("%s: %q accepted", c.doc, c.yaml)
			continue
		}
		key := strings.ReplaceAll(c.doc, ".*.", ".a.")
		if c.doc != "actions.*.timeout" {
			key = strings.ReplaceAll(c.doc, ".*.", ".fault.")
		}
		m := outOfRangeRE.FindStringSubmatch(err.Error())
		switch {
		case !errors.Is(err, ErrInvalid) || !errors.Is(err, config.ErrOutOfRange):
			t.Errorf("%s: %v does not wrap ErrInvalid and ErrOutOfRange", c.doc, err)
		case m == nil || m[1] != key:
			t.Errorf("%s: %q does not say key %s, value and range", c.doc, err, key)
		default:
			i := strings.Index(string(doc), "| `"+c.doc+"`")
			if i < 0 {
				t.Errorf("%s: no row in docs/config.md", c.doc)
				continue
			}
			if row, _, _ := strings.Cut(string(doc)[i:], "\n"); !strings.Contains(row, " "+m[3]) {
				t.Errorf("%s: the code's range is %s; docs/config.md says %q", c.doc, m[3], row)
			}
		}
	}
	for _, k := range config.NumericKeys(Config{}, "checks", "host") {
		if !covered[k] {
			t.Errorf("numeric key %s has no range case (and maybe no range)", k)
		}
	}
}

// manyCoordinators lists n distinct loopback addresses.
func manyCoordinators(n int) string {
	var out []string
	for i := range n {
		out = append(out, "127.0.0.1:"+strconv.Itoa(7000+i))
	}
	return strings.Join(out, ", ")
}
