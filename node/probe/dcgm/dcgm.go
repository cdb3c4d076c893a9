// Package dcgm parses `dcgmi diag -r N -j` output into a snapshot.DCGMDiag.
//
// Two shapes exist. DCGM 4.x writes {"DCGM Diagnostic": {"test_categories":
// [{"category", "tests": [{"name", "results": [{"entity_group",
// "entity_id", "status", "warnings": [{"error_id", "warning"}]}],
// "test_summary"}]}]}, "metadata": {"version", "Driver Version Detected"}}.
// DCGM 3.x writes {"DCGM GPU Diagnostic": {"test_categories": [...],
// "version"}} whose results name GPUs by "gpu_ids" (a number, or a string
// list "0,1,2" for node-wide tests) or "gpu_id". Some versions print a text
// banner before the JSON and put null members in lists; both are tolerated.
//
// The diagnostic level is not in the output: the caller that ran dcgmi
// knows it and sets DCGMDiag.Level.
package dcgm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Sentinel errors; every error Parse returns wraps one of them or a JSON
// error and names the source.
var (
	// ErrNoJSON: no JSON object with a diagnostic in the input.
	ErrNoJSON = errors.New("no dcgmi diag JSON object")
	// ErrRuntime: dcgmi reported that the diagnostic could not run.
	ErrRuntime = errors.New("diagnostic did not run")
	// ErrNoTests: the JSON parsed but held no test results.
	ErrNoTests = errors.New("no test results")
)

// Bounds on what hostile input can make the parser keep.
const (
	maxWarnings    = 16   // per result
	maxWarningText = 1024 // bytes per warning
	maxStarts      = 4    // "{" positions tried when a banner holds braces
)

// Parse reads dcgmi diag -j output. Text before the JSON object (DCGM 3.x
// banners) and after it is ignored.
func Parse(data []byte) (*snapshot.DCGMDiag, error) {
	d, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("parse dcgmi diag: %w", err)
	}
	return d, nil
}

// parse decodes the first JSON value that starts a line, so a banner with
// braces in it ("WARNING: {...}") is passed over. Only when that value is
// not valid JSON are later line starts tried; the first error is kept.
func parse(data []byte) (*snapshot.DCGMDiag, error) {
	var firstErr error
	for try, off := 0, 0; try < maxStarts; try++ {
		i := objectStart(data, off)
		if i < 0 {
			break
		}
		var doc document
		if err := json.NewDecoder(bytes.NewReader(data[i:])).Decode(&doc); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			off = i + 1
			continue
		}
		return build(&doc)
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrNoJSON
}

// objectStart finds the next "{" at or after off that only blanks precede
// on its line; failing that, the next "{" anywhere (JSON after a banner on
// the same line).
func objectStart(data []byte, off int) int {
	lineStart := true
	for i := off; i < len(data); i++ {
		switch data[i] {
		case '{':
			if lineStart || i == 0 {
				return i
			}
		case '\n', '\r':
			lineStart = true
			continue
		case ' ', '\t':
			continue
		}
		lineStart = false
	}
	if off == 0 {
		return bytes.IndexByte(data, '{')
	}
	return -1
}

type document struct {
	Diag4    *body     `json:"DCGM Diagnostic"`
	Diag3    *body     `json:"DCGM GPU Diagnostic"`
	Metadata *metadata `json:"metadata"`
	// DCGM 3.x keeps the driver version at the top level.
	Driver string `json:"Driver Version Detected"`
}

type body struct {
	Categories   []*category `json:"test_categories"`
	RuntimeError string      `json:"runtime_error"`
	Version      string      `json:"version"` // DCGM 3.x
}

type metadata struct {
	Version string `json:"version"`
	Driver  string `json:"Driver Version Detected"`
}

type category struct {
	Category string  `json:"category"`
	Tests    []*test `json:"tests"`
}

type test struct {
	Name    string    `json:"name"`
	Results []*result `json:"results"`
	Summary *struct {
		Status string `json:"status"`
	} `json:"test_summary"`
}

type result struct {
	EntityGroup string          `json:"entity_group"`
	EntityID    json.RawMessage `json:"entity_id"`
	GPUIDs      json.RawMessage `json:"gpu_ids"`
	GPUID       json.RawMessage `json:"gpu_id"`
	Status      string          `json:"status"`
	Warnings    json.RawMessage `json:"warnings"`
}

func build(doc *document) (*snapshot.DCGMDiag, error) {
	b := doc.Diag4
	if b == nil {
		b = doc.Diag3
	}
	if b == nil {
		return nil, ErrNoJSON
	}
	if s := strings.TrimSpace(b.RuntimeError); s != "" {
		return nil, fmt.Errorf("%w: %s", ErrRuntime, clip(s))
	}
	d := &snapshot.DCGMDiag{Version: b.Version, DriverVersion: doc.Driver}
	if m := doc.Metadata; m != nil {
		if m.Version != "" {
			d.Version = m.Version
		}
		if m.Driver != "" {
			d.DriverVersion = m.Driver
		}
	}
	for _, c := range b.Categories {
		if c == nil {
			continue
		}
		for _, t := range c.Tests {
			if t == nil {
				continue
			}
			d.Tests = appendTest(d.Tests, c.Category, t)
		}
	}
	if len(d.Tests) == 0 {
		return nil, ErrNoTests
	}
	return d, nil
}

// appendTest adds one entry per entity result; a test with no results but
// a summary becomes one node-wide entry so its verdict is not lost.
func appendTest(out []snapshot.DCGMTest, cat string, t *test) []snapshot.DCGMTest {
	n := 0
	for _, r := range t.Results {
		if r == nil {
			continue
		}
		n++
		group, id := entity(r)
		out = append(out, snapshot.DCGMTest{
			Category:    cat,
			Name:        t.Name,
			EntityGroup: group,
			EntityID:    id,
			Status:      snapshot.NormalizeDCGMStatus(r.Status),
			Warnings:    warnings(r.Warnings),
		})
	}
	if n == 0 && t.Summary != nil && t.Summary.Status != "" {
		out = append(out, snapshot.DCGMTest{
			Category: cat,
			Name:     t.Name,
			EntityID: -1,
			Status:   snapshot.NormalizeDCGMStatus(t.Summary.Status),
		})
	}
	return out
}

// entity returns the result's entity group and id; -1 means the result
// covers the node (no id, or a DCGM 3.x list of several GPUs).
func entity(r *result) (string, int) {
	if len(r.EntityID) > 0 {
		return strings.TrimSpace(r.EntityGroup), oneID(r.EntityID)
	}
	for _, raw := range []json.RawMessage{r.GPUIDs, r.GPUID} {
		if len(raw) > 0 && string(raw) != "null" {
			return "GPU", oneID(raw)
		}
	}
	return strings.TrimSpace(r.EntityGroup), -1
}

// oneID reads 3, 3.0, "3" as 3; anything else, including "0,1,2", is -1.
func oneID(raw json.RawMessage) int {
	b := bytes.TrimSpace(raw)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if json.Unmarshal(b, &s) != nil {
			return -1
		}
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n >= 0 {
			return n
		}
		return -1
	}
	x, err := strconv.ParseFloat(string(b), 64)
	if err != nil || x < 0 || x > math.MaxInt32 || x != math.Trunc(x) {
		return -1
	}
	return int(x)
}

// warnings reads a warnings list whose members may be objects
// ({"warning"|"message", "error_id"}), plain strings or null.
func warnings(raw json.RawMessage) []string {
	if len(raw) == 0 {
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		items = []json.RawMessage{raw} // a single object or string
	}
	var out []string
	for _, it := range items {
		if len(out) == maxWarnings {
			break
		}
		if s := warningText(it); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func warningText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return clip(strings.TrimSpace(s))
	}
	var w struct {
		Warning string   `json:"warning"`
		Message string   `json:"message"`
		ErrorID *float64 `json:"error_id"`
	}
	if json.Unmarshal(raw, &w) != nil {
		return ""
	}
	text := strings.TrimSpace(w.Warning)
	if text == "" {
		text = strings.TrimSpace(w.Message)
	}
	if text == "" {
		return ""
	}
	if w.ErrorID != nil && *w.ErrorID == math.Trunc(*w.ErrorID) && math.Abs(*w.ErrorID) < 1e9 {
		text = fmt.Sprintf("%s (DCGM error %d)", text, int64(*w.ErrorID))
	}
	return clip(text)
}

func clip(s string) string {
	if len(s) <= maxWarningText {
		return s
	}
	return strings.ToValidUTF8(s[:maxWarningText], "")
}
