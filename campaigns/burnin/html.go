package burnin

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// WriteHTML writes the report as one self-contained HTML page: inline CSS,
// inline SVG charts, no scripts and nothing fetched, so it can be attached
// to a sign-off or an RMA ticket as it is.
func WriteHTML(w io.Writer, r *Report) error {
	if r == nil {
		return fmt.Errorf("write burn-in html: no report")
	}
	v := buildView(r)
	if err := pageTemplate().Execute(w, v); err != nil {
		return fmt.Errorf("write burn-in html: %w", err)
	}
	return nil
}

// WriteHTML is the engine method form of the package function.
func (e *Engine) WriteHTML(w io.Writer, r *Report) error { return WriteHTML(w, r) }

type htmlView struct {
	R        *Report
	Title    string
	Charts   []barChart
	Temp     *barChart
	Rejected []NodeReport
}

// barChart is a horizontal bar chart, one bar per node, with reference
// lines (SKU baseline, campaign median, limits). Geometry is computed here
// so the template only places shapes.
type barChart struct {
	Title  string
	Unit   string
	Width  int
	Height int
	Bars   []bar
	Lines  []refLine
	Axis   []tick
	Legend []legendItem
	Note   string
}

type bar struct {
	Y, W      float64
	Label     string
	Value     string
	Class     string
	Tip       string
	ValueX    float64
	LabelAnch string
}

type refLine struct {
	X     float64
	Class string
	Label string
}

type tick struct {
	X     float64
	Label string
}

type legendItem struct {
	X     float64
	Class string
	Label string
}

const (
	chartLabelW = 170.0 // node names
	chartPlotW  = 560.0
	chartRowH   = 14.0
	chartTop    = 34.0
)

func buildView(r *Report) htmlView {
	v := htmlView{R: r, Title: r.Campaign.Name}
	if v.Title == r.Campaign.ID {
		v.Title = "level " + string(r.Spec.Level)
	}
	for _, n := range r.Nodes {
		if n.Verdict == Rejected {
			v.Rejected = append(v.Rejected, n)
		}
	}
	for _, ms := range r.Metrics {
		v.Charts = append(v.Charts, metricChart(r, ms))
	}
	v.Temp = tempChart(r)
	return v
}

func verdictClass(v Verdict) string {
	switch v {
	case Accepted:
		return "ok"
	case Rejected:
		return "bad"
	}
	return "pend"
}

func metricChart(r *Report, ms MetricSummary) barChart {
	type row struct {
		node  string
		value float64
		class string
		tip   string
	}
	var rows []row
	seen := map[string]bool{}
	for _, n := range r.Nodes {
		if n.SKU != ms.SKU {
			continue
		}
		for _, num := range n.Evidence.Numbers {
			if num.Metric != ms.Metric {
				continue
			}
			// A pair's number sits on both members and shows under each:
			// the reader looks for the node.
			label := n.Node
			key := label + "|" + num.Pair + "|" + strconv.FormatFloat(num.Value, 'g', -1, 64)
			if seen[key] {
				continue
			}
			seen[key] = true
			// Colour by this number's judgement; amber marks a node
			// rejected for something else.
			cls := "ok"
			switch {
			case num.Outlier || num.BaselineVerdict == "fail" || num.BelowFloor:
				cls = "bad"
			case n.Verdict != Accepted:
				cls = "pend"
			}
			tip := fmt.Sprintf("%s: %s (samples %s); baseline %s; campaign median %s; %s",
				n.Node, fnum(num.Value), joinNums(num.Samples), orDash(num.Baseline), orDash(num.CampaignMedian), n.Verdict)
			if num.Pair != "" {
				tip = num.Pair + ": " + tip
			}
			rows = append(rows, row{label, num.Value, cls, tip})
		}
	}
	maxV := 0.0
	for _, rw := range rows {
		maxV = math.Max(maxV, rw.value)
	}
	maxV = math.Max(maxV, ms.Baseline)
	maxV = math.Max(maxV, ms.Median)
	if maxV <= 0 {
		maxV = 1
	}
	maxV *= 1.08
	scale := func(x float64) float64 { return chartLabelW + x/maxV*chartPlotW }
	c := barChart{Title: fmt.Sprintf("%s — sku %s", ms.Metric, orNone(ms.SKU)), Unit: unitOf(ms.Metric),
		Width: int(chartLabelW + chartPlotW + 90)}
	for i, rw := range rows {
		y := chartTop + float64(i)*chartRowH
		w := rw.value / maxV * chartPlotW
		c.Bars = append(c.Bars, bar{Y: y, W: w, Label: rw.node, Value: fnum(rw.value), Class: rw.class, Tip: rw.tip, ValueX: chartLabelW + w + 4})
	}
	if ms.Baseline > 0 {
		c.Lines = append(c.Lines, refLine{X: scale(ms.Baseline), Class: "base", Label: "baseline " + fnum(ms.Baseline)})
		limit := ms.Baseline * (1 - r.Spec.Baseline.MaxDeviation)
		if ms.Direction == "lower" {
			limit = ms.Baseline * (1 + r.Spec.Baseline.MaxDeviation)
		}
		c.Lines = append(c.Lines, refLine{X: scale(limit), Class: "limit", Label: "limit " + fnum(limit)})
	}
	if ms.Nodes > 0 {
		c.Lines = append(c.Lines, refLine{X: scale(ms.Median), Class: "median", Label: "median " + fnum(ms.Median)})
	}
	for i := 0; i <= 4; i++ {
		x := maxV * float64(i) / 4
		c.Axis = append(c.Axis, tick{X: scale(x), Label: fnum(math.Round(x*10) / 10)})
	}
	c.Legend = []legendItem{{X: chartLabelW, Class: "base", Label: "SKU baseline"}, {X: chartLabelW + 120, Class: "median", Label: "campaign median"},
		{X: chartLabelW + 260, Class: "limit", Label: "baseline limit"}}
	c.Note = "green: fine · red: this number rejects the node · amber: node rejected for another reason"
	c.Height = int(chartTop + float64(len(rows))*chartRowH + 30)
	return c
}

func tempChart(r *Report) *barChart {
	type row struct {
		node string
		maxC float64
		cls  string
		n    int
	}
	var rows []row
	maxV := 0.0
	for _, n := range r.Nodes {
		if len(n.Temperatures) == 0 {
			continue
		}
		m := math.Inf(-1)
		for _, t := range n.Temperatures {
			m = math.Max(m, t.MaxC)
		}
		rows = append(rows, row{n.Node, m, verdictClass(n.Verdict), len(n.Temperatures)})
		maxV = math.Max(maxV, m)
	}
	if len(rows) == 0 {
		return nil
	}
	const hot = 85.0
	maxV = math.Max(maxV, hot) * 1.08
	c := &barChart{Title: "hottest GPU during stress (peak over the samples)", Unit: "°C", Width: int(chartLabelW + chartPlotW + 90)}
	for i, rw := range rows {
		w := rw.maxC / maxV * chartPlotW
		cls := rw.cls
		if rw.maxC > hot {
			cls = "bad"
		}
		c.Bars = append(c.Bars, bar{Y: chartTop + float64(i)*chartRowH, W: w, Label: rw.node, Value: fnum(rw.maxC),
			Class: cls, Tip: fmt.Sprintf("%s: peak %s °C over %d samples", rw.node, fnum(rw.maxC), rw.n), ValueX: chartLabelW + w + 4})
	}
	c.Lines = []refLine{{X: chartLabelW + hot/maxV*chartPlotW, Class: "limit", Label: "85 °C"}}
	for i := 0; i <= 4; i++ {
		x := maxV * float64(i) / 4
		c.Axis = append(c.Axis, tick{X: chartLabelW + x/maxV*chartPlotW, Label: strconv.Itoa(int(math.Round(x)))})
	}
	c.Legend = []legendItem{{X: chartLabelW, Class: "limit", Label: "sustained > 85 °C throttles"}}
	c.Height = int(chartTop + float64(len(rows))*chartRowH + 30)
	return c
}

// sparkline is a small SVG polyline of a node's temperatures over time.
func sparkline(ts []TempPoint) template.HTML {
	if len(ts) < 2 {
		return ""
	}
	const w, h = 240.0, 40.0
	lo, hi := math.Inf(1), math.Inf(-1)
	t0, t1 := ts[0].At, ts[len(ts)-1].At
	for _, t := range ts {
		lo, hi = math.Min(lo, t.MaxC), math.Max(hi, t.MaxC)
	}
	if hi-lo < 1 {
		hi = lo + 1
	}
	span := t1.Sub(t0).Seconds()
	if span <= 0 {
		span = 1
	}
	var pts []string
	for i, t := range ts {
		x := float64(i) / float64(len(ts)-1) * w
		if span > 1 {
			x = t.At.Sub(t0).Seconds() / span * w
		}
		y := h - 4 - (t.MaxC-lo)/(hi-lo)*(h-8)
		pts = append(pts, strconv.FormatFloat(x, 'f', 1, 64)+","+strconv.FormatFloat(y, 'f', 1, 64))
	}
	// Every value here is a number we formatted: nothing from outside
	// reaches the markup.
	return template.HTML(fmt.Sprintf(`<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="GPU temperature during stress"><polyline points="%s"/></svg> <span class="muted">%s–%s °C over %s</span>`,
		int(w), int(h), int(w), int(h), strings.Join(pts, " "), fnum(lo), fnum(hi), t1.Sub(t0).Round(time.Second)))
}

func unitOf(metric string) string {
	last := metric[strings.LastIndexByte(metric, '.')+1:]
	switch {
	case strings.HasSuffix(last, "_gbps"):
		return "GB/s"
	case strings.HasSuffix(last, "_c"):
		return "°C"
	}
	return ""
}

func orDash(v float64) string {
	if v == 0 || !finite(v) {
		return "—"
	}
	return fnum(v)
}

func orNone(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

func joinNums(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fnum(x)
	}
	return strings.Join(parts, ", ")
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// pageTemplate parses the page; built per call so no template state is
// shared between callers (parsing costs well under a millisecond).
func pageTemplate() *template.Template {
	return template.Must(template.New("page").Funcs(templateFuncs()).Parse(pageHTML))
}

func templateFuncs() template.FuncMap {
	return template.FuncMap{
		"add":   func(a, b float64) float64 { return a + b },
		"sub":   func(a, b, c int) int { return a - b - c },
		"num":   fnum,
		"dash":  orDash,
		"pct":   pct,
		"time":  fmtTime,
		"nums":  joinNums,
		"vcls":  verdictClass,
		"spark": sparkline,
		"f1":    func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
		"join":  strings.Join,
		"anchor": func(s string) string {
			return "node-" + strings.Map(func(r rune) rune {
				if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') || r == '-' || r == '_' {
					return r
				}
				return '_'
			}, s)
		},
		"dur": func(a, b time.Time) string {
			if a.IsZero() || b.IsZero() {
				return "—"
			}
			return b.Sub(a).Round(time.Second).String()
		},
		"runstatus": func(r Run) string {
			if r.Outcome != "" && r.Outcome != OutcomeOK {
				return r.Outcome
			}
			if r.Status == "" {
				return r.State
			}
			return string(r.Status)
		},
		"checksummary": func(r Run) string {
			if r.Result.Report == nil {
				if r.Result.Action != nil {
					if r.Result.Action.OK {
						return "action ok " + r.Result.Action.Message
					}
					return "action failed: " + r.Result.Action.Message
				}
				return r.Error
			}
			var parts []string
			for _, c := range r.Result.Report.Checks {
				parts = append(parts, c.Name+"="+string(c.Status))
			}
			return strings.Join(parts, " ")
		},
	}
}

const pageHTML = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Burn-in {{.R.Campaign.ID}} — {{.Title}}</title>
<style>
body{font:13px/1.45 -apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#1d2329;margin:24px;max-width:1180px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:14px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;width:100%}th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#116329}.bad{color:#b42318}.pend{color:#8a6d00}.muted{color:#667085}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;color:#fff}
.badge.ok{background:#1a7f37}.badge.bad{background:#cf222e}.badge.pend{background:#9a6700}
.kv td:first-child{width:190px;color:#667085}
.node{border:1px solid #d0d7de;border-radius:6px;padding:8px 14px;margin:14px 0;page-break-inside:avoid}
.node.bad{border-left:5px solid #cf222e}.node.ok{border-left:5px solid #1a7f37}
svg text{font:11px Helvetica,Arial,sans-serif;fill:#1d2329}
rect.ok{fill:#4ac26b}rect.bad{fill:#e5534b}rect.pend{fill:#d4a72c}
line.base{stroke:#0969da;stroke-width:2;stroke-dasharray:6 3}line.median{stroke:#57606a;stroke-width:2}
line.limit{stroke:#cf222e;stroke-width:1.5;stroke-dasharray:2 3}line.axis{stroke:#d0d7de}
svg.spark polyline{fill:none;stroke:#d1242f;stroke-width:1.5}
.warn{background:#fff8c5;border:1px solid #d4a72c;padding:6px 10px;border-radius:6px}
code{font-size:12px}
@media print{body{margin:0}}
</style></head><body>
<h1>Burn-in acceptance report: {{.Title}}</h1>
<p class="muted">campaign <code>{{.R.Campaign.ID}}</code> · generated {{time .R.GeneratedAt}} by fleetcheck</p>
<table class="kv">
<tr><td>state</td><td>{{.R.Campaign.State}} ({{.R.Campaign.Phase}}){{with .R.Campaign.Reason}} — {{.}}{{end}}</td></tr>
<tr><td>level / suite</td><td>{{.R.Spec.Level}} / <code>{{.R.Spec.Suite.Name}}</code>, {{.R.Spec.Repeats}} repeat(s)</td></tr>
<tr><td>selector</td><td><code>{{.R.Spec.Selector}}</code></td></tr>
<tr><td>started / finished</td><td>{{time .R.Campaign.CreatedAt}} / {{time .R.Campaign.FinishedAt}}</td></tr>
<tr><td>nodes</td><td>{{.R.Campaign.Nodes}}: <span class="ok">{{.R.Campaign.Accepted}} accepted</span>, <span class="bad">{{.R.Campaign.Rejected}} rejected</span>{{$p := sub .R.Campaign.Nodes .R.Campaign.Accepted .R.Campaign.Rejected}}{{if gt $p 0}}, <span class="pend">{{$p}} undecided</span>{{end}}</td></tr>
<tr><td>rules</td><td>reject on {{join .R.Spec.RejectOn ", "}}; SKU baseline limit {{pct .R.Spec.Baseline.MaxDeviation}} below; outlier: more than {{pct .R.Spec.Outlier.MinShortfall}} below the campaign median and beyond {{.R.Spec.Outlier.MADs}} MADs (at least {{.R.Spec.Outlier.MinPeers}} identical nodes); missing baseline: {{.R.Spec.Baseline.Missing}}</td></tr>
</table>
{{with .Rejected}}<div class="warn"><b>Rejected:</b> {{range $i, $n := .}}{{if $i}}, {{end}}<a href="#{{anchor $n.Node}}">{{$n.Node}}</a>{{end}}</div>{{end}}

<h2>Steps</h2>
<table><tr><th>step</th><th>kind</th><th>runs</th><th>params</th><th>timeout</th></tr>
{{range .R.Spec.Suite.Steps}}<tr><td>{{.Name}}</td><td>{{.Kind}}</td><td>{{if .Action}}action <code>{{.Action}}</code>{{else}}{{join .Checks ", "}}{{end}}{{with .SampleChecks}}; sampling {{join . ", "}}{{end}}</td><td>{{range $k, $v := .Params}}<code>{{$k}}={{$v}}</code> {{end}}</td><td>{{.Timeout.D 0}}</td></tr>
{{end}}</table>

<h2>Numbers</h2>
<table><tr><th>metric</th><th>sku</th><th>SKU baseline</th><th>campaign median</th><th>MAD</th><th>min</th><th>max</th><th>nodes</th></tr>
{{range .R.Metrics}}<tr><td>{{.Metric}}</td><td>{{.SKU}}</td><td class="n">{{dash .Baseline}}{{with .Scope}} <span class="muted">({{.}})</span>{{end}}</td><td class="n">{{num .Median}}</td><td class="n">{{num .MAD}}</td><td class="n">{{num .Min}}</td><td class="n">{{num .Max}}</td><td class="n">{{.Nodes}}</td></tr>
{{else}}<tr><td colspan="8" class="muted">no compared numbers</td></tr>{{end}}</table>
{{range .Charts}}{{template "chart" .}}{{end}}
{{with .Temp}}<h2>Temperatures during stress</h2>{{template "chart" .}}{{end}}

<h2>Nodes</h2>
<table><tr><th>node</th><th>verdict</th><th>sku</th><th>why</th></tr>
{{range .R.Nodes}}<tr><td><a href="#{{anchor .Node}}">{{.Node}}</a></td><td class="{{vcls .Verdict}}">{{if .Verdict}}{{.Verdict}}{{else}}{{.State}}{{end}}{{if .Evidence.RepeatOffenders}} ⚠ repeat offender{{end}}</td><td>{{.SKU}}</td><td>{{range $i, $r := .Evidence.Reasons}}{{if lt $i 2}}{{if $i}}<br>{{end}}<b>{{$r.Code}}</b> {{$r.Message}}{{end}}{{end}}{{if gt (len .Evidence.Reasons) 2}} <span class="muted">(+{{sub (len .Evidence.Reasons) 2 0}} more)</span>{{end}}</td></tr>
{{end}}</table>

{{range .R.Nodes}}
<div class="node {{vcls .Verdict}}" id="{{anchor .Node}}">
<h3>{{.Node}} <span class="badge {{vcls .Verdict}}">{{if .Verdict}}{{.Verdict}}{{else}}{{.State}}{{end}}</span></h3>
<p class="muted">sku {{.SKU}} · driver {{.Inventory.DriverVersion}} · {{if .DrainedByUs}}drained by this campaign{{else}}already out of service or not drained by this campaign{{end}}{{with .Note}} · {{.}}{{end}}</p>
{{with .Evidence.RepeatOffenders}}<div class="warn"><b>Repeat offender:</b><ul>{{range .}}<li>{{.Part.Kind}} {{.Part.Component}} <code>{{.Part.Identity}}</code> ({{.IdentityKind}}) was rejected in campaign <code>{{.Campaign}}</code> on {{.Node}} ({{.Component}}) at {{time .At}}: {{.Reason}}</li>{{end}}</ul></div>{{end}}
{{with .Evidence.Reasons}}<b>Reasons</b><ul>{{range .}}<li><b>{{.Code}}</b>{{with .Step}} [{{.}}]{{end}}{{with .Component}} {{.}}{{end}}: {{.Message}}</li>{{end}}</ul>{{end}}
{{with .Evidence.Numbers}}<table><tr><th>metric</th><th>value</th><th>samples</th><th>SKU baseline</th><th>vs baseline</th><th>campaign median</th><th>vs median</th><th>peers</th><th>outlier</th></tr>
{{range .}}<tr><td>{{.Metric}}{{with .Pair}}<br><span class="muted">{{.}}</span>{{end}}</td><td class="n">{{num .Value}}</td><td class="n">{{nums .Samples}}</td><td class="n">{{dash .Baseline}}</td><td>{{if .Baseline}}{{.BaselineVerdict}} ({{pct .Deviation}} short){{else}}no baseline{{end}}</td><td class="n">{{dash .CampaignMedian}}</td><td class="n">{{if .Peers}}{{pct .MedianShortfall}} short{{end}}</td><td class="n">{{.Peers}}</td><td class="{{if .Outlier}}bad{{end}}">{{if .Outlier}}yes{{else}}no{{end}}</td></tr>
{{end}}</table>{{end}}
{{with .Evidence.Notes}}<ul class="muted">{{range .}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{with .Temperatures}}<p>GPU temperature during stress: {{spark .}}</p>{{end}}
{{with .Evidence.Parts}}<table><tr><th>part</th><th>identity</th><th>by</th><th>model</th><th>firmware</th><th>PCI</th><th>implicated</th></tr>
{{range .}}<tr><td>{{.Kind}} {{.Component}}</td><td><code>{{.Identity}}</code></td><td>{{.IdentityKind}}</td><td>{{.Model}}</td><td>{{.Firmware}}</td><td>{{.PCIBusID}}</td><td class="{{if .Implicated}}bad{{end}}">{{if .Implicated}}yes{{end}}</td></tr>
{{end}}</table>{{end}}
{{with .Findings}}<b>Findings</b><table><tr><th>step</th><th>rep</th><th>check</th><th>severity</th><th>component</th><th>code</th><th>message</th><th>action</th></tr>
{{range .}}<tr><td>{{.Step}}{{with .Peers}} with {{join . ","}}{{end}}</td><td class="n">{{.Repeat}}</td><td>{{.Check}}</td><td class="{{if eq (print .Finding.Severity) "fail"}}bad{{else}}pend{{end}}">{{.Finding.Severity}}</td><td>{{.Finding.Component}}{{with .Finding.PCIBusID}} <span class="muted">{{.}}</span>{{end}}</td><td>{{.Finding.Code}}</td><td>{{.Finding.Message}}</td><td>{{.Finding.Action}}</td></tr>
{{end}}</table>{{end}}
<b>Runs</b><table><tr><th>#</th><th>step</th><th>rep</th><th>with</th><th>result</th><th>checks</th><th>started</th><th>took</th><th>tries</th></tr>
{{range .Runs}}<tr><td class="n">{{.Seq}}</td><td>{{.Step}}</td><td class="n">{{.Repeat}}</td><td>{{join .Peers ","}}</td><td>{{runstatus .}}</td><td>{{checksummary .}}{{with .Error}} <span class="bad">{{.}}</span>{{end}}</td><td>{{time .StartedAt}}</td><td>{{dur .StartedAt .FinishedAt}}</td><td class="n">{{.Attempts}}</td></tr>
{{end}}</table>
</div>
{{end}}

<h2>History</h2>
<table><tr><th>at</th><th>node</th><th>what</th></tr>
{{range .R.Events}}<tr><td>{{time .At}}</td><td>{{.Node}}</td><td>{{.What}}</td></tr>
{{end}}</table>
</body></html>
{{define "chart"}}<h3>{{.Title}}{{with .Unit}} ({{.}}){{end}}</h3>
<svg width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Title}}" xmlns="http://www.w3.org/2000/svg">
{{range .Legend}}<line class="{{.Class}}" x1="{{f1 .X}}" y1="10" x2="{{f1 (add .X 22)}}" y2="10"/><text x="{{f1 (add .X 26)}}" y="14">{{.Label}}</text>
{{end}}{{range .Bars}}<g><title>{{.Tip}}</title><text x="166" y="{{f1 (add .Y 10)}}" text-anchor="end">{{.Label}}</text><rect class="{{.Class}}" x="170" y="{{f1 (add .Y 1)}}" width="{{f1 .W}}" height="11"/><text x="{{f1 .ValueX}}" y="{{f1 (add .Y 10)}}">{{.Value}}</text></g>
{{end}}{{$h := .Height}}{{range .Axis}}<line class="axis" x1="{{f1 .X}}" y1="28" x2="{{f1 .X}}" y2="{{sub $h 22 0}}"/><text x="{{f1 .X}}" y="{{sub $h 8 0}}" text-anchor="middle">{{.Label}}</text>
{{end}}{{range .Lines}}<line class="{{.Class}}" x1="{{f1 .X}}" y1="28" x2="{{f1 .X}}" y2="{{sub $h 22 0}}"><title>{{.Label}}</title></line>
{{end}}</svg>{{with .Note}}<div class="muted">{{.}}</div>{{end}}{{end}}
`
