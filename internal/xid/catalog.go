// Package xid is NVIDIA's Xid catalog as shipped in the binary, and the one
// place where NVIDIA's resolution buckets become report actions.
//
// The catalog is a CSV export embedded at build time (see README.md for its
// provenance). It is parsed once, on first use; it is pure data, so there is
// no registration and nothing to configure here: operators override actions
// per Xid in the checks' config, not in this package.
package xid

import (
	"bytes"
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

//go:embed xid_catalog.csv
var catalogCSV []byte

// Entry is what fleetcheck knows about one Xid.
type Entry struct {
	Code        int
	Mnemonic    string // ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS
	Description string // NVIDIA's short description
	// NVIDIAAction is NVIDIA's immediate-action bucket as the catalog spells
	// it (RESET_GPU, RESTART_BM, WORKFLOW_XID_48 ...); empty when NVIDIA
	// gives none.
	NVIDIAAction string
	// Investigatory is NVIDIA's investigatory-action bucket, for messages.
	Investigatory string
	Action        report.Action
	Severity      report.Severity
	// Hardware marks Xids that point at the GPU or its board rather than at
	// software (imbue cluster-health's hardware list).
	Hardware bool
	// Application marks the Xids that usually mean a faulty job (13, 31, 43,
	// 45): they warn and never fail a node on their own.
	Application bool
}

// IsApplication reports whether code is one of the application Xids. One
// crashing job prints these on every node it ran on, so they must never
// drain a job's worth of nodes (docs/design.md "Xid actions").
func IsApplication(code int) bool {
	switch code {
	case 13, 31, 43, 45:
		return true
	}
	return false
}

// mapImmediate is THE table from NVIDIA's immediate-action bucket to a
// report action and severity. Every bucket that occurs in the catalog's
// nvidia_immediate_action column has a row; ok is false for a bucket this
// table does not know (a newer catalog), which then gets monitor/warn.
//
//	bucket               action       sev   why
//	RESTART_APP          restart_app  warn  the app died; the GPU is usable (DESIGN)
//	RESET_GPU            reset_gpu    fail  (DESIGN)
//	RESTART_BM           reboot       fail  restart the bare-metal node (DESIGN; Xid 79)
//	RESTART_VM           reboot       fail  the VM form of RESTART_BM (Xid 151)
//	CONTACT_SUPPORT      replace      fail  on a hardware Xid (DESIGN): a support case ends in an RMA
//	CONTACT_SUPPORT      monitor      warn  on other Xids: mostly codes NVIDIA lists as unused; worth
//	                                        a look, not a reason to drain
//	IGNORE               none         warn  nothing to do, but an Xid is shown (DOMAIN: any Xid alerts)
//	WORKFLOW_XID_45      restart_app  warn  preemptive cleanup after another error; the Xid that
//	                                        preceded it carries the verdict (45 is an application Xid)
//	WORKFLOW_XID_48      reset_gpu    fail  double-bit ECC: drain, reset, check remap; RMA if it repeats
//	WORKFLOW_NVLINK_ERR  reset_gpu    fail  NVLink error (74): reset retrains; persistent → hardware
//	WORKFLOW_NVLINK5_ERR reset_gpu    fail  NVLink5 (144–150); Classify lowers "Nonfatal" ones to warn
//	XID_154              monitor      warn  recovery action changed; Classify reads the new action
//	CHECK_MECHANICALS    reseat       fail  aux power not connected (54): hands on the cabling
//	UPDATE_SWFW          drain        fail  vGPU start error (78): needs a software/firmware update
//	                                        before the node takes work again
//	CHECK_UVM            restart_app  warn  C2C CHI non-data error (159) surfaced to UVM: the
//	                                        affected process dies; look at the UVM log
//	"" (none given)      monitor      warn  codes NVIDIA has not classified yet (162–172)
func mapImmediate(bucket string, hardware bool) (report.Action, report.Severity, bool) {
	switch bucket {
	case "RESTART_APP", "WORKFLOW_XID_45", "CHECK_UVM":
		return report.ActionRestartApp, report.SevWarn, true
	case "RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR":
		return report.ActionResetGPU, report.SevFail, true
	case "RESTART_BM", "RESTART_VM":
		return report.ActionReboot, report.SevFail, true
	case "CONTACT_SUPPORT":
		if hardware {
			return report.ActionReplace, report.SevFail, true
		}
		return report.ActionMonitor, report.SevWarn, true
	case "IGNORE":
		return report.ActionNone, report.SevWarn, true
	case "XID_154", "":
		return report.ActionMonitor, report.SevWarn, true
	case "CHECK_MECHANICALS":
		return report.ActionReseat, report.SevFail, true
	case "UPDATE_SWFW":
		return report.ActionDrain, report.SevFail, true
	}
	return report.ActionMonitor, report.SevWarn, false
}

// SeverityFor is the severity an action implies when an operator overrides
// a catalog action: anything that takes the GPU or node out of service fails.
func SeverityFor(a report.Action) report.Severity {
	switch a {
	case report.ActionNone, report.ActionMonitor, report.ActionRestartApp:
		return report.SevWarn
	}
	return report.SevFail
}

// WithAction returns e with its action replaced (an operator override) and
// the severity that action implies. Application Xids stay at warn whatever
// the action: they never fail a node on their own.
func (e Entry) WithAction(a report.Action) Entry {
	e.Action = a
	e.Severity = SeverityFor(a)
	if e.Application {
		e.Severity = report.SevWarn
	}
	return e
}

func newEntry(code int, mnemonic, desc, immediate, investigatory string, hardware bool) (Entry, bool) {
	e := Entry{
		Code:          code,
		Mnemonic:      mnemonic,
		Description:   desc,
		NVIDIAAction:  immediate,
		Investigatory: investigatory,
		Hardware:      hardware,
	}
	var known bool
	e.Action, e.Severity, known = mapImmediate(immediate, hardware)
	if IsApplication(code) {
		// 43 is IGNORE in the catalog and 45 a workflow: docs/design.md makes all
		// four restart_app/warn so the job's owner hears about it.
		e.Application = true
		e.Action, e.Severity = report.ActionRestartApp, report.SevWarn
	}
	return e, known
}

// unknown is the entry for a code the catalog does not list: a newer
// driver's Xid. It is shown and watched, not acted on.
func unknown(code int) Entry {
	e, _ := newEntry(code, "UNKNOWN", "not in fleetcheck's Xid catalog", "", "", false)
	return e
}

type table struct {
	byCode map[int]Entry
	list   []Entry // sorted by code
	// unmapped lists immediate-action buckets mapImmediate does not know.
	unmapped []string
}

// load parses the embedded catalog once. A broken catalog is a build
// defect that the package's tests catch; at run time Lookup then answers
// "unknown" for every code instead of taking the agent down.
var load = sync.OnceValues(func() (*table, error) { return parseCatalog(catalogCSV) })

// required columns of the CSV; others are ignored.
const (
	colCode          = "xid"
	colMnemonic      = "mnemonic"
	colDescription   = "nvidia_description"
	colImmediate     = "nvidia_immediate_action"
	colInvestigatory = "nvidia_investigatory_action"
	colHardware      = "imbue_cluster_health_hardware_xid"
)

func parseCatalog(data []byte) (*table, error) {
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = -1
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("xid catalog: read header: %w", err)
	}
	idx := make(map[string]int, len(header))
	for i, h := range header {
		idx[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, c := range []string{colCode, colMnemonic, colDescription, colImmediate, colInvestigatory, colHardware} {
		if _, ok := idx[c]; !ok {
			return nil, fmt.Errorf("xid catalog: missing column %q", c)
		}
	}
	t := &table{byCode: make(map[int]Entry)}
	unmapped := map[string]bool{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("xid catalog: %w", err)
		}
		line, _ := r.FieldPos(0)
		if len(rec) != len(header) {
			return nil, fmt.Errorf("xid catalog: line %d: %d fields, header has %d", line, len(rec), len(header))
		}
		field := func(c string) string { return strings.TrimSpace(rec[idx[c]]) }
		code, err := strconv.Atoi(field(colCode))
		if err != nil || code <= 0 {
			return nil, fmt.Errorf("xid catalog: line %d: bad xid %q", line, field(colCode))
		}
		if _, dup := t.byCode[code]; dup {
			return nil, fmt.Errorf("xid catalog: line %d: xid %d listed twice", line, code)
		}
		var hw bool
		switch strings.ToLower(field(colHardware)) {
		case "yes":
			hw = true
		case "no", "":
		default:
			return nil, fmt.Errorf("xid catalog: line %d: bad %s %q", line, colHardware, field(colHardware))
		}
		e, known := newEntry(code, field(colMnemonic), field(colDescription),
			field(colImmediate), field(colInvestigatory), hw)
		if !known {
			unmapped[e.NVIDIAAction] = true
		}
		t.byCode[code] = e
		t.list = append(t.list, e)
	}
	if len(t.list) == 0 {
		return nil, errors.New("xid catalog: no rows")
	}
	sort.Slice(t.list, func(i, j int) bool { return t.list[i].Code < t.list[j].Code })
	for b := range unmapped {
		t.unmapped = append(t.unmapped, b)
	}
	sort.Strings(t.unmapped)
	return t, nil
}

// Lookup returns the catalog entry for an Xid. For a code the catalog does
// not list it returns an entry with action monitor and severity warn, and
// false.
func Lookup(code int) (Entry, bool) {
	t, err := load()
	if err == nil {
		if e, ok := t.byCode[code]; ok {
			return e, true
		}
	}
	return unknown(code), false
}

// Catalog returns every entry, ordered by code; nil only if the embedded
// catalog failed to parse (which the package's tests rule out).
func Catalog() []Entry {
	t, err := load()
	if err != nil {
		return nil
	}
	return append([]Entry(nil), t.list...)
}

// Classify is Lookup refined by the Xid line's own text, for the Xids whose
// catalog bucket says "read the message":
//   - 154 names the GPU's new recovery action ("... to 0x4 (Drain and Reset)");
//   - NVLink5 Xids (144–150) say whether the error was fatal; a "Nonfatal"
//     one was handled by the hardware and only warns.
func Classify(code int, message string) Entry {
	e, _ := Lookup(code)
	switch e.NVIDIAAction {
	case "XID_154":
		if target, ok := RecoveryAction(message); ok {
			e.Action, e.Severity = recoveryAction(target)
		}
	case "WORKFLOW_NVLINK5_ERR":
		if isNonfatal(message) {
			e.Action, e.Severity = report.ActionMonitor, report.SevWarn
		}
	}
	return e
}

// recoveryAction maps the driver's recovery-action names (gpu_recovery_action
// in nvidia-smi, the target of Xid 154) onto report actions.
func recoveryAction(name string) (report.Action, report.Severity) {
	switch strings.ToLower(name) {
	case "none":
		// The GPU needs nothing any more: it was recovered.
		return report.ActionNone, report.SevWarn
	case "gpu reset required", "drain and reset":
		return report.ActionResetGPU, report.SevFail
	case "node reboot required":
		return report.ActionReboot, report.SevFail
	case "drain p2p", "recover imex domain":
		// Peer-to-peer / multi-node memory is unsafe until recovered: keep
		// work off the node.
		return report.ActionDrain, report.SevFail
	}
	return report.ActionMonitor, report.SevWarn
}

// RecoveryAction extracts the new recovery action from an Xid 154 message,
// "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)" →
// "Drain and Reset".
func RecoveryAction(message string) (string, bool) {
	i := strings.LastIndex(message, " to ")
	if i < 0 {
		return "", false
	}
	rest := message[i+len(" to "):]
	open := strings.IndexByte(rest, '(')
	if open < 0 {
		return "", false
	}
	end := strings.IndexByte(rest[open:], ')')
	if end < 0 {
		return "", false
	}
	name := strings.TrimSpace(rest[open+1 : open+end])
	return name, name != ""
}

// isNonfatal reports whether an NVLink5 Xid message calls itself non-fatal.
func isNonfatal(message string) bool {
	m := strings.ToLower(message)
	return strings.Contains(m, "nonfatal") || strings.Contains(m, "non-fatal") || strings.Contains(m, "non fatal")
}
