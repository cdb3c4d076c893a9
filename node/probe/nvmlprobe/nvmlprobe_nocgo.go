//go:build !linux || !cgo

package nvmlprobe

import (
	"fmt"
	"runtime"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Collect always fails in this build: go-nvml needs cgo on Linux.
func Collect() (*snapshot.GPUState, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: not supported on %s", ErrUnavailable, runtime.GOOS)
	}
	return nil, fmt.Errorf("%w: built without cgo", ErrUnavailable)
}
