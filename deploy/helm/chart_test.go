// Package helm holds the tests of the Helm chart in fleetcheck/: it is
// rendered with Helm's own Go SDK (the engine `helm install` runs), every
// object it renders is decoded strictly with client-go's scheme, its RBAC
// is compared with the calls the Kubernetes drain adapter makes, and its
// PrometheusRule with the shipped rules. Only this package pays for
// compiling Helm.
package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/coordinator"
	k8sdrain "github.com/fleetcheck/fleetcheck/internal/drain/kubernetes"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

const (
	chartDir    = "fleetcheck"
	shippedRule = "../prometheus/fleetcheck-rules.yml"
	chartRules  = "fleetcheck/files/fleetcheck-rules.yml"
	shippedDash = "../grafana/fleetcheck.json"
	chartDash   = "fleetcheck/files/fleetcheck-dashboard.json"
	release     = "fc"
	namespace   = "gpu-health"
)

// nonDefault turns on everything optional.
const nonDefault = `
trustDomain: gpu.example.org
tls:
  source: cert-manager
  certManager:
    issuerRef: {name: fleet-ca, kind: ClusterIssuer, group: cert-manager.io}
agent:
  runtimeClassName: nvidia
  privileged: false
  infiniband: false
  config:
    interval: 2m
coordinator:
  persistence: {storageClassName: fast-ssd, size: 50Gi}
metrics:
  serviceMonitor: {enabled: true, labels: {release: prom}}
  prometheusRule: {enabled: true}
  grafanaDashboard: {enabled: true, annotations: {grafana_folder: GPU fleet}}
`

// crdKinds are the kinds client-go's scheme does not know: they decode
// as unstructured, and only these may appear.
var crdKinds = map[string]string{
	"ServiceMonitor": "monitoring.coreos.com/v1",
	"PrometheusRule": "monitoring.coreos.com/v1",
	"Certificate":    "cert-manager.io/v1",
}

type rendered struct {
	typed   []runtime.Object
	crds    []*unstructured.Unstructured
	configs map[string]string // ConfigMap key → content
	notes   string            // what helm install prints
}

func render(t *testing.T, values string) (rendered, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return rendered{}, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return rendered{}, err
	}
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	out := rendered{configs: map[string]string{}, notes: files[chartDir+"/templates/NOTES.txt"]}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if path.Ext(name) != ".yaml" {
			continue // _helpers.tpl
		}
		for _, doc := range releaseutil.SplitManifests(files[name]) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("%s: not YAML: %v\n%s", name, err, doc)
			}
			if want, ok := crdKinds[u.GetKind()]; ok {
				if u.GetAPIVersion() != want {
					t.Errorf("%s: %s has apiVersion %q, want %q", name, u.GetKind(), u.GetAPIVersion(), want)
				}
				out.crds = append(out.crds, &u)
				continue
			}
			obj, _, err := strict.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Errorf("%s: strict decode: %v\n%s", name, err, doc)
				continue
			}
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				for k, v := range cm.Data {
					out.configs[k] = v
				}
			}
			out.typed = append(out.typed, obj)
		}
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func (r rendered) kinds() []string {
	var ks []string
	for _, o := range r.typed {
		ks = append(ks, reflect.TypeOf(o).Elem().Name())
	}
	for _, u := range r.crds {
		ks = append(ks, u.GetKind())
	}
	sort.Strings(ks)
	return ks
}

func find[T runtime.Object](t *testing.T, r rendered) T {
	t.Helper()
	for _, o := range r.typed {
		if v, ok := o.(T); ok {
			return v
		}
	}
	var zero T
	t.Fatalf("no %T rendered", zero)
	return zero
}

func findCRD(t *testing.T, r rendered, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, u := range r.crds {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// TestChartRenders renders the chart (chart files fleetcheck/Chart.yaml,
// fleetcheck/values.yaml and fleetcheck/templates/*) with default and
// non-default values and checks what each choice renders.
func TestChartRenders(t *testing.T) {
	t.Parallel()
	base := []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "ConfigMap", "DaemonSet", "Service", "ServiceAccount", "StatefulSet"}
	tests := []struct {
		name   string
		values string
		kinds  []string
		check  func(t *testing.T, r rendered)
	}{
		{"defaults", "", base, func(t *testing.T, r rendered) {
			for _, want := range []string{"Secret fleetcheck-nodes", "Secret fleetcheck-coordinator-tls", "port-forward svc/fc-fleetcheck-coordinator 7443"} {
				if !strings.Contains(r.notes, want) {
					t.Errorf("NOTES.txt lacks %q:\n%s", want, r.notes)
				}
			}
			if !strings.Contains(r.configs["agent.yaml"], "coordinator: fc-fleetcheck-coordinator.gpu-health.svc:7443\n") {
				t.Errorf("agents do not dial the coordinator Service:\n%s", r.configs["agent.yaml"])
			}
			ds := find[*appsv1.DaemonSet](t, r)
			ps := ds.Spec.Template.Spec
			if ps.RuntimeClassName != nil {
				t.Errorf("runtimeClassName %q by default", *ps.RuntimeClassName)
			}
			if !ps.HostPID || !ps.HostNetwork || ps.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
				t.Errorf("hostPID %v hostNetwork %v dnsPolicy %q", ps.HostPID, ps.HostNetwork, ps.DNSPolicy)
			}
			if ps.NodeSelector["nvidia.com/gpu.present"] != "true" {
				t.Errorf("nodeSelector %v: not GPU nodes", ps.NodeSelector)
			}
			if !slices.ContainsFunc(ps.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == k8sdrain.TaintKey }) {
				t.Errorf("tolerations %v: the agent would leave the nodes fleetcheck drains", ps.Tolerations)
			}
			c := ps.Containers[0]
			if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Errorf("agent securityContext %+v: want privileged by default", c.SecurityContext)
			}
			hostPaths := map[string]corev1.HostPathType{}
			for _, v := range ps.Volumes {
				if v.HostPath != nil {
					hostPaths[v.HostPath.Path] = *v.HostPath.Type
				}
			}
			want := map[string]corev1.HostPathType{"/sys": corev1.HostPathDirectory, "/proc": corev1.HostPathDirectory,
				"/dev/kmsg": corev1.HostPathCharDev, "/dev/infiniband": corev1.HostPathDirectory,
				"/var/lib/fleetcheck-agent": corev1.HostPathDirectoryOrCreate}
			if !reflect.DeepEqual(hostPaths, want) {
				t.Errorf("host paths %v, want %v", hostPaths, want)
			}
			var certPaths []string
			for _, m := range c.VolumeMounts {
				if m.Name == "tls" {
					certPaths = append(certPaths, m.SubPath+m.SubPathExpr)
				}
			}
			if !reflect.DeepEqual(certPaths, []string{"ca.crt", "node-$(NODE_NAME).crt", "node-$(NODE_NAME).key"}) {
				t.Errorf("agent certificate mounts %v: each agent must mount its own node's pair", certPaths)
			}
			ss := find[*appsv1.StatefulSet](t, r)
			if len(ss.Spec.VolumeClaimTemplates) != 1 || ss.Spec.VolumeClaimTemplates[0].Spec.StorageClassName != nil {
				t.Errorf("coordinator volume %+v", ss.Spec.VolumeClaimTemplates)
			}
			if s := secretOf(ss.Spec.Template.Spec.Volumes, "tls"); s != "fleetcheck-coordinator-tls" {
				t.Errorf("coordinator TLS secret %q", s)
			}
			svc := find[*corev1.Service](t, r)
			var ports []string
			for _, p := range svc.Spec.Ports {
				ports = append(ports, p.Name+":"+p.TargetPort.String())
			}
			if !reflect.DeepEqual(ports, []string{"grpc:grpc", "http:http"}) {
				t.Errorf("service ports %v", ports)
			}
		}},
		{"non-default", nonDefault, sorted(append(slices.Clone(base), "Certificate", "ConfigMap", "PrometheusRule", "Service", "ServiceMonitor", "ServiceMonitor")), func(t *testing.T, r rendered) {
			ps := find[*appsv1.DaemonSet](t, r).Spec.Template.Spec
			if ps.RuntimeClassName == nil || *ps.RuntimeClassName != "nvidia" {
				t.Errorf("runtimeClassName %v, want nvidia", ps.RuntimeClassName)
			}
			sc := ps.Containers[0].SecurityContext
			if sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil ||
				!reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
				!reflect.DeepEqual(sc.Capabilities.Add, []corev1.Capability{"SYSLOG", "SYS_ADMIN", "SYS_RAWIO", "NET_ADMIN", "IPC_LOCK", "KILL"}) {
				t.Errorf("unprivileged agent securityContext %+v", sc)
			}
			for _, v := range ps.Volumes {
				if v.HostPath != nil && v.HostPath.Path == "/dev/infiniband" {
					t.Error("/dev/infiniband mounted with infiniband: false")
				}
			}
			ss := find[*appsv1.StatefulSet](t, r)
			if sc := ss.Spec.VolumeClaimTemplates[0].Spec.StorageClassName; sc == nil || *sc != "fast-ssd" {
				t.Errorf("storage class %v", sc)
			}
			cert := findCRD(t, r, "Certificate", "fc-fleetcheck-coordinator")
			secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
			if got := secretOf(ss.Spec.Template.Spec.Volumes, "tls"); got != secret {
				t.Errorf("coordinator mounts secret %q, cert-manager writes %q", got, secret)
			}
			uris, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "uris")
			if !reflect.DeepEqual(uris, []string{"spiffe://gpu.example.org/coordinator/coord-1"}) {
				t.Errorf("certificate URIs %v", uris)
			}
			dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
			if !slices.Contains(dns, "fc-fleetcheck-coordinator.gpu-health.svc") {
				t.Errorf("certificate DNS names %v lack the Service agents dial", dns)
			}
			issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "kind")
			if issuer != "ClusterIssuer" {
				t.Errorf("issuerRef kind %q", issuer)
			}
			for _, sm := range []string{"fc-fleetcheck-coordinator", "fc-fleetcheck-agent"} {
				u := findCRD(t, r, "ServiceMonitor", sm)
				if u.GetLabels()["release"] != "prom" {
					t.Errorf("ServiceMonitor %s labels %v", sm, u.GetLabels())
				}
				if jl, _, _ := unstructured.NestedString(u.Object, "spec", "jobLabel"); jl != "fleetcheck.io/job" {
					t.Errorf("ServiceMonitor %s jobLabel %q", sm, jl)
				}
			}
			// The job names the shipped rules expect come from the Services.
			jobs := map[string]bool{}
			for _, o := range r.typed {
				if s, ok := o.(*corev1.Service); ok {
					jobs[s.Labels["fleetcheck.io/job"]] = true
				}
			}
			if !jobs["fleetcheck-coordinator"] || !jobs["fleetcheck-agent"] {
				t.Errorf("scrape jobs %v", jobs)
			}
			if !strings.Contains(r.notes, "from cert-manager (ClusterIssuer fleet-ca)") {
				t.Errorf("NOTES.txt does not name the issuer:\n%s", r.notes)
			}
			if !strings.Contains(r.configs["agent.yaml"], "interval: 2m") {
				t.Errorf("agent.config did not reach agent.yaml:\n%s", r.configs["agent.yaml"])
			}
		}},
		{"agents of a node pool only", "coordinator: {enabled: false}\nagent: {coordinator: \"coord.gpu-health.svc:7443\", tls: {secretName: pool-b-nodes}}", []string{"ConfigMap", "DaemonSet"}, func(t *testing.T, r rendered) {
			if !strings.Contains(r.configs["agent.yaml"], "coordinator: coord.gpu-health.svc:7443\n") {
				t.Errorf("agent.coordinator did not reach agent.yaml:\n%s", r.configs["agent.yaml"])
			}
			if s := secretOf(find[*appsv1.DaemonSet](t, r).Spec.Template.Spec.Volumes, "tls"); s != "pool-b-nodes" {
				t.Errorf("agent TLS secret %q", s)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.kinds(); !reflect.DeepEqual(got, tc.kinds) {
				t.Errorf("kinds %v\nwant  %v", got, tc.kinds)
			}
			for _, o := range r.typed {
				m, err := metaOf(o)
				if err != nil {
					t.Fatal(err)
				}
				if _, cluster := o.(*rbacv1.ClusterRole); !cluster && m.GetNamespace() == "" {
					if _, crb := o.(*rbacv1.ClusterRoleBinding); !crb {
						t.Errorf("%T %s has no namespace", o, m.GetName())
					}
				}
			}
			// The configs the chart writes load as the binaries load them.
			if _, err := agent.ParseConfig([]byte(r.configs["agent.yaml"])); err != nil {
				t.Errorf("agent.yaml: %v\n%s", err, r.configs["agent.yaml"])
			}
			if _, ok := r.configs["coordinator.yaml"]; !ok {
				tc.check(t, r)
				return
			}
			cc, err := coordinator.ParseConfig([]byte(r.configs["coordinator.yaml"]))
			if err != nil {
				t.Errorf("coordinator.yaml: %v\n%s", err, r.configs["coordinator.yaml"])
			} else if cc.Drain.Adapter != "kubernetes" {
				t.Errorf("coordinator drain adapter %q, want kubernetes", cc.Drain.Adapter)
			}
			tc.check(t, r)
		})
	}
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	type m interface{ GetObjectMeta() metav1.Object }
	return o.(m).GetObjectMeta(), nil
}

func secretOf(vols []corev1.Volume, name string) string {
	for _, v := range vols {
		if v.Name == name && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

// TestChartRefusesBadValues: a value the chart cannot honour stops the
// install with a message naming it.
func TestChartRefusesBadValues(t *testing.T) {
	t.Parallel()
	_, err := render(t, "tls: {source: vault}")
	if err == nil || !strings.Contains(err.Error(), `tls.source "vault"`) {
		t.Fatalf("tls.source vault: %v", err)
	}
}

// TestRBACIsExactlyWhatTheAdapterCalls runs the Kubernetes drain adapter
// over a fake clientset (drain, status, the fleet's unavailable nodes,
// node conditions, undrain), records every (resource, verb) it called, and
// compares them with the rendered ClusterRole: a verb missing from the
// role breaks drains in a cluster; one more is a grant nobody uses.
func TestRBACIsExactlyWhatTheAdapterCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	yes := true
	cs := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-0",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train", UID: "u1", Controller: &yes}}},
			Spec: corev1.PodSpec{NodeName: "gpu-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
	)
	// The API server's eviction deletes the pod; the fake's does not.
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(metav1.Object)
		return true, nil, cs.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ev.GetNamespace(), ev.GetName())
	})
	a := k8sdrain.New(cs, k8sdrain.Options{})
	if _, err := a.Status(ctx, "gpu-1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Drain(ctx, "gpu-1", "sweep s-1: gpu.ecc"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Unavailable(ctx); err != nil {
		t.Fatal(err)
	}
	conds := k8sdrain.AreaConditions([]report.CheckResult{{Name: "gpu.ecc", Status: report.Fail}, {Name: "ib.ports", Status: report.Pass}})
	if err := a.SetConditions(ctx, "gpu-1", conds); err != nil {
		t.Fatal(err)
	}
	if err := a.Undrain(ctx, "gpu-1"); err != nil {
		t.Fatal(err)
	}
	called := map[string]bool{}
	for _, act := range cs.Actions() {
		res := act.GetResource().Resource
		if sub := act.GetSubresource(); sub != "" {
			res += "/" + sub
		}
		called[res+" "+act.GetVerb()] = true
	}

	r, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	role := find[*rbacv1.ClusterRole](t, r)
	granted := map[string]bool{}
	for _, rule := range role.Rules {
		if !reflect.DeepEqual(rule.APIGroups, []string{""}) || len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
			t.Errorf("rule %+v: the adapter uses only the core group, by resource", rule)
		}
		for _, res := range rule.Resources {
			for _, v := range rule.Verbs {
				granted[res+" "+v] = true
			}
		}
	}
	if !reflect.DeepEqual(called, granted) {
		t.Errorf("the adapter called %v\nthe ClusterRole grants %v", keys(called), keys(granted))
	}
	if len(called) < 5 {
		t.Errorf("only %v recorded: the run did not exercise the adapter", keys(called))
	}
	binding := find[*rbacv1.ClusterRoleBinding](t, r)
	sa := find[*corev1.ServiceAccount](t, r)
	ss := find[*appsv1.StatefulSet](t, r)
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.Name ||
		binding.Subjects[0].Namespace != namespace || ss.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("binding %+v does not bind role %s to the coordinator's account %s (pod runs as %q)",
			binding, role.Name, sa.Name, ss.Spec.Template.Spec.ServiceAccountName)
	}
}

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestPrometheusRuleIsShippedRules: the chart's copy of the rules
// (fleetcheck/files/fleetcheck-rules.yml, because .Files.Get reads only
// inside the chart) is byte for byte deploy/prometheus/fleetcheck-rules.yml,
// and the rendered PrometheusRule carries exactly its groups.
func TestPrometheusRuleIsShippedRules(t *testing.T) {
	t.Parallel()
	shipped, err := os.ReadFile(shippedRule)
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(chartRules)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, copied) {
		t.Fatalf("%s differs from %s: cp %s %s", chartRules, shippedRule, shippedRule, chartRules)
	}
	r, err := render(t, "metrics: {prometheusRule: {enabled: true}}")
	if err != nil {
		t.Fatal(err)
	}
	pr := findCRD(t, r, "PrometheusRule", "fc-fleetcheck")
	var want map[string]any
	if err := yaml.Unmarshal(shipped, &want); err != nil {
		t.Fatal(err)
	}
	got, _, _ := unstructured.NestedFieldNoCopy(pr.Object, "spec")
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if !bytes.Equal(gj, wj) {
		t.Errorf("PrometheusRule spec differs from %s:\n got %s\nwant %s", shippedRule, gj, wj)
	}
	if groups, _ := want["groups"].([]any); len(groups) < 2 {
		t.Fatalf("%s has %d groups: read the wrong file?", shippedRule, len(groups))
	}
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}

// TestGrafanaDashboardIsShipped: the chart's copy of the dashboard
// (fleetcheck/files/fleetcheck-dashboard.json, because .Files.Get reads
// only inside the chart) is byte for byte deploy/grafana/fleetcheck.json,
// and metrics.grafanaDashboard renders it as the ConfigMap Grafana's
// sidecar loads: its label, the annotations and namespace asked for.
func TestGrafanaDashboardIsShipped(t *testing.T) {
	t.Parallel()
	shipped, err := os.ReadFile(shippedDash)
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(chartDash)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, copied) {
		t.Fatalf("%s differs from %s: cp %s %s", chartDash, shippedDash, shippedDash, chartDash)
	}
	dashboardMap := func(r rendered) *corev1.ConfigMap {
		for _, o := range r.typed {
			if cm, ok := o.(*corev1.ConfigMap); ok && cm.Name == "fc-fleetcheck-grafana-dashboard" {
				return cm
			}
		}
		return nil
	}
	r, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if cm := dashboardMap(r); cm != nil {
		t.Errorf("dashboard ConfigMap rendered by default: %s", cm.Name)
	}
	r, err = render(t, "metrics: {grafanaDashboard: {enabled: true, namespace: monitoring, annotations: {grafana_folder: GPU fleet}}}")
	if err != nil {
		t.Fatal(err)
	}
	cm := dashboardMap(r)
	if cm == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "GPU fleet" || cm.Namespace != "monitoring" {
		t.Errorf("ConfigMap %s/%s labels %v annotations %v", cm.Namespace, cm.Name, cm.Labels, cm.Annotations)
	}
	got := cm.Data["fleetcheck.json"]
	if strings.TrimSpace(got) != strings.TrimSpace(string(shipped)) {
		t.Errorf("ConfigMap's fleetcheck.json differs from %s (%d bytes, want %d)", shippedDash, len(got), len(shipped))
	}
	var model map[string]any
	if err := json.Unmarshal([]byte(got), &model); err != nil || model["uid"] != "fleetcheck-fleet" {
		t.Errorf("rendered dashboard is not the model: uid %v, %v", model["uid"], err)
	}
}
