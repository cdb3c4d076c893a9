package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/config"
)

// revertsFileName holds the armed revert timers, so that an agent
// restarted mid-drill still reverts on time.
const revertsFileName = "reverts.json"

// Revert retries: a revert that failed is tried again, less and less
// often, until it works or the coordinator reverts.
const (
	revertRetryFirst = 30 * time.Second
	revertRetryMax   = 10 * time.Minute
)

// armedRevert is one revert timer: the action that armed it, the revert
// action with its parameters, and when it fires.
type armedRevert struct {
	ID     string            `json:"id"` // the action id that armed it
	Action string            `json:"action"`
	Revert string            `json:"revert"`
	Params map[string]string `json:"params,omitempty"`
	// ArmedAt and Due are wall-clock times: the timer fires at Due whether
	// the agent ran all along or restarted.
	ArmedAt time.Time `json:"armed_at"`
	Due     time.Time `json:"due"`
	// OnDisconnect fires the revert once the agent has been without a
	// coordinator stream this long (0: only at Due).
	// Stored as "2m"; older state files hold nanoseconds, read as well.
	OnDisconnect config.Duration `json:"on_disconnect,omitempty"`
	Reason       string          `json:"reason,omitempty"`
	Attempts     int             `json:"attempts,omitempty"`
	NextTry      time.Time       `json:"next_try,omitzero"`
}

// fireAt is when the timer fires, given since when the agent has been
// without a stream (zero while it has one).
func (r *armedRevert) fireAt(disconnected time.Time) time.Time {
	t := r.Due
	if r.OnDisconnect > 0 && !disconnected.IsZero() {
		if d := disconnected.Add(time.Duration(r.OnDisconnect)); d.Before(t) {
			t = d
		}
	}
	if r.NextTry.After(t) {
		t = r.NextTry
	}
	return t
}

type revertsFile struct {
	Version int            `json:"version"`
	Armed   []*armedRevert `json:"armed"`
}

// revertKeeper holds the armed revert timers, on disk and in memory, and
// runs each revert when its timer fires: with the stream up or down.
type revertKeeper struct {
	path string
	log  zerolog.Logger
	// run runs the revert action; it is the agent's execAction.
	run  func(ctx context.Context, r *armedRevert) error
	wake chan struct{}

	mu    sync.Mutex
	armed []*armedRevert
	// disconnected is since when no stream has been up (zero while one is).
	disconnected time.Time
}

func newRevertKeeper(dir string, log zerolog.Logger, run func(context.Context, *armedRevert) error) *revertKeeper {
	return &revertKeeper{
		path:         filepath.Join(dir, revertsFileName),
		log:          log,
		run:          run,
		wake:         make(chan struct{}, 1),
		disconnected: time.Now(),
	}
}

// load reads the armed timers a previous run left. An unreadable file is
// an error: forgetting a fault in place is worse than not starting.
func (k *revertKeeper) load() error {
	data, err := os.ReadFile(k.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read armed reverts: %w", err)
	}
	var f revertsFile
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("parse armed reverts %s: %w", k.path, err)
	}
	if f.Version != 1 {
		return fmt.Errorf("armed reverts %s: version %d, want 1", k.path, f.Version)
	}
	k.mu.Lock()
	k.armed = f.Armed
	k.mu.Unlock()
	for _, r := range f.Armed {
		k.log.Warn().Str("action", r.Action).Str("revert", r.Revert).Time("due", r.Due).
			Msg("revert timer left armed by the previous run")
	}
	return nil
}

// saveLocked writes the timers atomically; k.mu is held.
func (k *revertKeeper) saveLocked() error {
	data, err := json.Marshal(revertsFile{Version: 1, Armed: k.armed})
	if err != nil {
		return fmt.Errorf("encode armed reverts: %w", err)
	}
	return writeFileAtomic(k.path, data)
}

func (k *revertKeeper) signal() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// arm adds a timer and keeps it on disk before returning.
func (k *revertKeeper) arm(r *armedRevert) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.armed = append(k.armed, r)
	if err := k.saveLocked(); err != nil {
		k.armed = k.armed[:len(k.armed)-1]
		return err
	}
	k.signal()
	return nil
}

// disarm drops the timers that the revert action with these parameters
// answers, and returns how many.
func (k *revertKeeper) disarm(revert string, params map[string]string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := len(k.armed)
	k.armed = slices.DeleteFunc(k.armed, func(r *armedRevert) bool {
		return r.Revert == revert && maps.Equal(r.Params, params)
	})
	removed := n - len(k.armed)
	if removed > 0 {
		if err := k.saveLocked(); err != nil {
			// The timer fires later and runs the revert once more.
			k.log.Error().Err(err).Msg("cannot record a disarmed revert timer")
		}
		k.signal()
	}
	return removed
}

// connected tells the keeper whether a coordinator stream is up.
func (k *revertKeeper) connected(up bool) {
	k.mu.Lock()
	switch {
	case up:
		k.disconnected = time.Time{}
	case k.disconnected.IsZero():
		k.disconnected = time.Now()
	}
	k.mu.Unlock()
	k.signal()
}

// pending lists the armed timers (a copy).
func (k *revertKeeper) pending() []armedRevert {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]armedRevert, 0, len(k.armed))
	for _, r := range k.armed {
		out = append(out, *r)
	}
	return out
}

// next returns the first timer due at or before now, or when the next
// one fires.
func (k *revertKeeper) next(now time.Time) (*armedRevert, time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var when time.Time
	for _, r := range k.armed {
		t := r.fireAt(k.disconnected)
		if !t.After(now) {
			return r, t
		}
		if when.IsZero() || t.Before(when) {
			when = t
		}
	}
	return nil, when
}

// loop fires timers until ctx ends; what is still armed then stays on
// disk for the next run.
func (k *revertKeeper) loop(ctx context.Context) {
	for {
		r, when := k.next(time.Now())
		if r != nil {
			k.fire(ctx, r)
			continue
		}
		var t *time.Timer
		var timer <-chan time.Time
		if !when.IsZero() {
			t = time.NewTimer(time.Until(when))
			timer = t.C
		}
		select {
		case <-ctx.Done():
		case <-k.wake:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// fire runs one revert. It is dropped once it worked; a failure is
// retried later, with backoff.
func (k *revertKeeper) fire(ctx context.Context, r *armedRevert) {
	log := k.log.With().Str("action", r.Action).Str("revert", r.Revert).Str("action_id", r.ID).Logger()
	k.mu.Lock()
	why := "its timer fired"
	if !k.disconnected.IsZero() && r.OnDisconnect > 0 && time.Since(k.disconnected) >= time.Duration(r.OnDisconnect) {
		why = fmt.Sprintf("no coordinator for %s", time.Since(k.disconnected).Round(time.Second))
	}
	k.mu.Unlock()
	log.Warn().Str("why", why).Time("armed_at", r.ArmedAt).Msg("reverting on the agent's own timer")
	err := k.run(ctx, r)
	if ctx.Err() != nil {
		return // stopping: the timer stays on disk and fires after a restart
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	i := slices.Index(k.armed, r)
	if i < 0 {
		return // the coordinator reverted meanwhile
	}
	if err == nil {
		k.armed = slices.Delete(k.armed, i, i+1)
		log.Info().Msg("reverted")
	} else {
		r.Attempts++
		wait := min(revertRetryFirst<<min(r.Attempts-1, 10), revertRetryMax)
		r.NextTry = time.Now().Add(wait)
		log.Error().Err(err).Int("attempts", r.Attempts).Dur("retry_in_ms", wait).Msg("revert failed")
	}
	if err := k.saveLocked(); err != nil {
		log.Error().Err(err).Msg("cannot record the revert")
	}
}

// runRevert runs an armed timer's revert action as the config defines it
// now, then asks for a pass so the node's recovery shows.
func (a *Agent) runRevert(ctx context.Context, r *armedRevert) error {
	cfg, ok := a.cfg.Actions[r.Revert]
	switch {
	case !ok:
		return fmt.Errorf("revert action %q is not configured", r.Revert)
	case a.actions == nil:
		return errors.New("this host cannot run actions")
	}
	if err := cfg.checkParams(r.Params); err != nil {
		return fmt.Errorf("revert %s: %w", r.Revert, err)
	}
	_, err := a.execAction(ctx, r.Revert, cfg, r.Params, cfg.timeout())
	a.kickPass()
	return err
}
