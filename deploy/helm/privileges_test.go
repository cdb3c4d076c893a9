package helm

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

const (
	deployDoc = "../../docs/deploy.md"
	agentUnit = "../systemd/fleetcheck-agent.service"
)

// privilegeRows returns the rows of docs/deploy.md "The agent's
// privileges" table: privilege, systemd, Helm, why.
func privilegeRows(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(deployDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## The agent's privileges\n")
	if !ok {
		t.Fatalf("%s has no section \"The agent's privileges\"", deployDoc)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var rows [][]string
	for line := range strings.SplitSeq(sec, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| ---") || strings.HasPrefix(line, "| privilege ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 {
			t.Fatalf("privileges row with %d cells, want 4: %s", len(cells), line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) == 0 {
		t.Fatal("the privileges table has no rows")
	}
	return rows
}

// unitCaps is the agent unit's CapabilityBoundingSet.
func unitCaps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(agentUnit)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapabilityBoundingSet="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("%s sets no CapabilityBoundingSet", agentUnit)
	return nil
}

func agentPod(t *testing.T, values string) corev1.PodSpec {
	t.Helper()
	r, err := render(t, values)
	if err != nil {
		t.Fatal(err)
	}
	return find[*appsv1.DaemonSet](t, r).Spec.Template.Spec
}

// TestAgentPrivilegesAgree: what docs/deploy.md says the agent is given is
// what the systemd unit and the Helm DaemonSet give it, capability by
// capability and host path by host path.
func TestAgentPrivilegesAgree(t *testing.T) {
	t.Parallel()
	rows := privilegeRows(t)
	var docCaps, docHostPaths []string
	docSays := map[string]bool{}
	for _, r := range rows {
		name := strings.Trim(r[0], "`")
		if strings.HasPrefix(name, "CAP_") {
			docCaps = append(docCaps, name)
		}
		if strings.HasPrefix(r[2], "hostPath") {
			docHostPaths = append(docHostPaths, name)
		}
		docSays[r[2]] = true
	}

	if got := unitCaps(t); !slices.Equal(sorted(docCaps), sorted(got)) {
		t.Errorf("capabilities: docs/deploy.md %v, the systemd unit %v", sorted(docCaps), sorted(got))
	}

	// privileged: false leaves the DaemonSet with exactly agent.capabilities.
	unpriv := agentPod(t, "agent: {privileged: false}\n")
	var helmCaps []string
	for _, c := range unpriv.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil {
			t.Fatalf("container %s: no capabilities with privileged false", c.Name)
		}
		if !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s drops %v, want ALL", c.Name, sc.Capabilities.Drop)
		}
		for _, a := range sc.Capabilities.Add {
			helmCaps = append(helmCaps, "CAP_"+string(a))
		}
	}
	if !slices.Equal(sorted(docCaps), sorted(helmCaps)) {
		t.Errorf("capabilities: docs/deploy.md %v, the Helm DaemonSet %v", sorted(docCaps), sorted(helmCaps))
	}

	pod := agentPod(t, "")
	var hostPaths []string
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	if !slices.Equal(sorted(docHostPaths), sorted(hostPaths)) {
		t.Errorf("host paths: docs/deploy.md %v, the Helm DaemonSet %v", sorted(docHostPaths), sorted(hostPaths))
	}
	for _, c := range []struct {
		doc  string
		set  bool
		what string
	}{
		{"`hostPID: true`", pod.HostPID, "hostPID"},
		{"`hostNetwork: true`", pod.HostNetwork, "hostNetwork"},
		{"`privileged: true` (`agent.privileged`)", len(pod.Containers) > 0 && pod.Containers[0].SecurityContext != nil &&
			pod.Containers[0].SecurityContext.Privileged != nil && *pod.Containers[0].SecurityContext.Privileged, "privileged"},
	} {
		if docSays[c.doc] != c.set {
			t.Errorf("%s: docs/deploy.md says %q: %v, the DaemonSet sets it: %v", c.what, c.doc, docSays[c.doc], c.set)
		}
	}
	for _, c := range pod.Containers {
		if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
			t.Errorf("container %s does not run as root whatever the image's user", c.Name)
		}
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the agent pod mounts a service account token; the docs say it has none")
	}

	// The unit's only writable path is the state dir the table names.
	unit, err := os.ReadFile(agentUnit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nReadWritePaths=/var/lib/fleetcheck-agent\n") || !slices.Contains(docHostPaths, "/var/lib/fleetcheck-agent") {
		t.Error("the state dir /var/lib/fleetcheck-agent is not the unit's ReadWritePaths and the table's hostPath both")
	}
}
