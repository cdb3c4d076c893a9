//go:build !node

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func newCoordinatorMigrateCmd() *cobra.Command {
	var from, to string
	var replace bool
	cmd := &cobra.Command{
		Use:   "migrate --from sqlite:PATH --to postgres://... | --from postgres://... --to sqlite:PATH",
		Short: "Move a coordinator's database between SQLite and PostgreSQL, every table, checked",
		Long: `Move a coordinator's whole history from its SQLite database to PostgreSQL: the
store's tables (nodes, results, check results, events, summaries, inventory
history, dispatches), the baselines and every campaign engine's tables.

Stop the coordinator first: migrate takes the data directory's lock, so it
refuses while a coordinator holds it. It brings the SQLite schema up to date,
creates the store's and the baselines' schema in PostgreSQL, creates any other
table from its SQLite definition, and copies one snapshot of the source in one
PostgreSQL transaction. Then it counts and checksums every table on both sides;
any difference rolls the copy back and exits non-zero. A target that already
holds rows is refused unless --replace (which deletes those rows first).

--from is sqlite:PATH, a database file, or a data directory (its fleetcheck.db).
--to is a PostgreSQL URL; keep the password out of it (PGPASSFILE, PGPASSWORD).
Afterwards set store_url in the coordinator's config to the --to URL
(docs/store.md).

The way back, --from postgres://... --to sqlite:PATH (or a data directory),
copies every table into a SQLite database that has them all already: the
file the fleet came from (with --replace), or a new one a coordinator was
started on once (it creates every table) and stopped. Stop every
coordinator on the PostgreSQL database first; the copy is one snapshot.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return migrateStore(cmd, from, to, replace)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the source: sqlite:PATH, a file or a data directory; or postgres://... (required)")
	cmd.Flags().StringVar(&to, "to", "", "the target: postgres://USER@HOST:PORT/DB?sslmode=...; or sqlite:PATH, a file or a data directory (required)")
	cmd.Flags().BoolVar(&replace, "replace", false, "delete the rows the target's tables already hold instead of refusing")
	return cmd
}

// sqliteSource resolves --from to a database file.
func sqliteSource(from string) (string, error) {
	if from == "" {
		return "", errors.New("--from is required (sqlite:PATH, a database file or a data directory)")
	}
	t, err := sqldb.Parse(from)
	if err != nil {
		return "", fmt.Errorf("--from: %w", err)
	}
	if t.Dialect != sqldb.SQLite {
		return "", fmt.Errorf("--from %s: migrate moves a SQLite database (sqlite:PATH); for PostgreSQL to PostgreSQL use pg_dump", t)
	}
	fi, err := os.Stat(t.Path)
	switch {
	case err != nil:
		return "", fmt.Errorf("--from: %w", err)
	case fi.IsDir():
		p := filepath.Join(t.Path, store.FileName)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("--from: %w in %s: %w", store.ErrNotInitialized, t.Path, err)
		}
		return p, nil
	}
	return t.Path, nil
}

func migrateStore(cmd *cobra.Command, from, to string, replace bool) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if ft, err := sqldb.Parse(from); err == nil && ft.Dialect == sqldb.Postgres && from != "" {
		return migrateBack(cmd, ft, to, replace)
	}
	path, err := sqliteSource(from)
	if err != nil {
		return err
	}
	if to == "" {
		return errors.New("--to is required (postgres://...)")
	}
	dt, err := sqldb.Parse(to)
	if err != nil {
		return fmt.Errorf("--to: %w", err)
	}
	if dt.Dialect != sqldb.Postgres {
		return fmt.Errorf("--to %s: migrate moves to PostgreSQL (postgres://...)", dt)
	}
	start := time.Now()
	log := zerolog.Nop()

	// The source store holds the data directory's lock for the whole
	// copy: no coordinator writes meanwhile. Opening it brings its schema
	// (and the baselines') up to this fleetcheck's.
	src, err := store.Open(ctx, store.Options{URL: "sqlite:" + path, Logger: log})
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w: stop the coordinator before migrating", err)
		}
		return fmt.Errorf("source: %w", err)
	}
	defer src.Close() //nolint:errcheck // read only from here on; the copy's errors are the ones to report
	srcDB, err := src.OpenSQLDB(ctx)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	defer srcDB.Close() //nolint:errcheck // as above
	if _, err := baselines.NewSQLStore(srcDB); err != nil {
		return fmt.Errorf("source: %w", err)
	}

	dst, err := store.Open(ctx, store.Options{URL: dt.URL, Logger: log})
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	defer dst.Close() //nolint:errcheck // the copy goes through its own pool
	dstDB, err := dst.OpenSQLDB(ctx)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	defer dstDB.Close() //nolint:errcheck // as above
	if _, err := baselines.NewSQLStore(dstDB); err != nil {
		return fmt.Errorf("target: %w", err)
	}

	tables, err := srcDB.Tables(ctx)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	copied, err := sqldb.CopySQLiteToPostgres(ctx, srcDB, dstDB, sqldb.CopyOptions{Replace: replace, Versions: versionTables(tables)})
	if err != nil {
		if errors.Is(err, sqldb.ErrNotEmpty) {
			return fmt.Errorf("%w; nothing was copied", err)
		}
		return fmt.Errorf("migrate %s to %s: %w (nothing was copied)", path, dt, err)
	}
	return printCopied(cmd, copied, path, dt.String(), start)
}

// versionTables are the schema version tables among tables.
func versionTables(tables []string) []string {
	var versions []string
	for _, t := range tables {
		if t == "schema_version" || strings.HasSuffix(t, "_schema_version") {
			versions = append(versions, t)
		}
	}
	return versions
}

// migrateBack copies a PostgreSQL store into a SQLite database that has
// every table already (the one the fleet came from, or one a coordinator
// created).
func migrateBack(cmd *cobra.Command, src sqldb.Target, to string, replace bool) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if to == "" {
		return errors.New("--to is required (sqlite:PATH, a database file or a data directory)")
	}
	dt, err := sqldb.Parse(to)
	if err != nil {
		return fmt.Errorf("--to: %w", err)
	}
	if dt.Dialect != sqldb.SQLite {
		return fmt.Errorf("--to %s: from PostgreSQL, migrate moves to SQLite (sqlite:PATH); for PostgreSQL to PostgreSQL use pg_dump", dt)
	}
	path := dt.Path
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, store.FileName)
	}
	start := time.Now()
	log := zerolog.Nop()
	// The source is opened as a coordinator would (its schema brought up
	// to this fleetcheck's) and the target too, holding its directory's
	// lock: no coordinator writes it meanwhile.
	srcStore, err := store.Open(ctx, store.Options{URL: src.URL, Logger: log, Writers: 1})
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	defer srcStore.Close() //nolint:errcheck // read only from here on; the copy's errors are the ones to report
	srcDB, err := srcStore.OpenSQLDB(ctx)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	defer srcDB.Close() //nolint:errcheck // as above
	if _, err := baselines.NewSQLStore(srcDB); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	dst, err := store.Open(ctx, store.Options{URL: "sqlite:" + path, Logger: log})
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w: stop the coordinator before migrating", err)
		}
		return fmt.Errorf("target: %w", err)
	}
	defer dst.Close() //nolint:errcheck // the copy goes through its own connection
	dstDB, err := dst.OpenSQLDB(ctx)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	defer dstDB.Close() //nolint:errcheck // as above
	if _, err := baselines.NewSQLStore(dstDB); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	tables, err := srcDB.Tables(ctx)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	copied, err := sqldb.CopyPostgresToSQLite(ctx, srcDB, dstDB, sqldb.CopyOptions{Replace: replace, Versions: versionTables(tables)})
	switch {
	case errors.Is(err, sqldb.ErrMissingTables):
		return fmt.Errorf("%w; nothing was copied: migrate into the SQLite file the fleet came from (--replace), or start a coordinator on %s once (it creates every table), stop it, and migrate again with --replace", err, path)
	case errors.Is(err, sqldb.ErrNotEmpty):
		return fmt.Errorf("%w; nothing was copied", err)
	case err != nil:
		return fmt.Errorf("migrate %s to %s: %w (nothing was copied)", src, path, err)
	}
	return printCopied(cmd, copied, src.String(), "sqlite:"+path, start)
}

func printCopied(cmd *cobra.Command, copied []sqldb.TableCopy, from, to string, start time.Time) error {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	pr := newPrinter(w)
	pr.println("TABLE\tROWS\tCHECKSUM\tNOTE")
	var rows int64
	for _, c := range copied {
		note := "same rows on both sides"
		if c.Created {
			note += "; table created from the SQLite schema"
		}
		rows += c.TargetRows
		pr.printf("%s\t%d\t%016x\t%s\n", c.Table, c.TargetRows, c.TargetSum, note)
	}
	if err := pr.flush(w); err != nil {
		return err
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), "migrated %s to %s: %d tables, %d rows, in %s\nset store_url: %s in the coordinator's config\n",
		from, to, len(copied), rows, time.Since(start).Round(time.Millisecond), to)
	return wrote(err)
}
