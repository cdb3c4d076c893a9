package main

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// A go test -json stream: one package passes, one fails a test, one does
// not build.
const stream = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestOK"}
{"Action":"output","Package":"example.com/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestOK","Elapsed":0.01}
{"Action":"pass","Package":"example.com/a","Elapsed":1.5}
{"Action":"run","Package":"example.com/b","Test":"TestBad"}
{"Action":"output","Package":"example.com/b","Test":"TestBad","Output":"    b_test.go:9: want 2, got 3\n"}
{"Action":"fail","Package":"example.com/b","Test":"TestBad","Elapsed":0.2}
{"Action":"fail","Package":"example.com/b","Elapsed":7.25}
{"ImportPath":"example.com/c","Action":"build-output","Output":"c.go:3:1: syntax error\n"}
{"ImportPath":"example.com/c","Action":"build-fail"}
{"Action":"fail","Package":"example.com/c","Elapsed":0,"FailedBuild":"example.com/c"}
`

func TestSummary(t *testing.T) {
	var out bytes.Buffer
	s := newSummary(&out)
	sc := bufio.NewScanner(strings.NewReader(stream))
	for sc.Scan() {
		s.add(sc.Bytes())
	}
	if s.end() {
		t.Error("a stream with a failed test and a failed build passed")
	}
	got := out.String()
	for _, want := range []string{
		"ok   example.com/a",
		"--- FAIL example.com/b TestBad (0.20s)\n    b_test.go:9: want 2, got 3\n",
		"FAIL example.com/b",
		"BUILD FAIL example.com/c\nc.go:3:1: syntax error\n",
		"3 packages, 9s of package time; the 3 slowest:\n      7.2s  example.com/b\n      1.5s  example.com/a\n",
		"FAILED (2):\n  example.com/b TestBad\n  example.com/c (build)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "=== RUN   TestOK") {
		t.Errorf("a passing test's output printed:\n%s", got)
	}
}

func TestAllPassing(t *testing.T) {
	var out bytes.Buffer
	s := newSummary(&out)
	s.add([]byte(`{"Action":"pass","Package":"example.com/a","Elapsed":0.5}`))
	if !s.end() || strings.Contains(out.String(), "FAILED") {
		t.Fatalf("passing stream failed:\n%s", out.String())
	}
}

func TestEmptyStreamWithPlainErrorFails(t *testing.T) {
	var out bytes.Buffer
	s := newSummary(&out)
	s.add([]byte("go: no packages to test"))
	if s.end() {
		t.Fatalf("a stream of only plain text passed:\n%s", out.String())
	}
}

// A test binary that times out: the panic and the dump go to the test that
// was running, which never gets a fail event; the summary must still show
// them and which test it was.
func TestTimeoutShowsTheRunningTest(t *testing.T) {
	var out bytes.Buffer
	s := newSummary(&out)
	for _, line := range []string{
		`{"Action":"run","Package":"example.com/d","Test":"TestQuick"}`,
		`{"Action":"output","Package":"example.com/d","Test":"TestQuick","Output":"=== RUN   TestQuick\n"}`,
		`{"Action":"pass","Package":"example.com/d","Test":"TestQuick","Elapsed":0.1}`,
		`{"Action":"run","Package":"example.com/d","Test":"TestHangs"}`,
		`{"Action":"output","Package":"example.com/d","Test":"TestHangs","Output":"panic: test timed out after 20m0s\n"}`,
		`{"Action":"output","Package":"example.com/d","Test":"TestHangs","Output":"goroutine 7 [chan receive]:\n"}`,
		`{"Action":"output","Package":"example.com/d","Output":"FAIL\texample.com/d\t1200.0s\n"}`,
		`{"Action":"fail","Package":"example.com/d","Elapsed":1200}`,
	} {
		s.add([]byte(line))
	}
	if s.end() {
		t.Fatal("a timed-out package passed")
	}
	got := out.String()
	want := "--- UNFINISHED example.com/d TestHangs\npanic: test timed out after 20m0s\ngoroutine 7 [chan receive]:\n"
	if !strings.Contains(got, want) {
		t.Errorf("summary lacks %q:\n%s", want, got)
	}
	if strings.Contains(got, "TestQuick") {
		t.Errorf("a passing test's output printed:\n%s", got)
	}
}
