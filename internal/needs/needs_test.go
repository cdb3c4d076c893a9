package needs

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// outcome is a testing.TB that records how the test would have ended.
type outcome struct {
	testing.TB
	fatal, skip string
}

func (o *outcome) Helper() {}
func (o *outcome) Fatalf(format string, a ...any) {
	o.fatal = fmt.Sprintf(format, a...)
	runtime.Goexit()
}
func (o *outcome) Skipf(format string, a ...any) {
	o.skip = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

// run calls f with an outcome on its own goroutine, as testing does, so the
// Goexit of Fatalf/Skipf ends only f.
func run(t *testing.T, f func(testing.TB)) *outcome {
	o := &outcome{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); f(o) }()
	<-done
	return o
}

func TestSkipFailsInCI(t *testing.T) {
	for _, tc := range []struct {
		ci                  string
		wantFatal, wantSkip bool
	}{
		{ci: "true", wantFatal: true},
		{ci: "", wantSkip: true},
		{ci: "false", wantSkip: true},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			o := run(t, func(tb testing.TB) { Skip(tb, "no %s", "widget") })
			if (o.fatal != "") != tc.wantFatal || (o.skip != "") != tc.wantSkip {
				t.Fatalf("fatal %q skip %q", o.fatal, o.skip)
			}
			if !strings.Contains(o.fatal+o.skip, "no widget") {
				t.Fatalf("reason lost: fatal %q skip %q", o.fatal, o.skip)
			}
		})
	}
}

func TestPartlyGoesOnAndFailsInCI(t *testing.T) {
	for _, ci := range []string{"true", ""} {
		t.Run("CI="+ci, func(t *testing.T) {
			t.Setenv("CI", ci)
			o := &partial{TB: t}
			Partly(o, "no %s", "gadget")
			if (o.errored != "") != (ci == "true") || !strings.Contains(o.errored+o.logged, "no gadget") {
				t.Fatalf("errored %q logged %q", o.errored, o.logged)
			}
		})
	}
}

// partial is a testing.TB that records errors and logs.
type partial struct {
	testing.TB
	errored, logged string
}

func (p *partial) Helper()                        {}
func (p *partial) Errorf(format string, a ...any) { p.errored = fmt.Sprintf(format, a...) }
func (p *partial) Logf(format string, a ...any)   { p.logged = fmt.Sprintf(format, a...) }

func TestTool(t *testing.T) {
	t.Setenv("CI", "true")
	if o := run(t, func(tb testing.TB) { Tool(tb, "fleetcheck-no-such-tool", "apt-get install nothing") }); !strings.Contains(o.fatal, "apt-get install nothing") {
		t.Fatalf("missing tool: fatal %q skip %q", o.fatal, o.skip)
	}
	var path string
	if o := run(t, func(tb testing.TB) { path = Tool(tb, "go", "the Go toolchain") }); o.fatal != "" || path == "" {
		t.Fatalf("go on PATH: fatal %q, path %q", o.fatal, path)
	}
}
