package burnin

import (
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// State is a campaign's state.
type State string

// Campaign states.
const (
	StateRunning   State = "running"
	StateDone      State = "done"
	StateCancelled State = "cancelled"
)

// Phase is where a running campaign is.
type Phase string

// Phases, in order. Single-node steps run per node as soon as the node is
// drained; pair rounds wait for every node's single-node steps (both
// members of a pair must be free); verdicts wait for everything, because
// peers are compared with each other.
const (
	PhaseNodes    Phase = "nodes"    // drain, then single-node steps
	PhasePairs    Phase = "pairs"    // multi-node rounds
	PhaseEvaluate Phase = "evaluate" // verdicts
	PhaseFinish   Phase = "finish"   // baselines, undrain accepted nodes
	PhaseDone     Phase = "done"
)

// NodeState is one node's place in the campaign.
type NodeState string

// Node states. A node is written "draining" before the adapter is
// called, and each run "running" before the agent is asked.
const (
	NodePending   NodeState = "pending"
	NodeDraining  NodeState = "draining"
	NodeTesting   NodeState = "testing"
	NodeTested    NodeState = "tested"
	NodeFinishing NodeState = "finishing" // verdict written; baselines and undrain left
	NodeDone      NodeState = "done"
)

// Verdict is a node's outcome.
type Verdict string

// Verdicts. Every node ends with one of the two; inconclusive evidence
// rejects (it never passes).
const (
	Accepted Verdict = "accepted"
	Rejected Verdict = "rejected"
)

// Reason codes, stable for tooling.
const (
	ReasonCheckFailed   = "check_failed"   // a check failed (or warned, with reject_on: warn)
	ReasonActionFailed  = "action_failed"  // an agent action (stress, bandwidth test) failed
	ReasonInconclusive  = "inconclusive"   // error, skip where data was expected, missing number or baseline
	ReasonBelowFloor    = "below_floor"    // beyond the metric's absolute floor
	ReasonBelowBaseline = "below_baseline" // more than max_deviation short of the SKU baseline
	ReasonPeerOutlier   = "peer_outlier"   // an outlier among identical nodes in this campaign
	ReasonPairSlow      = "pair_slow"      // slow with every partner in the 2-node runs
	ReasonNotDrained    = "not_drained"    // could not be taken out of service
	ReasonRepeat        = "repeat_offender"
)

// Reason is one cause of a rejection.
type Reason struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Step    string `json:"step,omitempty"`
	Check   string `json:"check,omitempty"`
	Metric  string `json:"metric,omitempty"`
	// Component names the part when one is to blame (GPU3, mlx5_4/1).
	Component string `json:"component,omitempty"`
}

// Outcome of one run, beyond its report's status.
const (
	OutcomeOK          = "ok"
	OutcomeUnreachable = "unreachable"
	OutcomeRefused     = "refused"
	OutcomeTimeout     = "timeout"
	OutcomeError       = "error"
)

// Sample is one poll of the sample checks while an action ran.
type Sample struct {
	At      time.Time          `json:"at"`
	Status  report.Status      `json:"status,omitempty"`
	Metrics map[string]float64 `json:"metrics,omitempty"`
	// Findings of the sampled checks, when they found something.
	Findings []report.Finding `json:"findings,omitempty"`
	Error    string           `json:"error,omitempty"`
}

// RunResult is what one run brought back.
type RunResult struct {
	Report *report.Report    `json:"report,omitempty"`
	Action *kit.ActionResult `json:"action,omitempty"`
	// Metrics are the compared numbers this run measured.
	Metrics map[string]float64 `json:"metrics,omitempty"`
	Samples []Sample           `json:"samples,omitempty"`
}

// Run is one unit of work: one step on one node (or one pair) in one
// repeat.
type Run struct {
	Seq    int      `json:"seq"`
	Node   string   `json:"node"`            // the node, or a pair's launcher
	Peers  []string `json:"peers,omitempty"` // a pair's other node
	Repeat int      `json:"repeat"`          // from 1
	Step   string   `json:"step"`
	Kind   StepKind `json:"kind"`
	Round  int      `json:"round,omitempty"` // pairs: from 1
	State  string   `json:"state"`           // pending, running, done
	// Attempts counts starts: more than one means a restart re-ran it.
	Attempts   int           `json:"attempts"`
	Status     report.Status `json:"status,omitempty"`
	Outcome    string        `json:"outcome,omitempty"`
	Error      string        `json:"error,omitempty"`
	StartedAt  time.Time     `json:"started_at,omitzero"`
	FinishedAt time.Time     `json:"finished_at,omitzero"`
	Result     RunResult     `json:"result"`
}

// Members lists the nodes a run touched.
func (r Run) Members() []string { return append([]string{r.Node}, r.Peers...) }

// Run states.
const (
	RunPending = "pending"
	RunRunning = "running"
	RunDone    = "done"
)

// Number is one compared metric on one node: its value against the SKU
// baseline and against the campaign's median of identical nodes.
type Number struct {
	Metric string `json:"metric"`
	// Pair names the 2-node run a pair number comes from ("a+b round 1
	// repeat 1"); empty for a node's own number.
	Pair      string    `json:"pair,omitempty"`
	Direction string    `json:"direction"`
	Value     float64   `json:"value"`
	Samples   []float64 `json:"samples"` // one per repeat (or per pair run)
	// Baseline is the SKU baseline's value, 0 when there is none.
	Baseline        float64 `json:"baseline,omitempty"`
	BaselineScope   string  `json:"baseline_scope,omitempty"`
	BaselineVersion int     `json:"baseline_version,omitempty"`
	// Deviation is the shortfall from the baseline as a fraction.
	Deviation float64 `json:"deviation"`
	// BaselineVerdict: pass, fail or inconclusive.
	BaselineVerdict string `json:"baseline_verdict"`
	BaselineNote    string `json:"baseline_note,omitempty"`
	// CampaignMedian and MAD are over this SKU's nodes in the campaign;
	// Peers counts them. MedianShortfall is this value's shortfall from
	// the median as a fraction.
	CampaignMedian  float64 `json:"campaign_median,omitempty"`
	MAD             float64 `json:"mad,omitempty"`
	Peers           int     `json:"peers"`
	MedianShortfall float64 `json:"median_shortfall"`
	Outlier         bool    `json:"outlier"`
	BelowFloor      bool    `json:"below_floor,omitempty"`
}

// Part is a GPU or HCA seen on a node, by its identity.
type Part struct {
	Kind      string `json:"kind"`      // gpu, hca
	Component string `json:"component"` // GPU3, mlx5_4
	// Identity is the serial when the inventory has one; IdentityKind
	// says what it is (serial, uuid, slot: see docs/burnin.md).
	Identity     string `json:"identity"`
	IdentityKind string `json:"identity_kind"`
	Model        string `json:"model,omitempty"`
	Firmware     string `json:"firmware,omitempty"`
	PCIBusID     string `json:"pci_bus_id,omitempty"`
	// Implicated: a finding behind the rejection names this part; an
	// inconclusive step or a reason about no part implicates none.
	Implicated bool `json:"implicated,omitempty"`
}

// Offence is an earlier rejection of a part seen again.
type Offence struct {
	Part         Part      `json:"part"`
	Campaign     string    `json:"campaign"`
	Node         string    `json:"node"`
	Component    string    `json:"component"`
	At           time.Time `json:"at"`
	Reason       string    `json:"reason"`
	IdentityKind string    `json:"identity_kind"`
}

// Evidence is everything behind one node's verdict.
type Evidence struct {
	Reasons []Reason `json:"reasons"`
	Numbers []Number `json:"numbers"`
	Parts   []Part   `json:"parts"`
	// RepeatOffenders are parts rejected in an earlier campaign.
	RepeatOffenders []Offence `json:"repeat_offenders,omitempty"`
	// Notes say what weakened a comparison (another stack, too few peers).
	Notes []string `json:"notes,omitempty"`
}
