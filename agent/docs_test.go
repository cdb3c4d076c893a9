package agent

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// fence is one fenced code block of a Markdown page.
type fence struct {
	info string // "yaml", "yaml invalid", "text", "sh"
	line int
	body string
}

func fences(t *testing.T, path string) []fence {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []fence
	var cur *fence
	var body strings.Builder
	for i, l := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimLeft(l, " ")
		if !strings.HasPrefix(trimmed, "```") {
			if cur != nil {
				body.WriteString(l + "\n")
			}
			continue
		}
		if cur == nil {
			cur = &fence{info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), line: i + 1}
			body.Reset()
			continue
		}
		cur.body = body.String()
		out = append(out, *cur)
		cur = nil
	}
	if cur != nil {
		t.Fatalf("%s:%d: unclosed code block", path, cur.line)
	}
	return out
}

// TestDocsExamplesLoad loads every ```yaml block of docs/agent.md, checks
// every ```yaml invalid block fails with the error in the ```text block
// after it, and loads examples/agent.yaml: the docs cannot drift.
func TestDocsExamplesLoad(t *testing.T) {
	t.Parallel()
	const page = "../docs/agent.md"
	blocks := fences(t, page)
	valid, invalid := 0, 0
	for i, b := range blocks {
		switch b.info {
		case "yaml":
			valid++
			if _, err := ParseConfig([]byte(b.body)); err != nil {
				t.Errorf("%s:%d: example does not load: %v", page, b.line, err)
			}
		case "yaml invalid":
			invalid++
			_, err := ParseConfig([]byte(b.body))
			if err == nil {
				t.Errorf("%s:%d: example marked invalid loads", page, b.line)
				continue
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s:%d: error does not wrap ErrInvalid: %v", page, b.line, err)
			}
			if i+1 >= len(blocks) || blocks[i+1].info != "text" {
				t.Errorf("%s:%d: invalid example without its error in a ```text block", page, b.line)
				continue
			}
			if want := strings.TrimSpace(blocks[i+1].body); !strings.Contains(err.Error(), want) {
				t.Errorf("%s:%d: error\n  %v\ndoes not contain the documented\n  %s", page, b.line, err, want)
			}
		}
	}
	if valid < 2 || invalid < 3 {
		t.Errorf("%s: %d valid and %d invalid examples; the page lost its examples?", page, valid, invalid)
	}

	c, err := LoadConfig("../examples/agent.yaml")
	if err != nil {
		t.Fatalf("examples/agent.yaml: %v", err)
	}
	if c.Node != "gpu-017" || c.Checks.Matrix == nil || c.Checks.Expect.GPUCount != 8 {
		t.Errorf("example not read whole: node %q, matrix loaded %v, gpu_count %d", c.Node, c.Checks.Matrix != nil, c.Checks.Expect.GPUCount)
	}
	if _, err := New(c, &fakeHost{}, nopLogger()); err != nil {
		t.Errorf("example config does not make an agent: %v", err)
	}
}
