package ibsysfs

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// maxTextLen bounds names kept from sysfs (state names, link layers): real
// ones are a few words.
const maxTextLen = 64

// parseState turns "4: ACTIVE" into "ACTIVE" and "5: LinkUp" into "LinkUp"
// (the kernel prints "%u: %s"). A bare name without the number is accepted.
func parseState(s string) (string, error) {
	s = strings.TrimSpace(s)
	if num, name, found := strings.Cut(s, ":"); found {
		if !allDigits(strings.TrimSpace(num)) {
			return "", fmt.Errorf("parse %q: want \"<number>: <name>\"", clip(s))
		}
		s = strings.TrimSpace(name)
	}
	if s == "" {
		return "", errors.New("empty state")
	}
	if strings.Contains(s, ":") {
		return "", fmt.Errorf("parse %q: more than one ':'", clip(s))
	}
	if err := checkText(s); err != nil {
		return "", err
	}
	return s, nil
}

// parseRate turns "400 Gb/sec (4X NDR)" into 400 and the trimmed text. The
// kernel prints "%d%s Gb/sec (%dX%s)" where %s may be ".5" (2.5 Gb/sec SDR).
func parseRate(s string) (float64, string, error) {
	text := strings.TrimSpace(s)
	num, rest, _ := strings.Cut(text, " ")
	if !strings.HasPrefix(rest, "Gb/sec") {
		return 0, "", fmt.Errorf("parse rate %q: want \"<number> Gb/sec ...\"", clip(text))
	}
	// Digits and one dot only: ParseFloat alone would take "NaN", "Inf",
	// exponents and hex floats.
	if num == "" || strings.Count(num, ".") > 1 || !allDigits(strings.Replace(num, ".", "", 1)) ||
		num[0] == '.' || num[len(num)-1] == '.' {
		return 0, "", fmt.Errorf("parse rate %q: bad number", clip(text))
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, "", fmt.Errorf("parse rate %q: %w", clip(text), err)
	}
	if err := checkText(text); err != nil {
		return 0, "", err
	}
	return v, text, nil
}

// parseCounter parses a counter value: a decimal uint64, surrounding white
// space allowed.
func parseCounter(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) {
			err = ne.Err
		}
		return 0, fmt.Errorf("parse %q: %w", clip(t), err)
	}
	return v, nil
}

// checkText accepts short printable ASCII only: these values end up in
// reports and metric names.
func checkText(s string) error {
	if s == "" {
		return errors.New("empty value")
	}
	if len(s) > maxTextLen {
		return fmt.Errorf("value longer than %d bytes", maxTextLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return fmt.Errorf("parse %q: not printable text", clip(s))
		}
	}
	return nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// clip shortens a bad value for an error message.
func clip(s string) string {
	const n = 32
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
