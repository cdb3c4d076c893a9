package kit

import (
	"encoding/json"
	"testing"
)

// An action's result is written with snake_case keys, and one stored by
// an older coordinator (Go field names) still reads back.
func TestActionResultJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(ActionResult{OK: true, Message: "done", Output: "metric pcie.h2d_bandwidth_gbps 55.2\n"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"ok":true,"message":"done","output":"metric pcie.h2d_bandwidth_gbps 55.2\n"}`; string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	for _, stored := range []string{
		`{"OK":false,"Message":"gpu_burn exited 1","Output":"GPU 1: FAULTY"}`,
		`{"ok":false,"message":"gpu_burn exited 1","output":"GPU 1: FAULTY"}`,
	} {
		var r ActionResult
		if err := json.Unmarshal([]byte(stored), &r); err != nil {
			t.Fatal(err)
		}
		if r.OK || r.Message != "gpu_burn exited 1" || r.Output != "GPU 1: FAULTY" {
			t.Errorf("%s read as %+v", stored, r)
		}
	}
}
