package store

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// decodeMetrics reads check's stored metrics column back, keeping the
// names keep accepts (nil: all). Readers of many rows want a few metrics of each
// (the remediation feed: two counters of ~350), and encoding/json fills a
// map through reflection at ~5x the cost of a scan. The scan reads the
// form appendMetricsJSON writes — {"name":number,...}, no spaces, names
// without escapes — and hands anything else (older rows, an escaped name)
// to encoding/json, so what it returns never depends on which path read
// it (FuzzDecodeMetrics).
func decodeMetrics(s, check string, keep func(check, name string) bool) (map[string]float64, error) {
	if m, ok := scanMetrics(s, check, keep); ok {
		return m, nil
	}
	var all map[string]float64
	if err := json.Unmarshal([]byte(s), &all); err != nil {
		return nil, err
	}
	if keep == nil {
		return all, nil
	}
	for k := range all {
		if !keep(check, k) {
			delete(all, k)
		}
	}
	return all, nil
}

// scanMetrics is decodeMetrics' fast path; ok is false when s is not in
// the written form (the caller then decodes it in full).
func scanMetrics(s, check string, keep func(check, name string) bool) (map[string]float64, bool) {
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, false
	}
	var out map[string]float64
	body := s[1 : len(s)-1]
	for body != "" {
		if body[0] != '"' {
			return nil, false
		}
		end := strings.IndexByte(body[1:], '"')
		if end < 0 {
			return nil, false
		}
		name := body[1 : 1+end]
		if strings.IndexByte(name, '\\') >= 0 || !plainName(name) {
			return nil, false
		}
		body = body[1+end+1:]
		if body == "" || body[0] != ':' {
			return nil, false
		}
		body = body[1:]
		n := strings.IndexByte(body, ',')
		last := n < 0
		if last {
			n = len(body)
		}
		num := body[:n]
		if !jsonNumber(num) {
			return nil, false
		}
		if keep == nil || keep(check, name) {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return nil, false // out of range: encoding/json says how
			}
			if out == nil {
				out = map[string]float64{}
			}
			if _, dup := out[name]; dup {
				return nil, false // never written; the slow path decides
			}
			out[name] = v
		} else if len(num) > 300 || strings.ContainsAny(num, "eE") {
			// A number out of float64's range is an error even unread.
			if _, err := strconv.ParseFloat(num, 64); err != nil {
				return nil, false
			}
		}
		if last {
			break
		}
		body = body[n+1:]
		if body == "" {
			return nil, false // a trailing comma
		}
	}
	if out == nil {
		out = map[string]float64{}
	}
	return out, true
}

// plainName reports whether a JSON string body needs no decoding: printable
// ASCII only (other bytes, valid or not, take encoding/json's reading).
func plainName(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}

// jsonNumber reports whether s is a number in JSON's grammar.
func jsonNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	return i == len(s)
}

// decodeFindings reads a stored findings column; "[]", what a passing
// check stores, costs nothing.
func decodeFindings(s string) ([]report.Finding, error) {
	if s == "[]" {
		return nil, nil
	}
	var out []report.Finding
	err := json.Unmarshal([]byte(s), &out)
	return out, err
}
