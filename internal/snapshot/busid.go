package snapshot

import (
	"strconv"
	"strings"
)

// NormalizeBusID turns the PCI bus id spellings that nvidia-smi, NVML, sysfs
// and the kernel log use into one form, "0000:19:00.0": lowercase, a domain of
// at least four hex digits, and a function number. It accepts an 8-digit
// domain ("00000000:19:00.0"), a missing function ("0000:9b:00", as Xid lines
// print it), a missing domain ("19:00.0") and a "PCI:" prefix. Input it cannot
// read comes back trimmed and lowercased, so that it still compares equal to
// itself.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "pci:")
	fallback := s

	fn := "0"
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		fn = s[i+1:]
		s = s[:i]
	}
	parts := strings.Split(s, ":")
	var domain, bus, dev string
	switch len(parts) {
	case 2:
		domain, bus, dev = "0", parts[0], parts[1]
	case 3:
		domain, bus, dev = parts[0], parts[1], parts[2]
	default:
		return fallback
	}
	d, err1 := strconv.ParseUint(domain, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	v, err3 := strconv.ParseUint(dev, 16, 8)
	f, err4 := strconv.ParseUint(fn, 16, 8)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || v > 0x1f || f > 7 {
		return fallback
	}
	var buf [20]byte
	out := strconv.AppendUint(buf[:0], d, 16)
	for len(out) < 4 {
		out = append([]byte{'0'}, out...)
	}
	out = append(out, ':')
	out = appendHex2(out, b)
	out = append(out, ':')
	out = appendHex2(out, v)
	out = append(out, '.')
	out = strconv.AppendUint(out, f, 16)
	return string(out)
}

func appendHex2(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	return append(b, digits[v>>4&0xf], digits[v&0xf])
}
