// Package sim models a GPU node and renders it in the raw formats real tools
// produce: `nvidia-smi -q -x` XML, `nvidia-smi nvlink` text, dmesg lines,
// /sys and /proc files, nccl-tests all_reduce_perf output, dcgmi diag JSON.
// A Node implements host.Host, so the real parsers read it in every test and
// demo exactly as they read a live machine or a bundle.
//
// Faults are injected and cleared at runtime and change the raw output the
// way the real failure does. Everything a node renders is derived from its
// name and seed (plus the injected clock for time-dependent values), so the
// same spec renders the same bytes.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

// Node is a simulated GPU node. It is safe for concurrent use.
type Node struct {
	spec  Spec
	clock Clock
	gpus  []gpuInfo // static per-GPU values derived at New
	hcas  []hcaInfo
	pci   []pciFunc
	tree  *fsTree

	// firstBoot is the boot at New: the GPUs' static values follow it.
	firstBoot time.Time

	mu   sync.Mutex
	boot time.Time
	// driver and fabricManager are the installed versions: an upgrade
	// action changes them; base is the boot log that loads them.
	driver, fabricManager string
	base                  []logLine // boot messages, stamped since boot
	// upgrading is set while a driver action runs: a second one is refused.
	upgrading bool
	// burns counts gpu-burn actions running: the GPUs run hot meanwhile.
	burns    int
	actions  map[string]int // built-in action runs that succeeded
	entries  []faultEntry
	nextID   uint64
	v        *view
	ports    []portCounters
	nvlErr   [][]uint64 // replay errors per GPU per link
	ncclRuns uint64
}

var _ host.Host = (*Node)(nil)

type faultEntry struct {
	id    uint64
	f     Fault
	added time.Time
	// rebooted: the node rebooted since the fault was added, so volatile
	// state it caused is gone.
	rebooted bool
}

// portCounters are an IB port's counters that accumulate from events rather
// than from traffic over time.
type portCounters struct {
	symbol     uint64
	linkDowned uint64
	downSince  time.Time     // zero while the port is up
	paused     time.Duration // time the port carried no traffic since boot
}

// New builds a node from spec, filling identities the spec leaves empty.
func New(spec Spec) (*Node, error) {
	if spec.Name == "" {
		return nil, errors.New("sim: spec has no name")
	}
	spec.GPUs = slices.Clone(spec.GPUs)
	spec.HCAs = slices.Clone(spec.HCAs)
	spec.NVSwitches = slices.Clone(spec.NVSwitches)
	spec.Labels = maps.Clone(spec.Labels)
	spec.fillDerived()
	seen := map[string]bool{}
	for _, h := range spec.HCAs {
		if h.Name == "" || seen[h.Name] {
			return nil, fmt.Errorf("sim: HCA name %q empty or repeated", h.Name)
		}
		seen[h.Name] = true
	}
	for _, g := range spec.GPUs {
		if g.BusID == "" || seen[g.BusID] {
			return nil, fmt.Errorf("sim: GPU bus id %q empty or repeated", g.BusID)
		}
		seen[g.BusID] = true
	}
	n := &Node{spec: spec, clock: spec.Clock}
	if n.clock == nil {
		n.clock = wallClock{}
	}
	n.boot = spec.Boot
	if n.boot.IsZero() {
		n.boot = n.clock.Now().Add(-spec.Uptime)
	}
	n.firstBoot = n.boot
	n.gpus = deriveGPUs(&n.spec, n.boot)
	n.hcas = deriveHCAs(&n.spec)
	n.driver, n.fabricManager = spec.Driver, spec.FabricManager
	n.base = bootLog(&n.spec)
	n.ports = make([]portCounters, len(spec.HCAs))
	n.nvlErr = make([][]uint64, len(spec.GPUs))
	for i, g := range spec.GPUs {
		n.nvlErr[i] = make([]uint64, g.Model.NVLinks)
	}
	n.pci = pciFuncs(&n.spec)
	n.tree = spec.Shared.tree(treeShape(&n.spec, n.pci), func() *fsTree { return buildTree(&n.spec, n.pci) })
	n.rebuild()
	if spec.Fabric != nil {
		spec.Fabric.join(n)
	}
	return n, nil
}

// Name is the node's name.
func (n *Node) Name() string { return n.spec.Name }

// Now is the node's clock.
func (n *Node) Now() time.Time { return n.clock.Now() }

// Spec returns the node's spec with derived identities filled in.
func (n *Node) Spec() Spec {
	s := n.spec
	n.mu.Lock()
	s.Driver, s.FabricManager = n.driver, n.fabricManager
	n.mu.Unlock()
	s.GPUs = slices.Clone(s.GPUs)
	s.HCAs = slices.Clone(s.HCAs)
	s.NVSwitches = slices.Clone(s.NVSwitches)
	s.Labels = maps.Clone(s.Labels)
	return s
}

// Labels returns the labels the node's agent declares.
func (n *Node) Labels() map[string]string { return maps.Clone(n.spec.Labels) }

// Boot returns when the node last booted.
func (n *Node) Boot() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.boot
}

// AddFault injects f. A fault of the same kind and target replaces the
// earlier one; Xid events accumulate.
func (n *Node) AddFault(f Fault) error {
	if err := n.spec.validate(f); err != nil {
		return err
	}
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if f.Kind() != KindXid {
		n.removeLocked(f.Kind(), f.Target(), now)
	}
	if d, ok := f.(IBPortDown); ok {
		p := &n.ports[n.spec.hcaIndex(d.HCA)]
		p.downSince = now
		p.linkDowned++
	}
	n.nextID++
	n.entries = append(n.entries, faultEntry{id: n.nextID, f: f, added: now})
	n.rebuild()
	return nil
}

// ClearFault removes the faults of kind on target ("" matches every target)
// and reports whether any was removed. Counters that only rise (symbol
// errors, link downed, NVLink replays) keep what they counted, as hardware does.
func (n *Node) ClearFault(kind FaultKind, target string) bool {
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	ok := n.removeLocked(kind, target, now)
	if ok {
		n.rebuild()
	}
	return ok
}

// ClearAll removes every fault.
func (n *Node) ClearAll() {
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.removeLocked("", "", now)
	n.rebuild()
}

// Faults lists the active faults in the order they were added.
func (n *Node) Faults() []Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Fault, len(n.entries))
	for i, e := range n.entries {
		out[i] = e.f
	}
	return out
}

// Reboot restarts the node now: uptime, the kernel log, volatile ECC
// counters and port counters start over, pending row remaps are applied,
// Xid events are gone. Hardware faults stay.
func (n *Node) Reboot() {
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.boot = now
	kept := n.entries[:0]
	for _, e := range n.entries {
		if e.f.Kind() == KindXid {
			continue
		}
		e.rebooted = true
		kept = append(kept, e)
	}
	n.entries = kept
	for i := range n.ports {
		n.ports[i] = portCounters{}
	}
	n.rebuild()
	for _, e := range n.entries {
		if d, ok := e.f.(IBPortDown); ok {
			p := &n.ports[n.spec.hcaIndex(d.HCA)]
			p.downSince = now
		}
	}
	for i := range n.nvlErr {
		clear(n.nvlErr[i])
	}
}

// removeLocked drops matching entries; "" matches any kind or target.
func (n *Node) removeLocked(kind FaultKind, target string, now time.Time) bool {
	kept := n.entries[:0]
	removed := false
	for _, e := range n.entries {
		if (kind == "" || e.f.Kind() == kind) && (target == "" || e.f.Target() == target) {
			removed = true
			if d, ok := e.f.(IBPortDown); ok {
				p := &n.ports[n.spec.hcaIndex(d.HCA)]
				if !p.downSince.IsZero() {
					p.paused += now.Sub(p.downSince)
					p.downSince = time.Time{}
				}
			}
			continue
		}
		kept = append(kept, e)
	}
	clear(n.entries[len(kept):])
	n.entries = kept
	return removed
}

// rebuild folds the fault entries into a fresh view. Called with mu held.
func (n *Node) rebuild() {
	v := &view{
		gpus:    make([]gpuFaults, len(n.spec.GPUs)),
		hcas:    make([]hcaFaults, len(n.spec.HCAs)),
		slow:    1,
		burning: n.burns > 0,
	}
	for i := range v.gpus {
		v.gpus[i].linkFactor = 1
	}
	for _, e := range n.entries {
		if e.rebooted {
			switch f := e.f.(type) {
			case ECCUncorrectable:
				v.gpus[f.GPU].eccAggregate += f.Count
				continue
			case RowRemapPending:
				v.gpus[f.GPU].remapApplied++
				continue
			}
		}
		e.f.apply(v, &n.spec)
	}
	for i := range v.gpus {
		g := &v.gpus[i]
		if g.linksDown > 0 && g.linkFactor == 0 {
			total := n.spec.GPUs[i].Model.NVLinks
			g.linkFactor = float64(total-g.linksDown) / float64(total)
		}
		if !g.missing {
			v.gpusPresent++
		}
	}
	n.v = v
}

// frame is what one rendering reads: the immutable view, the time and
// the installed software.
type frame struct {
	v    *view
	now  time.Time
	boot time.Time
	// driver and fabricManager are the installed versions; base is the
	// boot log (never modified, replaced on a driver change).
	driver, fabricManager string
	base                  []logLine
}

func (n *Node) frame() frame {
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	return frame{v: n.v, now: now, boot: n.boot, driver: n.driver, fabricManager: n.fabricManager, base: n.base}
}

// uptime is the time since boot, never negative.
func (f frame) uptime() time.Duration {
	if d := f.now.Sub(f.boot); d > 0 {
		return d
	}
	return 0
}

// Capture renders the raw output of a command source.
func (n *Node) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	if err := ctx.Err(); err != nil {
		return ctxCapture(err)
	}
	noGPU := len(n.spec.GPUs) == 0
	switch src {
	case snapshot.SrcNvidiaSMI, snapshot.SrcNVLink:
		if noGPU {
			return host.Absent("nvidia-smi not found")
		}
		f := n.frame()
		if f.v.hung {
			<-ctx.Done()
			return host.Capture{State: snapshot.StateTimeout, Err: "timed out"}
		}
		if f.v.gpusPresent == 0 {
			return host.Capture{Data: []byte("No devices were found\n"), State: snapshot.StateFailed,
				ExitCode: 6, Err: "nvidia-smi: no devices were found"}
		}
		if src == snapshot.SrcNvidiaSMI {
			if lost := n.handleErrors(f); lost != nil {
				return host.Capture{Data: append(lost, n.renderXML(f)...), State: snapshot.StateFailed,
					ExitCode: 15, Err: "nvidia-smi exited 15"}
			}
			return host.OK(n.renderXML(f))
		}
		return host.OK(n.renderNVLink(f, n.bumpNVLinkErrors(f)))
	case snapshot.SrcKernelLog:
		return host.OK(n.renderDmesg(n.frame()))
	case snapshot.SrcAllReduce:
		if noGPU {
			return host.Absent("all_reduce_perf not found")
		}
		return n.renderAllReduce(n.frame(), n.nextRun(), host.ParamsFrom(ctx))
	case snapshot.SrcDCGMDiag:
		if noGPU || !n.spec.DCGMDiag {
			return host.Absent("dcgmi not found")
		}
		level := n.spec.DCGMLevel
		if l, err := strconv.Atoi(host.ParamsFrom(ctx)["level"]); err == nil && l >= 1 && l <= 4 {
			level = l
		}
		return n.renderDCGM(n.frame(), level)
	case snapshot.SrcVersions:
		return host.OK(n.renderVersions(n.frame()))
	default:
		return host.Absent(string(src) + " is not a command source")
	}
}

func ctxCapture(err error) host.Capture {
	if errors.Is(err, context.DeadlineExceeded) {
		return host.Capture{State: snapshot.StateTimeout, Err: "timed out"}
	}
	return host.Capture{State: snapshot.StateFailed, Err: err.Error()}
}

func (n *Node) nextRun() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ncclRuns++
	return n.ncclRuns
}

// bumpNVLinkErrors advances the rising replay counters for one capture and
// returns a copy of all counters.
func (n *Node) bumpNVLinkErrors(f frame) [][]uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.entries {
		if le, ok := e.f.(NVLinkErrors); ok {
			n.nvlErr[le.GPU][le.Link] += le.PerPass
		}
	}
	out := make([][]uint64, len(n.nvlErr))
	for i := range n.nvlErr {
		out[i] = slices.Clone(n.nvlErr[i])
	}
	return out
}

// readSymbol advances the port's symbol_error for one snapshot read.
func (n *Node) readSymbol(h int, v *view) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ports[h].symbol += v.hcas[h].symbolPerPass
	return n.ports[h].symbol
}

// portTraffic returns how long the port has carried traffic since boot and
// how often it went down.
func (n *Node) portTraffic(h int, f frame) (time.Duration, uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.ports[h]
	busy := f.uptime() - p.paused
	if !p.downSince.IsZero() && f.now.After(p.downSince) {
		busy -= f.now.Sub(p.downSince)
	}
	return max(busy, 0), p.linkDowned
}

// xidEntries returns the Xid faults with their stamps. Called without mu.
func (n *Node) xidEntries() []faultEntry {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []faultEntry
	for _, e := range n.entries {
		if e.f.Kind() == KindXid {
			out = append(out, e)
		}
	}
	return out
}

// FS returns a snapshot of the node's file tree rooted at "/". Files render
// when read, at the time of this call.
func (n *Node) FS() fs.FS {
	return &fsView{n: n, f: n.frame()}
}

func itoa(i int) string { return strconv.Itoa(i) }
