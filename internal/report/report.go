// Package report defines the node report: check statuses, findings and
// metrics, in the JSON shape docs/design.md fixes, and how a node's status is
// derived from its checks.
package report

import (
	"math"
	"sort"
)

// Status is a check's or a report's outcome.
type Status string

const (
	Pass  Status = "pass"
	Warn  Status = "warn"
	Fail  Status = "fail"
	Error Status = "error" // the check could not decide
	Skip  Status = "skip"  // not applicable, or its source is absent
)

// rank orders statuses for "worst of": fail > error > warn > pass; skip counts for nothing.
func rank(s Status) int {
	switch s {
	case Fail:
		return 4
	case Error:
		return 3
	case Warn:
		return 2
	case Pass:
		return 1
	default:
		return 0
	}
}

// Worse returns the worse of two statuses.
func Worse(a, b Status) Status {
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// Severity is a finding's weight.
type Severity string

const (
	SevWarn Severity = "warn"
	SevFail Severity = "fail"
)

// Action is what an operator should do about a finding.
type Action string

const (
	ActionNone       Action = "none"
	ActionMonitor    Action = "monitor"
	ActionRestartApp Action = "restart_app"
	ActionResetGPU   Action = "reset_gpu"
	ActionReboot     Action = "reboot"
	ActionDrain      Action = "drain"
	ActionReplace    Action = "replace"
	ActionReseat     Action = "reseat"
)

// Finding is one thing a check found wrong.
type Finding struct {
	Severity  Severity `json:"severity"`
	Component string   `json:"component"` // GPU3, mlx5_4/1, node
	PCIBusID  string   `json:"pci_bus_id,omitempty"`
	Code      string   `json:"code"`
	Message   string   `json:"message"`
	Action    Action   `json:"action"`
}

// CheckResult is one check's outcome.
type CheckResult struct {
	Name       string             `json:"name"`
	Status     Status             `json:"status"`
	DurationMS float64            `json:"duration_ms"`
	Reason     string             `json:"reason,omitempty"`
	Findings   []Finding          `json:"findings"`
	Metrics    map[string]float64 `json:"metrics,omitempty"`
}

// Inventory describes the node's hardware and software.
type Inventory struct {
	DriverVersion        string `json:"driver_version"`
	CUDAVersion          string `json:"cuda_version"`
	Kernel               string `json:"kernel"`
	FabricManagerVersion string `json:"fabric_manager_version"`
	RDMAStack            string `json:"rdma_stack"`
	GPUs                 []GPU  `json:"gpus"`
	HCAs                 []HCA  `json:"hcas"`
}

// GPU is one GPU's identity.
type GPU struct {
	Index          int    `json:"index"`
	Name           string `json:"name"`
	UUID           string `json:"uuid"`
	PCIBusID       string `json:"pci_bus_id"`
	Serial         string `json:"serial"`
	VBIOSVersion   string `json:"vbios_version"`
	MemoryTotalMiB uint64 `json:"memory_total_mib"`
}

// HCA is one adapter's identity and ports.
type HCA struct {
	Name      string `json:"name"`
	Model     string `json:"model"`
	FWVersion string `json:"fw_version"`
	Ports     []Port `json:"ports"`
}

// Port is one HCA port.
type Port struct {
	Port      int     `json:"port"`
	State     string  `json:"state"`
	PhysState string  `json:"phys_state"`
	RateGbps  float64 `json:"rate_gbps"`
	LinkLayer string  `json:"link_layer"`
}

// Report is one node's report.
type Report struct {
	Node        string        `json:"node"`
	Status      Status        `json:"status"`
	CollectedAt string        `json:"collected_at,omitempty"`
	Inventory   Inventory     `json:"inventory"`
	Checks      []CheckResult `json:"checks"`
}

// Summarize sets the report's status to the worst of its checks and
// removes metric values that are not finite (JSON cannot carry them and the
// contract forbids them).
func (r *Report) Summarize() {
	st := Status("")
	for i := range r.Checks {
		c := &r.Checks[i]
		for k, v := range c.Metrics {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				delete(c.Metrics, k)
			}
		}
		if c.Findings == nil {
			c.Findings = []Finding{}
		}
		st = Worse(st, c.Status)
	}
	if st == "" {
		st = Pass
	}
	r.Status = st
}

// Failed reports whether any check failed or errored: the exit-status rule.
func (r *Report) Failed() bool {
	for _, c := range r.Checks {
		if c.Status == Fail || c.Status == Error {
			return true
		}
	}
	return false
}

// Check returns the named check's result, or nil.
func (r *Report) Check(name string) *CheckResult {
	for i := range r.Checks {
		if r.Checks[i].Name == name {
			return &r.Checks[i]
		}
	}
	return nil
}

// SortFindings orders findings worst first, then by component, so output is stable.
func SortFindings(fs []Finding) {
	sort.SliceStable(fs, func(i, j int) bool {
		if fs[i].Severity != fs[j].Severity {
			return fs[i].Severity == SevFail
		}
		if fs[i].Component != fs[j].Component {
			return componentLess(fs[i].Component, fs[j].Component)
		}
		return fs[i].Code < fs[j].Code
	})
}

// componentLess sorts GPU2 before GPU10.
func componentLess(a, b string) bool {
	na, pa := splitNum(a)
	nb, pb := splitNum(b)
	if pa == pb && na >= 0 && nb >= 0 {
		return na < nb
	}
	return a < b
}

func splitNum(s string) (int, string) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	if i == len(s) || len(s)-i > 9 {
		return -1, s
	}
	n := 0
	for _, c := range s[i:] {
		n = n*10 + int(c-'0')
	}
	return n, s[:i]
}

// FindingsByCause lists the findings of a node's check results in the
// order an operator should read them: failures before warnings, then by
// the check's place in order (the run order, which lists causes before
// their symptoms: ib.ports before ib.counters, so a port that went down
// comes before the link_downed counter it raised; gpu.inventory before
// the per-GPU checks), then as SortFindings orders one check's findings.
// Checks not in order come last, by name. results is not modified.
func FindingsByCause(results []CheckResult, order []string) []Finding {
	rank := make(map[string]int, len(order))
	for i, n := range order {
		rank[n] = i
	}
	pos := func(name string) int {
		if r, ok := rank[name]; ok {
			return r
		}
		return len(order)
	}
	rs := append([]CheckResult(nil), results...)
	sort.SliceStable(rs, func(i, j int) bool {
		pi, pj := pos(rs[i].Name), pos(rs[j].Name)
		if pi != pj {
			return pi < pj
		}
		return rs[i].Name < rs[j].Name
	})
	var out []Finding
	for _, sev := range []Severity{SevFail, SevWarn} {
		for _, r := range rs {
			fs := append([]Finding(nil), r.Findings...)
			SortFindings(fs)
			for _, f := range fs {
				if f.Severity == sev {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// CauseOrder lists the check names causes first, for reading one node's
// findings or failing checks: the driver's own account of a fault (an Xid
// such as 79, fallen off the bus) before the missing GPU it leaves in the
// inventory; the GPU checks before the link checks; a port's state before
// the counters its going down raised; measurements last. A check not
// listed sorts after these, by name (checks/registry tests that every
// check is listed).
func CauseOrder() []string {
	return []string{
		"gpu.xid", "gpu.inventory", "gpu.fabric", "gpu.ecc", "gpu.thermal", "gpu.pcie", "gpu.nvlink",
		"gpu.config", "gpu.processes", "gpu.peermem", "ib.ports", "ib.counters",
		"fw.matrix", "dcgm.diag", "nccl.allreduce",
	}
}

// CauseLess orders two check names by CauseOrder.
func CauseLess(a, b string) bool {
	pa, pb := causeRank(a), causeRank(b)
	if pa != pb {
		return pa < pb
	}
	return a < b
}

func causeRank(name string) int {
	for i, n := range CauseOrder() {
		if n == name {
			return i
		}
	}
	return len(CauseOrder())
}
