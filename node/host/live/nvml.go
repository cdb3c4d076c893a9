//go:build linux && cgo

package live

import (
	"errors"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/nvmlprobe"
)

// errNVMLOff says the config turned NVML off.
var errNVMLOff = errors.New("NVML disabled in config")

// nvmlHandle keeps NVML initialised across passes: Init costs far more
// than a query, and an agent asks every minute.
type nvmlHandle struct {
	mu  sync.Mutex
	lib nvml.Interface
	err error
	// tried is set after the first attempt; a library that did not load
	// will not load later in the same process.
	tried bool
}

// GPUStateNVML reads the GPUs through NVML. It returns an error starting
// with "NVML not available" when the library does not load.
func (h *Host) GPUStateNVML() (*snapshot.GPUState, error) {
	if h.tools.UseNVML != nil && !*h.tools.UseNVML {
		return nil, errNVMLOff
	}
	h.nvml.mu.Lock()
	defer h.nvml.mu.Unlock()
	if !h.nvml.tried {
		h.nvml.tried = true
		lib, _, err := nvmlprobe.Open()
		h.nvml.lib, h.nvml.err = lib, err
	}
	if h.nvml.err != nil {
		return nil, h.nvml.err
	}
	return nvmlprobe.Read(h.nvml.lib)
}
