package drill

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Get returns one drill with its targets.
func (e *Engine) Get(ctx context.Context, id string) (*Drill, error) {
	d, err := loadDrill(ctx, e.db, id)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// List returns every drill, oldest first.
func (e *Engine) List(ctx context.Context) ([]Drill, error) {
	return loadDrills(ctx, e.db, "")
}

// Events returns a drill's history.
func (e *Engine) Events(ctx context.Context, id string) ([]Event, error) {
	if _, err := loadDrill(ctx, e.db, id); err != nil {
		return nil, err
	}
	return events.List(ctx, e.db, id)
}

// ReportOptions choose the drills a report covers.
type ReportOptions struct {
	// Since and Until bound the drills' start (zero: unbounded).
	Since, Until time.Time
	// Fault keeps one fault kind ("" = all).
	Fault string
	// Bucket is the trend's period (default 7 days), aligned to Since or,
	// without it, to the first drill's day.
	Bucket time.Duration
}

// Row is one target of one drill, as `drill report` lists it.
type Row struct {
	Drill     string    `json:"drill"`
	Name      string    `json:"name"`
	Fault     string    `json:"fault"`
	State     State     `json:"state"`
	StartedAt time.Time `json:"started_at"`
	Node      string    `json:"node"`
	// Seconds; absent when not measured.
	TTDSeconds          *float64 `json:"ttd_seconds,omitempty"`
	TTRSeconds          *float64 `json:"ttr_seconds,omitempty"`
	OutOfServiceSeconds *float64 `json:"out_of_service_seconds,omitempty"`
	// CheckInterval is how often the target's agent ran its checks on its
	// own ("1m"), beside the time to detect it bounds.
	CheckInterval string `json:"check_interval,omitempty"`
	DetectedBy    string `json:"detected_by,omitempty"`
	// Detected lists what the watched checks found after injection, one
	// line per finding ("gpu.xid fail XID_79 GPU3: ...").
	Detected         []string `json:"detected"`
	Expected         string   `json:"expected_check"`
	ExpectedDetected bool     `json:"expected_detected"`
	RevertedBy       string   `json:"reverted_by,omitempty"`
	// Findings are the codes of what was found: the watched checks'
	// findings ("gpu.xid:XID_79") and then the drill's own (detection_gap,
	// not_recovered, ...).
	Findings []string `json:"findings"`
}

// Stats sums up drills of one fault kind (in one period).
type Stats struct {
	Fault  string    `json:"fault"`
	Period time.Time `json:"period,omitzero"`
	// Targets counts drilled nodes (refused drills have none).
	Targets  int `json:"targets"`
	Detected int `json:"detected"`
	// Gaps counts detection gaps: injected, nothing detected.
	Gaps      int `json:"detection_gaps"`
	Recovered int `json:"recovered"`
	Aborted   int `json:"aborted"`
	// MTTD is the mean time to detect over detected targets; MTTR the
	// mean time from injection to healthy over recovered, not aborted
	// targets. Seconds; absent when nothing was measured.
	MTTDSeconds *float64 `json:"mttd_seconds,omitempty"`
	MTTRSeconds *float64 `json:"mttr_seconds,omitempty"`
	MaxTTD      *float64 `json:"max_ttd_seconds,omitempty"`
	MaxTTR      *float64 `json:"max_ttr_seconds,omitempty"`
}

// Report is `drill report`: every drilled node with its times, and MTTD
// and MTTR per fault kind, overall and per period.
type Report struct {
	Since   time.Time `json:"since,omitzero"`
	Until   time.Time `json:"until,omitzero"`
	Bucket  string    `json:"bucket"`
	Drills  int       `json:"drills"`
	Refused int       `json:"refused"`
	Rows    []Row     `json:"rows"`
	ByFault []Stats   `json:"by_fault"`
	Trend   []Stats   `json:"trend"`
}

// Report builds the drill report.
func (e *Engine) Report(ctx context.Context, o ReportOptions) (*Report, error) {
	ds, err := loadDrills(ctx, e.db, "")
	if err != nil {
		return nil, err
	}
	return buildReport(ds, o), nil
}

func secs(d time.Duration) *float64 {
	v := d.Seconds()
	return &v
}

// buildReport does the arithmetic; it is a pure function of the drills.
func buildReport(ds []Drill, o ReportOptions) *Report {
	if o.Bucket <= 0 {
		o.Bucket = 7 * 24 * time.Hour
	}
	r := &Report{Since: o.Since, Until: o.Until, Bucket: o.Bucket.String(), Rows: []Row{}, ByFault: []Stats{}, Trend: []Stats{}}
	var kept []Drill
	for _, d := range ds {
		if (!o.Since.IsZero() && d.CreatedAt.Before(o.Since)) || (!o.Until.IsZero() && !d.CreatedAt.Before(o.Until)) {
			continue
		}
		if o.Fault != "" && d.Fault != o.Fault {
			continue
		}
		kept = append(kept, d)
	}
	anchor := o.Since
	if anchor.IsZero() && len(kept) > 0 {
		anchor = kept[0].CreatedAt.UTC().Truncate(24 * time.Hour)
	}
	type key struct {
		fault  string
		period time.Time
	}
	total := map[string]*acc{}
	trend := map[key]*acc{}
	for _, d := range kept {
		r.Drills++
		if d.State == StateRefused {
			r.Refused++
			continue
		}
		period := anchor.Add(d.CreatedAt.Sub(anchor) / o.Bucket * o.Bucket)
		for _, t := range d.Targets {
			row := Row{Drill: d.ID, Name: d.Name, Fault: d.Fault, State: d.State, StartedAt: d.CreatedAt, Node: t.Node,
				DetectedBy: t.DetectedBy, Expected: d.Spec.Expect.Check, ExpectedDetected: t.ExpectedDetected, RevertedBy: t.RevertedBy,
				Detected: []string{}, Findings: []string{}}
			if t.CheckInterval > 0 {
				row.CheckInterval = t.CheckInterval.String()
			}
			for _, det := range t.Detections {
				for _, f := range det.Findings {
					row.Detected = append(row.Detected, fmt.Sprintf("%s %s %s %s: %s", det.Check, det.Status, f.Code, f.Component, f.Message))
					if code := det.Check + ":" + f.Code; !slices.Contains(row.Findings, code) {
						row.Findings = append(row.Findings, code)
					}
				}
				if len(det.Findings) == 0 {
					row.Detected = append(row.Detected, fmt.Sprintf("%s %s", det.Check, det.Status))
				}
			}
			if v, ok := t.TTD(); ok {
				row.TTDSeconds = secs(v)
			}
			if v, ok := t.TTR(); ok {
				row.TTRSeconds = secs(v)
			}
			if v, ok := t.TimeToOutOfService(); ok {
				row.OutOfServiceSeconds = secs(v)
			}
			for _, f := range t.Findings {
				row.Findings = append(row.Findings, f.Code)
			}
			r.Rows = append(r.Rows, row)
			for _, a := range []*acc{get(total, d.Fault), getK(trend, key{d.Fault, period}, func() *acc { return &acc{} })} {
				a.add(t)
			}
		}
	}
	faults := make([]string, 0, len(total))
	for f := range total {
		faults = append(faults, f)
	}
	sort.Strings(faults)
	for _, f := range faults {
		r.ByFault = append(r.ByFault, total[f].stats(f, time.Time{}))
	}
	keys := make([]key, 0, len(trend))
	for k := range trend {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if !keys[i].period.Equal(keys[j].period) {
			return keys[i].period.Before(keys[j].period)
		}
		return keys[i].fault < keys[j].fault
	})
	for _, k := range keys {
		r.Trend = append(r.Trend, trend[k].stats(k.fault, k.period))
	}
	return r
}

// acc accumulates one fault kind's targets.
type acc struct {
	targets, detected, gaps, recovered, aborted int
	sumTTD, sumTTR, maxTTD, maxTTR              time.Duration
	nTTR                                        int
}

func get(m map[string]*acc, k string) *acc {
	return getK(m, k, func() *acc { return &acc{} })
}

func getK[K comparable](m map[K]*acc, k K, mk func() *acc) *acc {
	a, ok := m[k]
	if !ok {
		a = mk()
		m[k] = a
	}
	return a
}

func (a *acc) add(t Target) {
	if t.InjectedAt.IsZero() {
		// Never injected (refused precheck, aborted before): nothing to time.
		if t.Aborted {
			a.aborted++
		}
		return
	}
	a.targets++
	if v, ok := t.TTD(); ok {
		a.detected++
		a.sumTTD += v
		a.maxTTD = max(a.maxTTD, v)
	}
	if t.HasFinding(FindingDetectionGap) {
		a.gaps++
	}
	if v, ok := t.TTR(); ok {
		a.recovered++
		a.nTTR++
		a.sumTTR += v
		a.maxTTR = max(a.maxTTR, v)
	}
	if t.Aborted {
		a.aborted++
	}
}

func (a *acc) stats(fault string, period time.Time) Stats {
	s := Stats{Fault: fault, Period: period, Targets: a.targets, Detected: a.detected, Gaps: a.gaps, Recovered: a.recovered, Aborted: a.aborted}
	if a.detected > 0 {
		s.MTTDSeconds = secs(a.sumTTD / time.Duration(a.detected))
		s.MaxTTD = secs(a.maxTTD)
	}
	if a.nTTR > 0 {
		s.MTTRSeconds = secs(a.sumTTR / time.Duration(a.nTTR))
		s.MaxTTR = secs(a.maxTTR)
	}
	return s
}

func fmtSecs(v *float64) string {
	if v == nil {
		return "-"
	}
	return (time.Duration(*v * float64(time.Second))).Round(time.Second).String()
}

// WriteTable prints the report for `drill report -o table`.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// The first failed write is the answer (a table cut short is not
	// printed); a tabwriter may report it on any write, not only at Flush.
	var werr error
	printf := func(format string, a ...any) {
		if werr == nil {
			_, werr = fmt.Fprintf(tw, format, a...)
		}
	}
	printf("DRILL\tFAULT\tNODE\tSTATE\tSTARTED\tDETECTED BY\tTTD\tCHECK INTERVAL\tOUT OF SERVICE\tTTR\tFINDINGS\n")
	for _, row := range r.Rows {
		by := row.DetectedBy
		if by == "" {
			by = "-"
		} else if !row.ExpectedDetected {
			by += " (expected " + row.Expected + ")"
		}
		printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Drill, row.Fault, row.Node, row.State,
			row.StartedAt.UTC().Format("2006-01-02 15:04"), by, fmtSecs(row.TTDSeconds), orText(row.CheckInterval, "-"), fmtSecs(row.OutOfServiceSeconds),
			fmtSecs(row.TTRSeconds), orText(strings.Join(row.Findings, ","), "-"))
	}
	printf("\n")
	printf("FAULT\tPERIOD\tNODES\tDETECTED\tGAPS\tRECOVERED\tABORTED\tMTTD\tMTTR\tMAX TTD\tMAX TTR\n")
	for _, s := range append(append([]Stats{}, r.ByFault...), r.Trend...) {
		period := "all"
		if !s.Period.IsZero() {
			period = s.Period.UTC().Format("2006-01-02")
		}
		printf("%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", s.Fault, period, s.Targets, s.Detected, s.Gaps,
			s.Recovered, s.Aborted, fmtSecs(s.MTTDSeconds), fmtSecs(s.MTTRSeconds), fmtSecs(s.MaxTTD), fmtSecs(s.MaxTTR))
	}
	if r.Refused > 0 {
		printf("\n%d of %d drills refused before touching a node\n", r.Refused, r.Drills)
	}
	if werr != nil {
		return werr
	}
	return tw.Flush()
}
