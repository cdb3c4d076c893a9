// Package kubernetes is the drain adapter for Kubernetes nodes: cordon, a
// fleetcheck taint, eviction of the node's pods through the Eviction API
// (policy/v1, so PodDisruptionBudgets hold), and owner/reason annotations
// that say the drain is fleetcheck's. Undrain only uncordons a node that
// carries fleetcheck's owner annotation.
//
// It belongs to the coordinator: it pulls in client-go, so nothing the node
// agent imports may import it.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/fleetcheck/fleetcheck/internal/drain"
)

// Names fleetcheck writes on nodes.
const (
	// TaintKey is the NoSchedule taint fleetcheck adds; its value is the
	// reason, shortened to a label value.
	TaintKey = "fleetcheck.io/drain"
	// AnnotationDrainedBy marks a cordon as fleetcheck's; Undrain needs it.
	AnnotationDrainedBy = "fleetcheck.io/drained-by"
	// AnnotationReason holds the full reason ("fleetcheck: rollout r-1 ...").
	AnnotationReason = "fleetcheck.io/reason"
	// mirrorAnnotation marks static pods the kubelet mirrors: they cannot
	// be evicted, as kubectl drain knows.
	mirrorAnnotation = "kubernetes.io/config.mirror"
)

// ErrEvictionBlocked: pods were still on the node when Drain's eviction
// deadline passed (a PodDisruptionBudget kept refusing, or a pod has no
// controller and EvictUnmanaged is off). The node stays cordoned; calling
// Drain again retries the evictions.
var ErrEvictionBlocked = errors.New("eviction blocked")

// Options configure the adapter. Zero values take the defaults.
type Options struct {
	// Owner is written to AnnotationDrainedBy (default "fleetcheck").
	Owner string
	// EvictionTimeout bounds how long one Drain retries evictions that a
	// PodDisruptionBudget refuses (HTTP 429) (default 5m).
	EvictionTimeout time.Duration
	// RetryInterval is the wait between eviction rounds (default 5s).
	RetryInterval time.Duration
	// GracePeriod overrides the pods' termination grace period when set.
	GracePeriod *int64
	// EvictUnmanaged also evicts pods no controller will recreate
	// (kubectl drain's --force). Off, they block the drain.
	EvictUnmanaged bool
}

// Adapter drains Kubernetes nodes.
type Adapter struct {
	c    k8s.Interface
	opts Options
}

var (
	_ drain.Adapter = (*Adapter)(nil)
	_ drain.Lister  = (*Adapter)(nil)
)

// New returns an adapter over a clientset.
func New(c k8s.Interface, opts Options) *Adapter {
	if opts.Owner == "" {
		opts.Owner = "fleetcheck"
	}
	if opts.EvictionTimeout <= 0 {
		opts.EvictionTimeout = 5 * time.Minute
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = 5 * time.Second
	}
	return &Adapter{c: c, opts: opts}
}

func (a *Adapter) getNode(ctx context.Context, name string) (*corev1.Node, error) {
	n, err := a.c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("node %s: %w", name, drain.ErrUnknownNode)
	}
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", name, err)
	}
	return n, nil
}

func (a *Adapter) ours(n *corev1.Node) bool {
	return n.Annotations[AnnotationDrainedBy] == a.opts.Owner
}

// Status reads the cordon, the owner annotation and the pods a drain would
// evict.
func (a *Adapter) Status(ctx context.Context, node string) (drain.Status, error) {
	if err := drain.CheckNode(node); err != nil {
		return drain.Status{}, err
	}
	n, err := a.getNode(ctx, node)
	if err != nil {
		return drain.Status{}, err
	}
	st := a.status(n)
	pods, err := a.pods(ctx, node)
	if err != nil {
		return drain.Status{}, err
	}
	for i := range pods {
		if blocksDrain(&pods[i]) {
			st.RunningJobs++
		}
	}
	return st, nil
}

func (a *Adapter) status(n *corev1.Node) drain.Status {
	st := drain.Status{Drained: n.Spec.Unschedulable}
	if st.Drained && a.ours(n) {
		st.ByFleetcheck = true
		st.Reason = n.Annotations[AnnotationReason]
	}
	if st.Drained && !st.ByFleetcheck {
		st.Reason = "cordoned"
		if r := n.Annotations[AnnotationReason]; r != "" {
			st.Reason = r
		}
	}
	return st
}

// Drain cordons and taints the node, writes the owner and reason, then
// evicts its pods, retrying refusals until the eviction deadline. A node
// cordoned by someone else gives ErrNotOurs and is left alone.
func (a *Adapter) Drain(ctx context.Context, node, reason string) error {
	if err := drain.CheckNode(node); err != nil {
		return err
	}
	reason = drain.Reason(reason)
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := a.getNode(ctx, node)
		if err != nil {
			return err
		}
		if n.Spec.Unschedulable && !a.ours(n) {
			return fmt.Errorf("drain %s: %w (cordoned without fleetcheck's annotation)", node, drain.ErrNotOurs)
		}
		if a.ours(n) && n.Spec.Unschedulable && hasTaint(n) {
			return nil // already ours: keep the first reason
		}
		n = n.DeepCopy()
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[AnnotationDrainedBy] = a.opts.Owner
		if _, ok := n.Annotations[AnnotationReason]; !ok || !n.Spec.Unschedulable {
			n.Annotations[AnnotationReason] = reason
		}
		n.Spec.Unschedulable = true
		if !hasTaint(n) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{
				Key: TaintKey, Value: taintValue(reason), Effect: corev1.TaintEffectNoSchedule,
			})
		}
		_, err = a.c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		if errors.Is(err, drain.ErrNotOurs) || errors.Is(err, drain.ErrUnknownNode) {
			return err
		}
		return fmt.Errorf("cordon %s: %w", node, err)
	}
	return a.evictAll(ctx, node)
}

// evictAll evicts the node's pods in rounds until none is left to evict
// or the eviction deadline passes.
func (a *Adapter) evictAll(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeout(ctx, a.opts.EvictionTimeout)
	defer cancel()
	for {
		pods, err := a.pods(ctx, node)
		if err != nil {
			return fmt.Errorf("drain %s: %w", node, err)
		}
		var blocked []string
		for i := range pods {
			p := &pods[i]
			if !blocksDrain(p) || p.DeletionTimestamp != nil {
				continue // left alone, or already leaving
			}
			name := p.Namespace + "/" + p.Name
			if !a.opts.EvictUnmanaged && controllerOf(p) == nil {
				blocked = append(blocked, name+" (no controller)")
				continue
			}
			switch err := a.evict(ctx, p); {
			case err == nil, apierrors.IsNotFound(err):
			case apierrors.IsTooManyRequests(err):
				blocked = append(blocked, name+" (disruption budget)")
			case apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err):
				// The API server refuses a pod covered by two budgets with a
				// 500; it stays blocked until someone fixes the budgets.
				blocked = append(blocked, name+" ("+firstLine(err.Error())+")")
			case ctx.Err() != nil:
				return a.blockedErr(node, []string{name})
			default:
				return fmt.Errorf("drain %s: evict %s: %w", node, name, err)
			}
		}
		if len(blocked) == 0 {
			return nil
		}
		t := time.NewTimer(a.opts.RetryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return a.blockedErr(node, blocked)
		case <-t.C:
		}
	}
}

func (a *Adapter) blockedErr(node string, blocked []string) error {
	slices.Sort(blocked)
	if len(blocked) > 5 {
		blocked = append(blocked[:5], fmt.Sprintf("and %d more", len(blocked)-5))
	}
	return fmt.Errorf("drain %s: %w after %v: %s", node, ErrEvictionBlocked, a.opts.EvictionTimeout, strings.Join(blocked, ", "))
}

func (a *Adapter) evict(ctx context.Context, p *corev1.Pod) error {
	ev := &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
	}
	if a.opts.GracePeriod != nil {
		g := *a.opts.GracePeriod
		ev.DeleteOptions = &metav1.DeleteOptions{GracePeriodSeconds: &g}
	}
	return a.c.PolicyV1().Evictions(p.Namespace).Evict(ctx, ev)
}

// pods lists the pods bound to the node. The field selector does the work
// on a real API server; the check below keeps the answer right where a
// server (or a fake) ignores it.
func (a *Adapter) pods(ctx context.Context, node string) ([]corev1.Pod, error) {
	list, err := a.c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list pods on %s: %w", node, err)
	}
	out := list.Items[:0]
	for _, p := range list.Items {
		if p.Spec.NodeName == node {
			out = append(out, p)
		}
	}
	return out, nil
}

// blocksDrain tells the pods a drain waits for, as kubectl drain does:
// DaemonSet pods stay (their controller ignores the cordon), mirror pods
// cannot be evicted, finished pods hold nothing.
func blocksDrain(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	if _, ok := p.Annotations[mirrorAnnotation]; ok {
		return false
	}
	if c := controllerOf(p); c != nil && c.Kind == "DaemonSet" {
		return false
	}
	return true
}

func controllerOf(p *corev1.Pod) *metav1.OwnerReference {
	return metav1.GetControllerOf(p)
}

// Undrain removes fleetcheck's taint and annotations and uncordons the
// node, only when fleetcheck's owner annotation is on it.
func (a *Adapter) Undrain(ctx context.Context, node string) error {
	if err := drain.CheckNode(node); err != nil {
		return err
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := a.getNode(ctx, node)
		if err != nil {
			return err
		}
		if !a.ours(n) {
			if n.Spec.Unschedulable {
				return fmt.Errorf("undrain %s: %w (cordoned without fleetcheck's annotation)", node, drain.ErrNotOurs)
			}
			return nil
		}
		n = n.DeepCopy()
		n.Spec.Unschedulable = false
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintKey })
		delete(n.Annotations, AnnotationDrainedBy)
		delete(n.Annotations, AnnotationReason)
		_, err = a.c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		if errors.Is(err, drain.ErrNotOurs) || errors.Is(err, drain.ErrUnknownNode) {
			return err
		}
		return fmt.Errorf("uncordon %s: %w", node, err)
	}
	return nil
}

// Unavailable lists cordoned nodes and nodes whose Ready condition is not
// True, with one list call.
func (a *Adapter) Unavailable(ctx context.Context) (map[string]drain.Status, error) {
	list, err := a.c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make(map[string]drain.Status)
	for i := range list.Items {
		n := &list.Items[i]
		st := a.status(n)
		if !st.Drained && !ready(n) {
			st = drain.Status{Drained: true, Reason: "NotReady"}
		}
		if st.Drained {
			out[n.Name] = st
		}
	}
	return out, nil
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasTaint(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintKey })
}

// taintValue turns a reason into a label value (63 characters of
// [A-Za-z0-9._-], alphanumeric at both ends): "fleetcheck: rollout r-1:
// driver 550.90.07" → "rollout-r-1-driver-550.90.07".
func taintValue(reason string) string {
	r := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(reason), drain.ReasonPrefix))
	var b strings.Builder
	dash := false
	for _, c := range r {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_'
		if ok {
			b.WriteRune(c)
			dash = false
			continue
		}
		if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	v := b.String()
	if len(v) > 63 {
		v = v[:63]
	}
	v = strings.TrimRightFunc(v, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	})
	v = strings.TrimLeftFunc(v, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	})
	if v == "" {
		return "fleetcheck"
	}
	return v
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	if len(l) > 200 {
		l = l[:200]
	}
	return l
}
