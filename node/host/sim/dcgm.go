package sim

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

// dcgmi diag -j in the DCGM 3.x shape ("DCGM GPU Diagnostic", gpu_ids),
// which is what a driver 535 fleet runs.
type dcgmDoc struct {
	Diag dcgmBody `json:"DCGM GPU Diagnostic"`
}

type dcgmBody struct {
	Categories []dcgmCategory `json:"test_categories"`
	Version    string         `json:"version"`
}

type dcgmCategory struct {
	Category string      `json:"category"`
	Tests    []*dcgmTest `json:"tests"` // nil members print as null, as DCGM 3.x does
}

type dcgmTest struct {
	Name    string       `json:"name"`
	Results []dcgmResult `json:"results"`
}

type dcgmResult struct {
	GPUIDs   string        `json:"gpu_ids"`
	Status   string        `json:"status"`
	Warnings []dcgmWarning `json:"warnings,omitempty"`
}

type dcgmWarning struct {
	Warning string `json:"warning"`
	ErrorID int    `json:"error_id,omitempty"`
}

// DCGM error codes (dcgm_errors.h) for the warnings the simulator emits.
const (
	dcgmFRVolatileDBE     = 4
	dcgmFRRowRemapFailure = 80
	dcgmFRPendingRowRemap = 85
)

// renderDCGM is `dcgmi diag -r LEVEL -j`. A failed test makes dcgmi exit
// 226 with the JSON still complete, so the capture stays ok.
func (n *Node) renderDCGM(f frame, level int) host.Capture {
	var ids []string
	var present []int
	for i := range n.spec.GPUs {
		if !f.v.gpus[i].missing {
			ids = append(ids, strconv.Itoa(i))
			present = append(present, i)
		}
	}
	all := strings.Join(ids, ",")
	failed := false

	// Deployment tests report once for all GPUs.
	deploy := []string{"Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS-related Blocks",
		"Persistence Mode", "Environmental Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom"}
	dep := dcgmCategory{Category: "Deployment"}
	for k, name := range deploy {
		r := dcgmResult{GPUIDs: all, Status: "PASS"}
		for _, i := range present {
			gf := &f.v.gpus[i]
			if name == "Page Retirement/Row Remap" {
				if gf.eccVolatile > 0 {
					r.Warnings = append(r.Warnings, dcgmWarning{fmt.Sprintf("Detected %d volatile double-bit ECC error(s) in GPU %d.", gf.eccVolatile, i), dcgmFRVolatileDBE})
				}
				if gf.remapFailure {
					r.Warnings = append(r.Warnings, dcgmWarning{fmt.Sprintf("GPU %d had uncorrectable memory errors and row remapping failed.", i), dcgmFRRowRemapFailure})
				}
				if gf.remapPending {
					r.Warnings = append(r.Warnings, dcgmWarning{fmt.Sprintf("GPU %d had uncorrectable memory errors that have not been remapped yet: reset the GPU.", i), dcgmFRPendingRowRemap})
				}
			}
			for _, d := range gf.dcgm {
				if d.Test == name {
					r.Warnings = append(r.Warnings, dcgmWarning{Warning: d.Warning})
				}
			}
		}
		if len(r.Warnings) > 0 {
			r.Status = "FAIL"
			failed = true
		}
		if k > 0 {
			dep.Tests = append(dep.Tests, nil)
		}
		dep.Tests = append(dep.Tests, &dcgmTest{Name: name, Results: []dcgmResult{r}})
	}
	doc := dcgmDoc{Diag: dcgmBody{Categories: []dcgmCategory{dep}, Version: n.spec.DCGM}}

	perGPU := func(name string, check func(i int, gf *gpuFaults) []dcgmWarning) *dcgmTest {
		t := &dcgmTest{Name: name}
		for _, i := range present {
			gf := &f.v.gpus[i]
			r := dcgmResult{GPUIDs: strconv.Itoa(i), Status: "PASS"}
			if check != nil {
				r.Warnings = check(i, gf)
			}
			for _, d := range gf.dcgm {
				if d.Test == name {
					r.Warnings = append(r.Warnings, dcgmWarning{Warning: d.Warning})
				}
			}
			if len(r.Warnings) > 0 {
				r.Status = "FAIL"
				failed = true
			}
			t.Results = append(t.Results, r)
		}
		return t
	}
	if level >= 2 {
		pcie := perGPU("PCIe", func(i int, gf *gpuFaults) []dcgmWarning {
			if gf.width == 0 {
				return nil
			}
			return []dcgmWarning{{Warning: fmt.Sprintf("GPU %d: PCIe link width x%d is below the expected x%d.", i, gf.width, n.spec.GPUs[i].Model.PCIeWidth)}}
		})
		mem := perGPU("GPU Memory", func(i int, gf *gpuFaults) []dcgmWarning {
			if gf.eccVolatile == 0 {
				return nil
			}
			return []dcgmWarning{{fmt.Sprintf("Detected %d volatile double-bit ECC error(s) in GPU %d.", gf.eccVolatile, i), dcgmFRVolatileDBE}}
		})
		hw := dcgmCategory{Category: "Hardware", Tests: []*dcgmTest{mem}}
		if level >= 3 {
			hw.Tests = append(hw.Tests, perGPU("Diagnostic", nil))
		}
		doc.Diag.Categories = append(doc.Diag.Categories,
			dcgmCategory{Category: "Integration", Tests: []*dcgmTest{pcie}}, hw)
	}
	if level >= 3 {
		doc.Diag.Categories = append(doc.Diag.Categories, dcgmCategory{Category: "Stress", Tests: []*dcgmTest{
			perGPU("Targeted Stress", nil), perGPU("Targeted Power", nil), perGPU("Memory Bandwidth", nil),
		}})
	}
	data, err := json.MarshalIndent(doc, "", "   ")
	if err != nil {
		return host.Capture{State: snapshot.StateFailed, Err: "dcgmi: " + err.Error()}
	}
	data = append(data, '\n')
	c := host.OK(data)
	if failed {
		c.ExitCode = 226
	}
	return c
}

// renderVersions is versions.json: the software stack the live host
// assembles from uname, nvidia-smi, fabricmanager, ofed_info and NCCL.
func (n *Node) renderVersions(f frame) []byte {
	v := snapshot.Versions{
		Driver: f.driver, CUDA: n.spec.CUDA, Kernel: n.spec.Kernel,
		FabricManager: f.fabricManager, RDMAStack: n.spec.RDMAStack, NCCL: n.spec.NCCL,
	}
	if n.spec.DCGMDiag {
		v.DCGM = n.spec.DCGM
	}
	if len(n.spec.GPUs) == 0 {
		v.Driver, v.CUDA, v.FabricManager, v.NCCL = "", "", "", ""
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil
	}
	return append(data, '\n')
}
