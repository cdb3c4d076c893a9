package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/baselines"
)

// baseline record says what it recorded, and a selector's nodes that
// hold no measurement are named with why instead of left out silently.
func TestBaselineRecordSaysWhatItSkipped(t *testing.T) {
	conn := campaignCoordinator(t)
	out, code := execute(t, append([]string{"baseline", "record", "--from", "sku=h100"}, conn...)...)
	if code != exitCommand || !strings.Contains(out, "gpu-0001: no stored nccl.allreduce result") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	out, code = execute(t, append([]string{"baseline", "record", "--scope", "node:gpu-0001", "--driver", "550.54.15", "--sample", "470,480", "-o", "json"}, conn...)...)
	var rep baselines.RecordReport
	if err := json.Unmarshal([]byte(out), &rep); code != exitOK || err != nil || len(rep.Recorded) != 1 || rep.Recorded[0].Value != 475 || rep.Skipped == nil {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	out, code = execute(t, append([]string{"baseline", "record", "--scope", "node:gpu-0002", "--sample", "470"}, conn...)...)
	if code != exitOK || !strings.Contains(out, "node:gpu-0002") || strings.Contains(out, "skipped") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
