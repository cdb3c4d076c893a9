//go:build !node

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
)

// TestRemediationVerbsEndToEnd: a coordinator with no remediation section
// (a new install) records what the ladder would do for a node whose
// agent reports Xid 79, and drains nothing; `remediation list / show /
// cancel / approve` work on that record through the real CLI.
func TestRemediationVerbsEndToEnd(t *testing.T) {
	nodes := e2eRack(2, "r21", nil)
	nodes[0].faults = []sim.Fault{sim.Xid{GPU: 3, Code: 79}}
	nodes[0].interval = time.Second
	f := newE2EFleet(t, newE2EClock(1), nodes...)

	l := e2ePoll(f, 20*time.Second, "a shadow remediation for gpu-001", func() remediationList {
		return e2eJSON[remediationList](f, "remediation", "list", "--node", "gpu-001")
	}, func(l remediationList) bool { return len(l.Remediations) > 0 })
	r := l.Remediations[0]
	if l.Mode != remediation.ModeShadow || r.State != remediation.StateShadow || r.Component != "GPU3" || r.Step != remediation.StepReboot || len(r.Would) == 0 {
		t.Fatalf("list: mode %s, %+v", l.Mode, r)
	}
	if st := f.drainState("gpu-001"); st.Drained {
		t.Fatalf("shadow mode drained gpu-001: %+v", st)
	}
	if len(l.Remediations) != 1 {
		t.Fatalf("one fault, %d records", len(l.Remediations))
	}
	if out := f.cli("remediation", "show", r.ID); !strings.Contains(out, "would") || !strings.Contains(out, "XID_79") {
		t.Fatalf("show:\n%s", out)
	}
	if out := f.cli("remediation", "list"); !strings.Contains(out, "mode: shadow") || !strings.Contains(out, r.ID) {
		t.Fatalf("list table:\n%s", out)
	}
	got := e2eJSON[remediation.Remediation](f, "remediation", "cancel", r.ID, "--reason", "known: reseat booked")
	if got.State != remediation.StateCancelled || !strings.Contains(got.Reason, "known: reseat booked") {
		t.Fatalf("cancel: %+v", got)
	}
	if !f.hasAudit("remediation.cancel", r.ID) {
		t.Errorf("cancel not audited: %v", f.auditEvents())
	}
	out, code := execute(t, append([]string{"remediation", "approve", r.ID}, f.conn...)...)
	if code != exitCommand || !strings.Contains(out, "not possible in this state") {
		t.Fatalf("approve a cancelled one: exit %d:\n%s", code, out)
	}
	out, code = execute(t, append([]string{"remediation", "show", "rem-nope"}, f.conn...)...)
	if code != exitCommand || !strings.Contains(out, "no such remediation") {
		t.Fatalf("show unknown: exit %d:\n%s", code, out)
	}
}
