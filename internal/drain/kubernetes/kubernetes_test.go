package kubernetes

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fleetcheck/fleetcheck/internal/drain"
)

func node(name string, unschedulable bool, ann map[string]string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:       corev1.NodeSpec{Unschedulable: unschedulable},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
		}},
	}
}

func pod(ns, name, nodeName, ownerKind string, lbl map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec:       corev1.PodSpec{NodeName: nodeName},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if ownerKind != "" {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: ownerKind, Name: name + "-owner", UID: "u-" + "x", Controller: &yes}}
	}
	return p
}

func pdb(ns, name string, sel map[string]string, allowed int32) *policyv1.PodDisruptionBudget {
	one := intstr.FromInt32(1)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: sel}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
	}
}

// pdbReactor makes the fake clientset's eviction subresource behave like
// the API server: an eviction that a PodDisruptionBudget does not allow
// gets 429 TooManyRequests; an allowed one uses up one disruption and
// deletes the pod. refused counts the 429s; afterRefusals, when set, runs
// after each refusal (a budget that frees up over time).
type pdbReactor struct {
	mu            sync.Mutex
	cs            *fake.Clientset
	refused       int
	evicted       []string
	afterRefusals func(n int)
}

func (r *pdbReactor) react(a k8stesting.Action) (bool, runtime.Object, error) {
	ca, ok := a.(k8stesting.CreateAction)
	if !ok || a.GetSubresource() != "eviction" {
		return false, nil, nil
	}
	ev, ok := ca.GetObject().(*policyv1.Eviction)
	if !ok {
		return true, nil, apierrors.NewBadRequest("not an eviction")
	}
	tr := r.cs.Tracker()
	gvrPods := corev1.SchemeGroupVersion.WithResource("pods")
	gvrPDB := policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets")
	obj, err := tr.Get(gvrPods, ev.Namespace, ev.Name)
	if err != nil {
		return true, nil, err
	}
	p := obj.(*corev1.Pod)
	list, err := tr.List(gvrPDB, policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"), ev.Namespace)
	if err != nil {
		return true, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range list.(*policyv1.PodDisruptionBudgetList).Items {
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		if b.Status.DisruptionsAllowed < 1 {
			r.refused++
			if r.afterRefusals != nil {
				r.afterRefusals(r.refused)
			}
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		b.Status.DisruptionsAllowed--
		if err := tr.Update(gvrPDB, &b, b.Namespace); err != nil {
			return true, nil, err
		}
	}
	if err := tr.Delete(gvrPods, p.Namespace, p.Name); err != nil {
		return true, nil, err
	}
	r.evicted = append(r.evicted, p.Namespace+"/"+p.Name)
	return true, nil, nil
}

func newCluster(objs ...runtime.Object) (*fake.Clientset, *pdbReactor) {
	cs := fake.NewSimpleClientset(objs...)
	r := &pdbReactor{cs: cs}
	cs.PrependReactor("create", "pods", r.react)
	return cs, r
}

func fastOpts() Options {
	return Options{EvictionTimeout: 300 * time.Millisecond, RetryInterval: 10 * time.Millisecond}
}

func TestDrainEvictsAndUndrainRestores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mirror := pod("kube-system", "static-etcd", "gpu-1", "", nil)
	mirror.Annotations = map[string]string{mirrorAnnotation: "x"}
	done := pod("batch", "finished", "gpu-1", "Job", nil)
	done.Status.Phase = corev1.PodSucceeded
	cs, r := newCluster(
		node("gpu-1", false, nil),
		node("gpu-2", false, nil),
		pod("ml", "train-0", "gpu-1", "StatefulSet", map[string]string{"app": "train"}),
		pod("ml", "infer-0", "gpu-1", "ReplicaSet", map[string]string{"app": "infer"}),
		pod("ml", "infer-1", "gpu-2", "ReplicaSet", map[string]string{"app": "infer"}),
		pod("kube-system", "dcgm-exporter-x", "gpu-1", "DaemonSet", nil),
		mirror, done,
		pdb("ml", "infer", map[string]string{"app": "infer"}, 1),
	)
	a := New(cs, fastOpts())

	st, err := a.Status(ctx, "gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Drained || st.RunningJobs != 2 {
		t.Fatalf("before: %+v", st)
	}
	if err := a.Drain(ctx, "gpu-1", "rollout r-1: driver 550.90.07"); err != nil {
		t.Fatal(err)
	}
	n, _ := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if !n.Spec.Unschedulable || n.Annotations[AnnotationDrainedBy] != "fleetcheck" ||
		n.Annotations[AnnotationReason] != "fleetcheck: rollout r-1: driver 550.90.07" {
		t.Fatalf("node after drain: %+v %v", n.Spec, n.Annotations)
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != TaintKey || n.Spec.Taints[0].Value != "rollout-r-1-driver-550.90.07" ||
		n.Spec.Taints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
	if len(r.evicted) != 2 {
		t.Fatalf("evicted %v", r.evicted)
	}
	pods, _ := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 2 {
		t.Fatalf("daemonset and mirror pods must stay: %d left", len(pods.Items))
	}
	st, err = a.Status(ctx, "gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Drained || !st.ByFleetcheck || st.RunningJobs != 0 {
		t.Fatalf("after drain: %+v", st)
	}

	// A second drain with another reason keeps the first one.
	if err := a.Drain(ctx, "gpu-1", "sweep s-9"); err != nil {
		t.Fatal(err)
	}
	if n, _ := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{}); n.Annotations[AnnotationReason] != "fleetcheck: rollout r-1: driver 550.90.07" || len(n.Spec.Taints) != 1 {
		t.Fatalf("redrain changed the node: %v %v", n.Annotations, n.Spec.Taints)
	}

	un, err := a.Unavailable(ctx)
	if err != nil || len(un) != 1 || !un["gpu-1"].ByFleetcheck {
		t.Fatalf("unavailable %+v %v", un, err)
	}

	if err := a.Undrain(ctx, "gpu-1"); err != nil {
		t.Fatal(err)
	}
	n, _ = cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if n.Spec.Unschedulable || len(n.Spec.Taints) != 0 || len(n.Annotations) != 0 {
		t.Fatalf("node after undrain: %+v %v", n.Spec, n.Annotations)
	}
	if err := a.Undrain(ctx, "gpu-1"); err != nil {
		t.Fatalf("second undrain: %v", err)
	}
}

func TestPDBBlocksUntilDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs, r := newCluster(
		node("gpu-1", false, nil),
		pod("ml", "db-0", "gpu-1", "StatefulSet", map[string]string{"app": "db"}),
		pdb("ml", "db", map[string]string{"app": "db"}, 0),
	)
	a := New(cs, fastOpts())
	start := time.Now()
	err := a.Drain(ctx, "gpu-1", "rollout r-1")
	if !errors.Is(err, ErrEvictionBlocked) {
		t.Fatalf("got %v, want ErrEvictionBlocked", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	if r.refused < 3 {
		t.Fatalf("only %d attempts", r.refused)
	}
	st, err := a.Status(ctx, "gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Drained || !st.ByFleetcheck || st.RunningJobs != 1 {
		t.Fatalf("status %+v", st)
	}
}

func TestPDBFreesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs, r := newCluster(
		node("gpu-1", false, nil),
		pod("ml", "db-0", "gpu-1", "StatefulSet", map[string]string{"app": "db"}),
		pod("ml", "db-1", "gpu-1", "StatefulSet", map[string]string{"app": "db"}),
		pdb("ml", "db", map[string]string{"app": "db"}, 0),
	)
	// The budget allows one more disruption every third refusal, as
	// replacement pods become ready elsewhere.
	r.afterRefusals = func(n int) {
		if n%3 != 0 {
			return
		}
		gvr := policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets")
		obj, _ := cs.Tracker().Get(gvr, "ml", "db")
		b := obj.(*policyv1.PodDisruptionBudget).DeepCopy()
		b.Status.DisruptionsAllowed++
		_ = cs.Tracker().Update(gvr, b, "ml")
	}
	opts := fastOpts()
	opts.EvictionTimeout = 5 * time.Second
	if err := New(cs, opts).Drain(ctx, "gpu-1", "rollout"); err != nil {
		t.Fatal(err)
	}
	if len(r.evicted) != 2 || r.refused < 3 {
		t.Fatalf("evicted %v after %d refusals", r.evicted, r.refused)
	}
}

func TestUnmanagedPodBlocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs, r := newCluster(node("gpu-1", false, nil), pod("dev", "notebook", "gpu-1", "", nil))
	err := New(cs, fastOpts()).Drain(ctx, "gpu-1", "rollout")
	if !errors.Is(err, ErrEvictionBlocked) || len(r.evicted) != 0 {
		t.Fatalf("got %v, evicted %v", err, r.evicted)
	}
	opts := fastOpts()
	opts.EvictUnmanaged = true
	if err := New(cs, opts).Drain(ctx, "gpu-1", "rollout"); err != nil || len(r.evicted) != 1 {
		t.Fatalf("forced: %v, evicted %v", err, r.evicted)
	}
}

func TestForeignCordonNeverUndone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs, r := newCluster(
		node("gpu-1", true, map[string]string{"ops/ticket": "HW-4411"}),
		pod("ml", "train-0", "gpu-1", "StatefulSet", nil),
	)
	a := New(cs, fastOpts())
	if err := a.Undrain(ctx, "gpu-1"); !errors.Is(err, drain.ErrNotOurs) {
		t.Fatalf("undrain: %v", err)
	}
	if err := a.Drain(ctx, "gpu-1", "rollout"); !errors.Is(err, drain.ErrNotOurs) {
		t.Fatalf("drain: %v", err)
	}
	n, _ := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if !n.Spec.Unschedulable || len(n.Spec.Taints) != 0 || n.Annotations[AnnotationDrainedBy] != "" {
		t.Fatalf("node changed: %+v %v", n.Spec, n.Annotations)
	}
	if len(r.evicted) != 0 {
		t.Fatalf("evicted %v", r.evicted)
	}
	st, err := a.Status(ctx, "gpu-1")
	if err != nil || !st.Drained || st.ByFleetcheck || st.RunningJobs != 1 {
		t.Fatalf("status %+v %v", st, err)
	}
	if _, err := a.Status(ctx, "gpu-404"); !errors.Is(err, drain.ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
}

func TestUnavailableCountsNotReady(t *testing.T) {
	t.Parallel()
	down := node("gpu-3", false, nil)
	down.Status.Conditions[0].Status = corev1.ConditionUnknown
	cs, _ := newCluster(node("gpu-1", false, nil), node("gpu-2", true, nil), down)
	un, err := New(cs, fastOpts()).Unavailable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(un) != 2 || un["gpu-2"].ByFleetcheck || un["gpu-3"].Reason != "NotReady" {
		t.Fatalf("got %+v", un)
	}
}

func TestTaintValue(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"fleetcheck: rollout r-1: driver 550.90.07": "rollout-r-1-driver-550.90.07",
		"fleetcheck:":       "fleetcheck",
		"--weird__ reason!": "weird__-reason",
		"fleetcheck: " + string(make([]byte, 0)) + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbb": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	} {
		if got := taintValue(in); got != want {
			t.Errorf("taintValue(%q) = %q, want %q", in, got, want)
		}
	}
}
