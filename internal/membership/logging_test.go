package membership

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/sim/faultnet"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

func TestLogWriterLevels(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line  string
		level string
		msg   string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:4000", "debug", "Stream connection from=127.0.0.1:4000"},
		{"[INFO] memberlist: Marking n2 as failed, suspect timeout reached (0 peer confirmations)", "info", "Marking n2 as failed, suspect timeout reached (0 peer confirmations)"},
		{"[WARN] memberlist: Was able to connect to n3 over TCP but UDP probes failed", "warn", "Was able to connect to n3 over TCP but UDP probes failed"},
		{"[ERR] memberlist: Failed to send ping: write: connection refused", "error", "Failed to send ping: write: connection refused"},
		{"2026/01/02 15:04:05 [WARN] memberlist: with a timestamp", "warn", "with a timestamp"},
		{"no tag at all", "info", "no tag at all"},
		{"[BOGUS] unknown tag", "info", "[BOGUS] unknown tag"},
		{"[ERR] memberlist: bracket [inside] message\n", "error", "bracket [inside] message"},
		// One exchange with a slow or departed peer cut short: the failure
		// detector's input, a warning.
		{"[ERR] memberlist: Failed fallback TCP ping: timeout 162ms: read tcp 127.0.0.1:33706->127.0.0.1:46089: i/o timeout", "warn",
			"Failed fallback TCP ping: timeout 162ms: read tcp 127.0.0.1:33706->127.0.0.1:46089: i/o timeout"},
		{"[ERR] memberlist: Push/Pull with gpu-107 failed: read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer", "warn",
			"Push/Pull with gpu-107 failed: read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer"},
		{"[ERR] memberlist: failed to receive: msgpack decode error [pos 1]: read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout from=127.0.0.1:2", "warn",
			"failed to receive: msgpack decode error [pos 1]: read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout from=127.0.0.1:2"},
		{"[ERR] memberlist: Too many pending push/pull requests", "warn", "Too many pending push/pull requests"},
		// Misconfiguration and malformed input stay errors.
		{"[ERR] memberlist: failed to receive: No installed keys could decrypt the message from=127.0.0.1:2", "error",
			"failed to receive: No installed keys could decrypt the message from=127.0.0.1:2"},
		{`[ERR] memberlist: discarding stream with unacceptable label "other": from=127.0.0.1:2`, "error",
			`discarding stream with unacceptable label "other": from=127.0.0.1:2`},
		{"[ERR] memberlist: Failed to decode ping: EOF", "error", "Failed to decode ping: EOF"},
	}
	for _, tc := range tests {
		t.Run(tc.level+"/"+tc.msg, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			w := newLogWriter(zerolog.New(&buf).Level(zerolog.DebugLevel))
			n, err := w.Write([]byte(tc.line))
			if err != nil || n != len(tc.line) {
				t.Fatalf("Write = %d, %v", n, err)
			}
			got := decodeLogLines(t, &buf)
			if len(got) != 1 {
				t.Fatalf("got %d log lines, want 1: %v", len(got), got)
			}
			if got[0]["level"] != tc.level || got[0]["message"] != tc.msg || got[0]["subsystem"] != "memberlist" {
				t.Fatalf("got %v, want level=%s message=%q subsystem=memberlist", got[0], tc.level, tc.msg)
			}
		})
	}
}

func TestLogWriterThroughStdLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	// The way New wires it: a *log.Logger without prefix or flags.
	l := log.New(newLogWriter(zerolog.New(&buf).Level(zerolog.WarnLevel)), "", 0)
	l.Printf("[DEBUG] memberlist: filtered out by level")
	l.Printf("[WARN] memberlist: %s", "kept")
	l.Printf("[ERR] memberlist: %s", "also kept")
	got := decodeLogLines(t, &buf)
	if len(got) != 2 || got[0]["message"] != "kept" || got[1]["level"] != "error" {
		t.Fatalf("got %v", got)
	}
}

func TestLogWriterSplitsLines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	w := newLogWriter(zerolog.New(&buf))
	fmt.Fprint(w, "[INFO] memberlist: one\n[ERR] memberlist: two\n\n")
	got := decodeLogLines(t, &buf)
	if len(got) != 2 || got[0]["level"] != "info" || got[1]["level"] != "error" {
		t.Fatalf("got %v", got)
	}
}

func decodeLogLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// lockedBuffer collects log output from memberlist's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestPoolSendsMemberlistLogsThroughZerolog(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	logger := zerolog.New(&out).Level(zerolog.DebugLevel)
	var network memberlist.MockNetwork
	faults := faultnet.New()
	ta, tb := faults.Wrap(network.NewTransport("a")), faults.Wrap(network.NewTransport("b"))
	ca, cb := fastConfig("a"), fastConfig("b")
	ca.Transport, cb.Transport = ta, tb
	a, err := New(ca, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cb, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.Shutdown()
		_ = b.Shutdown()
		faults.Close()
	})
	if _, err := b.Join([]string{a.LocalMember().Addr}); err != nil {
		t.Fatal(err)
	}
	// memberlist logs each push/pull at debug.
	testwait.For(t, 5*time.Second, "a memberlist debug line", func() (bool, string) {
		return strings.Contains(out.String(), `"level":"debug","subsystem":"memberlist"`), out.String()
	})
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.Contains(line, "[DEBUG]") || strings.Contains(line, "[INFO]") || strings.Contains(line, "[WARN]") || strings.Contains(line, "[ERR]") {
			t.Fatalf("level tag left in the message: %s", line)
		}
	}
	if !strings.Contains(out.String(), `"subsystem":"membership","node":"b"`) {
		t.Fatalf("no membership line about b in: %s", out.String())
	}
}
