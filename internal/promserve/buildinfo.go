package promserve

import (
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfoDesc describes fleetcheck_build_info, which both daemons export
// (always 1), so a dashboard can tell which build every process runs.
var BuildInfoDesc = prometheus.NewDesc("fleetcheck_build_info",
	"Always 1: the fleetcheck version, the VCS revision it was built from (-dirty with local changes; unknown when the build did not stamp it) and the Go version.",
	[]string{"version", "revision", "goversion"}, nil)

var revision = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
})

// AddBuildInfo adds fleetcheck_build_info for version to s.
func AddBuildInfo(s *Series, version string) {
	if version == "" {
		version = "unknown"
	}
	s.Add(BuildInfoDesc, prometheus.GaugeValue, 1, version, revision(), runtime.Version())
}
