// Command testsum turns `go test -json` on stdin into the readable summary
// make test prints: one line per package as it finishes, the output of
// every failed test and build, and at the end the slowest packages. The raw
// events stay in bin/test.json for CI to keep per-package durations.
//
//	go test -json ./... | tee bin/test.json | go run ./scripts/testsum
//
// It exits 1 when anything failed, so the pipeline fails even without
// pipefail.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is the part of test2json's TestEvent that testsum reads.
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     float64 // seconds
	Output      string
	ImportPath  string // build-output, build-fail
	FailedBuild string
}

// slowest is how many packages the final table lists.
const slowest = 15

type pkgResult struct {
	name    string
	action  string
	elapsed time.Duration
}

type summary struct {
	out      io.Writer
	output   map[string][]string // package + "\x00" + test → its output lines
	builds   map[string][]string // import path → build output
	results  []pkgResult
	failed   []string
	testFail map[string]bool // packages with a failed test already listed
	nonEvent int
}

func newSummary(out io.Writer) *summary {
	return &summary{out: out, output: map[string][]string{}, builds: map[string][]string{}, testFail: map[string]bool{}}
}

func (s *summary) add(line []byte) {
	var e event
	if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
		// go test prints some failures (a vet or setup error) as plain text.
		s.nonEvent++
		fmt.Fprintf(s.out, "%s\n", line)
		return
	}
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "build-output":
		s.builds[e.ImportPath] = append(s.builds[e.ImportPath], e.Output)
	case "build-fail":
		fmt.Fprintf(s.out, "BUILD FAIL %s\n%s", e.ImportPath, strings.Join(s.builds[e.ImportPath], ""))
		s.failed = append(s.failed, e.ImportPath+" (build)")
	case "output":
		s.output[key] = append(s.output[key], e.Output)
	case "pass":
		if e.Test == "" {
			s.finish(e)
		}
		delete(s.output, key)
	case "skip": // a package with no tests, or a skipped test: nothing to say

		delete(s.output, key)
	case "fail":
		if e.Test != "" {
			fmt.Fprintf(s.out, "--- FAIL %s %s (%.2fs)\n%s", e.Package, e.Test, e.Elapsed, strings.Join(s.output[key], ""))
			s.failed = append(s.failed, e.Package+" "+e.Test)
			s.testFail[e.Package] = true
		} else {
			// Output outside any test: a panic, a TestMain failure, a timeout.
			s.unfinished(e.Package)
			if lines := s.output[key]; len(lines) > 0 {
				fmt.Fprint(s.out, strings.Join(lines, ""))
			}
			if e.FailedBuild == "" && !s.testFail[e.Package] {
				s.failed = append(s.failed, e.Package)
			}
			s.finish(e)
		}
		delete(s.output, key)
	}
}

// unfinishedLines bounds what one unfinished test prints: a timeout's
// goroutine dump can run to many thousands of lines.
const unfinishedLines = 3000

// unfinished prints the output of the package's tests that never ended:
// when a test binary panics or times out, test2json files the panic and the
// goroutine dump under the test that was running, and that test gets no
// pass or fail of its own.
func (s *summary) unfinished(pkg string) {
	var keys []string
	for key := range s.output {
		if p, test, _ := strings.Cut(key, "\x00"); p == pkg && test != "" {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		lines := s.output[key]
		_, test, _ := strings.Cut(key, "\x00")
		fmt.Fprintf(s.out, "--- UNFINISHED %s %s\n", pkg, test)
		if len(lines) > unfinishedLines {
			fmt.Fprintf(s.out, "    (the first %d of %d lines)\n", unfinishedLines, len(lines))
			lines = lines[:unfinishedLines]
		}
		fmt.Fprint(s.out, strings.Join(lines, ""))
		delete(s.output, key)
	}
}

func (s *summary) finish(e event) {
	d := time.Duration(e.Elapsed * float64(time.Second))
	word := map[string]string{"pass": "ok  ", "fail": "FAIL"}[e.Action]
	fmt.Fprintf(s.out, "%s %-60s %7.1fs\n", word, e.Package, d.Seconds())
	s.results = append(s.results, pkgResult{e.Package, e.Action, d})
}

// end prints the table of the slowest packages and the failures; it
// reports whether everything passed.
func (s *summary) end() bool {
	rs := append([]pkgResult(nil), s.results...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].elapsed > rs[j].elapsed })
	var total time.Duration
	for _, r := range rs {
		total += r.elapsed
	}
	fmt.Fprintf(s.out, "\n%d packages, %.0fs of package time; the %d slowest:\n", len(rs), total.Seconds(), min(slowest, len(rs)))
	for _, r := range rs[:min(slowest, len(rs))] {
		fmt.Fprintf(s.out, "  %7.1fs  %s\n", r.elapsed.Seconds(), r.name)
	}
	if len(s.failed) > 0 {
		fmt.Fprintf(s.out, "\nFAILED (%d):\n  %s\n", len(s.failed), strings.Join(s.failed, "\n  "))
		return false
	}
	return s.nonEvent == 0 || len(rs) > 0
}

func main() {
	s := newSummary(os.Stdout)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		s.add(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(1)
	}
	if !s.end() {
		os.Exit(1)
	}
}
