package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// FormatDuration writes d as a Go duration without zero tails: "4m", "1h",
// "1h30m", "90s", "1.5s". time.ParseDuration reads it back.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// String writes the duration as FormatDuration does.
func (d Duration) String() string { return FormatDuration(time.Duration(d)) }

// MarshalJSON writes the duration as a string ("4m"): specs, reports and
// stored documents show durations, never nanoseconds.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string ("30s", "4m"). A bare integer is
// read as nanoseconds: documents stored before durations were strings
// hold those, and must still load after an upgrade.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	var v time.Duration
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("duration: %w", err)
		}
		p, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("bad duration %q: %w", s, err)
		}
		v = p
	} else {
		var ns int64
		if err := json.Unmarshal(b, &ns); err != nil {
			return fmt.Errorf("duration %s: want a string such as \"30s\"", b)
		}
		v = time.Duration(ns)
	}
	if v < 0 {
		return fmt.Errorf("negative duration %s", b)
	}
	*d = Duration(v)
	return nil
}
