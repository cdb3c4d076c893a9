package kubernetes

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

func TestAreaConditions(t *testing.T) {
	t.Parallel()
	ecc := report.CheckResult{Name: "gpu.ecc", Status: report.Fail, Findings: []report.Finding{
		{Severity: report.SevWarn, Component: "GPU1", Code: "ECC_SBE_RISING", Message: "rising"},
		{Severity: report.SevFail, Component: "GPU3", Code: "ECC_UNCORRECTABLE", Message: "2 uncorrectable errors"},
	}}
	tests := []struct {
		name    string
		results []report.CheckResult
		want    []Condition
	}{
		{"no results writes nothing", nil, nil},
		{"unknown areas are left out", []report.CheckResult{{Name: "custom.x", Status: report.Fail}}, nil},
		{"all pass", []report.CheckResult{{Name: "gpu.ecc", Status: report.Pass}, {Name: "gpu.xid", Status: report.Pass}}, []Condition{
			{ConditionGPU, corev1.ConditionTrue, ReasonPassed, "fleetcheck: gpu.ecc, gpu.xid passed"}}},
		{"a failure names its first failing finding", []report.CheckResult{{Name: "gpu.xid", Status: report.Pass}, ecc, {Name: "dcgm.diag", Status: report.Fail, Reason: "diag failed"}}, []Condition{
			{ConditionGPU, corev1.ConditionFalse, ReasonFailed, "fleetcheck: gpu.ecc: GPU3 ECC_UNCORRECTABLE: 2 uncorrectable errors (and 1 more failing: dcgm.diag)"}}},
		{"error beats pass, as unknown", []report.CheckResult{{Name: "ib.ports", Status: report.Pass}, {Name: "ib.counters", Status: report.Error, Reason: "perfquery timed out"}}, []Condition{
			{ConditionIB, corev1.ConditionUnknown, ReasonCheckError, "fleetcheck: ib.counters: perfquery timed out"}}},
		{"skipped never reads as healthy", []report.CheckResult{{Name: "nccl.allreduce", Status: report.Skip}}, []Condition{
			{ConditionNCCL, corev1.ConditionUnknown, ReasonNotChecked, "fleetcheck: every check of this area was skipped"}}},
		{"warnings stay healthy and say so", []report.CheckResult{{Name: "nccl.allreduce", Status: report.Warn}, {Name: "ib.ports", Status: report.Pass}}, []Condition{
			{ConditionIB, corev1.ConditionTrue, ReasonPassed, "fleetcheck: ib.ports passed"},
			{ConditionNCCL, corev1.ConditionTrue, ReasonWarnings, "fleetcheck: warnings from nccl.allreduce"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AreaConditions(tc.results)
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("[%d] got %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestSetConditions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	long := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	n := node("gpu-1", false, nil)
	n.Status.Conditions = append(n.Status.Conditions,
		corev1.NodeCondition{Type: ConditionGPU, Status: corev1.ConditionTrue, Reason: ReasonPassed, LastTransitionTime: long, LastHeartbeatTime: long},
		corev1.NodeCondition{Type: ConditionIB, Status: corev1.ConditionTrue, Reason: ReasonPassed, LastTransitionTime: long, LastHeartbeatTime: long},
		corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionFalse, Reason: "KernelHasNoDeadlock"})
	cs := fake.NewClientset(n)
	a := New(cs, Options{})

	err := a.SetConditions(ctx, "gpu-1", []Condition{
		{ConditionGPU, corev1.ConditionFalse, ReasonFailed, "fleetcheck: gpu.ecc: GPU3 ECC_UNCORRECTABLE"},
		{ConditionIB, corev1.ConditionTrue, ReasonPassed, "fleetcheck: ib.ports passed"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	by := map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, c := range got.Status.Conditions {
		by[c.Type] = c
	}
	if len(by) != 4 {
		t.Fatalf("conditions %+v: want Ready, KernelDeadlock and fleetcheck's GPU and IB", got.Status.Conditions)
	}
	if by[corev1.NodeReady].Status != corev1.ConditionTrue || by["KernelDeadlock"].Reason != "KernelHasNoDeadlock" {
		t.Errorf("other writers' conditions changed: %+v", got.Status.Conditions)
	}
	gpu := by[ConditionGPU]
	if gpu.Status != corev1.ConditionFalse || gpu.Reason != ReasonFailed || gpu.Message != "fleetcheck: gpu.ecc: GPU3 ECC_UNCORRECTABLE" {
		t.Errorf("GPU condition %+v", gpu)
	}
	if !gpu.LastTransitionTime.After(long.Time) {
		t.Errorf("GPU went True → False but its transition time stayed %v", gpu.LastTransitionTime)
	}
	ib := by[ConditionIB]
	if !ib.LastTransitionTime.Equal(&long) || !ib.LastHeartbeatTime.After(long.Time) {
		t.Errorf("IB stayed True: transition time must stay %v and the heartbeat move, got %+v", long, ib)
	}
	if got.Spec.Unschedulable || len(got.Spec.Taints) > 0 {
		t.Errorf("conditions cordoned or tainted the node: %+v", got.Spec)
	}
}

func TestSetConditionsRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs := fake.NewClientset(node("gpu-1", false, nil))
	a := New(cs, Options{})
	ok := []Condition{{ConditionGPU, corev1.ConditionTrue, ReasonPassed, "x"}}
	if err := a.SetConditions(ctx, "gpu-9", ok); !errors.Is(err, drain.ErrUnknownNode) {
		t.Errorf("unknown node: %v", err)
	}
	if err := a.SetConditions(ctx, "n[1-4]", ok); !errors.Is(err, drain.ErrInvalidNode) {
		t.Errorf("hostlist: %v", err)
	}
	if err := a.SetConditions(ctx, "gpu-1", []Condition{{corev1.NodeReady, corev1.ConditionFalse, "x", "y"}}); err == nil {
		t.Error("SetConditions wrote the kubelet's Ready condition")
	}
	for _, act := range cs.Actions() {
		if act.GetVerb() == "patch" {
			t.Errorf("a refused call patched: %+v", act)
		}
	}
}
