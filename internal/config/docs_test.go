package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/compat"
)

// block is one fenced code block of a Markdown file.
type block struct {
	info string // "yaml", "yaml invalid", "text"
	line int    // line of the opening fence
	body string
}

func fencedBlocks(t *testing.T, path string) []block {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []block
	var cur *block
	var body strings.Builder
	for i, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "```") {
			if cur != nil {
				body.WriteString(l + "\n")
			}
			continue
		}
		if cur == nil {
			cur = &block{info: strings.TrimSpace(strings.TrimPrefix(l, "```")), line: i + 1}
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

// checkDocBlocks parses every ```yaml block of a page with parse, and checks
// that every ```yaml invalid block fails with the error in the ```text block
// right after it.
func checkDocBlocks(t *testing.T, path string, parse func([]byte) error) {
	blocks := fencedBlocks(t, path)
	valid, invalid := 0, 0
	for i, b := range blocks {
		switch b.info {
		case "yaml":
			valid++
			if err := parse([]byte(b.body)); err != nil {
				t.Errorf("%s:%d: example does not load: %v\n%s", path, b.line, err, b.body)
			}
		case "yaml invalid":
			invalid++
			err := parse([]byte(b.body))
			if err == nil {
				t.Errorf("%s:%d: example marked invalid loads", path, b.line)
				continue
			}
			if i+1 >= len(blocks) || blocks[i+1].info != "text" {
				t.Errorf("%s:%d: invalid example without its error in a ```text block", path, b.line)
				continue
			}
			if want := strings.TrimSpace(blocks[i+1].body); !strings.Contains(err.Error(), want) {
				t.Errorf("%s:%d: error\n  %v\ndoes not contain the documented\n  %s", path, b.line, err, want)
			}
		}
	}
	if valid == 0 {
		t.Errorf("%s: no yaml examples found", path)
	}
	t.Logf("%s: %d valid and %d invalid examples", path, valid, invalid)
}

func TestConfigDocExamples(t *testing.T) {
	t.Parallel()
	checkDocBlocks(t, filepath.Join("..", "..", "docs", "config.md"), func(b []byte) error {
		_, err := Parse(b)
		return err
	})
}

func TestMatrixDocExamples(t *testing.T) {
	t.Parallel()
	checkDocBlocks(t, filepath.Join("..", "..", "docs", "matrix.md"), func(b []byte) error {
		_, err := compat.Parse(b)
		return err
	})
}

// Every config field is documented: each YAML key of Config appears in
// docs/config.md as a `key`.
func TestConfigDocCoversEveryField(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range yamlKeys(Config{}) {
		if !strings.Contains(string(data), "`"+key+"`") {
			t.Errorf("docs/config.md does not document `%s`", key)
		}
	}
}

func TestExampleNodeConfig(t *testing.T) {
	t.Parallel()
	c, err := Load(filepath.Join("..", "..", "examples", "node-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Expect.GPUCount != 8 || c.Expect.GPUModel != "H100" || c.Expect.IBPorts != 8 || c.Expect.IBRateGbps != 400 {
		t.Errorf("expect = %+v", c.Expect)
	}
	if c.Expect.NVSwitch == nil || !*c.Expect.NVSwitch || c.Expect.MIGEnabled == nil || *c.Expect.MIGEnabled {
		t.Errorf("expect flags = %+v", c.Expect)
	}
	if got := c.Xid.Lookback.D(0); got != 24*time.Hour {
		t.Errorf("xid.lookback = %v", got)
	}
	if c.Xid.Overrides[63] != "reset_gpu" {
		t.Errorf("xid.overrides = %v", c.Xid.Overrides)
	}
	// Listed counters override, the others keep their defaults.
	if r := c.Limits.IBCounterRise; r["port_xmit_discards"] != 100 || r["symbol_error"] != 10 || r["link_error_recovery"] != 0 || len(r) != 8 {
		t.Errorf("ib_counter_rise = %v", r)
	}
	if c.NCCL.ExpectTransport != "IB" || c.NCCL.MaxDeviation != 0.30 || c.NCCL.BaselineGBps != 480 {
		t.Errorf("nccl = %+v", c.NCCL)
	}
	if c.Tools.DCGMLevel != 2 || c.Tools.NCCLTimeout.D(0) != 10*time.Minute || len(c.Tools.AllReduceArgs) != 8 {
		t.Errorf("tools = %+v", c.Tools)
	}
	if c.PeerMem.Required == nil || !*c.PeerMem.Required {
		t.Errorf("peermem = %+v", c.PeerMem)
	}
	// matrix_file was resolved next to the config and loaded.
	if c.Matrix == nil || !c.Matrix.Judges(compat.KindFabricManager) || !c.Matrix.Judges(compat.KindKnownBad) {
		t.Fatalf("matrix not loaded: %+v", c.Matrix)
	}
	yes := true
	n := compat.Node{
		Driver: "535.129.03", CUDA: "12.2", FabricManager: "535.129.03", Kernel: "6.5.0-1007-nvidia",
		RDMAStack: "MLNX_OFED 23.10-1.1.9.0", NVSwitch: &yes,
		GPUs: []compat.GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3", VBIOS: "96.00.99.00.01"}},
		HCAs: []compat.HCA{{Name: "mlx5_0", Model: "MT4129", FW: "28.39.1002"}},
	}
	if v := c.Matrix.Evaluate(n); !v.OK() {
		t.Errorf("pinned tuple under the example matrix: %+v", v)
	}
}

func TestLoadMatrixFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := write("missing.yaml", "matrix_file: nowhere.yaml\n")
	if _, err := Load(cfg); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "matrix_file") {
		t.Errorf("missing matrix file: %v", err)
	}
	write("bad-matrix.yaml", "gpus:\n  - model: H100\n")
	cfg = write("bad.yaml", "matrix_file: bad-matrix.yaml\n")
	if _, err := Load(cfg); !errors.Is(err, compat.ErrInvalid) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad matrix file: %v", err)
	}
	// An absolute matrix_file is used as is.
	abs := write("good-matrix.yaml", "kernels: ['*']\n")
	cfg = write("abs.yaml", "matrix_file: "+abs+"\n")
	if c, err := Load(cfg); err != nil || c.Matrix == nil {
		t.Errorf("absolute matrix_file: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "none.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing config: %v", err)
	}
}
