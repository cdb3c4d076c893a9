package agent

import (
	"os"
	"slices"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/checks/registry"
)

// exampleAgent is examples/agent.yaml, loaded as the agent loads it.
func exampleAgent(t *testing.T) *Config {
	t.Helper()
	c, err := LoadConfig("../examples/agent.yaml")
	if err != nil {
		t.Fatalf("examples/agent.yaml: %v", err)
	}
	return c
}

// admitter answers what the agent of a config would refuse in a request,
// with the checks the agent itself makes: the same functions, not a copy.
type admitter struct {
	t   *testing.T
	cfg *Config
}

func (a admitter) enabled(check string) bool {
	for _, k := range a.cfg.enabledChecks(registry.All()) {
		if k.Name() == check {
			return true
		}
	}
	return false
}

// checks fails for a requested run the agent would refuse or cut short.
func (a admitter) checks(what string, names []string, params map[string]string, timeout time.Duration) {
	a.t.Helper()
	for _, n := range names {
		if !a.enabled(n) {
			a.t.Errorf("%s: check %q is not in the example agent's enabled_checks", what, n)
		}
	}
	if why := admitParams(params, names); why != "" {
		a.t.Errorf("%s: the example agent refuses the parameters: %s", what, why)
	}
	if max := time.Duration(a.cfg.Work.MaxTimeout); timeout > max {
		a.t.Errorf("%s: asks for %s, the example agent's work.max_timeout %s cuts it short", what, timeout, max)
	}
}

// action fails for an action request the agent would refuse or cut short.
func (a admitter) action(what, name string, params map[string]string, timeout time.Duration) ActionConfig {
	a.t.Helper()
	ac, ok := a.cfg.Actions[name]
	if !ok {
		a.t.Errorf("%s: action %q is not in the example agent's actions", what, name)
		return ac
	}
	if err := ac.checkParams(params); err != nil {
		a.t.Errorf("%s: the example agent refuses action %s: %v", what, name, err)
	}
	if timeout > ac.timeout() {
		a.t.Errorf("%s: asks for %s, action %s's timeout %s cuts it short", what, timeout, name, ac.timeout())
	}
	if ac.Disruptive && !slices.Contains(a.cfg.DisruptiveAllowedWhen, ActivityDrained) {
		a.t.Errorf("%s: action %s is disruptive and the example agent never runs one on a drained node", what, name)
	}
	return ac
}

// TestExampleAgentServesBurnin runs every step of every built-in burn-in
// level (at the default stress and at examples/burnin.yaml's) past the
// example agent's own admission: each check enabled, each action
// configured, each parameter accepted, no timeout cut.
func TestExampleAgentServesBurnin(t *testing.T) {
	t.Parallel()
	a := admitter{t, exampleAgent(t)}
	b, err := os.ReadFile("../examples/burnin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := burnin.ParseSpec(b)
	if err != nil {
		t.Fatalf("examples/burnin.yaml: %v", err)
	}
	suites := []burnin.Suite{*ex.Suite}
	for _, l := range []burnin.Level{burnin.Quick, burnin.Standard, burnin.Extended} {
		suites = append(suites, burnin.DefaultSuite(l, 0))
	}
	actions := 0
	for _, su := range suites {
		for _, st := range su.Steps {
			what := su.Name + "/" + st.Name
			switch st.Kind {
			case burnin.StepChecks:
				a.checks(what, st.Checks, st.Params, time.Duration(st.Timeout))
			case burnin.StepAction:
				actions++
				a.action(what, st.Action, st.Params, time.Duration(st.Timeout))
			case burnin.StepPairs:
				if a.cfg.MultiNode == nil {
					t.Errorf("%s: the example agent has no multi_node section", what)
				}
				if !a.enabled("nccl.allreduce") {
					t.Errorf("%s: nccl.allreduce is not enabled", what)
				}
				// admitMulti's rule: the launcher command fixes the sizes.
				if len(st.Params) > 0 {
					t.Errorf("%s: sends parameters %v; every agent refuses them in a multi-node run", what, st.Params)
				}
			default:
				t.Errorf("%s: step kind %q this test does not know", what, st.Kind)
			}
			if len(st.SampleChecks) > 0 {
				a.checks(what+" (samples)", st.SampleChecks, nil, time.Duration(st.SampleEvery))
			}
		}
	}
	if actions < 3 {
		t.Errorf("only %d action steps in the built-in levels: the test lost its subject?", actions)
	}
}

// TestExampleAgentServesDrill: examples/drill.yaml's fault and revert are
// configured as a pair, both take its parameters, and what it watches is
// enabled.
func TestExampleAgentServesDrill(t *testing.T) {
	t.Parallel()
	a := admitter{t, exampleAgent(t)}
	b, err := os.ReadFile("../examples/drill.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d, err := drill.ParseSpec(b)
	if err != nil {
		t.Fatalf("examples/drill.yaml: %v", err)
	}
	fault := a.action("drill fault", d.Fault, d.Params, 0)
	if fault.Revert != d.Revert {
		t.Errorf("the agent reverts %s with %q, the drill with %q", d.Fault, fault.Revert, d.Revert)
	}
	if fault.Revert != "" && fault.RevertAfterDefault == 0 {
		t.Logf("%s: no revert_after_default; the drill's revert_after applies", d.Fault)
	}
	rev := a.cfg.Actions[d.Revert]
	a.action("drill revert", d.Revert, rev.only(d.Params), 0)
	a.checks("drill watch", append([]string{d.Expect.Check}, d.Watch...), nil, time.Duration(d.PollInterval))
}

// TestExampleAgentServesDrillKinds: every built-in drill fault kind, with
// its default parameters, is configured with its revert, and what detects
// it is enabled.
func TestExampleAgentServesDrillKinds(t *testing.T) {
	t.Parallel()
	a := admitter{t, exampleAgent(t)}
	for kind, f := range drill.Catalog() {
		fault := a.action("drill "+kind, kind, f.Params, 0)
		if fault.Revert != f.Revert {
			t.Errorf("%s: reverted by %q in the example agent, by %q in the drill catalog", kind, fault.Revert, f.Revert)
		}
		if fault.RevertAfterDefault == 0 {
			t.Errorf("%s: no revert_after_default: a drill that names none is refused", kind)
		}
		rev := a.cfg.Actions[f.Revert]
		a.action("drill "+kind+" revert", f.Revert, rev.only(f.Params), 0)
		a.checks("drill "+kind+" detection", []string{f.Check}, nil, 0)
	}
}

// TestExampleAgentServesRollout: examples/rollout.yaml's upgrade and
// rollback actions take the versions it sends, and its validation checks
// are enabled.
func TestExampleAgentServesRollout(t *testing.T) {
	t.Parallel()
	a := admitter{t, exampleAgent(t)}
	s, err := rollout.LoadSpec("../examples/rollout.yaml")
	if err != nil {
		t.Fatalf("examples/rollout.yaml: %v", err)
	}
	params := map[string]string{"version": s.Target.Driver}
	if fm := s.Target.FabricManager; fm != "" && fm != "same" {
		params["fabric_manager"] = fm
	}
	if s.Target.Firmware.VBIOS != "" {
		params["vbios"] = s.Target.Firmware.VBIOS
	}
	a.action("rollout upgrade", s.Action, params, s.Deadlines.Upgrading.D())
	// A rollback sends the node's previous driver: the one the sim fleet
	// and the example matrix pin.
	a.action("rollout rollback", s.RollbackAction, map[string]string{"version": "535.161.08"}, s.Deadlines.Upgrading.D())
	a.checks("rollout validation", s.Validation.Checks, nil, s.Deadlines.Validating.D())
}

// TestExampleAgentServesRemediation: every action the remediation ladder
// asks for, by the defaults' names and by examples/coordinator.yaml's,
// is configured with the parameters the engine sends (a disruptive one
// allowed on a drained node), and the verification's checks are enabled.
func TestExampleAgentServesRemediation(t *testing.T) {
	t.Parallel()
	a := admitter{t, exampleAgent(t)}
	b, err := os.ReadFile("../examples/coordinator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var coord struct {
		Remediation remediation.Config `yaml:"remediation"`
	}
	if err := yaml.Unmarshal(b, &coord); err != nil {
		t.Fatalf("examples/coordinator.yaml: %v", err)
	}
	for what, cfg := range map[string]remediation.Config{"defaults": {}, "examples/coordinator.yaml": coord.Remediation} {
		cfg = cfg.WithDefaults()
		for _, s := range []struct{ step, component string }{
			{remediation.StepResetGPU, "GPU7"},
			{remediation.StepResetIBPort, "mlx5_3/1"},
			{remediation.StepReboot, "node"},
			{remediation.ActionCollect, "node"},
		} {
			name, params := cfg.Action(s.step, s.component)
			if name == "" {
				t.Errorf("%s: no action for %s", what, s.step)
				continue
			}
			// The agent's own timeout for the action bounds it; the
			// engine's action_timeout only bounds its wait.
			ac := a.action(what+" "+s.step, name, params, 0)
			if want := s.step != remediation.ActionCollect; ac.Disruptive != want {
				t.Errorf("%s: action %s disruptive %v, want %v", what, name, ac.Disruptive, want)
			}
		}
		a.checks(what+" verify", append(cfg.VerifyChecks, cfg.VerifyAllReduce), nil, 0)
	}
}
