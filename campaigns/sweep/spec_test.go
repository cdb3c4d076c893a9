package sweep

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Durations in a sweep spec are written as durations ("10m"), in what an
// operator sends and in what the coordinator stores and shows; specs
// stored with nanoseconds by an older coordinator still load.
func TestSpecDurationsJSON(t *testing.T) {
	t.Parallel()
	var s Spec
	if err := json.Unmarshal([]byte(`{"test_timeout":"12m","budget":{"node_test_time":"4m","max_gpu_hours":10}}`), &s); err != nil {
		t.Fatal(err)
	}
	if time.Duration(s.TestTimeout) != 12*time.Minute || time.Duration(s.Budget.NodeTestTime) != 4*time.Minute {
		t.Fatalf("decoded %+v", s)
	}
	b, err := json.Marshal(s.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"test_timeout":"12m"`, `"node_test_time":"4m"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("marshalled spec lacks %s:\n%s", want, b)
		}
	}
	var old Spec
	if err := json.Unmarshal([]byte(`{"test_timeout":600000000000,"budget":{"node_test_time":240000000000}}`), &old); err != nil {
		t.Fatalf("stored spec with nanoseconds: %v", err)
	}
	if time.Duration(old.TestTimeout) != 10*time.Minute || time.Duration(old.Budget.NodeTestTime) != 4*time.Minute {
		t.Fatalf("old spec decoded as %+v", old)
	}
	if err := json.Unmarshal([]byte(`{"test_timeout":"ten minutes"}`), &old); err == nil {
		t.Fatal("a bad duration was accepted")
	}
}
