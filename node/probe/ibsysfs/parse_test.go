package ibsysfs

import (
	"math"
	"strings"
	"testing"
)

func TestParseState(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "4: ACTIVE", want: "ACTIVE"},
		{in: "4: ACTIVE\n", want: "ACTIVE"},
		{in: "1: DOWN\n", want: "DOWN"},
		{in: "5: LinkUp", want: "LinkUp"},
		{in: "2: Polling", want: "Polling"},
		{in: "4: PortConfigurationTraining\n", want: "PortConfigurationTraining"},
		{in: "0: <unknown>", want: "<unknown>"},
		{in: "3: Disabled", want: "Disabled"},
		{in: "ACTIVE", want: "ACTIVE"},
		{in: "", wantErr: true},
		{in: "\n", wantErr: true},
		{in: "4:", wantErr: true},
		{in: "x: ACTIVE", wantErr: true},
		{in: ": ACTIVE", wantErr: true},
		{in: "0:0:00", wantErr: true},
		{in: "4: ACT\x00IVE", wantErr: true},
		{in: "4: " + strings.Repeat("A", 65), wantErr: true},
	}
	for _, tc := range tests {
		got, err := parseState(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseState(%q) = %q, %v; want %q, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in       string
		want     float64
		wantText string
		wantErr  bool
	}{
		{in: "400 Gb/sec (4X NDR)", want: 400, wantText: "400 Gb/sec (4X NDR)"},
		{in: "400 Gb/sec (4X NDR)\n", want: 400, wantText: "400 Gb/sec (4X NDR)"},
		{in: "200 Gb/sec (2X NDR)", want: 200, wantText: "200 Gb/sec (2X NDR)"},
		{in: "2.5 Gb/sec (1X SDR)\n", want: 2.5, wantText: "2.5 Gb/sec (1X SDR)"},
		{in: "100 Gb/sec (4X EDR)", want: 100, wantText: "100 Gb/sec (4X EDR)"},
		{in: "10 Gb/sec (4X)", want: 10, wantText: "10 Gb/sec (4X)"},
		{in: "25 Gb/sec", want: 25, wantText: "25 Gb/sec"},
		{in: "", wantErr: true},
		{in: "fast", wantErr: true},
		{in: "NaN Gb/sec", wantErr: true},
		{in: "Inf Gb/sec", wantErr: true},
		{in: "1e3 Gb/sec", wantErr: true},
		{in: "-400 Gb/sec", wantErr: true},
		{in: ".5 Gb/sec", wantErr: true},
		{in: "5. Gb/sec", wantErr: true},
		{in: "1.2.3 Gb/sec", wantErr: true},
		{in: "400 Mb/sec", wantErr: true},
		{in: "400Gb/sec", wantErr: true},
		{in: strings.Repeat("9", 400) + " Gb/sec", wantErr: true},
	}
	for _, tc := range tests {
		got, text, err := parseRate(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want || text != tc.wantText {
			t.Errorf("parseRate(%q) = %v, %q, %v; want %v, %q, err %v", tc.in, got, text, err, tc.want, tc.wantText, tc.wantErr)
		}
	}
}

func TestParseCounter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{in: "0", want: 0},
		{in: "15\n", want: 15},
		{in: "230539874932483", want: 230539874932483},
		{in: " 18446744073709551615 \n", want: math.MaxUint64},
		{in: "18446744073709551616", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "+1", wantErr: true},
		{in: "1_000", wantErr: true},
		{in: "0x10", wantErr: true},
		{in: "", wantErr: true},
		{in: "garbage", wantErr: true},
	}
	for _, tc := range tests {
		got, err := parseCounter(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseCounter(%q) = %v, %v; want %v, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
