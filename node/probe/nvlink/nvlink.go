// Package nvlink parses the text of `nvidia-smi nvlink --status`, optionally
// followed in the same input by `nvidia-smi nvlink -e` (error counters), as
// a bundle's nvidia-smi-nvlink.txt holds them.
//
//	GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708-...)
//	         Link 0: 25 GB/s
//	         Link 1: <inactive>
//	GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708-...)
//	         Link 0: Replay Errors: 0
//	         Link 0: Recovery Errors: 0
//	         Link 0: CRC Errors: 0
//
// A GPU's sections are merged by its index. A link seen only in the error
// counters (no status line) is reported inactive; nvidia-smi prints a status
// line for every link it counts, so this arises only when the status part
// is missing, and then no link is active and gpu.nvlink skips. Counter names are normalised to
// lowercase snake case without the trailing "errors" word: "Replay Errors"
// → replay, "Recovery Errors" → recovery, "CRC Errors" → crc, "CRC Flit
// Errors"/"Flit CRC Errors" → crc_flit, "CRC Data Errors" → crc_data, and
// newer drivers' names the same way ("Rx remote Errors" → rx_remote,
// "Tx discards" → tx_discards). Values that are not whole numbers (BER
// ratios, N/A) are not counters and are left out.
package nvlink

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Bounds that keep hostile input from growing the result without limit;
// real GPUs have at most 18 links (H100) and nodes at most a few dozen GPUs.
const (
	maxLine  = 4 << 10
	maxIndex = 4096
)

// Parse reads nvidia-smi nvlink output. Empty input is an empty state (a
// node whose GPUs have no NVLink prints nothing). Non-empty input without a
// single "GPU N:" header is an error: it is nvidia-smi complaining (driver
// mismatch, no devices) rather than NVLink data.
func Parse(data []byte) (*snapshot.NVLinkState, error) {
	p := parser{gpus: map[int]*gpu{}}
	firstText := ""
	// One copy of the (small) output; names and UUIDs are cut from it.
	text := string(data)
	for len(text) > 0 {
		var line string
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			line, text = text, ""
		}
		if len(line) > maxLine {
			line = line[:maxLine]
		}
		s := strings.TrimSpace(line)
		if s == "" {
			continue
		}
		if firstText == "" {
			firstText = s
		}
		p.line(s)
	}
	if len(p.gpus) == 0 {
		if firstText != "" {
			if len(firstText) > 120 {
				firstText = firstText[:120]
			}
			return nil, fmt.Errorf("parse nvidia-smi nvlink: no \"GPU N:\" sections (output starts %q)", firstText)
		}
		return &snapshot.NVLinkState{}, nil
	}
	return p.state(), nil
}

type gpu struct {
	g     snapshot.NVLinkGPU
	links map[int]*snapshot.NVLink
}

type parser struct {
	gpus map[int]*gpu
	cur  *gpu
}

func (p *parser) line(s string) {
	if idx, name, uuid, ok := header(s); ok {
		g := p.gpus[idx]
		if g == nil {
			g = &gpu{g: snapshot.NVLinkGPU{Index: idx}, links: map[int]*snapshot.NVLink{}}
			p.gpus[idx] = g
		}
		if g.g.Name == "" {
			g.g.Name = name
		}
		if g.g.UUID == "" {
			g.g.UUID = uuid
		}
		p.cur = g
		return
	}
	if p.cur == nil || !strings.HasPrefix(s, "Link ") {
		return
	}
	n, rest, ok := leadingInt(s[len("Link "):])
	if !ok || n > maxIndex || !strings.HasPrefix(rest, ":") {
		return
	}
	rest = strings.TrimSpace(rest[1:])
	if strings.Contains(rest, ":") {
		p.counters(n, rest)
		return
	}
	active, speed, ok := linkStatus(rest)
	if !ok {
		return
	}
	l := p.link(n)
	l.Active, l.SpeedGBps = active, speed
}

func (p *parser) link(n int) *snapshot.NVLink {
	l := p.cur.links[n]
	if l == nil {
		l = &snapshot.NVLink{Link: n}
		p.cur.links[n] = l
	}
	return l
}

// counters reads "Replay Errors: 0" or several such items joined by ", ".
func (p *parser) counters(n int, rest string) {
	for rest != "" {
		var item string
		item, rest, _ = strings.Cut(rest, ", ")
		name, val, ok := strings.Cut(item, ":")
		if !ok {
			continue
		}
		key := counterName(name)
		v, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
		if key == "" || err != nil {
			continue
		}
		l := p.link(n)
		if l.Errors == nil {
			l.Errors = map[string]uint64{}
		}
		l.Errors[key] = v
	}
}

func (p *parser) state() *snapshot.NVLinkState {
	st := &snapshot.NVLinkState{GPUs: make([]snapshot.NVLinkGPU, 0, len(p.gpus))}
	for _, g := range p.gpus {
		out := g.g
		out.Links = make([]snapshot.NVLink, 0, len(g.links))
		for _, l := range g.links {
			out.Links = append(out.Links, *l)
		}
		sort.Slice(out.Links, func(i, j int) bool { return out.Links[i].Link < out.Links[j].Link })
		st.GPUs = append(st.GPUs, out)
	}
	sort.Slice(st.GPUs, func(i, j int) bool { return st.GPUs[i].Index < st.GPUs[j].Index })
	return st
}

// header reads "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)".
func header(s string) (idx int, name, uuid string, ok bool) {
	if !strings.HasPrefix(s, "GPU ") {
		return 0, "", "", false
	}
	idx, rest, ok := leadingInt(s[len("GPU "):])
	if !ok || idx > maxIndex || !strings.HasPrefix(rest, ":") {
		return 0, "", "", false
	}
	name = strings.TrimSpace(rest[1:])
	if i := strings.LastIndex(name, "(UUID:"); i >= 0 {
		uuid = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(name[i+len("(UUID:"):]), ")"))
		name = strings.TrimSpace(name[:i])
	}
	return idx, name, uuid, true
}

// linkStatus reads "25 GB/s", "26.562 GB/s" or "<inactive>". ok is false
// for anything else, which is then left out rather than guessed.
func linkStatus(s string) (active bool, speedGBps float64, ok bool) {
	switch strings.ToLower(strings.Trim(s, "<> ")) {
	case "inactive", "down", "disabled", "off", "not active":
		return false, 0, true
	}
	num, unit, found := strings.Cut(s, " ")
	if !found {
		return false, 0, false
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || v > 1e6 || v != v {
		return false, 0, false
	}
	switch strings.TrimSpace(unit) {
	case "GB/s":
	case "Gb/s":
		v /= 8
	case "MB/s":
		v /= 1000
	default:
		return false, 0, false
	}
	return v > 0, v, true
}

// counterName normalises a counter label; see the package comment.
func counterName(s string) string {
	l := strings.ToLower(strings.TrimSpace(s))
	switch l {
	case "crc flit errors", "flit crc errors":
		return "crc_flit"
	case "crc data errors", "data crc errors":
		return "crc_data"
	}
	l = strings.TrimSuffix(l, " errors")
	l = strings.TrimSuffix(l, " error")
	var b strings.Builder
	under := false
	for _, r := range l {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if under && b.Len() > 0 {
				b.WriteByte('_')
			}
			under = false
			b.WriteRune(r)
			continue
		}
		under = true
	}
	return b.String()
}

// leadingInt reads up to 9 decimal digits at the start of s.
func leadingInt(s string) (int, string, bool) {
	i, n := 0, 0
	for i < len(s) && i < 9 && s[i] >= '0' && s[i] <= '9' {
		n = n*10 + int(s[i]-'0')
		i++
	}
	if i == 0 || (i < len(s) && s[i] >= '0' && s[i] <= '9') {
		return 0, s, false
	}
	return n, s[i:], true
}
