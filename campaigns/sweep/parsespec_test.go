package sweep

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// ParseSpec decodes what an operator sends (sweep start -f, YAML or JSON)
// strictly, with durations as durations.
func TestParseSpec(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     string // error substring; "" accepts
		timeout  time.Duration
	}{
		{"yaml durations", "selector: sku=h100\ntest_timeout: 10m\nbudget: {node_test_time: 3m}\n", "", 10 * time.Minute},
		{"json durations", `{"selector":"sku=h100","test_timeout":"12m"}`, "", 12 * time.Minute},
		{"json from the CLI's flags", `{"selector":"","threshold":0,"repeat":{},"budget":{},"drain":true}`, "", 0},
		{"yaml bare number", "test_timeout: 600\n", `bad duration "600": a bare number has no unit; write it with one, e.g. 600s`, 0},
		{"json bare number", `{"test_timeout":600}`, `bad duration "600": a bare number has no unit`, 0},
		{"nanoseconds in json", `{"budget":{"node_test_time":240000000000}}`, "a bare number has no unit", 0},
		{"second document", "selector: sku=h100\n---\nselector: sku=a100\ndrain: true\n", "more than one YAML document", 0},
		{"unknown key", "thresold: 0.2\n", "field thresold not found", 0},
		{"empty", "  \n", "empty spec", 0},
		{"out of range", "test_timeout: 100ms\n", "test_timeout 100ms is out of range: must be within 1s..24h", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := ParseSpec([]byte(tc.in))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && time.Duration(s.TestTimeout) != tc.timeout:
				t.Fatalf("test_timeout %v, want %v", time.Duration(s.TestTimeout), tc.timeout)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			case tc.want != "" && !errors.Is(err, ErrInvalidSpec):
				t.Fatalf("%v does not wrap ErrInvalidSpec", err)
			}
		})
	}
}
