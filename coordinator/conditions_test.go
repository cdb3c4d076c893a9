package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
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

// nodeCondition reads one condition of a node from the fake clientset.
func nodeCondition(t *testing.T, cs *fake.Clientset, node string, typ corev1.NodeConditionType) corev1.NodeCondition {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
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

// TestNodeConditionsUnknownWhenAgentStops: an agent whose stream ends
// leaves its last results behind, and they no longer describe the node:
// every Fleetcheck condition goes Unknown (AgentNotReporting), with the
// last known state in the message, and the next result writes them anew.
func TestNodeConditionsUnknownWhenAgentStops(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-001"}})
	s := policyServer(t, k8sdrain.New(cs, k8sdrain.Options{}), func(c *Config) { c.Drain.Policy = DrainPolicyConfig{} })
	cond := func(typ corev1.NodeConditionType) corev1.NodeCondition { return nodeCondition(t, cs, "gpu-001", typ) }

	a := mustConnect(t, s, "gpu-001")
	a.sendResult(result("gpu-001", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "GPU False, IB True", func() bool {
		return cond(k8sdrain.ConditionGPU).Status == corev1.ConditionFalse && cond(k8sdrain.ConditionIB).Status == corev1.ConditionTrue
	})

	a.close()
	testwait.Until(t, 5*time.Second, "GPU and IB Unknown", func() bool {
		return cond(k8sdrain.ConditionGPU).Status == corev1.ConditionUnknown && cond(k8sdrain.ConditionIB).Status == corev1.ConditionUnknown
	})
	gpu, ib := cond(k8sdrain.ConditionGPU), cond(k8sdrain.ConditionIB)
	for _, c := range []corev1.NodeCondition{gpu, ib} {
		if c.Reason != ReasonNotReporting || !strings.HasPrefix(c.Message, "fleetcheck: the agent stopped reporting (") {
			t.Errorf("%s: %s %q, want %s with why", c.Type, c.Reason, c.Message, ReasonNotReporting)
		}
	}
	if !strings.Contains(gpu.Message, "; last: gpu.ecc: GPU3 ECC_UNCORRECTABLE") {
		t.Errorf("GPU message %q does not keep the last known failure", gpu.Message)
	}
	if c := cond(k8sdrain.ConditionNCCL); c.Type != "" {
		t.Errorf("NCCL condition %+v written for an area that never had a result", c)
	}

	// Back: the next result is written at once, whatever the refresh.
	b := mustConnect(t, s, "gpu-001")
	b.sendResult(result("gpu-001", false))
	b.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "GPU and IB True again", func() bool {
		return cond(k8sdrain.ConditionGPU).Status == corev1.ConditionTrue && cond(k8sdrain.ConditionIB).Status == corev1.ConditionTrue
	})
}

// TestNodeConditionsUnknownWhenAgentNeverReturns: after a coordinator
// restart, a node whose agent does not reconnect within the grace gets
// Unknown conditions too (the new process never saw its stream end).
func TestNodeConditionsUnknownWhenAgentNeverReturns(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-001"}})
	dir := t.TempDir()
	start := func() *Server {
		cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: dir, HeartbeatInterval: 200 * time.Millisecond, Insecure: true}
		s, err := New(cfg, Options{Logger: zerolog.Nop(), Version: "test", Drain: k8sdrain.New(cs, k8sdrain.Options{})})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := start()
	a := mustConnect(t, s, "gpu-001")
	a.sendResult(result("gpu-001", false))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "GPU True", func() bool {
		return nodeCondition(t, cs, "gpu-001", k8sdrain.ConditionGPU).Status == corev1.ConditionTrue
	})
	// The coordinator stops first: that is not the agent going silent.
	stopServer(t, s)
	a.close()
	if c := nodeCondition(t, cs, "gpu-001", k8sdrain.ConditionGPU); c.Status != corev1.ConditionTrue {
		t.Fatalf("the coordinator's own stop made the GPU condition %s", c.Status)
	}

	s2 := start()
	t.Cleanup(func() { stopServer(t, s2) })
	testwait.Until(t, 10*time.Second, "GPU Unknown after the grace", func() bool {
		return nodeCondition(t, cs, "gpu-001", k8sdrain.ConditionGPU).Status == corev1.ConditionUnknown
	})
	if c := nodeCondition(t, cs, "gpu-001", k8sdrain.ConditionGPU); c.Reason != ReasonNotReporting || !strings.Contains(c.Message, "no agent connected within") {
		t.Errorf("GPU condition %s %q", c.Reason, c.Message)
	}
}
