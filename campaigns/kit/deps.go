package kit

import (
	"fmt"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// Deps are what every campaign engine runs on; each engine's
// constructor has the one shape New(ctx, Deps, Options), Options being
// the engine's own knobs. The coordinator builds one Deps and hands it to
// every engine, so they share the database, clock, breaker and Busy.
type Deps struct {
	// DB holds the engines' tables (each engine's prefixed with its name)
	// beside the coordinator's own; SQLite or PostgreSQL.
	DB    *sqldb.DB
	Fleet Fleet
	// Clock is the campaign clock (nil: the wall clock).
	Clock Clock
	// Drainer takes nodes out of service and back (nil: drain.None,
	// which records and does nothing).
	Drainer drain.Adapter
	// Breaker is asked before every drain (nil: none).
	Breaker *Breaker
	// Busy is which nodes campaigns hold, across engines (nil: the engine
	// sees only its own campaigns).
	Busy   *Busy
	Logger zerolog.Logger
}

// Check fills the defaults and says what is missing; engine prefixes
// the error ("burnin engine"). A database is required by the engines
// that open their tables on it (their schema's Migrate says so).
func (d Deps) Check(engine string) (Deps, error) {
	if d.Fleet == nil {
		return d, fmt.Errorf("%s: no fleet", engine)
	}
	d.Clock = OrWall(d.Clock)
	if d.Drainer == nil {
		d.Drainer = drain.NewNone(nil)
	}
	if d.Busy == nil {
		d.Busy = &Busy{}
	}
	return d, nil
}
