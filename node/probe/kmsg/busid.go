package kmsg

import (
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// normalizeBusID turns the driver's PCI address forms ("PCI:0000:9b:00",
// "0000:03:00", "00000000:19:00.0") into the snapshot's form, "0000:9b:00.0".
// snapshot.NormalizeBusID hands unreadable input back as it came; a kernel
// line with a garbled address is better off with no bus id than a wrong
// one, so that case gives "".
func normalizeBusID(s string) string {
	n := snapshot.NormalizeBusID(s)
	if !canonical(n) {
		return ""
	}
	return n
}

// canonical reports whether s is "dddd:bb:dd.f": a domain of four or more
// hex digits, a bus, a device up to 0x1f and a function up to 7.
func canonical(s string) bool {
	l := len(s)
	if l < 12 || s[l-2] != '.' || s[l-5] != ':' || s[l-8] != ':' {
		return false
	}
	for i := 0; i < l-8; i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return isHex(s[l-7]) && isHex(s[l-6]) && s[l-4] <= '1' && s[l-4] >= '0' && isHex(s[l-3]) && s[l-1] >= '0' && s[l-1] <= '7'
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }
