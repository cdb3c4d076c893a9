package coordinator

import (
	"net/url"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// configKeys lists every YAML key of the coordinator config as a dotted
// path ("drain.slurm.timeout"), walking nested sections.
func configKeys(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		path := prefix + name
		out = append(out, path)
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		// A sweep spec's keys are docs/sweep.md's, held to the spec by
		// sweep's own test; here it is one key.
		if ft.Kind() == reflect.Struct && ft.PkgPath() != "time" && ft != reflect.TypeOf(sweep.Spec{}) {
			out = append(out, configKeys(ft, path+".")...)
		}
	}
	return out
}

// lookup reports whether a dotted path is set in a decoded YAML document.
func lookup(doc map[string]any, path string) bool {
	var cur any = doc
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[k]; !ok {
			return false
		}
	}
	return true
}

// TestExampleConfigComplete: examples/coordinator.yaml loads with the
// strict loader and sets every key the config has, so it shows an
// operator all of them.
func TestExampleConfigComplete(t *testing.T) {
	t.Parallel()
	const path = "../examples/coordinator.yaml"
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if c.Drain.Adapter != "slurm" || !c.Gossip.Enabled() || c.SweepSchedule == nil {
		t.Errorf("%s not read whole: %+v", path, c)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	keys := configKeys(reflect.TypeOf(Config{}), "")
	if len(keys) < 30 {
		t.Fatalf("only %d keys found: %v", len(keys), keys)
	}
	for _, k := range keys {
		if !lookup(doc, k) {
			t.Errorf("%s does not set %s", path, k)
		}
	}
}

// TestConfigReference: docs/coordinator-config.md names every key of the
// config by its dotted path, in backticks.
func TestConfigReference(t *testing.T) {
	t.Parallel()
	const page = "../docs/coordinator-config.md"
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range configKeys(reflect.TypeOf(Config{}), "") {
		if !strings.Contains(string(b), "`"+k+"`") {
			t.Errorf("%s does not document `%s`", page, k)
		}
	}
}

// TestExamplePostgresConfig: examples/coordinator-postgres.yaml loads, names
// a PostgreSQL store without a password, and a store opens at its URL's
// kind of database (a real PostgreSQL standing in for db.example.net).
func TestExamplePostgresConfig(t *testing.T) {
	t.Parallel()
	const path = "../examples/coordinator-postgres.yaml"
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tg, err := sqldb.Parse(c.StoreURL)
	if err != nil || tg.Dialect != sqldb.Postgres {
		t.Fatalf("store_url %q: %v %v, want PostgreSQL", c.StoreURL, tg.Dialect, err)
	}
	if u, _ := url.Parse(c.StoreURL); u == nil || u.User == nil {
		t.Fatalf("store_url %q names no user", c.StoreURL)
	} else if _, has := u.User.Password(); has {
		t.Fatalf("store_url %q holds a password: the example must show PGPASSFILE instead", c.StoreURL)
	}
	if !pgtest.Available() {
		pgtest.Shared(t) // skips loudly (fails under CI=true)
	}
	srv, err := pgtest.Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	name, err := srv.CreateDB(t.Context(), "example")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), store.Options{Dir: t.TempDir(), URL: srv.URLFor(name), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Dialect() != sqldb.Postgres || st.Path() != "" {
		t.Fatalf("store on %s (%v), want PostgreSQL", st.Where(), st.Dialect())
	}
}
