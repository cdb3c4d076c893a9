package xid

import (
	"bytes"
	"encoding/csv"
	"strconv"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

func TestCatalogParses(t *testing.T) {
	t.Parallel()
	tab, err := load()
	if err != nil {
		t.Fatalf("embedded catalog: %v", err)
	}
	if len(tab.unmapped) > 0 {
		t.Fatalf("immediate actions without a row in mapImmediate: %q", tab.unmapped)
	}

	// Every data row of the CSV must have become exactly one entry.
	rows, err := csv.NewReader(bytes.NewReader(catalogCSV)).ReadAll()
	if err != nil {
		t.Fatalf("read csv: %v", err)
	}
	if got, want := len(tab.list), len(rows)-1; got != want {
		t.Fatalf("entries = %d, csv data rows = %d", got, want)
	}
	for _, rec := range rows[1:] {
		code, err := strconv.Atoi(rec[0])
		if err != nil {
			t.Fatalf("row %q: %v", rec, err)
		}
		e, ok := Lookup(code)
		if !ok || e.Code != code || e.Mnemonic == "" {
			t.Errorf("Lookup(%d) = %+v, %v", code, e, ok)
		}
		if e.Action == "" || e.Severity == "" {
			t.Errorf("xid %d: empty action or severity: %+v", code, e)
		}
	}
	if got := len(Catalog()); got != len(rows)-1 {
		t.Errorf("Catalog() has %d entries", got)
	}
}

func TestKeyCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code     int
		action   report.Action
		sev      report.Severity
		hardware bool
		app      bool
	}{
		{79, report.ActionReboot, report.SevFail, true, false},     // RESTART_BM: fell off the bus
		{48, report.ActionResetGPU, report.SevFail, true, false},   // WORKFLOW_XID_48: DBE
		{63, report.ActionNone, report.SevWarn, true, false},       // IGNORE: remap recorded
		{64, report.ActionResetGPU, report.SevFail, true, false},   // remap failure
		{94, report.ActionRestartApp, report.SevWarn, true, false}, // contained ECC
		{95, report.ActionResetGPU, report.SevFail, true, false},   // uncontained ECC
		{13, report.ActionRestartApp, report.SevWarn, false, true},
		{31, report.ActionRestartApp, report.SevWarn, false, true},
		{43, report.ActionRestartApp, report.SevWarn, false, true}, // IGNORE in the catalog, app by DESIGN
		{45, report.ActionRestartApp, report.SevWarn, false, true}, // WORKFLOW_XID_45
		{119, report.ActionResetGPU, report.SevFail, true, false},  // GSP RPC timeout
		{154, report.ActionMonitor, report.SevWarn, false, false},  // refined by Classify
		{74, report.ActionResetGPU, report.SevFail, true, false},   // WORKFLOW_NVLINK_ERR
		{54, report.ActionReseat, report.SevFail, false, false},    // CHECK_MECHANICALS
		{58, report.ActionReplace, report.SevFail, true, false},    // CONTACT_SUPPORT on hardware
		{142, report.ActionMonitor, report.SevWarn, false, false},  // CONTACT_SUPPORT, not hardware
		{151, report.ActionReboot, report.SevFail, false, false},   // RESTART_VM
		{78, report.ActionDrain, report.SevFail, false, false},     // UPDATE_SWFW
		{159, report.ActionRestartApp, report.SevWarn, false, false},
		{167, report.ActionMonitor, report.SevWarn, false, false}, // not classified by NVIDIA
	}
	for _, tc := range tests {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			t.Parallel()
			e, ok := Lookup(tc.code)
			if !ok {
				t.Fatalf("xid %d not in catalog", tc.code)
			}
			if e.Action != tc.action || e.Severity != tc.sev || e.Hardware != tc.hardware || e.Application != tc.app {
				t.Errorf("xid %d = action %s sev %s hw %v app %v; want %s %s %v %v",
					tc.code, e.Action, e.Severity, e.Hardware, e.Application, tc.action, tc.sev, tc.hardware, tc.app)
			}
		})
	}
}

func TestUnknownCode(t *testing.T) {
	t.Parallel()
	for _, code := range []int{0, -1, 999, 100000} {
		e, ok := Lookup(code)
		if ok {
			t.Errorf("Lookup(%d) ok", code)
		}
		if e.Code != code || e.Action != report.ActionMonitor || e.Severity != report.SevWarn {
			t.Errorf("Lookup(%d) = %+v", code, e)
		}
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		code   int
		msg    string
		action report.Action
		sev    report.Severity
	}{
		{"154 drain and reset", 154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", report.ActionResetGPU, report.SevFail},
		{"154 reset", 154, "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)", report.ActionResetGPU, report.SevFail},
		{"154 reboot", 154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", report.ActionReboot, report.SevFail},
		{"154 drain p2p", 154, "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", report.ActionDrain, report.SevFail},
		{"154 recovered", 154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", report.ActionNone, report.SevWarn},
		{"154 unparsable", 154, "something else", report.ActionMonitor, report.SevWarn},
		{"149 fatal", 149, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000)", report.ActionResetGPU, report.SevFail},
		{"149 nonfatal", 149, "NETIR_LINK_EVT  Nonfatal XC0 i0 Link 01", report.ActionMonitor, report.SevWarn},
		{"79 message ignored", 79, "GPU has fallen off the bus.", report.ActionReboot, report.SevFail},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := Classify(tc.code, tc.msg)
			if e.Action != tc.action || e.Severity != tc.sev {
				t.Errorf("Classify(%d, %q) = %s/%s, want %s/%s", tc.code, tc.msg, e.Action, e.Severity, tc.action, tc.sev)
			}
		})
	}
}

func TestWithAction(t *testing.T) {
	t.Parallel()
	e, _ := Lookup(63)
	if o := e.WithAction(report.ActionReplace); o.Severity != report.SevFail || o.Action != report.ActionReplace {
		t.Errorf("override 63 → replace = %+v", o)
	}
	e, _ = Lookup(79)
	if o := e.WithAction(report.ActionMonitor); o.Severity != report.SevWarn {
		t.Errorf("override 79 → monitor = %+v", o)
	}
	e, _ = Lookup(13)
	if o := e.WithAction(report.ActionDrain); o.Severity != report.SevWarn || o.Action != report.ActionDrain {
		t.Errorf("application xid must stay warn: %+v", o)
	}
}

func TestParseCatalogErrors(t *testing.T) {
	t.Parallel()
	const hdr = "xid,mnemonic,nvidia_description,nvidia_immediate_action,nvidia_investigatory_action,imbue_cluster_health_hardware_xid\n"
	bad := map[string]string{
		"empty":          "",
		"missing column": "xid,mnemonic\n1,A\n",
		"bad code":       hdr + "x,A,B,IGNORE,,no\n",
		"duplicate":      hdr + "1,A,B,IGNORE,,no\n1,A,B,IGNORE,,no\n",
		"bad hardware":   hdr + "1,A,B,IGNORE,,maybe\n",
		"short row":      hdr + "1,A\n",
		"no rows":        hdr,
	}
	for name, in := range bad {
		if _, err := parseCatalog([]byte(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	tab, err := parseCatalog([]byte(hdr + "7,A,B,SOMETHING_NEW,,no\n"))
	if err != nil || len(tab.unmapped) != 1 {
		t.Errorf("unmapped bucket not reported: %v %+v", err, tab)
	}
}

func TestRecoveryAction(t *testing.T) {
	t.Parallel()
	if got, ok := RecoveryAction("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"); !ok || got != "Drain and Reset" {
		t.Errorf("got %q %v", got, ok)
	}
	for _, s := range []string{"", " to ", " to (", " to ()", "to 0x1 (x)"} {
		if got, ok := RecoveryAction(s); ok {
			t.Errorf("RecoveryAction(%q) = %q", s, got)
		}
	}
}
