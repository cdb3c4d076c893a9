package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// stateFileName holds what one scheduled pass leaves for the next, so that
// counter deltas and "new since the last run" survive a restart.
const stateFileName = "agent-state.json"

// persisted is the state file's content.
type persisted struct {
	Version int           `json:"version"`
	Checks  *checks.State `json:"checks,omitempty"`
	// Inventory of the last pass: the Hello carries it before the first
	// pass of a restarted agent is done.
	Inventory *report.Inventory `json:"inventory,omitempty"`
}

const stateVersion = 1

// loadState reads the state file. A missing file is a first start; an
// unreadable one costs one pass of deltas, so it is reported, not fatal.
func loadState(dir string) (persisted, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if errors.Is(err, os.ErrNotExist) {
		return persisted{}, nil
	}
	if err != nil {
		return persisted{}, fmt.Errorf("read state: %w", err)
	}
	var p persisted
	if err := json.Unmarshal(data, &p); err != nil {
		return persisted{}, fmt.Errorf("parse state %s: %w", filepath.Join(dir, stateFileName), err)
	}
	if p.Version != stateVersion {
		return persisted{}, fmt.Errorf("state %s: version %d, want %d", filepath.Join(dir, stateFileName), p.Version, stateVersion)
	}
	return p, nil
}

// saveState writes the state file atomically: a crash mid-write leaves the
// previous state, never half a file.
func saveState(dir string, p persisted) error {
	p.Version = stateVersion
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, stateFileName), data)
}

// writeFileAtomic writes data to path via a temporary file, fsync and
// rename, then syncs the directory so the rename itself is durable.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Dir(path), err)
	}
	defer func() { _ = d.Close() }() // opened only to fsync: Sync's error is the one that counts
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Dir(path), err)
	}
	return nil
}
