package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// smiReset is a fake nvidia-smi for the reset wrapper: SMI_GPU is the
// --query-gpu line ("" : no such GPU), SMI_APPS the compute processes,
// SMI_RESET a non-zero exit for -r.
const smiReset = `case "$1" in
--query-gpu=index*)
	if [ -z "${SMI_GPU:-}" ]; then echo "No devices were found"; exit 6; fi
	printf '%s\n' "$SMI_GPU" ;;
--query-gpu=pci.bus_id) echo "00000000:9B:00.0" ;;
--query-compute-apps=*) printf '%s' "${SMI_APPS:-}" ;;
-r)
	if [ "${SMI_RESET:-0}" != 0 ]; then echo "GPU 00000000:9B:00.0 is currently in use by another client."; exit "$SMI_RESET"; fi
	echo "GPU 00000000:9B:00.0 was successfully reset." ;;
esac
`

func TestGPUResetWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-gpu-reset"
	const gpu3 = "3, 00000000:9B:00.0, Enabled, Disabled"
	for _, tc := range []struct {
		name     string
		args     []string
		env      []string
		nvswitch bool
		code     int
		want     string   // in the output
		calls    []string // exactly these, in order
	}{
		{name: "idle GPU", args: []string{"3"}, env: []string{"SMI_GPU=" + gpu3}, code: 0, want: "is back",
			calls: []string{
				"nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode,mig.mode.current --format=csv,noheader -i 3",
				"nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name --format=csv,noheader",
				"nvidia-smi -r -i 3",
				"nvidia-smi -i 3 -pm 1",
				"nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 3",
			}},
		{name: "persistence off stays off", args: []string{"3"}, env: []string{"SMI_GPU=3, 00000000:9B:00.0, Disabled, [N/A]"}, code: 0,
			calls: []string{
				"nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode,mig.mode.current --format=csv,noheader -i 3",
				"nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name --format=csv,noheader",
				"nvidia-smi -r -i 3",
				"nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 3",
			}},
		{name: "a process on another GPU", args: []string{"3"}, env: []string{"SMI_GPU=" + gpu3, "SMI_APPS=00000000:1B:00.0, 4242, python3\n"}, code: 0, want: "is back"},
		{name: "busy GPU refused", args: []string{"3"}, env: []string{"SMI_GPU=" + gpu3, "SMI_APPS=00000000:9b:00.0, 4242, python3\n00000000:9B:00.0, 4243, python3\n"},
			code: 1, want: "in use by 4242 (python3), 4243 (python3)"},
		{name: "unknown GPU refused", args: []string{"7"}, code: 1, want: "not known to nvidia-smi"},
		{name: "MIG refused", args: []string{"3"}, env: []string{"SMI_GPU=3, 00000000:9B:00.0, Enabled, Enabled"}, code: 1, want: "MIG is enabled"},
		{name: "NVSwitch without Fabric Manager refused", args: []string{"3"}, env: []string{"SMI_GPU=" + gpu3, "FM_CODE=3"}, nvswitch: true,
			code: 1, want: "nvidia-fabricmanager is not active"},
		{name: "NVSwitch with Fabric Manager", args: []string{"3"}, env: []string{"SMI_GPU=" + gpu3, "FM_CODE=0"}, nvswitch: true, code: 0, want: "is back"},
		{name: "reset fails", args: []string{"3"}, env: []string{"SMI_GPU=" + gpu3, "SMI_RESET=255"}, code: 1, want: "in use by another client"},
		{name: "index too high", args: []string{"16"}, code: 2, want: "usage"},
		{name: "not an index", args: []string{"3;reboot"}, code: 2, want: "usage"},
		{name: "negative", args: []string{"-1"}, code: 2, want: "usage"},
		{name: "no argument", code: 2, want: "usage"},
		{name: "two arguments", args: []string{"3", "4"}, code: 2, want: "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			dev := filepath.Join(r.dir, "dev")
			if err := os.Mkdir(dev, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.nvswitch {
				if err := os.WriteFile(filepath.Join(dev, "nvidia-nvswitch0"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r.env = append([]string{"FLEETCHECK_DEV=" + dev}, tc.env...)
			r.script("nvidia-smi", smiReset)
			r.script("systemctl", `exit "${FM_CODE:-0}"`+"\n")
			out, code := r.run(script, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
			calls := r.calls()
			if tc.calls != nil && !slices.Equal(calls, tc.calls) {
				t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(tc.calls, "\n"))
			}
			if tc.code == 2 && len(calls) > 0 {
				t.Errorf("bad usage still called %q", calls)
			}
			if reset := contains(calls, "nvidia-smi -r -i "+strings.Join(tc.args, " ")); reset != (tc.code == 0 || tc.name == "reset fails") {
				t.Errorf("reset called %v (exit %d): %q", reset, code, calls)
			}
			if tc.nvswitch && !contains(calls, "systemctl is-active --quiet nvidia-fabricmanager") {
				t.Errorf("Fabric Manager not asked about: %q", calls)
			}
		})
	}
}

func TestIBPortResetWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-ib-port-reset"
	for _, tc := range []struct {
		name   string
		args   []string
		env    []string
		after  string // what ibportstate leaves in the port's state file ("": unchanged)
		ibCode int
		code   int
		want   string
		sleeps int
	}{
		{name: "back at once", args: []string{"mlx5_0", "1"}, after: "4: ACTIVE", code: 0, want: "is 4: ACTIVE again"},
		{name: "never back", args: []string{"mlx5_0", "1"}, env: []string{"FLEETCHECK_IB_WAIT=3"}, code: 1, want: "not ACTIVE within 3s (now 1: DOWN)", sleeps: 3},
		{name: "ibportstate fails", args: []string{"mlx5_0", "1"}, ibCode: 1, code: 1, want: "ibportstate reset failed"},
		{name: "no such HCA", args: []string{"mlx5_3", "1"}, code: 1, want: "no such port"},
		{name: "no such port", args: []string{"mlx5_0", "2"}, code: 1, want: "no such port"},
		{name: "not an HCA", args: []string{"eth0", "1"}, code: 2, want: "usage"},
		{name: "path in the HCA", args: []string{"mlx5_0/../x", "1"}, code: 2, want: "usage"},
		{name: "bad port", args: []string{"mlx5_0", "9"}, code: 2, want: "usage"},
		{name: "one argument", args: []string{"mlx5_0"}, code: 2, want: "usage"},
		{name: "wait out of range", args: []string{"mlx5_0", "1"}, env: []string{"FLEETCHECK_IB_WAIT=601"}, code: 2, want: "at most 600"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			sys := filepath.Join(r.dir, "sys")
			port := filepath.Join(sys, "class", "infiniband", "mlx5_0", "ports", "1")
			if err := os.MkdirAll(port, 0o755); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(port, "state")
			if err := os.WriteFile(state, []byte("1: DOWN\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r.env = append([]string{"FLEETCHECK_SYSFS=" + sys, "STATE=" + state, "AFTER=" + tc.after, "IB_CODE=" + string(rune('0'+tc.ibCode))}, tc.env...)
			r.script("ibportstate", `if [ -n "$AFTER" ]; then echo "$AFTER" >"$STATE"; fi`+"\n"+`exit "$IB_CODE"`+"\n")
			r.tool("sleep", "", 0)
			out, code := r.run(script, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
			calls := r.calls()
			reset := called(calls, "ibportstate")
			if want := tc.code == 0 || tc.sleeps > 0 || tc.ibCode != 0; reset != want {
				t.Errorf("ibportstate called %v, want %v: %q", reset, want, calls)
			}
			if reset && !contains(calls, "ibportstate -C mlx5_0 -P 1 -D 0 1 reset") {
				t.Errorf("calls %q", calls)
			}
			n := 0
			for _, c := range calls {
				if c == "sleep 1" {
					n++
				}
			}
			if n != tc.sleeps {
				t.Errorf("%d sleeps, want %d", n, tc.sleeps)
			}
		})
	}
}

func TestRebootWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-reboot"
	for _, tc := range []struct {
		name    string
		args    []string
		apps    string
		smiCode int
		sysCode int
		code    int
		want    string
		reboot  bool
	}{
		{name: "idle node", code: 0, want: "reboot queued", reboot: true},
		{name: "busy node refused", apps: "4242, python3\n", code: 1, want: "in use by 4242 (python3)"},
		{name: "GPU off the bus still reboots", smiCode: 15, code: 0, want: "rebooting anyway", reboot: true},
		{name: "systemctl fails", sysCode: 1, code: 1, want: "systemctl reboot failed", reboot: true},
		{name: "bad usage", args: []string{"now"}, code: 2, want: "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			r.tool("nvidia-smi", tc.apps, tc.smiCode)
			r.tool("systemctl", "", tc.sysCode)
			out, code := r.run(script, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
			calls := r.calls()
			if got := contains(calls, "systemctl --no-block reboot"); got != tc.reboot {
				t.Errorf("reboot asked %v, want %v: %q", got, tc.reboot, calls)
			}
			if tc.code == 2 && len(calls) > 0 {
				t.Errorf("bad usage still called %q", calls)
			}
		})
	}
}

func TestCollectBundleWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-collect-bundle"
	t.Run("collects and keeps the newest", func(t *testing.T) {
		t.Parallel()
		r := newFakeRoot(t)
		dir := filepath.Join(r.dir, "bundles")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var old []string
		for _, ts := range []string{"20261101T000000Z", "20261102T000000Z", "20261103T000000Z", "20261104T000000Z", "20261105T000000Z"} {
			p := filepath.Join(dir, "gpu-007-"+ts+".tar.gz")
			if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			old = append(old, p)
		}
		r.env = []string{"FLEETCHECK_BUNDLE_DIR=" + dir, "FLEETCHECK_BUNDLE_KEEP=3"}
		r.tool("hostname", "gpu-007\n", 0)
		r.tool("date", "20261202T051500Z\n", 0)
		r.script("fleetcheck-node", `echo bundle >"$2"; echo "wrote $2: 42 files, 1000 bytes"`+"\n")
		out, code := r.run(script)
		want := filepath.Join(dir, "gpu-007-20261202T051500Z.tar.gz")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 0 || lines[len(lines)-1] != "bundle "+want {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if c := r.calls(); !contains(c, "fleetcheck-node collect "+want) {
			t.Errorf("calls %q", c)
		}
		left, err := filepath.Glob(filepath.Join(dir, "*.tar.gz"))
		if err != nil {
			t.Fatal(err)
		}
		if wantLeft := []string{old[3], old[4], want}; !slices.Equal(left, wantLeft) {
			t.Errorf("left %q, want %q", left, wantLeft)
		}
	})
	for _, tc := range []struct {
		name string
		env  []string
		node int
		code int
		want string
	}{
		{name: "collect fails", node: 1, code: 1, want: "collect failed"},
		{name: "keep zero", env: []string{"FLEETCHECK_BUNDLE_KEEP=0"}, code: 2, want: "want 1-50"},
		{name: "keep too many", env: []string{"FLEETCHECK_BUNDLE_KEEP=51"}, code: 2, want: "at most 50"},
		{name: "relative dir", env: []string{"FLEETCHECK_BUNDLE_DIR=bundles"}, code: 2, want: "absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			r.env = append([]string{"FLEETCHECK_BUNDLE_DIR=" + filepath.Join(r.dir, "bundles")}, tc.env...)
			r.tool("hostname", "gpu-007\n", 0)
			r.tool("date", "20261202T051500Z\n", 0)
			r.tool("fleetcheck-node", "", tc.node)
			out, code := r.run(script)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
			if left, _ := filepath.Glob(filepath.Join(r.dir, "bundles", "*.tar.gz")); len(left) > 0 {
				t.Errorf("left %q behind", left)
			}
		})
	}
}
