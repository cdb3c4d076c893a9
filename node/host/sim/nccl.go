package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

// The all_reduce time model: t(S) = t0 + S/B + tMid·S/(S+sMid). t0 is the
// launch latency that dominates small sizes, tMid the protocol and channel
// ramp of mid sizes; B is solved so that busbw at the largest size is the
// spec's. The curve follows real single-node 8×H100 runs: ~50 GB/s busbw at
// 1 MiB, ~410 at 128 MiB, ~470 at 1 GiB.
const (
	allReduceT0   = 18e-6
	allReduceTMid = 60e-6
	allReduceSMid = 4 << 20
)

// ncclVersionCode is NCCL_VERSION_CODE for "2.21.5": 22105.
func ncclVersionCode(v string) int {
	p := strings.Split(v, ".")
	if len(p) < 3 {
		return 0
	}
	a, _ := strconv.Atoi(p[0])
	b, _ := strconv.Atoi(p[1])
	c, _ := strconv.Atoi(p[2])
	return a*10000 + b*100 + c
}

// arShape is what one all_reduce_perf run sweeps: sizes from minBytes to
// maxBytes by step, and how many ranks (GPUs) take part.
type arShape struct {
	minBytes, maxBytes, step uint64
	ranks                    int
}

// shape is the node's own run: the spec's sizes, overridden by a
// request's nccl.allreduce parameters (validated by the agent).
func (n *Node) shape(p host.RunParams) arShape {
	sh := arShape{minBytes: 8, maxBytes: n.spec.MaxBytes, step: 2, ranks: len(n.spec.GPUs)}
	if v, ok := parseSize(p["min_bytes"]); ok {
		sh.minBytes = v
	}
	if v, ok := parseSize(p["max_bytes"]); ok {
		sh.maxBytes = v
	}
	if v, err := strconv.ParseUint(p["step_factor"], 10, 64); err == nil && v >= 2 {
		sh.step = v
	}
	sh.minBytes = max(sh.minBytes, 1)
	sh.maxBytes = max(sh.maxBytes, sh.minBytes)
	return sh
}

// parseSize reads an all_reduce_perf size: "8", "64K", "8G" (binary units,
// as nccl-tests reads them).
func parseSize(v string) (uint64, bool) {
	if v == "" {
		return 0, false
	}
	mult := uint64(1)
	switch v[len(v)-1] {
	case 'K', 'k':
		mult = 1 << 10
	case 'M', 'm':
		mult = 1 << 20
	case 'G', 'g':
		mult = 1 << 30
	}
	if mult > 1 {
		v = v[:len(v)-1]
	}
	x, err := strconv.ParseUint(v, 10, 64)
	if err != nil || x == 0 || x > (1<<40)/mult {
		return 0, false
	}
	return x * mult, true
}

// renderAllReduce is `all_reduce_perf -b 8 -e MaxBytes -f 2 -g N` on this
// node, run number run (each run draws fresh noise), with a request's
// parameters applied.
func (n *Node) renderAllReduce(f frame, run uint64, p host.RunParams) host.Capture {
	s := &n.spec
	nGPU := len(s.GPUs)
	sh := n.shape(p)
	pid := 100000 + int(hash64(s.Seed, s.Name, "nccl-pid", strconv.FormatUint(run, 10))%3000000)
	code := ncclVersionCode(s.NCCL)

	var b strings.Builder
	b.Grow(8192)
	fmt.Fprintf(&b, "# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", s.NCCLTests, code, code)
	b.WriteString("# Collective test starting: all_reduce_perf\n")
	fmt.Fprintf(&b, "# nThread 1 nGpus %d minBytes %d maxBytes %d step: %d(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n", nGPU, sh.minBytes, sh.maxBytes, sh.step)
	b.WriteString("#\n# Using devices\n")

	if c, failed := n.cannotStart(&b, f, pid); failed {
		return c
	}
	n.appendRanks(&b, 0, pid)
	if s.NCCLDebugInfo {
		n.appendNCCLInfo(&b, f, pid)
	}

	busTarget := s.BusBWGBps * f.v.slow
	for i := range f.v.gpus {
		busTarget *= f.v.gpus[i].linkFactor
	}
	rng := rand.New(rand.NewPCG(hash64(s.Seed, s.Name, "nccl"), run))
	writeAllReduceTable(&b, sh, busTarget, s.NoisePct, f.v.ncclWrong, rng)
	return host.OK([]byte(b.String()))
}

// cannotStart writes why all_reduce_perf cannot run on this node, if it
// cannot: a GPU gone, or an NVSwitch fabric not up.
func (n *Node) cannotStart(b *strings.Builder, f frame, pid int) (host.Capture, bool) {
	s := &n.spec
	nGPU := len(s.GPUs)
	if f.v.gpusPresent < nGPU {
		// CUDA sees fewer devices than -g asks for.
		fmt.Fprintf(b, "Invalid number of GPUs: %d requested but only %d were found.\n", nGPU, f.v.gpusPresent)
		b.WriteString("Please check the number of processes and GPUs per process.\n")
		return host.Capture{Data: []byte(b.String()), State: snapshot.StateFailed, ExitCode: 1,
			Err: "all_reduce_perf exited with status 1"}, true
	}
	if f.v.fabricNotReady && s.GPUs[0].Model.Fabric {
		// Without the NVSwitch fabric CUDA does not initialize (error 802).
		fmt.Fprintf(b, "%s: Test CUDA failure common.cu:892 'system not yet initialized'\n", s.Name)
		fmt.Fprintf(b, " .. %s pid %d: Test failure common.cu:1003\n", s.Name, pid)
		return host.Capture{Data: []byte(b.String()), State: snapshot.StateFailed, ExitCode: 2,
			Err: "all_reduce_perf exited with status 2"}, true
	}
	return host.Capture{}, false
}

// appendRanks lists this node's GPUs as ranks first..first+N-1.
func (n *Node) appendRanks(b *strings.Builder, first, pid int) {
	s := &n.spec
	for i, g := range s.GPUs {
		dom, bus, dev, _ := splitBDF(g.BusID)
		fmt.Fprintf(b, "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s:%s:%s] %s\n", first+i, pid, s.Name, i, dom, bus, dev, g.Model.Name)
	}
}

// sideFactor is what the node's faults leave of its GPU-side bandwidth:
// a slow node and lost NVLinks.
func (n *Node) sideFactor(f frame) float64 {
	x := f.v.slow
	for i := range f.v.gpus {
		x *= f.v.gpus[i].linkFactor
	}
	return x
}

// writeAllReduceTable writes the result table and the footer of a run
// whose bus bandwidth at the largest size is busTarget, over ranks ranks.
func writeAllReduceTable(b *strings.Builder, sh arShape, busTarget, noisePct float64, wrongAt uint64, rng *rand.Rand) {
	factor := 1.0
	if sh.ranks > 1 {
		factor = 2 * float64(sh.ranks-1) / float64(sh.ranks)
	}
	maxB := float64(sh.maxBytes)
	tTarget := maxB / (busTarget / factor * 1e9)
	rest := tTarget - allReduceT0 - allReduceTMid*maxB/(maxB+allReduceSMid)
	bw := maxB / math.Max(rest, tTarget/4) // bytes/s at infinite size

	b.WriteString("#\n")
	fmt.Fprintf(b, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "", "", "")
	fmt.Fprintf(b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n",
		"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "")
	fmt.Fprintf(b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n",
		"(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "")

	var sum float64
	var rows int
	var wrongTotal uint64
	for size := sh.minBytes; size <= sh.maxBytes; size *= sh.step {
		fmt.Fprintf(b, "%12d  %12d  %8s  %6s  %6d", size, size/4, "float", "sum", -1)
		sz := float64(size)
		base := allReduceT0 + sz/bw + allReduceTMid*sz/(sz+allReduceSMid)
		// Small sizes jitter more: launch latency is noisy, bulk copies are not.
		sigma := noisePct / 100 * (1 + 3*allReduceSMid/(sz+allReduceSMid))
		for place := range 2 {
			t := base * (1 + sigma*rng.NormFloat64())
			if place == 1 {
				t *= 1.002 // in-place runs a hair slower
			}
			t = math.Max(t, base/2)
			alg := sz / t / 1e9
			bus := alg * factor
			var wrong uint64
			if size*2 > sh.maxBytes && wrongAt > 0 {
				wrong = wrongAt
			}
			wrongTotal += wrong
			sum += bus
			rows++
			fmt.Fprintf(b, "  %7s  %6s  %6s  %6d", floatStr(t*1e6, 7), floatStr(alg, 6), floatStr(bus, 6), wrong)
		}
		b.WriteByte('\n')
		if size > sh.maxBytes/sh.step {
			break // the next size would overflow or pass the end
		}
	}
	verdict := "OK"
	if wrongTotal > 0 {
		verdict = "FAILED"
	}
	fmt.Fprintf(b, "# %-20s : %d %s\n", "Out of bounds values", wrongTotal, verdict)
	fmt.Fprintf(b, "# %-20s : %s \n", "Avg bus bandwidth", strconv.FormatFloat(sum/float64(max(rows, 1)), 'g', 6, 64))
	b.WriteString("#\n# Collective test concluded: all_reduce_perf\n#\n")
}

// floatStr prints v in width columns with as many decimals (2, 1, 0) as
// fit, as nccl-tests does.
func floatStr(v float64, width int) string {
	for _, prec := range [3]int{2, 1, 0} {
		s := strconv.FormatFloat(v, 'f', prec, 64)
		if len(s) <= width {
			return strings.Repeat(" ", width-len(s)) + s
		}
	}
	return strconv.FormatFloat(v, 'e', 1, 64)
}

// appendNCCLInfo adds the NCCL_DEBUG=INFO lines that name the version and
// the network transport: NET/IB over the active ports, NET/Socket when none.
func (n *Node) appendNCCLInfo(b *strings.Builder, f frame, pid int) {
	s := &n.spec
	var cudaMajor, cudaMinor int
	// A spec with no CUDA version prints 0.0, as a node without the toolkit would.
	_, _ = fmt.Sscanf(s.CUDA, "%d.%d", &cudaMajor, &cudaMinor)
	prefix := fmt.Sprintf("%s:%d:%d [0] NCCL INFO ", s.Name, pid, pid)
	oob := fmt.Sprintf("eth0:10.%d.%d.%d<0>", hash64(s.Seed, s.Name, "ip")%250, hash64(s.Seed, s.Name, "ip2")%250, 1+hash64(s.Seed, s.Name, "ip3")%250)
	b.WriteString(prefix + "Bootstrap : Using " + oob + "\n")
	fmt.Fprintf(b, "%scudaDriverVersion %d\n", prefix, cudaMajor*1000+cudaMinor*10)
	fmt.Fprintf(b, "NCCL version %s+cuda%s\n", s.NCCL, s.CUDA)
	var ib []string
	for i, h := range s.HCAs {
		if f.v.hcas[i].down || h.LinkLayer != "InfiniBand" {
			continue
		}
		ib = append(ib, fmt.Sprintf("[%d]%s:1/IB", len(ib), h.Name))
	}
	initPrefix := fmt.Sprintf("%s:%d:%d [0] NCCL INFO ", s.Name, pid, pid+47)
	if len(ib) > 0 {
		b.WriteString(initPrefix + "NET/IB : Using " + strings.Join(ib, " ") + " ; OOB " + oob + "\n")
		b.WriteString(initPrefix + "Using network IB\n")
	} else {
		b.WriteString(initPrefix + "NET/Socket : Using [0]" + oob + "\n")
		b.WriteString(initPrefix + "Using network Socket\n")
	}
	for i, g := range s.GPUs {
		_, bus, _, _ := splitBDF(g.BusID)
		fmt.Fprintf(b, "%s:%d:%d [%d] NCCL INFO comm 0x%x rank %d nranks %d cudaDev %d nvmlDev %d busId %s000 commId 0x%x - Init COMPLETE\n",
			s.Name, pid, pid+47+i, i, 0x55d0c8a00000+uint64(i)*0x1000, i, len(s.GPUs), i, i, bus, hash64(s.Seed, s.Name, "commid"))
	}
}
