package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3" // the "sqlite3" driver the campaign engines' stores use

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// CampaignScenarios lists the campaign scenarios RunCampaign knows, in
// the order "all" runs them.
func CampaignScenarios() []string {
	return []string{"sweep", "rollout", "burnin", "drill", "remediation"}
}

// CampaignOptions shape the campaign scenarios. They run the real campaign
// engines against simfleet on its virtual clock: simulated hours take
// wall seconds and nothing leaves the process.
type CampaignOptions struct {
	// Progress receives the narrative and tables (nil: discarded).
	Progress io.Writer
	// Seed drives the simulated measurement noise.
	Seed uint64
	// HTML, when set, is where the burn-in scenario writes its HTML report.
	HTML string
	// Dir holds the engines' SQLite stores; "" uses a temporary directory
	// that is removed afterwards.
	Dir string
	// RemediationNodes and RemediationDays size the remediation scenario
	// (0: the full 1,024 nodes and 30 days).
	RemediationNodes, RemediationDays int
	// remediationConfig lets tests break the engine's config on purpose.
	remediationConfig func(*remediation.Config)
}

// Campaigns is what the campaign scenarios found, for -o json.
type Campaigns struct {
	Sweep       *SweepResult       `json:"sweep,omitempty"`
	Rollout     *RolloutResult     `json:"rollout,omitempty"`
	Burnin      *BurninResult      `json:"burnin,omitempty"`
	Drill       *DrillResult       `json:"drill,omitempty"`
	Remediation *RemediationResult `json:"remediation,omitempty"`
}

// RunCampaign runs one campaign scenario by name and records its outcome
// in into.
func RunCampaign(ctx context.Context, name string, opts CampaignOptions, into *Campaigns) error {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "fleetcheck-campaign-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dir) }() // best effort: a temp dir
		opts.Dir = dir
	}
	var err error
	switch name {
	case "sweep":
		into.Sweep, err = runSweep(ctx, opts)
	case "rollout":
		into.Rollout, err = runRollout(ctx, opts)
	case "burnin":
		into.Burnin, err = runBurnin(ctx, opts)
	case "drill":
		into.Drill, err = runDrill(ctx, opts)
	case "remediation":
		into.Remediation, err = runRemediation(ctx, opts)
	default:
		return fmt.Errorf("unknown campaign scenario %q (want one of %s)", name, strings.Join(CampaignScenarios(), ", "))
	}
	if err != nil {
		return fmt.Errorf("%s scenario: %w", name, err)
	}
	return nil
}

// openCampaignDB opens a fresh SQLite database for one engine, as the
// coordinator's store would (sqldb: WAL, busy timeout, immediate write
// transactions).
func openCampaignDB(dir, name string) (*sqldb.DB, error) {
	return sqldb.Open(context.Background(), filepath.Join(dir, name+".db"), sqldb.Options{})
}

// heading prints a scenario's title line.
func heading(w io.Writer, title string) {
	fmt.Fprintf(w, "\n== %s ==\n", title)
}

// simDur formats a simulated duration for people.
func simDur(d time.Duration) string {
	if d >= time.Hour {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}
