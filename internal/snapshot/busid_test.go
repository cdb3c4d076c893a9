package snapshot

import "testing"

func TestNormalizeBusID(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"00000000:19:00.0", "0000:19:00.0"},
		{"00000000:9B:00.0", "0000:9b:00.0"},
		{"0000:19:00.0", "0000:19:00.0"},
		{"0000:9b:00", "0000:9b:00.0"},
		{"PCI:0000:9b:00", "0000:9b:00.0"},
		{"19:00.0", "0000:19:00.0"},
		{" 0000:00:1E.0\n", "0000:00:1e.0"},
		{"00010000:01:00.1", "10000:01:00.1"},
		{"0001:02:03.4", "0001:02:03.4"},
		{"", ""},
		{"garbage", "garbage"},
		{"0000:zz:00.0", "0000:zz:00.0"},
		{"0000:19:20.0", "0000:19:20.0"}, // device > 0x1f is not a PCI address
		{"0000:19:00.9", "0000:19:00.9"},
		{"a:b:c:d", "a:b:c:d"},
	}
	for _, c := range cases {
		if got := NormalizeBusID(c.in); got != c.want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
