package campaigndb

import (
	"testing"
	"time"
)

func TestTimeRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 29, 23, 0, 1, 123456789, time.FixedZone("x", 3600))
	if got := ParseTime(Time(at)); !got.Equal(at) {
		t.Errorf("round trip %v -> %v", at, got)
	}
	if Time(time.Time{}) != "" || !ParseTime("").IsZero() || !ParseTime("yesterday").IsZero() {
		t.Error("the zero time is written as \"\" and anything unreadable reads as zero")
	}
	if a, b := Time(at), Time(at.Add(time.Nanosecond)); a >= b {
		t.Errorf("written times do not sort: %q >= %q", a, b)
	}
}

func TestJSON(t *testing.T) {
	if got := JSON(map[string]int{"b": 2, "a": 1}); got != `{"a":1,"b":2}` {
		t.Errorf("JSON = %s", got)
	}
	if got := JSON(func() {}); got != "null" {
		t.Errorf("an unmarshalable value = %s, want null", got)
	}
}

func TestTimeIsFixedWidth(t *testing.T) {
	a := Time(time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC))
	b := Time(time.Date(2026, 1, 1, 0, 0, 1, 500e6, time.UTC))
	if len(a) != len(b) || a >= b {
		t.Errorf("%q and %q: want the same width, in time order", a, b)
	}
}
