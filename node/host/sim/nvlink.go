package sim

import "strconv"

// nvlinkIndent is how the real capture in shared/fixtures indents link
// lines (nvidia-smi's tab, expanded).
const nvlinkIndent = "         "

// renderNVLink is `nvidia-smi nvlink --status` followed by
// `nvidia-smi nvlink -e`. GPUs are numbered in nvidia-smi order, so a
// missing GPU shifts the ones after it, as on a real node.
func (n *Node) renderNVLink(f frame, replays [][]uint64) []byte {
	b := make([]byte, 0, 4096*len(n.spec.GPUs))
	header := func(b []byte, idx, i int) []byte {
		g := &n.spec.GPUs[i]
		b = append(b, "GPU "...)
		b = strconv.AppendInt(b, int64(idx), 10)
		b = append(b, ": "...)
		b = append(b, g.Model.Name...)
		b = append(b, " (UUID: "...)
		b = append(b, g.UUID...)
		return append(b, ")\n"...)
	}
	idx := 0
	for i, g := range n.spec.GPUs {
		gf := &f.v.gpus[i]
		if gf.missing {
			continue
		}
		b = header(b, idx, i)
		speed := strconv.FormatFloat(g.Model.NVLinkGBps, 'f', -1, 64) + " GB/s\n"
		for l := range g.Model.NVLinks {
			b = append(b, nvlinkIndent+"Link "...)
			b = strconv.AppendInt(b, int64(l), 10)
			if l >= g.Model.NVLinks-gf.linksDown {
				b = append(b, ": <inactive>\n"...)
				continue
			}
			b = append(b, ": "...)
			b = append(b, speed...)
		}
		idx++
	}
	idx = 0
	for i, g := range n.spec.GPUs {
		if f.v.gpus[i].missing {
			continue
		}
		b = header(b, idx, i)
		for l := range g.Model.NVLinks {
			for _, c := range [3]struct {
				name string
				val  uint64
			}{{"Replay Errors", replays[i][l]}, {"Recovery Errors", 0}, {"CRC Errors", 0}} {
				b = append(b, nvlinkIndent+"Link "...)
				b = strconv.AppendInt(b, int64(l), 10)
				b = append(b, ": "...)
				b = append(b, c.name...)
				b = append(b, ": "...)
				b = strconv.AppendUint(b, c.val, 10)
				b = append(b, '\n')
			}
		}
		idx++
	}
	return b
}
