package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/internal/compat"
)

// yamlKeys lists the YAML keys of a struct and of the structs inside it.
func yamlKeys(v any) []string {
	var out []string
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			out = append(out, name)
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() && ft.Name() != "Duration" {
				walk(ft)
			}
		}
	}
	walk(reflect.TypeOf(v))
	return out
}

func TestEmptyIsDefaults(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{"", "\n", "# just a comment\n", "---\n", "~\n"} {
		c, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if !reflect.DeepEqual(c, Defaults()) {
			t.Errorf("Parse(%q) = %+v, want defaults", doc, c)
		}
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	d := Defaults()
	if d.Limits.GPUTempWarnC != 85 || d.Limits.RetiredPagesMax != 60 || d.NCCL.MaxDeviation != 0.30 {
		t.Errorf("limits = %+v, nccl = %+v", d.Limits, d.NCCL)
	}
	if d.Xid.Lookback.D(0) != 24*time.Hour {
		t.Errorf("xid.lookback = %v", d.Xid.Lookback.D(0))
	}
	if d.Limits.IBCounterRise["symbol_error"] != 10 || len(d.Limits.IBCounterRise) != 7 {
		t.Errorf("ib_counter_rise = %v", d.Limits.IBCounterRise)
	}
	if err := d.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
	// Defaults returns a fresh copy each time: callers may change it.
	d.Limits.IBCounterRise["symbol_error"] = 99
	if Defaults().Limits.IBCounterRise["symbol_error"] != 10 {
		t.Errorf("Defaults shares its map")
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, doc, want string
	}{
		{"unknown top key", "expectations:\n  gpu_count: 8\n", "field expectations not found"},
		{"unknown nested key", "limits:\n  gpu_temp_warn: 80\n", "line 2: field gpu_temp_warn not found"},
		{"misspelled expect key", "expect:\n  gpu_cnt: 8\n", "field gpu_cnt not found"},
		{"wrong type", "expect:\n  gpu_count: eight\n", "cannot unmarshal"},
		{"bad duration", "xid:\n  lookback: 1 day\n", `line 2: bad duration "1 day"`},
		{"duration without unit", "tools:\n  timeout: 30\n", `bad duration "30"`},
		{"negative duration", "tools:\n  nccl_timeout: -5m\n", "negative duration"},
		{"duration as list", "tools:\n  timeout: [30s]\n", "cannot unmarshal"},
		{"bad action override", "xid:\n  overrides:\n    79: rma\n", `xid.overrides[79]: unknown action "rma"`},
		{"action is case-sensitive", "xid:\n  overrides:\n    79: Drain\n", `unknown action "Drain"`},
		{"negative gpu count", "expect:\n  gpu_count: -1\n", "expect.gpu_count -1 is out of range: must be within 0..64"},
		{"negative ports", "expect:\n  ib_ports: -2\n", "expect.ib_ports -2 is out of range: must be within 0..64"},
		{"negative rate", "expect:\n  ib_rate_gbps: -400\n", "expect.ib_rate_gbps -400 is out of range: must be within 0..3200"},
		{"NaN limit", "limits:\n  gpu_temp_warn_c: .nan\n", "limits.gpu_temp_warn_c NaN is out of range: must be within 0..150"},
		{"Inf limit", "nccl:\n  baseline_gbps: .inf\n", "nccl.baseline_gbps +Inf is out of range"},
		{"NaN deviation", "nccl:\n  max_deviation: .nan\n", "nccl.max_deviation NaN is out of range"},
		{"deviation 1", "nccl:\n  max_deviation: 1\n", "nccl.max_deviation 1 is out of range: must be within 0..0.99"},
		{"transport", "nccl:\n  expect_transport: ib\n", `nccl.expect_transport must be IB or Socket, not "ib"`},
		{"dcgm level", "tools:\n  dcgm_level: 5\n", "tools.dcgm_level 5 is out of range: must be within 1..4"},
		{"matrix and file", "matrix_file: m.yaml\nmatrix:\n  kernels: ['*']\n", "set matrix or matrix_file, not both"},
		{"bad inline matrix", "matrix:\n  gpus:\n    - model: H100\n", "line 3: gpus[0]: empty rule"},
		{"inline matrix unknown key", "matrix:\n  kernel: ['*']\n", `line 2: matrix: unknown key "kernel"`},
		{"two documents", "expect:\n  gpu_count: 8\n---\nexpect:\n  gpu_count: 4\n", "more than one YAML document"},
		{"not a mapping", "- 1\n", "cannot unmarshal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse: want error, got %+v", c)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestInlineMatrixErrorWrapsCompat(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("matrix:\n  kernels: ['>=6.6, <6.5']\n"))
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, compat.ErrInvalid) {
		t.Errorf("error %v should wrap both ErrInvalid and compat.ErrInvalid", err)
	}
}

func TestParseValues(t *testing.T) {
	t.Parallel()
	doc := `
expect:
  gpu_count: 8
  nvswitch: false
xid:
  lookback: 90m
  overrides: {79: replace, 63: reset_gpu}
  ignore: [13, 43]
limits:
  ib_counter_rise:
    symbol_error: 50
nccl:
  expect_transport: Socket
tools:
  dcgm_level: 0
  use_nvml: false
matrix:
  kernels: [">=6.5.0-1007, <6.6"]
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if c.Expect.NVSwitch == nil || *c.Expect.NVSwitch {
		t.Errorf("nvswitch = %v", c.Expect.NVSwitch)
	}
	if c.Expect.ECCEnabled != nil {
		t.Errorf("unset bool should stay nil")
	}
	if c.Xid.Lookback.D(time.Hour) != 90*time.Minute || c.Tools.Timeout.D(30*time.Second) != 30*time.Second {
		t.Errorf("durations: %v %v", c.Xid.Lookback.D(0), c.Tools.Timeout.D(30*time.Second))
	}
	if c.Xid.Overrides[79] != "replace" || len(c.Xid.Ignore) != 2 {
		t.Errorf("xid = %+v", c.Xid)
	}
	if c.Limits.IBCounterRise["symbol_error"] != 50 || c.Limits.IBCounterRise["link_downed"] != 0 || len(c.Limits.IBCounterRise) != 7 {
		t.Errorf("ib_counter_rise should merge with defaults: %v", c.Limits.IBCounterRise)
	}
	if c.Limits.GPUTempWarnC != 85 {
		t.Errorf("unset limit lost its default: %v", c.Limits.GPUTempWarnC)
	}
	if c.Tools.UseNVML == nil || *c.Tools.UseNVML {
		t.Errorf("use_nvml = %v", c.Tools.UseNVML)
	}
	if c.Matrix == nil || !c.Matrix.Judges(compat.KindKernel) {
		t.Errorf("inline matrix not decoded")
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte("xid:\n  lookback: 90m\nmatrix:\n  kernels: ['>=6.5, <6.6']\n  hcas:\n    - {model: MT4129, min_firmware: 28.39.1002}\n"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Parse(out)
	if err != nil {
		t.Fatalf("re-parse:\n%s\n%v", out, err)
	}
	if c2.Xid.Lookback != c.Xid.Lookback || c2.Matrix == nil || !c2.Matrix.Judges(compat.KindHCAFirmware) {
		t.Errorf("round trip lost values:\n%s", out)
	}
}

// A config loaded from a matrix_file still validates: Load fills Matrix.
func TestLoadedConfigValidates(t *testing.T) {
	t.Parallel()
	c, err := Load("../../examples/node-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate after Load: %v", err)
	}
}
