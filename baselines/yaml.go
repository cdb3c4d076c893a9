package baselines

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// FileFormat is the version of the YAML format written by Export.
const FileFormat = 1

// Import limits: a baselines file is read whole, so it is bounded.
const (
	maxImportBytes   = 16 << 20
	maxImportEntries = 100000
	maxReportedErrs  = 20
)

// The YAML shapes. Pointers tell "absent" from zero where that matters.
type fileYAML struct {
	Format    int         `yaml:"format"`
	Baselines []entryYAML `yaml:"baselines"`
}

type entryYAML struct {
	Metric    string     `yaml:"metric"`
	Scope     string     `yaml:"scope"`
	Stack     *stackYAML `yaml:"stack,omitempty"`
	Direction string     `yaml:"direction,omitempty"`
	Value     *float64   `yaml:"value,omitempty"`
	Threshold float64    `yaml:"threshold,omitempty"`
	Samples   *statsYAML `yaml:"samples,omitempty"`
	Version   int        `yaml:"version,omitempty"`
	TakenAt   string     `yaml:"taken_at,omitempty"`
	Who       string     `yaml:"who,omitempty"`
	FromRun   string     `yaml:"from_run,omitempty"`
	Note      noteText   `yaml:"note,omitempty"`
}

// noteText is a note as YAML writes it: a literal block when it has
// several lines, for people reading the file, but double-quoted when the
// block form would not read back the same (yaml.v3 loses a leading empty
// line of a literal block, for one).
type noteText string

// MarshalYAML picks the style that reads back unchanged.
func (n noteText) MarshalYAML() (any, error) {
	node := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: string(n)}
	if !strings.Contains(string(n), "\n") {
		return node, nil
	}
	node.Style = yaml.LiteralStyle
	out, err := yaml.Marshal(node)
	var back string
	if err != nil || yaml.Unmarshal(out, &back) != nil || back != string(n) {
		node.Style = yaml.DoubleQuotedStyle
	}
	return node, nil
}

type stackYAML struct {
	Driver    string `yaml:"driver,omitempty"`
	NCCL      string `yaml:"nccl,omitempty"`
	RDMAStack string `yaml:"rdma_stack,omitempty"`
}

type statsYAML struct {
	Count  *int      `yaml:"count,omitempty"`
	Median *float64  `yaml:"median,omitempty"`
	MAD    *float64  `yaml:"mad,omitempty"`
	Min    *float64  `yaml:"min,omitempty"`
	Max    *float64  `yaml:"max,omitempty"`
	Values []float64 `yaml:"values,flow,omitempty"`
}

// Allowed keys at each level: a misspelt "treshold" must not be dropped
// silently from a file that gates the fleet.
func fileKeys() []string { return []string{"format", "baselines"} }

func entryKeys() []string {
	return []string{"metric", "scope", "stack", "direction", "value", "threshold", "samples",
		"version", "taken_at", "who", "from_run", "note"}
}

func stackKeys() []string { return []string{"driver", "nccl", "rdma_stack"} }

func statsKeys() []string { return []string{"count", "median", "mad", "min", "max", "values"} }

// entry is one parsed file entry: the baseline, and the version the file
// gave it (0 if none), for replaying a history in order.
type entry struct {
	b        Baseline
	fileVers int
}

// ParseYAML reads a baselines file (the format Export writes) without
// storing anything. Every entry is validated; the error lists the bad
// ones by position, line, metric and scope. Entries without taken_at keep
// a zero TakenAt.
func ParseYAML(data []byte) ([]Baseline, error) {
	es, err := parseYAML(data)
	if err != nil {
		return nil, err
	}
	out := make([]Baseline, len(es))
	for i, e := range es {
		out[i] = e.b
	}
	return out, nil
}

func parseYAML(data []byte) ([]entry, error) {
	if len(data) > maxImportBytes {
		return nil, fmt.Errorf("%w: baselines file larger than %d bytes", ErrInvalid, maxImportBytes)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: baselines file: %w", ErrInvalid, err)
	}
	// A second document would be dropped without a word: refuse it.
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("%w: baselines file: %w", ErrInvalid, err)
		}
		return nil, fmt.Errorf("%w: baselines file line %d: a second YAML document; put every entry in one 'baselines:' list", ErrInvalid, next.Line)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, fmt.Errorf("%w: baselines file is empty: want a mapping with a 'baselines:' list", ErrInvalid)
	}
	root := deref(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: baselines file line %d: want a mapping with a 'baselines:' list", ErrInvalid, root.Line)
	}
	if err := checkKeys(root, fileKeys(), "the top level"); err != nil {
		return nil, fmt.Errorf("%w: baselines file %w", ErrInvalid, err)
	}
	if f := mapValue(root, "format"); f != nil {
		if n, err := strconv.Atoi(f.Value); f.Kind != yaml.ScalarNode || err != nil || n != FileFormat {
			return nil, fmt.Errorf("%w: baselines file line %d: format %q: this fleetcheck reads format %d", ErrInvalid, f.Line, f.Value, FileFormat)
		}
	}
	list := mapValue(root, "baselines")
	if list == nil {
		return nil, fmt.Errorf("%w: baselines file has no 'baselines:' list", ErrInvalid)
	}
	if list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
		return nil, nil
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%w: baselines file line %d: 'baselines' must be a list", ErrInvalid, list.Line)
	}
	if len(list.Content) > maxImportEntries {
		return nil, fmt.Errorf("%w: baselines file has %d entries, at most %d", ErrInvalid, len(list.Content), maxImportEntries)
	}
	var errs []error
	bad := 0
	note := func(err error) {
		bad++
		if len(errs) < maxReportedErrs {
			errs = append(errs, err)
		}
	}
	out := make([]entry, 0, len(list.Content))
	for i, item := range list.Content {
		e, err := parseEntry(deref(item))
		if err != nil {
			note(fmt.Errorf("entry %d (%s): %w", i+1, describe(deref(item)), err))
			continue
		}
		out = append(out, e)
	}
	for _, err := range duplicates(out) {
		note(err)
	}
	if bad > 0 {
		if bad > len(errs) {
			errs = append(errs, fmt.Errorf("and %d more", bad-len(errs)))
		}
		noun := "entries"
		if bad == 1 {
			noun = "entry"
		}
		return nil, fmt.Errorf("%w: baselines file: %d bad %s:\n%w", ErrInvalid, bad, noun, errors.Join(errs...))
	}
	return out, nil
}

// deref follows an alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 8; i++ {
		n = n.Alias
	}
	return n
}

// mapValue returns the value under key in a mapping node, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return deref(m.Content[i+1])
		}
	}
	return nil
}

// checkKeys rejects unknown, repeated and merge keys in a mapping.
func checkKeys(m *yaml.Node, allowed []string, where string) error {
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		switch {
		case k.Kind != yaml.ScalarNode:
			return fmt.Errorf("line %d: keys in %s must be plain words", k.Line, where)
		case k.Value == "<<":
			return fmt.Errorf("line %d: merge keys (<<) are not supported in %s; repeat the fields", k.Line, where)
		case !slices.Contains(allowed, k.Value):
			return fmt.Errorf("line %d: unknown field %q in %s (known: %s)", k.Line, k.Value, where, strings.Join(allowed, ", "))
		case seen[k.Value]:
			return fmt.Errorf("line %d: field %q repeated in %s", k.Line, k.Value, where)
		}
		seen[k.Value] = true
	}
	return nil
}

// describe names an entry for an error: its line, metric and scope.
func describe(n *yaml.Node) string {
	if n == nil {
		return "empty"
	}
	s := fmt.Sprintf("line %d", n.Line)
	if n.Kind != yaml.MappingNode {
		return s
	}
	field := func(k string) string {
		if v := mapValue(n, k); v != nil && v.Kind == yaml.ScalarNode && v.Value != "" {
			return truncate(v.Value, 80)
		}
		return ""
	}
	switch m, sc := field("metric"), field("scope"); {
	case m != "" && sc != "":
		s += ", " + m + " at " + sc
	case m != "":
		s += ", " + m
	case sc != "":
		s += ", at " + sc
	}
	return s
}

// truncate shortens s for a message, quoting it unless it is one plain word.
func truncate(s string, n int) string {
	cut := ""
	if len(s) > n {
		s, cut = s[:n], "..."
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || !unicode.IsPrint(r) }) || !utf8.ValidString(s) {
		return strconv.Quote(s) + cut
	}
	return s + cut
}

func parseEntry(n *yaml.Node) (entry, error) {
	if n == nil || n.Kind != yaml.MappingNode {
		return entry{}, errors.New("an entry must be a mapping of fields")
	}
	if err := checkKeys(n, entryKeys(), "the entry"); err != nil {
		return entry{}, err
	}
	for _, sub := range []struct {
		key     string
		allowed []string
	}{{"stack", stackKeys()}, {"samples", statsKeys()}} {
		v := mapValue(n, sub.key)
		if v == nil || (v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
			continue
		}
		if v.Kind != yaml.MappingNode {
			return entry{}, fmt.Errorf("line %d: %s must be a mapping", v.Line, sub.key)
		}
		if err := checkKeys(v, sub.allowed, sub.key); err != nil {
			return entry{}, err
		}
	}
	var e entryYAML
	if err := n.Decode(&e); err != nil {
		return entry{}, err
	}
	b, err := e.toBaseline()
	if err != nil {
		return entry{}, err
	}
	return entry{b: b, fileVers: e.Version}, nil
}

// toBaseline turns a file entry into a validated baseline.
func (e entryYAML) toBaseline() (Baseline, error) {
	b := Baseline{
		Key:       Key{Metric: e.Metric, Scope: Scope(e.Scope)},
		Direction: Direction(e.Direction),
		Threshold: e.Threshold,
		Who:       e.Who,
		FromRun:   e.FromRun,
		Note:      string(e.Note),
	}
	if e.Stack != nil {
		b.Stack = Stack{Driver: e.Stack.Driver, NCCL: e.Stack.NCCL, RDMAStack: e.Stack.RDMAStack}
	}
	if e.Version < 0 {
		return Baseline{}, fmt.Errorf("version %d is negative", e.Version)
	}
	if b.Direction == "" {
		d, ok := DirectionFor(e.Metric)
		if !ok {
			return Baseline{}, fmt.Errorf("no direction, and the unit of metric %q does not say one: add direction: higher or lower", e.Metric)
		}
		b.Direction = d
	}
	if e.Value != nil && (!finite(*e.Value) || *e.Value <= 0) {
		return Baseline{}, fmt.Errorf("value %v is not a positive number", *e.Value)
	}
	st, err := e.stats()
	if err != nil {
		return Baseline{}, err
	}
	b.Samples = st
	if e.Value != nil {
		b.Value = *e.Value
	}
	if e.TakenAt != "" {
		t, err := parseTime(e.TakenAt)
		if err != nil {
			return Baseline{}, err
		}
		b.TakenAt = t
	}
	// The caller names the entry, so the errors here need not name the key.
	k, err := b.Key.Normalize()
	if err != nil {
		return Baseline{}, unwrapInvalid(err)
	}
	b.Key = k
	return b.normalizeFields()
}

// stats builds the samples: none given is one sample, the value; values
// alone are summarised; a count above the values listed needs the
// summary spelled out.
func (e entryYAML) stats() (Stats, error) {
	s := e.Samples
	if s == nil {
		if e.Value == nil {
			return Stats{}, errors.New("no value and no samples")
		}
		v := *e.Value
		return Stats{Count: 1, Median: v, Min: v, Max: v, Values: []float64{v}}, nil
	}
	if s.Count != nil && *s.Count < len(s.Values) {
		return Stats{}, fmt.Errorf("samples count %d is less than the %d values listed", *s.Count, len(s.Values))
	}
	if len(s.Values) > 0 && (s.Count == nil || *s.Count == len(s.Values)) {
		st, err := NewStats(s.Values)
		if err != nil {
			return Stats{}, unwrapInvalid(err)
		}
		for _, f := range []struct {
			name       string
			given      *float64
			calculated float64
		}{{"median", s.Median, st.Median}, {"mad", s.MAD, st.MAD}, {"min", s.Min, st.Min}, {"max", s.Max, st.Max}} {
			if f.given != nil && !sameFloat(*f.given, f.calculated) {
				return Stats{}, fmt.Errorf("samples %s %v does not match the values (%v)", f.name, *f.given, f.calculated)
			}
		}
		return st, nil
	}
	if s.Count == nil {
		return Stats{}, errors.New("samples: give values, or count with median, mad, min and max")
	}
	var missing []string
	for _, f := range []struct {
		name string
		v    *float64
	}{{"median", s.Median}, {"mad", s.MAD}, {"min", s.Min}, {"max", s.Max}} {
		if f.v == nil {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return Stats{}, fmt.Errorf("samples: count %d with %d values listed needs %s", *s.Count, len(s.Values), strings.Join(missing, ", "))
	}
	vals := slices.Clone(s.Values)
	slices.Sort(vals)
	return Stats{Count: *s.Count, Median: *s.Median, MAD: *s.MAD, Min: *s.Min, Max: *s.Max, Values: vals}, nil
}

// parseTime takes RFC 3339 or a plain date.
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("taken_at %s: want RFC 3339 (2025-05-20T10:00:00Z) or a date (2025-05-20)", truncate(s, 40))
}

// unwrapInvalid drops the ErrInvalid prefix from a message that will be
// wrapped in ErrInvalid again with the entry's name.
func unwrapInvalid(err error) error {
	msg := strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")
	return errors.New(msg)
}

// duplicates reports keys given twice in one file, unless every copy has
// a version of its own (an exported history).
func duplicates(es []entry) []error {
	byKey := map[Key][]int{}
	var order []Key
	for _, e := range es {
		if _, ok := byKey[e.b.Key]; !ok {
			order = append(order, e.b.Key)
		}
		byKey[e.b.Key] = append(byKey[e.b.Key], e.fileVers)
	}
	var errs []error
	for _, k := range order {
		vers := byKey[k]
		if len(vers) < 2 {
			continue
		}
		distinct := !slices.Contains(vers, 0)
		sorted := slices.Clone(vers)
		slices.Sort(sorted)
		if len(slices.Compact(sorted)) != len(vers) {
			distinct = false
		}
		if !distinct {
			errs = append(errs, fmt.Errorf("%s is given %d times; give each copy its own version, or keep one", k, len(vers)))
		}
	}
	return errs
}

// ImportResult says what Import stored.
type ImportResult struct {
	Added     int             `json:"added"`
	Unchanged int             `json:"unchanged"`
	Entries   []ImportedEntry `json:"entries"`
}

// ImportedEntry is one entry's outcome.
type ImportedEntry struct {
	Key Key `json:"key"`
	// Version is the new version, or the existing one an identical entry matched.
	Version int  `json:"version"`
	Added   bool `json:"added"`
}

// Import reads a baselines file and stores each entry as its key's next
// version, all or nothing. An entry equal to its key's latest version
// (value, direction, threshold and samples) stores nothing, nor does one
// equal to an older version taken at the same moment (an exported
// history imported again), so importing the same file twice is harmless. Entries without who take who; without
// taken_at, the store's clock. Versions in the file only order the
// entries of one key; the store numbers its own.
func (s *Store) Import(ctx context.Context, r io.Reader, who string) (ImportResult, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxImportBytes+1))
	if err != nil {
		return ImportResult{}, fmt.Errorf("import baselines: read: %w", err)
	}
	es, err := parseYAML(data)
	if err != nil {
		return ImportResult{}, fmt.Errorf("import baselines: %w", err)
	}
	return s.importEntries(ctx, es, who, false)
}

// importEntries stores entries in one transaction; onlyMissing skips
// every key that already has a version.
func (s *Store) importEntries(ctx context.Context, es []entry, who string, onlyMissing bool) (ImportResult, error) {
	// Only the entries of one key need ordering; a stable sort by the
	// file's version does that and keeps the file's order otherwise.
	slices.SortStableFunc(es, func(a, b entry) int { return a.fileVers - b.fileVers })
	var res ImportResult
	err := s.writeTx(ctx, func(q querier) error {
		res = ImportResult{}
		for _, e := range es {
			b := e.b
			if b.Who == "" {
				b.Who = who
			}
			b, err := s.prepare(b)
			if err != nil {
				return err
			}
			prev, err := s.alreadyStored(ctx, q, b, onlyMissing)
			switch {
			case err == nil:
				res.Unchanged++
				res.Entries = append(res.Entries, ImportedEntry{Key: b.Key, Version: prev.Version})
				continue
			case !errors.Is(err, ErrNotFound):
				return fmt.Errorf("%s: %w", b.Key, err)
			}
			v, err := s.insert(ctx, q, b)
			if err != nil {
				return fmt.Errorf("%s: %w", b.Key, err)
			}
			res.Added++
			res.Entries = append(res.Entries, ImportedEntry{Key: b.Key, Version: v, Added: true})
		}
		return nil
	})
	if err != nil {
		return ImportResult{}, fmt.Errorf("import baselines: %w", err)
	}
	return res, nil
}

// alreadyStored finds the version an import entry repeats: the key's
// latest when it says the same (or any version, with onlyMissing), or an
// older version with the same value taken at the same moment (the same
// record, from an exported history). ErrNotFound when there is none.
func (s *Store) alreadyStored(ctx context.Context, q querier, b Baseline, onlyMissing bool) (Baseline, error) {
	prev, err := s.latest(ctx, q, b.Key)
	if err != nil {
		return Baseline{}, err
	}
	if onlyMissing || prev.sameValue(b) {
		return prev, nil
	}
	same, err := s.query(ctx, q, `SELECT `+columns+` FROM baselines WHERE `+keyWhere+` AND taken_at = ? ORDER BY version`,
		b.Metric, string(b.Scope), b.Stack.Driver, b.Stack.NCCL, b.Stack.RDMAStack, b.TakenAt.UTC().Format(time.RFC3339Nano))
	if err != nil {
		return Baseline{}, err
	}
	for _, o := range same {
		if o.sameValue(b) {
			return o, nil
		}
	}
	return Baseline{}, ErrNotFound
}

// Export writes the baselines the filter selects as a baselines file
// that Import reads back.
func (s *Store) Export(ctx context.Context, w io.Writer, f Filter) error {
	bs, err := s.List(ctx, f)
	if err != nil {
		return fmt.Errorf("export baselines: %w", err)
	}
	header := fmt.Sprintf("# fleetcheck baselines, %d entries, exported %s.\n", len(bs), s.now().UTC().Format(time.RFC3339))
	if err := writeYAML(w, header, bs); err != nil {
		return fmt.Errorf("export baselines: %w", err)
	}
	return nil
}

// fileHelp heads every exported file: what the fields mean.
const fileHelp = `# value is the median of the samples (mad: their median absolute deviation).
# A measurement fails when it is worse than value, in the direction's bad
# sense, by more than threshold (a fraction; 0 or absent = 0.30); exactly
# at the threshold it passes. version is informative: import numbers its own.
`

// MarshalYAML writes baselines in the file format, header included.
func MarshalYAML(bs []Baseline) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeYAML(&buf, "# fleetcheck baselines\n", bs); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeYAML(w io.Writer, header string, bs []Baseline) error {
	doc := fileYAML{Format: FileFormat, Baselines: make([]entryYAML, 0, len(bs))}
	for _, b := range bs {
		doc.Baselines = append(doc.Baselines, toYAML(b))
	}
	if _, err := io.WriteString(w, header+fileHelp); err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("encode YAML: %w", err)
	}
	return enc.Close()
}

func toYAML(b Baseline) entryYAML {
	v := b.Value
	st := b.Samples
	count, med, mad, lo, hi := st.Count, st.Median, st.MAD, st.Min, st.Max
	e := entryYAML{
		Metric:    b.Metric,
		Scope:     string(b.Scope),
		Direction: string(b.Direction),
		Value:     &v,
		Threshold: b.Threshold,
		Samples:   &statsYAML{Count: &count, Median: &med, MAD: &mad, Min: &lo, Max: &hi, Values: st.Values},
		Version:   b.Version,
		Who:       b.Who,
		FromRun:   b.FromRun,
		Note:      noteText(b.Note),
	}
	if !b.Stack.IsZero() {
		e.Stack = &stackYAML{Driver: b.Stack.Driver, NCCL: b.Stack.NCCL, RDMAStack: b.Stack.RDMAStack}
	}
	if !b.TakenAt.IsZero() {
		e.TakenAt = b.TakenAt.UTC().Format(time.RFC3339Nano)
	}
	return e
}
