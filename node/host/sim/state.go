package sim

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A fault's text form is words: the kind, then its target, then the
// values the kind takes, e.g. "ib_port_down mlx5_4", "ecc_uncorrectable
// GPU3 2", "slow_node node 0.7". It is what the sim-fault action takes as
// arguments and what an agent config lists as faults present at boot.
//
//	ecc_uncorrectable GPUi [COUNT=1]    row_remap_pending GPUi
//	row_remap_failure GPUi              xid GPUi CODE
//	gpu_missing GPUi                    thermal_slowdown GPUi [TEMP_C]
//	pcie_downtrained GPUi [WIDTH]       ib_port_down HCA
//	ib_rate_drop HCA GBPS               ib_symbol_errors HCA [PER_PASS=10]
//	nvlink_degraded GPUi [LINKS=2]      nvlink_errors GPUi [LINK=0 [PER_PASS=5]]
//	ghost_process GPUi [MIB=2048]       slow_node [node] FACTOR
//	hung_nvidia_smi | peermem_missing | fabric_not_ready [node]
//	nccl_wrong_results [node] [COUNT=1] dcgm_failure GPUi TEST
//
// A GPU is written GPUi or i (its index in PCI bus order).

// FaultKinds lists every fault kind, in declaration order.
func FaultKinds() []FaultKind {
	return []FaultKind{KindECCUncorrectable, KindRowRemapPending, KindRowRemapFailure, KindXid, KindGPUMissing,
		KindThermalSlowdown, KindPCIeDowntrained, KindIBPortDown, KindIBRateDrop, KindIBSymbolErrors,
		KindNVLinkDegraded, KindNVLinkErrors, KindHungNvidiaSMI, KindGhostProcess, KindSlowNode,
		KindPeerMemMissing, KindFabricNotReady, KindNCCLWrongResults, KindDCGMFailure}
}

// ParseFault reads a fault's text form (see above). It checks the words,
// not the node: AddFault says whether the target exists.
func ParseFault(words []string) (Fault, error) {
	if len(words) == 0 {
		return nil, fmt.Errorf("%w: empty fault (want KIND TARGET [VALUE...])", ErrBadFault)
	}
	kind, args := FaultKind(words[0]), words[1:]
	if !slices.Contains(FaultKinds(), kind) {
		return nil, fmt.Errorf("%w: unknown fault kind %q (known: %s)", ErrBadFault, words[0], kindList())
	}
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	var err error
	fail := func(what string, v string) {
		if err == nil {
			err = fmt.Errorf("%w: %s: %s %q", ErrBadFault, kind, what, v)
		}
	}
	gpu := func() int {
		s := strings.TrimPrefix(arg(0), "GPU")
		i, e := strconv.Atoi(s)
		if e != nil || i < 0 || i > 1024 {
			fail("GPU (GPUi or an index)", arg(0))
		}
		return i
	}
	num := func(i int, def uint64, hi uint64) uint64 {
		if arg(i) == "" {
			return def
		}
		v, e := strconv.ParseUint(arg(i), 10, 64)
		if e != nil || v > hi {
			fail(fmt.Sprintf("value (0..%d)", hi), arg(i))
		}
		return v
	}
	hca := func() string {
		if arg(0) == "" {
			fail("HCA", "")
		}
		return arg(0)
	}
	// Node-wide kinds take an optional "node" target first.
	nodeArgs := func() {
		if arg(0) == TargetNode {
			args = args[1:]
		}
	}
	max := 2
	var f Fault
	switch kind {
	case KindECCUncorrectable:
		f = ECCUncorrectable{GPU: gpu(), Count: num(1, 1, 1<<32)}
	case KindRowRemapPending:
		f, max = RowRemapPending{GPU: gpu()}, 1
	case KindRowRemapFailure:
		f, max = RowRemapFailure{GPU: gpu()}, 1
	case KindXid:
		g := gpu()
		code := num(1, 0, 1000)
		if code == 0 {
			fail("xid code (1..1000)", arg(1))
		}
		f = Xid{GPU: g, Code: int(code)}
	case KindGPUMissing:
		f, max = GPUMissing{GPU: gpu()}, 1
	case KindThermalSlowdown:
		f = ThermalSlowdown{GPU: gpu(), TempC: float64(num(1, 92, 150))}
	case KindPCIeDowntrained:
		f = PCIeDowntrained{GPU: gpu(), Width: int(num(1, 8, 32))}
	case KindIBPortDown:
		f, max = IBPortDown{HCA: hca()}, 1
	case KindIBRateDrop:
		h, g := hca(), num(1, 0, 3200)
		if g == 0 {
			fail("rate in Gb/s", arg(1))
		}
		f = IBRateDrop{HCA: h, Gbps: int(g)}
	case KindIBSymbolErrors:
		f = IBSymbolErrors{HCA: hca(), PerPass: num(1, 10, 1<<32)}
	case KindNVLinkDegraded:
		f = NVLinkDegraded{GPU: gpu(), Links: int(num(1, 2, 64))}
	case KindNVLinkErrors:
		f, max = NVLinkErrors{GPU: gpu(), Link: int(num(1, 0, 63)), PerPass: num(2, 5, 1<<32)}, 3
	case KindGhostProcess:
		f = GhostProcess{GPU: gpu(), MiB: num(1, 2048, 1<<24)}
	case KindSlowNode:
		nodeArgs()
		v, e := strconv.ParseFloat(arg(0), 64)
		if e != nil || !(v > 0 && v <= 1) {
			fail("factor (0 < factor <= 1)", arg(0))
		}
		f, max = SlowNode{Factor: v}, 1
	case KindHungNvidiaSMI:
		nodeArgs()
		f, max = HungNvidiaSMI{}, 0
	case KindPeerMemMissing:
		nodeArgs()
		f, max = PeerMemMissing{}, 0
	case KindFabricNotReady:
		nodeArgs()
		f, max = FabricNotReady{}, 0
	case KindNCCLWrongResults:
		nodeArgs()
		f, max = NCCLWrongResults{Count: num(0, 1, 1<<32)}, 1
	case KindDCGMFailure:
		g := gpu()
		test := strings.ReplaceAll(arg(1), "_", " ")
		if test == "" {
			fail("dcgm test name (e.g. GPU_Memory)", "")
		}
		f = DCGMFailure{GPU: g, Test: test}
	}
	if err == nil && len(args) > max {
		err = fmt.Errorf("%w: %s takes at most %d values after the kind, got %q", ErrBadFault, kind, max, strings.Join(args, " "))
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

func kindList() string {
	var b []string
	for _, k := range FaultKinds() {
		b = append(b, string(k))
	}
	return strings.Join(b, ", ")
}

// State is what a simulated node changed since it was built from its
// spec: the installed software, the boot time, the faults in place and the
// actions it ran. An agent in sim mode writes it to its state directory
// after every action, so a restarted agent finds the node as it left it
// (the upgraded driver, the fault a drill injected) and a test can count
// the upgrades a node went through.
type State struct {
	Boot          time.Time      `json:"boot"`
	FirstBoot     time.Time      `json:"first_boot"` // the boot the node was built at (InfoROM stamps follow it)
	Driver        string         `json:"driver"`
	FabricManager string         `json:"fabric_manager,omitempty"`
	Faults        []FaultRecord  `json:"faults"`
	Actions       map[string]int `json:"actions,omitempty"` // built-in action name → runs that succeeded
}

// FaultRecord is one fault in place, in JSON: its kind and fields.
type FaultRecord struct {
	Kind    FaultKind `json:"kind"`
	GPU     int       `json:"gpu,omitempty"`
	HCA     string    `json:"hca,omitempty"`
	Count   uint64    `json:"count,omitempty"`
	Value   float64   `json:"value,omitempty"` // temperature, factor
	Width   int       `json:"width,omitempty"` // pcie width, ib rate, nvlinks, link
	PerPass uint64    `json:"per_pass,omitempty"`
	Test    string    `json:"test,omitempty"`    // dcgm test
	Message string    `json:"message,omitempty"` // xid message, dcgm warning
	Code    int       `json:"code,omitempty"`    // xid code
	PID     int       `json:"pid,omitempty"`     // xid, ghost process
	Process string    `json:"process,omitempty"` // xid, ghost process
	At      time.Time `json:"at,omitzero"`
	Added   time.Time `json:"added"`
	// Rebooted: the node rebooted since the fault was added.
	Rebooted bool `json:"rebooted,omitempty"`
}

func record(e faultEntry) FaultRecord {
	r := FaultRecord{Kind: e.f.Kind(), Added: e.added, Rebooted: e.rebooted}
	switch f := e.f.(type) {
	case ECCUncorrectable:
		r.GPU, r.Count = f.GPU, f.Count
	case RowRemapPending:
		r.GPU = f.GPU
	case RowRemapFailure:
		r.GPU = f.GPU
	case Xid:
		r.GPU, r.Code, r.Message, r.PID, r.Process, r.At = f.GPU, f.Code, f.Message, f.PID, f.Process, f.At
	case GPUMissing:
		r.GPU = f.GPU
	case ThermalSlowdown:
		r.GPU, r.Value = f.GPU, f.TempC
	case PCIeDowntrained:
		r.GPU, r.Width = f.GPU, f.Width
	case IBPortDown:
		r.HCA = f.HCA
	case IBRateDrop:
		r.HCA, r.Width = f.HCA, f.Gbps
	case IBSymbolErrors:
		r.HCA, r.PerPass = f.HCA, f.PerPass
	case NVLinkDegraded:
		r.GPU, r.Width, r.Value = f.GPU, f.Links, f.Factor
	case NVLinkErrors:
		r.GPU, r.Width, r.PerPass = f.GPU, f.Link, f.PerPass
	case GhostProcess:
		r.GPU, r.Count, r.PID, r.Process = f.GPU, f.MiB, f.PID, f.Name
	case SlowNode:
		r.Value = f.Factor
	case NCCLWrongResults:
		r.Count = f.Count
	case DCGMFailure:
		r.GPU, r.Test, r.Message = f.GPU, f.Test, f.Warning
	}
	return r
}

// Fault rebuilds the fault a record holds.
func (r FaultRecord) Fault() (Fault, error) {
	switch r.Kind {
	case KindECCUncorrectable:
		return ECCUncorrectable{GPU: r.GPU, Count: r.Count}, nil
	case KindRowRemapPending:
		return RowRemapPending{GPU: r.GPU}, nil
	case KindRowRemapFailure:
		return RowRemapFailure{GPU: r.GPU}, nil
	case KindXid:
		return Xid{GPU: r.GPU, Code: r.Code, Message: r.Message, PID: r.PID, Process: r.Process, At: r.At}, nil
	case KindGPUMissing:
		return GPUMissing{GPU: r.GPU}, nil
	case KindThermalSlowdown:
		return ThermalSlowdown{GPU: r.GPU, TempC: r.Value}, nil
	case KindPCIeDowntrained:
		return PCIeDowntrained{GPU: r.GPU, Width: r.Width}, nil
	case KindIBPortDown:
		return IBPortDown{HCA: r.HCA}, nil
	case KindIBRateDrop:
		return IBRateDrop{HCA: r.HCA, Gbps: r.Width}, nil
	case KindIBSymbolErrors:
		return IBSymbolErrors{HCA: r.HCA, PerPass: r.PerPass}, nil
	case KindNVLinkDegraded:
		return NVLinkDegraded{GPU: r.GPU, Links: r.Width, Factor: r.Value}, nil
	case KindNVLinkErrors:
		return NVLinkErrors{GPU: r.GPU, Link: r.Width, PerPass: r.PerPass}, nil
	case KindHungNvidiaSMI:
		return HungNvidiaSMI{}, nil
	case KindGhostProcess:
		return GhostProcess{GPU: r.GPU, MiB: r.Count, PID: r.PID, Name: r.Process}, nil
	case KindSlowNode:
		return SlowNode{Factor: r.Value}, nil
	case KindPeerMemMissing:
		return PeerMemMissing{}, nil
	case KindFabricNotReady:
		return FabricNotReady{}, nil
	case KindNCCLWrongResults:
		return NCCLWrongResults{Count: r.Count}, nil
	case KindDCGMFailure:
		return DCGMFailure{GPU: r.GPU, Test: r.Test, Warning: r.Message}, nil
	}
	return nil, fmt.Errorf("%w: unknown fault kind %q", ErrBadFault, r.Kind)
}

// State returns what the node changed since New (see State).
func (n *Node) State() State {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := State{Boot: n.boot, FirstBoot: n.firstBoot, Driver: n.driver, FabricManager: n.fabricManager,
		Faults: make([]FaultRecord, 0, len(n.entries)), Actions: maps.Clone(n.actions)}
	for _, e := range n.entries {
		st.Faults = append(st.Faults, record(e))
	}
	return st
}

// Restore puts the node back in a state State returned (for the same
// spec): boot time, driver, faults and action counts. Counters that rise
// with events (symbol errors, NVLink replays) start over, as after a
// restart of the tool that reads them; traffic counters follow the boot
// time. It refuses a state whose faults do not fit the node. Call it
// before the node is read: what is derived from the boot time is derived
// again.
func (n *Node) Restore(st State) error {
	if st.Driver != "" && !driverVersionRE.MatchString(st.Driver) {
		return fmt.Errorf("sim state: driver %q is not a driver version", st.Driver)
	}
	entries := make([]faultEntry, 0, len(st.Faults))
	for i, r := range st.Faults {
		f, err := r.Fault()
		if err == nil {
			err = n.spec.validate(f)
		}
		if err != nil {
			return fmt.Errorf("sim state: fault %d: %w", i, err)
		}
		entries = append(entries, faultEntry{f: f, added: r.Added, rebooted: r.Rebooted})
	}
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if !st.Boot.IsZero() && !st.Boot.After(now) {
		n.boot = st.Boot
	}
	if !st.FirstBoot.IsZero() && !st.FirstBoot.After(n.boot) {
		n.firstBoot = st.FirstBoot
		n.gpus = deriveGPUs(&n.spec, n.firstBoot)
	}
	if st.Driver != "" && st.Driver != n.driver {
		n.driver = st.Driver
		sp := n.spec
		sp.Driver = st.Driver
		n.base = bootLog(&sp)
	}
	n.fabricManager = st.FabricManager
	for i := range n.ports {
		n.ports[i] = portCounters{}
	}
	n.entries = n.entries[:0]
	for _, e := range entries {
		n.nextID++
		e.id = n.nextID
		n.entries = append(n.entries, e)
		if d, ok := e.f.(IBPortDown); ok {
			p := &n.ports[n.spec.hcaIndex(d.HCA)]
			p.downSince = e.added
			if p.downSince.Before(n.boot) {
				p.downSince = n.boot
			}
		}
	}
	n.actions = maps.Clone(st.Actions)
	n.rebuild()
	return nil
}

// ActionCount returns how many times a built-in action succeeded on this
// node (since New, or as restored).
func (n *Node) ActionCount(name string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.actions[name]
}
