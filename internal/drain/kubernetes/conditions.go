package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Node condition types fleetcheck writes, one per area, as
// node-problem-detector does: True is healthy, False is a failing check,
// Unknown is a check that could not decide or did not run.
const (
	ConditionGPU  corev1.NodeConditionType = "FleetcheckGPUHealthy"
	ConditionIB   corev1.NodeConditionType = "FleetcheckIBHealthy"
	ConditionNCCL corev1.NodeConditionType = "FleetcheckNCCLHealthy"
)

// Reasons of the conditions (CamelCase, as Kubernetes writes them).
const (
	ReasonPassed       = "ChecksPassed"
	ReasonWarnings     = "ChecksPassedWithWarnings"
	ReasonFailed       = "CheckFailed"
	ReasonCheckError   = "CheckError"
	ReasonNotChecked   = "NotChecked"
	maxConditionMsgLen = 1024
)

// areas maps a check name's prefix to its condition.
var areas = []struct {
	prefix string
	typ    corev1.NodeConditionType
}{
	{"gpu.", ConditionGPU},
	{"dcgm.", ConditionGPU},
	{"ib.", ConditionIB},
	{"nccl.", ConditionNCCL},
}

// Condition is one area's state, as SetConditions writes it.
type Condition struct {
	Type    corev1.NodeConditionType
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// AreaConditions turns a node's latest check results into one condition
// per area that has a result; an area without one is left out, so its
// condition on the node stays as it was. A failing check makes the area
// False with its first failing finding as the message; an error, or only
// skipped checks, make it Unknown: a skipped check never reads as healthy.
func AreaConditions(results []report.CheckResult) []Condition {
	type acc struct {
		failed, errored, warned, passed []string
		firstFail                       string
		firstErr                        string
	}
	by := map[corev1.NodeConditionType]*acc{}
	for _, r := range results {
		typ, ok := areaOf(r.Name)
		if !ok {
			continue
		}
		a := by[typ]
		if a == nil {
			a = &acc{}
			by[typ] = a
		}
		switch r.Status {
		case report.Fail:
			a.failed = append(a.failed, r.Name)
			if a.firstFail == "" {
				a.firstFail = r.Name + ": " + firstFailure(r)
			}
		case report.Error:
			a.errored = append(a.errored, r.Name)
			if a.firstErr == "" {
				a.firstErr = r.Name + ": " + r.Reason
			}
		case report.Warn:
			a.warned = append(a.warned, r.Name)
		case report.Pass:
			a.passed = append(a.passed, r.Name)
		}
	}
	var out []Condition
	for _, ar := range areas {
		a := by[ar.typ]
		if a == nil || slices.ContainsFunc(out, func(c Condition) bool { return c.Type == ar.typ }) {
			continue
		}
		c := Condition{Type: ar.typ}
		switch {
		case len(a.failed) > 0:
			c.Status, c.Reason = corev1.ConditionFalse, ReasonFailed
			c.Message = a.firstFail
			if n := len(a.failed); n > 1 {
				c.Message += fmt.Sprintf(" (and %d more failing: %s)", n-1, strings.Join(a.failed[1:], ", "))
			}
		case len(a.errored) > 0:
			c.Status, c.Reason, c.Message = corev1.ConditionUnknown, ReasonCheckError, a.firstErr
		case len(a.warned) > 0:
			c.Status, c.Reason = corev1.ConditionTrue, ReasonWarnings
			c.Message = "warnings from " + strings.Join(a.warned, ", ")
		case len(a.passed) > 0:
			c.Status, c.Reason = corev1.ConditionTrue, ReasonPassed
			c.Message = strings.Join(a.passed, ", ") + " passed"
		default:
			c.Status, c.Reason, c.Message = corev1.ConditionUnknown, ReasonNotChecked, "every check of this area was skipped"
		}
		c.Message = "fleetcheck: " + c.Message
		if len(c.Message) > maxConditionMsgLen {
			c.Message = c.Message[:maxConditionMsgLen]
		}
		out = append(out, c)
	}
	return out
}

func areaOf(check string) (corev1.NodeConditionType, bool) {
	for _, a := range areas {
		if strings.HasPrefix(check, a.prefix) {
			return a.typ, true
		}
	}
	return "", false
}

func firstFailure(r report.CheckResult) string {
	for _, f := range r.Findings {
		if f.Severity == report.SevFail {
			return fmt.Sprintf("%s %s: %s", f.Component, f.Code, f.Message)
		}
	}
	if r.Reason != "" {
		return r.Reason
	}
	return "failed"
}

// SetConditions writes the conditions on the node's status with one
// strategic-merge patch (conditions merge by type, so the kubelet's and
// other writers' conditions stay). The transition time moves only when a
// condition's status changes.
func (a *Adapter) SetConditions(ctx context.Context, node string, conds []Condition) error {
	if err := drain.CheckNode(node); err != nil {
		return err
	}
	if len(conds) == 0 {
		return nil
	}
	n, err := a.getNode(ctx, node)
	if err != nil {
		return err
	}
	now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
	patch := make([]corev1.NodeCondition, 0, len(conds))
	for _, c := range conds {
		if !ourCondition(c.Type) {
			return fmt.Errorf("node %s: condition %q is not fleetcheck's", node, c.Type)
		}
		nc := corev1.NodeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message,
			LastHeartbeatTime: now, LastTransitionTime: now}
		for _, old := range n.Status.Conditions {
			if old.Type == c.Type && old.Status == c.Status {
				nc.LastTransitionTime = old.LastTransitionTime
			}
		}
		patch = append(patch, nc)
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": patch}})
	if err != nil {
		return fmt.Errorf("node %s conditions: %w", node, err)
	}
	_, err = a.c.CoreV1().Nodes().PatchStatus(ctx, node, body)
	if err != nil {
		return fmt.Errorf("node %s conditions: %w", node, err)
	}
	return nil
}

func ourCondition(t corev1.NodeConditionType) bool {
	for _, a := range areas {
		if a.typ == t {
			return true
		}
	}
	return false
}
