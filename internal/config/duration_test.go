package config

import (
	"encoding/json"
	"testing"
	"time"
)

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{4 * time.Minute, "4m"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{26 * time.Hour, "26h"},
		{90 * time.Second, "1m30s"},
		{1500 * time.Millisecond, "1.5s"},
		{time.Hour + time.Second, "1h0m1s"},
		{250 * time.Millisecond, "250ms"},
	} {
		got := FormatDuration(tc.in)
		if got != tc.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", tc.in, got, tc.want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != tc.in {
			t.Errorf("%q reads back as %v, %v", got, back, err)
		}
	}
}

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	type doc struct {
		D Duration `json:"d"`
	}
	b, err := json.Marshal(doc{D: Duration(4 * time.Minute)})
	if err != nil || string(b) != `{"d":"4m"}` {
		t.Fatalf("marshal: %s, %v", b, err)
	}
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{`{"d":"4m"}`, 4 * time.Minute, false},
		{`{"d":" 30s "}`, 30 * time.Second, false},
		{`{"d":240000000000}`, 4 * time.Minute, false}, // stored before durations were strings
		{`{"d":null}`, 0, false},
		{`{}`, 0, false},
		{`{"d":"-1s"}`, 0, true},
		{`{"d":-5}`, 0, true},
		{`{"d":"4 minutes"}`, 0, true},
		{`{"d":1.5}`, 0, true},
		{`{"d":true}`, 0, true},
		{`{"d":"99999999999h"}`, 0, true},
	} {
		var d doc
		err := json.Unmarshal([]byte(tc.in), &d)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err == nil && time.Duration(d.D) != tc.want {
			t.Errorf("%s: got %v, want %v", tc.in, time.Duration(d.D), tc.want)
		}
	}
}

// FuzzDurationJSON: any input either fails or reads as a non-negative
// duration that writes back and reads again as itself.
func FuzzDurationJSON(f *testing.F) {
	for _, s := range []string{`"4m"`, `"1h30m"`, `240000000000`, `null`, `"-1s"`, `-5`, `1.5`, `"9999999999h"`,
		`"1e3s"`, `"  "`, `""`, `"\u0000"`, `9223372036854775807`, `-9223372036854775808`, `{"d":1}`, `[1]`, `"1h\"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Duration
		if err := d.UnmarshalJSON(b); err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("%q read as negative %d", b, int64(d))
		}
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var back Duration
		if err := json.Unmarshal(out, &back); err != nil || back != d {
			t.Fatalf("%q -> %s -> %v, %v", b, out, back, err)
		}
	})
}
