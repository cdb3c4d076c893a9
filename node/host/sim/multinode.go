package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

var _ host.MultiNodeRunner = (*Node)(nil)

// Fabric joins simulated nodes into one cluster: a multi-node run launched
// on a member reaches the other members by name. Give every node of a
// simulated fleet the same Fabric (Spec.Fabric). Safe for concurrent use.
type Fabric struct {
	mu    sync.Mutex
	nodes map[string]*Node
}

// NewFabric returns an empty cluster.
func NewFabric() *Fabric { return &Fabric{nodes: map[string]*Node{}} }

func (fb *Fabric) join(n *Node) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.nodes[n.spec.Name] = n
}

// Node returns the member called name, nil when there is none.
func (fb *Fabric) Node(name string) *Node {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return fb.nodes[name]
}

// socketFactor is what is left of the bus bandwidth when NCCL falls back
// to TCP sockets: a few GB/s out of hundreds.
const socketFactor = 0.02

// netFactor is the share of the node's healthy network bandwidth its IB
// ports still carry (ports down carry nothing, a lower rate carries less).
func (n *Node) netFactor(f frame) float64 {
	var have, want float64
	for i, h := range n.spec.HCAs {
		if h.LinkLayer != "InfiniBand" {
			continue
		}
		want += float64(h.RateGbps)
		switch hf := f.v.hcas[i]; {
		case hf.down:
		case hf.rate > 0:
			have += float64(min(hf.rate, h.RateGbps))
		default:
			have += float64(h.RateGbps)
		}
	}
	if want == 0 {
		return socketFactor
	}
	return have / want
}

// RunMultiNode renders all_reduce_perf launched across run.Hosts, this
// node first, as mpirun prints it: every host's GPUs as ranks, NCCL's
// network line, the table. A pair's bus bandwidth is MultiBusBWGBps times
// the smallest GPU-side and network-side factor among the hosts; a host
// the Fabric does not know cannot be reached and the run fails. Without a
// Fabric, peers are taken as healthy nodes shaped like this one.
func (n *Node) RunMultiNode(ctx context.Context, run host.MultiNodeRun) host.Capture {
	if err := ctx.Err(); err != nil {
		return ctxCapture(err)
	}
	s := &n.spec
	if len(s.GPUs) == 0 {
		return host.Absent("all_reduce_perf not found")
	}
	if len(run.Hosts) == 0 || run.Hosts[0] != s.Name {
		return host.Capture{State: snapshot.StateFailed, Err: fmt.Sprintf("multi-node run on %s must list it first, got %v", s.Name, run.Hosts)}
	}
	runNo := n.nextRun()
	pid := 100000 + int(hash64(s.Seed, s.Name, "nccl-pid", strconv.FormatUint(runNo, 10))%3000000)
	sh := n.shape(nil)
	code := ncclVersionCode(s.NCCL)

	var b strings.Builder
	b.Grow(8192)
	fmt.Fprintf(&b, "# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", s.NCCLTests, code, code)
	b.WriteString("# Collective test starting: all_reduce_perf\n")
	fmt.Fprintf(&b, "# nThread 1 nGpus %d minBytes %d maxBytes %d step: %d(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n",
		len(s.GPUs), sh.minBytes, sh.maxBytes, sh.step)
	b.WriteString("#\n# Using devices\n")

	factor := math.Inf(1)
	netMin := math.Inf(1)
	ranks := 0
	var wrong uint64
	for i, name := range run.Hosts {
		peer := n
		if i > 0 {
			peer = n.peer(name)
		}
		if peer == nil {
			// mpirun cannot start the remote ranks: the launcher's NCCL
			// bootstrap times out waiting for them.
			fmt.Fprintf(&b, "ssh: Could not resolve hostname %s: Name or service not known\n", name)
			fmt.Fprintf(&b, "%s: Test NCCL failure common.cu:958 'unhandled system error (run with NCCL_DEBUG=INFO for details)'\n", s.Name)
			fmt.Fprintf(&b, " .. %s pid %d: Test failure common.cu:1003\n", s.Name, pid)
			return host.Capture{Data: []byte(b.String()), State: snapshot.StateFailed, ExitCode: 1,
				Err: "mpirun exited with status 1"}
		}
		pf := peer.frame()
		if c, failed := peer.cannotStart(&b, pf, pid); failed {
			c.Data = []byte(b.String())
			return c
		}
		ppid := pid
		if i > 0 {
			ppid = 100000 + int(hash64(peer.spec.Seed, name, "nccl-pid", strconv.FormatUint(runNo, 10))%3000000)
		}
		peer.appendRanks(&b, ranks, ppid)
		ranks += len(peer.spec.GPUs)
		net := peer.netFactor(pf)
		netMin = math.Min(netMin, net)
		factor = math.Min(factor, math.Min(peer.sideFactor(pf), net))
		wrong = max(wrong, pf.v.ncclWrong)
	}
	f := n.frame()
	prefix := fmt.Sprintf("%s:%d:%d [0] NCCL INFO ", s.Name, pid, pid+47)
	if netMin <= socketFactor || !n.hasIB(f) {
		b.WriteString(prefix + "NET/Socket : Using [0]eth0:10.0.0.1<0>\n")
		b.WriteString(prefix + "Using network Socket\n")
		factor = math.Min(factor, socketFactor)
	} else {
		var ib []string
		for i, h := range s.HCAs {
			if !f.v.hcas[i].down && h.LinkLayer == "InfiniBand" {
				ib = append(ib, fmt.Sprintf("[%d]%s:1/IB/GDRDMA", len(ib), h.Name))
			}
		}
		b.WriteString(prefix + "NET/IB : Using " + strings.Join(ib, " ") + " ; OOB eth0:10.0.0.1<0>\n")
		b.WriteString(prefix + "Using network IB\n")
	}
	sh.ranks = ranks
	busTarget := s.MultiBusBWGBps * math.Max(factor, 1e-3)
	rng := rand.New(rand.NewPCG(hash64(s.Seed, strings.Join(run.Hosts, ","), "nccl-multi"), runNo))
	writeAllReduceTable(&b, sh, busTarget, s.NoisePct, wrong, rng)
	return host.OK([]byte(b.String()))
}

// peer finds a participant: in the Fabric when there is one, otherwise a
// healthy node shaped like this one.
func (n *Node) peer(name string) *Node {
	if n.spec.Fabric != nil {
		return n.spec.Fabric.Node(name)
	}
	sp := n.spec
	sp.Name, sp.Fabric = name, nil
	p, err := New(sp)
	if err != nil {
		return nil
	}
	return p
}

func (n *Node) hasIB(f frame) bool {
	for i, h := range n.spec.HCAs {
		if h.LinkLayer == "InfiniBand" && !f.v.hcas[i].down {
			return true
		}
	}
	return false
}
