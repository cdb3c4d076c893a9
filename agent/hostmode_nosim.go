//go:build node

package agent

import (
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/node/host"
)

// ErrNoSimulator is the slim node build's answer to host mode sim.
var ErrNoSimulator = errors.New("this build has no simulator; use the full fleetcheck binary for staging agents")

// validateSim refuses host mode sim at config load, before anything runs.
func (c *Config) validateSim() error {
	return fmt.Errorf("%w: host.mode sim: %w", ErrInvalid, ErrNoSimulator)
}

func openSim(*Config, zerolog.Logger) (host.Host, error) {
	return nil, fmt.Errorf("host mode sim: %w", ErrNoSimulator)
}
