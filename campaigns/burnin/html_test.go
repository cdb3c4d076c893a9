package burnin

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

func TestHTMLReportContainsEveryNode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 9)
	h.setSKUBaselines()
	h.fleet.node("gpu-003").busbw = 400
	// Hostile text from an agent must come out escaped.
	h.fleet.node("gpu-006").fail["gpu.xid"] = report.Finding{Severity: report.SevFail, Component: "GPU1",
		Code: "XID_79", Message: `<script>alert("x")</script> fell off the bus`}
	id := h.start(`
selector: batch=new
level: extended
repeats: 2
stress_duration: 5m
`)
	h.finish(h.eng)
	r := h.report(id)
	var buf bytes.Buffer
	if err := h.eng.WriteHTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	var svgs, scripts, links, rects int
	var text strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			switch n.Data {
			case "svg":
				svgs++
			case "script":
				scripts++
			case "link", "img", "iframe":
				links++
			case "rect":
				rects++
			}
			for _, a := range n.Attr {
				if a.Key == "id" {
					ids[a.Val] = true
				}
				if (a.Key == "src" || a.Key == "href") && !strings.HasPrefix(a.Val, "#") {
					t.Errorf("external reference %s=%q", a.Key, a.Val)
				}
			}
		}
		if n.Type == html.TextNode {
			text.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	for _, n := range r.Nodes {
		if !ids["node-"+n.Node] {
			t.Errorf("no section for %s", n.Node)
		}
	}
	if scripts != 0 || links != 0 {
		t.Errorf("not self-contained: %d scripts, %d external elements", scripts, links)
	}
	// One chart per compared metric (busbw, pair busbw, two PCIe numbers)
	// plus temperatures, plus sparklines.
	if svgs < 5 || rects < 9 {
		t.Errorf("%d svg charts, %d bars", svgs, rects)
	}
	if !strings.Contains(text.String(), `<script>alert("x")</script> fell off the bus`) {
		t.Error("finding text lost")
	}
	if strings.Contains(page, `<script>alert`) {
		t.Error("finding text not escaped")
	}
	for _, want := range []string{"campaign median", "SKU baseline", "peer_outlier", "hottest GPU during stress", "rejected"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// The JSON form carries the same nodes.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Nodes) != 9 || back.Nodes[2].Verdict != Rejected {
		t.Errorf("json round trip: %d nodes", len(back.Nodes))
	}
}

func TestHTMLOfUnfinishedCampaign(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	id := h.start(standardSpec)
	var buf bytes.Buffer
	if err := WriteHTML(&buf, h.report(id)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "pending") {
		t.Error("pending nodes not shown")
	}
	if err := WriteHTML(&buf, nil); err == nil {
		t.Error("nil report accepted")
	}
}
