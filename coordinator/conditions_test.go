package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	k8sdrain "github.com/fleetcheck/fleetcheck/internal/drain/kubernetes"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// TestNodeConditionsFollowResults: with the Kubernetes adapter, a node's
// results show on its Kubernetes node as Fleetcheck*Healthy conditions,
// without a drain policy, and without cordoning anything.
func TestNodeConditionsFollowResults(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-001"}})
	s := policyServer(t, k8sdrain.New(cs, k8sdrain.Options{}), func(c *Config) { c.Drain.Policy = DrainPolicyConfig{} })
	a := mustConnect(t, s, "gpu-001")

	cond := func(typ corev1.NodeConditionType) corev1.NodeCondition {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), "gpu-001", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == typ {
				return c
			}
		}
		return corev1.NodeCondition{}
	}
	a.sendResult(result("gpu-001", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "GPU condition False", func() bool {
		return cond(k8sdrain.ConditionGPU).Status == corev1.ConditionFalse
	})
	gpu := cond(k8sdrain.ConditionGPU)
	if gpu.Reason != k8sdrain.ReasonFailed || gpu.Message != "fleetcheck: gpu.ecc: GPU3 ECC_UNCORRECTABLE: 2 uncorrectable DRAM errors" {
		t.Errorf("GPU condition %+v", gpu)
	}
	if ib := cond(k8sdrain.ConditionIB); ib.Status != corev1.ConditionTrue || ib.Reason != k8sdrain.ReasonPassed {
		t.Errorf("IB condition %+v", ib)
	}
	if c := cond(k8sdrain.ConditionNCCL); c.Type != "" {
		t.Errorf("NCCL condition %+v written with no nccl result", c)
	}

	// A later result of another GPU check alone does not clear the
	// failing gpu.ecc: the area counts each check's newest status.
	xid := result("gpu-001", false)
	xid.Full = false
	xid.Checks = []*pb.CheckResult{{Name: "gpu.xid", Status: "pass"}}
	a.sendResult(xid)
	a.ack(5 * time.Second)
	// A stream's results apply in order: once this one's IB change shows,
	// the gpu.xid result before it was applied.
	ib := result("gpu-001", false)
	ib.Full = false
	ib.Checks = []*pb.CheckResult{{Name: "ib.ports", Status: "fail", Findings: []*pb.Finding{{Severity: "fail", Component: "mlx5_0/1", Code: "IB_PORT_DOWN", Message: "port down", Action: "reseat"}}}}
	a.sendResult(ib)
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "IB condition False", func() bool {
		return cond(k8sdrain.ConditionIB).Status == corev1.ConditionFalse
	})
	if gpu := cond(k8sdrain.ConditionGPU); gpu.Status != corev1.ConditionFalse || !strings.Contains(gpu.Message, "gpu.ecc") {
		t.Errorf("a passing gpu.xid cleared a failing gpu.ecc: %+v", gpu)
	}

	a.sendResult(result("gpu-001", false))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "GPU and IB conditions True", func() bool {
		return cond(k8sdrain.ConditionGPU).Status == corev1.ConditionTrue && cond(k8sdrain.ConditionIB).Status == corev1.ConditionTrue
	})
	if gpu := cond(k8sdrain.ConditionGPU); gpu.Message != "fleetcheck: gpu.ecc, gpu.xid passed" {
		t.Errorf("GPU condition %+v", gpu)
	}
	n, _ := cs.CoreV1().Nodes().Get(context.Background(), "gpu-001", metav1.GetOptions{})
	if n.Spec.Unschedulable || len(n.Spec.Taints) > 0 {
		t.Errorf("no drain policy, yet the node was cordoned: %+v", n.Spec)
	}
}
