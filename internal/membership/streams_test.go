package membership

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/rs/zerolog"
)

// A peer that dials and gives up before writing (its probe deadline passed
// during the dial) leaves an empty stream: no error about a label. A
// stream that carries data without the label is still refused and logged.
func TestEmptyStreamIsNoLabelError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		send   []byte
		want   string // the line that says the stream was handled
		refuse bool   // logged as a stream with the wrong label
	}{
		{"closed before a byte", nil, "stream closed before its first byte", false},
		{"data without the label", []byte{0x07, 0x00, 0x00, 0x00}, `discarding stream with unacceptable label \"\"`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out lockedBuffer
			cfg := fastConfig("labelled")
			cfg.ClusterLabel = "fleet-a"
			p, err := New(cfg, zerolog.New(&out).Level(zerolog.DebugLevel), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Shutdown() })
			c, err := net.Dial("tcp", p.LocalMember().Addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			_ = c.Close()
			testwait.For(t, 5*time.Second, fmt.Sprintf("%q logged", tc.want), func() (bool, string) {
				return strings.Contains(out.String(), tc.want), out.String()
			})
			refused := strings.Contains(out.String(), "unacceptable label")
			if refused != tc.refuse {
				t.Errorf("logged as a stream with the wrong label: %v, want %v: %s", refused, tc.refuse, out.String())
			}
			if !tc.refuse && strings.Contains(out.String(), `"level":"error"`) {
				t.Errorf("an empty stream logged an error: %s", out.String())
			}
		})
	}
}
