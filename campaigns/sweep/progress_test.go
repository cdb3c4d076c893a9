package sweep

import "testing"

// TestProgressRound: a running sweep shows the round it is in; a finished
// one the last round it ran (it showed ROUND 0 in `sweep status`).
func TestProgressRound(t *testing.T) {
	t.Parallel()
	single := func(p Phase) TestRecord { return TestRecord{Phase: p, Nodes: []string{"gpu-001"}, State: TestDone} }
	pair := func(p Phase) TestRecord {
		return TestRecord{Phase: p, Nodes: []string{"gpu-001", "gpu-002"}, State: TestDone}
	}
	for _, tc := range []struct {
		name  string
		phase Phase
		tests []TestRecord
		want  int
	}{
		{"running round 2", PhaseInter, []TestRecord{single(PhaseIntra), pair(PhaseInter)}, 2},
		{"done after round 2", PhaseDone, []TestRecord{single(PhaseIntra), pair(PhaseInter)}, 2},
		{"done after localising", PhaseDone, []TestRecord{single(PhaseIntra), pair(PhaseInter), pair(PhaseLocalise)}, 3},
		{"done with no test", PhaseDone, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &Record{ID: "sweep-1", State: StateRunning, Phase: tc.phase}
			if tc.phase == PhaseDone {
				rec.State = StateDone
			}
			if got := progressOf(rec, tc.tests).Round; got != tc.want {
				t.Errorf("round %d, want %d", got, tc.want)
			}
		})
	}
}
