package drill

import (
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// State is a drill's state.
type State string

// Drill states.
const (
	StateRunning State = "running"
	StateDone    State = "done"    // every target recovered (findings may still say what went wrong)
	StateAborted State = "aborted" // a deadline or an unexpected state cut it short
	StateRefused State = "refused" // preflight refused it; nothing was touched
)

// TargetState is one target's place in the drill.
type TargetState string

// Target states, in order. A target is written "injecting" before the
// fault action is sent and "reverting" before the revert is: a restart
// finds it there and acts as if the action may have happened (a revert is
// always safe to send again).
const (
	TargetPending      TargetState = "pending"
	TargetPrechecking  TargetState = "prechecking"
	TargetInjecting    TargetState = "injecting"
	TargetWatching     TargetState = "watching"
	TargetOutOfService TargetState = "awaiting_out_of_service"
	TargetReverting    TargetState = "reverting"
	TargetRecovering   TargetState = "recovering"
	TargetDone         TargetState = "done"
)

// Finding codes of a drill, stable for tooling.
const (
	// FindingDetectionGap: no watched check detected the fault in time.
	FindingDetectionGap = "detection_gap"
	// FindingOtherCheck: detected, but not by the expected check.
	FindingOtherCheck = "detected_by_other_check"
	// FindingNotOutOfService: the node was expected to be taken out of
	// service and was not.
	FindingNotOutOfService = "not_out_of_service"
	// FindingUnexpectedOutOfService: taken out of service when the spec
	// said it would not be.
	FindingUnexpectedOutOfService = "unexpected_out_of_service"
	// FindingNotRecovered: not healthy again by the deadline.
	FindingNotRecovered = "not_recovered"
	// FindingRevertFailed: the coordinator could not revert; the agent's
	// own timer is the backstop.
	FindingRevertFailed = "revert_failed"
	// FindingInjectFailed: the fault action failed or was refused.
	FindingInjectFailed = "inject_failed"
	// FindingUnhealthyBefore: the expected check was not passing before
	// injection, so a detection could not be told from what was there.
	FindingUnhealthyBefore = "unhealthy_before"
	// FindingAborted: the drill was cut short (deadline, unexpected state,
	// operator).
	FindingAborted = "aborted"
)

// Finding is one thing a drill found.
type Finding struct {
	Code     string    `json:"code"`
	Severity string    `json:"severity"` // warn or fail
	Message  string    `json:"message"`
	At       time.Time `json:"at"`
}

// CheckSnap is a check's status and finding codes at one poll.
type CheckSnap struct {
	Status report.Status `json:"status"`
	Codes  []string      `json:"codes,omitempty"`
}

// Detection is the first poll at which a watched check saw something new.
type Detection struct {
	Check  string        `json:"check"`
	Status report.Status `json:"status"`
	Codes  []string      `json:"codes,omitempty"`
	// At is when the check ran (the report's collection time); Observed
	// is when the engine received it.
	At       time.Time `json:"at"`
	Observed time.Time `json:"observed"`
	Message  string    `json:"message,omitempty"`
	// Findings are the check's findings in that result (the XID_79 that
	// matched, with its GPU).
	Findings []report.Finding `json:"findings,omitempty"`
}

// Target is one node of a drill with everything measured on it.
type Target struct {
	Node  string      `json:"node"`
	State TargetState `json:"state"`
	// Precheck is each watched check before injection.
	Precheck   map[string]CheckSnap `json:"precheck,omitempty"`
	InjectedAt time.Time            `json:"injected_at,omitzero"`
	// CheckInterval is how often the target's agent ran its checks on its
	// own when the fault was injected: a time to detect reads against it.
	CheckInterval config.Duration `json:"check_interval,omitempty"`
	// DetectedAt is the earliest detection by any watched check;
	// DetectedBy names it.
	DetectedAt       time.Time `json:"detected_at,omitzero"`
	DetectedBy       string    `json:"detected_by,omitempty"`
	ExpectedDetected bool      `json:"expected_detected"`
	// DetectedPoll is the watch poll that first detected it.
	DetectedPoll int         `json:"detected_poll,omitempty"`
	Detections   []Detection `json:"detections,omitempty"`
	// OutOfServiceAt is when the node was seen out of service.
	OutOfServiceAt  time.Time `json:"out_of_service_at,omitzero"`
	RevertStartedAt time.Time `json:"revert_started_at,omitzero"`
	RevertedAt      time.Time `json:"reverted_at,omitzero"`
	// RevertedBy: "coordinator", or "agent" when the agent's own timer is
	// relied on (the coordinator could not reach it).
	RevertedBy     string    `json:"reverted_by,omitempty"`
	RevertAttempts int       `json:"revert_attempts,omitempty"`
	RecoveredAt    time.Time `json:"recovered_at,omitzero"`
	Aborted        bool      `json:"aborted"`
	AbortReason    string    `json:"abort_reason,omitempty"`
	Polls          int       `json:"polls"`
	NextAt         time.Time `json:"next_at,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	Findings       []Finding `json:"findings"`
}

// TTD is the time to detect (0, false when not detected).
func (t Target) TTD() (time.Duration, bool) {
	if t.DetectedAt.IsZero() || t.InjectedAt.IsZero() {
		return 0, false
	}
	return t.DetectedAt.Sub(t.InjectedAt), true
}

// TTR is the time from injection until the node was healthy again (0,
// false when it did not recover or the drill was aborted: an aborted
// drill's recovery does not count toward MTTR).
func (t Target) TTR() (time.Duration, bool) {
	if t.RecoveredAt.IsZero() || t.InjectedAt.IsZero() || t.Aborted {
		return 0, false
	}
	return t.RecoveredAt.Sub(t.InjectedAt), true
}

// TimeToOutOfService is from detection to out of service.
func (t Target) TimeToOutOfService() (time.Duration, bool) {
	if t.OutOfServiceAt.IsZero() || t.DetectedAt.IsZero() {
		return 0, false
	}
	return t.OutOfServiceAt.Sub(t.DetectedAt), true
}

func (t *Target) add(code, sev, msg string, at time.Time) {
	t.Findings = append(t.Findings, Finding{Code: code, Severity: sev, Message: msg, At: at})
}

// HasFinding reports whether the target has a finding with the code.
func (t Target) HasFinding(code string) bool {
	for _, f := range t.Findings {
		if f.Code == code {
			return true
		}
	}
	return false
}

// Drill is one drill with its targets.
type Drill struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Fault      string    `json:"fault"`
	Spec       *Spec     `json:"spec"`
	State      State     `json:"state"`
	Reason     string    `json:"reason,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Degraded lists the nodes already degraded when it started: only a
	// node degrading after that is unexpected.
	Degraded []string `json:"degraded_at_start,omitempty"`
	Targets  []Target `json:"targets"`
}
