package agent

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
)

// checkParam is a parameter a check takes in a requested run, and the
// pattern its value must match in full.
type checkParam struct {
	check string
	re    *regexp.Regexp
}

// checkParams are the parameters requested runs may carry: each is read by
// the host when it runs the tool behind the check (dcgmi -r, the
// all_reduce_perf -b/-e/-f arguments).
func checkParams() map[string]checkParam {
	size := regexp.MustCompile(`^[1-9][0-9]{0,12}[KMG]?$`)
	return map[string]checkParam{
		"level":       {check: "dcgm.diag", re: regexp.MustCompile(`^[1-4]$`)},
		"min_bytes":   {check: "nccl.allreduce", re: size},
		"max_bytes":   {check: "nccl.allreduce", re: size},
		"step_factor": {check: "nccl.allreduce", re: regexp.MustCompile(`^([2-9]|1[0-6])$`)},
	}
}

// admitParams validates a request's parameters: known names, values that
// match, each for a check the request runs. A non-empty reason refuses.
func admitParams(params map[string]string, checks []string) string {
	if len(params) == 0 {
		return ""
	}
	if len(params) > maxParams {
		return fmt.Sprintf("%d parameters, at most %d", len(params), maxParams)
	}
	known := checkParams()
	for _, k := range slices.Sorted(maps.Keys(params)) {
		v := params[k]
		p, ok := known[k]
		switch {
		case !ok:
			return fmt.Sprintf("unknown parameter %q (known: %s)", clip(k), strings.Join(slices.Sorted(maps.Keys(known)), ", "))
		case !p.re.MatchString(v):
			return fmt.Sprintf("parameter %s: value %q does not match %s", k, clip(v), p.re)
		case !slices.Contains(checks, p.check):
			return fmt.Sprintf("parameter %s applies to %s, which this request does not run", k, p.check)
		}
	}
	return ""
}

// requestedDuration reads a duration a request gives in milliseconds
// (timeout_ms, revert_after_ms, revert_on_disconnect_ms), clamped to
// limit. 0 or less is "not given" and returns 0; a number too large for a
// time.Duration (INT64_MAX ms) clamps like any other, instead of wrapping
// negative in the multiplication.
func requestedDuration(ms int64, limit time.Duration) time.Duration {
	switch {
	case ms <= 0:
		return 0
	case ms > limit.Milliseconds():
		return limit
	}
	return time.Duration(ms) * time.Millisecond
}
