package fw

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

const matrixDoc = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.129.03", ">=550.90.07, <551"]
    vbios: ["96.00.99.*"]
fabric_manager:
  - driver: "*"
    version: same
hcas:
  - model: MT4129
    name: ConnectX-7
    min_firmware: 28.39.1002
  - model: MT4123
    firmware: ["20.39.*"]
rdma_stacks: ["MLNX_OFED >=23.10"]
kernels: [">=6.5.0-1007, <6.6"]
known_bad:
  - when: {driver: 550.54.14, vbios: 96.00.74.*}
    reason: Xid 79 on boot
`

func cfg(t *testing.T, doc string) *config.Config {
	t.Helper()
	c := config.Defaults()
	if doc != "" {
		m, err := compat.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		c.Matrix = m
	}
	return c
}

// h100Snap is an 8x H100 SXM node on the pinned tuple, all sources ok.
func h100Snap() *snapshot.Snapshot {
	s := &snapshot.Snapshot{
		Hostname: "gpu-017",
		Versions: snapshot.Versions{
			Kernel: "6.5.0-1007-nvidia", FabricManager: "535.129.03", RDMAStack: "MLNX_OFED 23.10-1.1.9.0",
		},
		GPU: &snapshot.GPUState{DriverVersion: "535.129.03", CUDAVersion: "12.2", AttachedGPUs: 8},
	}
	for i := 0; i < 8; i++ {
		s.GPU.GPUs = append(s.GPU.GPUs, snapshot.GPU{
			Index: i, Name: "NVIDIA H100 80GB HBM3", VBIOS: "96.00.99.00.01",
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
			Fabric:   &snapshot.Fabric{State: "Completed", Status: "Success"},
		})
		s.HCAs = append(s.HCAs, snapshot.HCA{Name: fmt.Sprintf("mlx5_%d", i), Model: "MT4129", FWVersion: "28.39.1002"})
	}
	for _, src := range []snapshot.Source{snapshot.SrcNvidiaSMI, snapshot.SrcInfiniBand, snapshot.SrcVersions} {
		s.SetSource(src, snapshot.SourceState{State: snapshot.StateOK})
	}
	return s
}

type finding struct {
	sev       report.Severity
	component string
	code      string
}

func TestMatrixCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		matrix   string // "" for no matrix
		edit     func(*snapshot.Snapshot, *config.Config)
		status   report.Status
		findings []finding
		reason   string // substring
		message  string // substring of the first finding
	}{
		{name: "pinned tuple passes", matrix: matrixDoc, status: report.Pass},
		{name: "no matrix skips", status: report.Skip, reason: "no compatibility matrix configured"},
		{name: "matrix_file not loaded errors", edit: func(_ *snapshot.Snapshot, c *config.Config) { c.MatrixFile = "matrix.yaml" },
			status: report.Error, reason: `matrix_file "matrix.yaml" was not loaded`},
		{name: "GPU source failed errors", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.GPU = nil
			s.SetSource(snapshot.SrcNvidiaSMI, snapshot.SourceState{State: snapshot.StateFailed, Error: "exit status 15"})
		}, status: report.Error, reason: "exit status 15"},
		{name: "GPU source timeout errors", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.GPU = nil
			s.SetSource(snapshot.SrcNvidiaSMI, snapshot.SourceState{State: snapshot.StateTimeout})
		}, status: report.Error, reason: "timed out"},
		{name: "driver not allowed", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.GPU.DriverVersion, s.Versions.FabricManager = "545.23.08", "545.23.08"
		}, status: report.Fail, findings: []finding{{report.SevFail, "node", CodeDriverNotAllowed}},
			message: "driver 545.23.08 is not allowed"},
		{name: "fabric manager mismatch", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.Versions.FabricManager = "535.104.05"
		}, status: report.Fail, findings: []finding{{report.SevFail, "node", CodeFabricManager}},
			message: "Fabric Manager 535.104.05 does not match driver 535.129.03"},
		{name: "no NVSwitch by config: FM not judged", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, c *config.Config) {
			no := false
			c.Expect.NVSwitch = &no
			s.Versions.FabricManager = ""
			for i := range s.GPU.GPUs {
				s.GPU.GPUs[i].Fabric = nil
			}
		}, status: report.Pass},
		{name: "VBIOS per GPU with bus id", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.GPU.GPUs[6].VBIOS = "96.00.74.00.02"
		}, status: report.Fail, findings: []finding{{report.SevFail, "GPU6", CodeVBIOSNotAllowed}}},
		{name: "HCA firmware too old", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.HCAs[4].FWVersion = "28.36.1010"
		}, status: report.Fail, findings: []finding{{report.SevFail, "mlx5_4", CodeHCAFirmwareTooOld}},
			message: "ConnectX-7 (MT4129) firmware 28.36.1010 is older than the minimum 28.39.1002"},
		{name: "HCA firmware not in list", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.HCAs = append(s.HCAs, snapshot.HCA{Name: "mlx5_8", Model: "MT4123", FWVersion: "20.38.1002"})
		}, status: report.Fail, findings: []finding{{report.SevFail, "mlx5_8", CodeHCAFirmware}}},
		{name: "RDMA stack", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.Versions.RDMAStack = "DOCA 2.10.0"
		}, status: report.Fail, findings: []finding{{report.SevFail, "node", CodeRDMAStack}}},
		{name: "kernel", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.Versions.Kernel = "5.15.0-91-generic"
		}, status: report.Fail, findings: []finding{{report.SevFail, "node", CodeKernel}}},
		{name: "known bad", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.GPU.DriverVersion, s.Versions.FabricManager = "550.54.14", "550.54.14"
			for i := range s.GPU.GPUs {
				s.GPU.GPUs[i].VBIOS = "96.00.99.00.01"
			}
			s.GPU.GPUs[1].VBIOS = "96.00.74.00.01"
		}, status: report.Fail, findings: []finding{
			{report.SevFail, "GPU1", CodeKnownBad},
			{report.SevFail, "GPU1", CodeVBIOSNotAllowed},
			{report.SevFail, "node", CodeDriverNotAllowed},
		}, message: "Xid 79 on boot"},
		{name: "kernel unknown warns", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.Versions.Kernel = ""
		}, status: report.Warn, findings: []finding{{report.SevWarn, "node", CodeUnknown}},
			reason: "inconclusive: 1 matrix rule(s)", message: "kernel: version unknown"},
		{name: "violation and unknown: fail with both", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.Versions.Kernel = ""
			s.HCAs[0].FWVersion = "28.38.1000"
		}, status: report.Fail, findings: []finding{
			{report.SevFail, "mlx5_0", CodeHCAFirmwareTooOld},
			{report.SevWarn, "node", CodeUnknown},
		}},
		{name: "GPU source absent: GPU rules unknown", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.GPU = nil
			delete(s.Sources, snapshot.SrcNvidiaSMI)
			s.Versions.Driver = "535.129.03"
		}, status: report.Warn, findings: []finding{{report.SevWarn, "node", CodeUnknown}},
			message: "gpus: no GPUs reported"},
		{name: "IB walk failed: HCA firmware unknown", matrix: matrixDoc, edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.HCAs = nil
			s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateFailed, Error: "permission denied"})
		}, status: report.Warn, findings: []finding{{report.SevWarn, "node", CodeUnknown}},
			message: "hcas: sysfs-infiniband failed"},
		{name: "IB walk failed without HCA rules is fine", matrix: "kernels: ['>=6.5, <6.6']\n", edit: func(s *snapshot.Snapshot, _ *config.Config) {
			s.HCAs = nil
			s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateTimeout})
		}, status: report.Pass},
		{name: "nothing applies warns", matrix: "hcas:\n  - model: MT4123\n    min_firmware: 20.39.1002\n",
			status: report.Warn, findings: []finding{{report.SevWarn, "node", CodeUnknown}},
			reason: "no matrix rule applies", message: "no matrix rule applies"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := h100Snap()
			c := cfg(t, tc.matrix)
			if tc.edit != nil {
				tc.edit(s, c)
			}
			res := checks.Run([]checks.Check{Matrix{}}, checks.Input{Snap: s, Config: c, Now: time.Now()})[0]
			if res.Name != "fw.matrix" {
				t.Errorf("name = %q", res.Name)
			}
			if res.Status != tc.status {
				t.Fatalf("status = %s, want %s (reason %q, findings %+v)", res.Status, tc.status, res.Reason, res.Findings)
			}
			if !strings.Contains(res.Reason, tc.reason) {
				t.Errorf("reason = %q, want it to contain %q", res.Reason, tc.reason)
			}
			// The runner sorts findings worst first, then by component.
			var got []finding
			for _, f := range res.Findings {
				got = append(got, finding{f.Severity, f.Component, f.Code})
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.findings) && !(len(got) == 0 && len(tc.findings) == 0) {
				t.Fatalf("findings = %v\nwant %v\n%+v", got, tc.findings, res.Findings)
			}
			if tc.message != "" && !strings.Contains(res.Findings[0].Message+res.Findings[len(res.Findings)-1].Message, tc.message) {
				t.Errorf("messages %+v do not contain %q", res.Findings, tc.message)
			}
			for _, f := range res.Findings {
				switch f.Severity {
				case report.SevFail:
					if f.Action != report.ActionDrain {
						t.Errorf("fail finding %s has action %s, want drain", f.Code, f.Action)
					}
				case report.SevWarn:
					if f.Action != report.ActionNone {
						t.Errorf("warn finding %s has action %s, want none", f.Code, f.Action)
					}
				}
				if strings.HasPrefix(f.Component, "GPU") && f.PCIBusID == "" {
					t.Errorf("GPU finding without bus id: %+v", f)
				}
			}
			if tc.status != report.Skip && tc.status != report.Error {
				if _, ok := res.Metrics["fw.matrix.checked_count"]; !ok {
					t.Errorf("metrics = %v", res.Metrics)
				}
				if got := res.Metrics["fw.matrix.violation_count"]; tc.status == report.Pass && got != 0 {
					t.Errorf("violation_count = %v on a pass", got)
				}
			}
		})
	}
}

func TestContract(t *testing.T) {
	t.Parallel()
	var c checks.Check = Matrix{}
	if c.Name() != "fw.matrix" || c.Needs() != nil || c.Disruptive() {
		t.Errorf("contract: %s %v %v", c.Name(), c.Needs(), c.Disruptive())
	}
	// A nil config skips rather than panicking.
	if r := c.Run(checks.Input{Snap: h100Snap()}); r.Status != report.Skip {
		t.Errorf("nil config: %+v", r)
	}
}

func TestBusIDOnGPUFindings(t *testing.T) {
	t.Parallel()
	s := h100Snap()
	s.GPU.GPUs[3].VBIOS = "96.00.61.00.01"
	r := Matrix{}.Run(checks.Input{Snap: s, Config: cfg(t, matrixDoc)})
	if len(r.Findings) != 1 || r.Findings[0].PCIBusID != "0000:48:00.0" {
		t.Errorf("%+v", r.Findings)
	}
}

// The shipped example config and matrix judge a healthy node as a pass.
func TestShippedExample(t *testing.T) {
	t.Parallel()
	c, err := config.Load(filepath.Join("..", "..", "examples", "node-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := Matrix{}.Run(checks.Input{Snap: h100Snap(), Config: c})
	if r.Status != report.Pass {
		t.Errorf("pinned node under the shipped example: %s %q %+v", r.Status, r.Reason, r.Findings)
	}
	s := h100Snap()
	s.Versions.FabricManager = "550.90.07" // FM upgraded ahead of the driver
	r = Matrix{}.Run(checks.Input{Snap: s, Config: c})
	if r.Status != report.Fail || r.Findings[0].Code != CodeFabricManager {
		t.Errorf("FM ahead of the driver: %s %+v", r.Status, r.Findings)
	}
}
