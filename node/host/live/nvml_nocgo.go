//go:build !linux || !cgo

package live

import (
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/nvmlprobe"
)

// nvmlHandle is empty where go-nvml cannot be built.
type nvmlHandle struct{}

// GPUStateNVML says NVML is unavailable in this build.
func (h *Host) GPUStateNVML() (*snapshot.GPUState, error) { return nvmlprobe.Collect() }
