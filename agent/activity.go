package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// ActivitySource tells the agent what the node is doing. Scheduler
// adapters (Slurm, Kubernetes) implement it; the default reads the activity
// file and falls back to the config's activity.
type ActivitySource interface {
	Activity(ctx context.Context) (Activity, error)
}

// ActivityFunc adapts a function to ActivitySource.
type ActivityFunc func(ctx context.Context) (Activity, error)

// Activity calls f.
func (f ActivityFunc) Activity(ctx context.Context) (Activity, error) { return f(ctx) }

// fileActivity reads one word (idle, busy, drained) from a file that a
// scheduler's prolog/epilog writes; without the file, the configured value
// holds. A file that says something else is an error: the activity is then
// unknown and disruptive checks are refused.
type fileActivity struct {
	path     string
	fallback Activity
}

func (f fileActivity) Activity(context.Context) (Activity, error) {
	data, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return f.fallback, nil
	}
	if err != nil {
		return ActivityUnknown, fmt.Errorf("activity file: %w", err)
	}
	a, err := ParseActivity(string(data))
	if err != nil {
		return ActivityUnknown, fmt.Errorf("activity file %s: %w", f.path, err)
	}
	return a, nil
}
