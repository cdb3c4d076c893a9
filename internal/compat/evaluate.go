package compat

import (
	"fmt"
	"strings"
)

// Evaluate judges a node against every rule. Rules whose value is unknown
// on the node go to Verdict.Unknown, not to Violations.
//
// Which rules apply:
//   - gpus: each GPU takes the first rule whose model matches its name; a
//     GPU no rule matches is unknown (nothing says which driver it allows).
//   - fabric_manager: the first rule whose driver (and gpu_model, if set)
//     matches; none when the node has no NVSwitch fabric.
//   - hcas: each HCA takes the first rule whose model matches its hca_type;
//     HCAs no rule names are not judged (management NICs, DPUs).
//   - rdma_stacks: when the node has HCAs or reports a stack.
//   - kernels: always.
//   - known_bad: every rule; all its conditions must match.
func (m *Matrix) Evaluate(n Node) Verdict {
	e := &eval{seen: map[string]bool{}}
	if m == nil {
		return e.v
	}
	m.evalGPUs(e, n)
	m.evalFabric(e, n)
	m.evalHCAs(e, n)
	m.evalRDMA(e, n)
	m.evalKernel(e, n)
	for _, r := range m.knownBad {
		r.eval(e, n)
	}
	return e.v
}

type eval struct {
	v    Verdict
	seen map[string]bool
}

func (e *eval) unknown(s string) {
	if !e.seen[s] {
		e.seen[s] = true
		e.v.Unknown = append(e.v.Unknown, s)
	}
}

func (e *eval) ok() { e.v.Checked++ }

func (e *eval) violate(v Violation) {
	e.v.Checked++
	e.v.Violations = append(e.v.Violations, v)
}

func gpuComponent(i int) string { return fmt.Sprintf("GPU%d", i) }

// because returns the rule's own reason, else the generated one.
func because(ruleReason, generated string) string {
	if ruleReason != "" {
		return generated + ": " + ruleReason
	}
	return generated
}

func (m *Matrix) evalGPUs(e *eval, n Node) {
	if len(m.gpus) == 0 {
		return
	}
	if len(n.GPUs) == 0 {
		e.unknown("gpus: no GPUs reported")
		return
	}
	// Driver and CUDA are node-wide: judge them once per rule that applies,
	// VBIOS once per GPU.
	judged := map[int]bool{}
	for _, g := range n.GPUs {
		if strings.TrimSpace(g.Name) == "" {
			e.unknown(fmt.Sprintf("%s: model unknown", gpuComponent(g.Index)))
			continue
		}
		ri := -1
		for i, r := range m.gpus {
			if r.model.match(g.Name) {
				ri = i
				break
			}
		}
		if ri < 0 {
			e.unknown(fmt.Sprintf("gpus: no rule matches model %q", g.Name))
			continue
		}
		r := m.gpus[ri]
		if !judged[ri] {
			judged[ri] = true
			r.judgeNodeWide(e, n, g.Name)
		}
		if len(r.vbios) > 0 {
			switch {
			case g.VBIOS == "":
				e.unknown(fmt.Sprintf("%s: VBIOS unknown", gpuComponent(g.Index)))
			case r.vbios.match(g.VBIOS):
				e.ok()
			default:
				e.violate(Violation{
					Kind: KindVBIOS, Rule: r.ref.String(), Component: gpuComponent(g.Index), Field: "vbios",
					Have: g.VBIOS, Want: r.vbios.String(),
					Reason: because(r.reason, fmt.Sprintf("VBIOS %s is not allowed for %s (allowed: %s)", g.VBIOS, g.Name, r.vbios)),
				})
			}
		}
	}
}

func (r gpuRule) judgeNodeWide(e *eval, n Node, model string) {
	if len(r.drivers) > 0 {
		switch {
		case n.Driver == "":
			e.unknown("driver: version unknown")
		case r.drivers.match(n.Driver):
			e.ok()
		default:
			e.violate(Violation{
				Kind: KindDriver, Rule: r.ref.String(), Component: "node", Field: "driver",
				Have: n.Driver, Want: r.drivers.String(),
				Reason: because(r.reason, fmt.Sprintf("driver %s is not allowed for %s (allowed: %s)", n.Driver, model, r.drivers)),
			})
		}
	}
	if len(r.cuda) > 0 {
		switch {
		case n.CUDA == "":
			e.unknown("cuda: version unknown")
		case r.cuda.match(n.CUDA):
			e.ok()
		default:
			e.violate(Violation{
				Kind: KindCUDA, Rule: r.ref.String(), Component: "node", Field: "cuda",
				Have: n.CUDA, Want: r.cuda.String(),
				Reason: because(r.reason, fmt.Sprintf("CUDA %s is not allowed for %s (allowed: %s)", n.CUDA, model, r.cuda)),
			})
		}
	}
}

func (m *Matrix) evalFabric(e *eval, n Node) {
	if len(m.fabric) == 0 || (n.NVSwitch != nil && !*n.NVSwitch) {
		return
	}
	if n.Driver == "" {
		e.unknown("fabric_manager: driver version unknown")
		return
	}
	for _, r := range m.fabric {
		if !r.driver.match(n.Driver) {
			continue
		}
		if r.gpuModel != nil {
			applies, known := anyGPU(n, func(g GPU) (bool, bool) {
				return r.gpuModel.match(g.Name), g.Name != ""
			})
			if !applies {
				if !known {
					e.unknown(fmt.Sprintf("%s: GPU model unknown (the rule covers gpu_model %s)", r.ref.path, r.gpuModel.text))
				}
				continue
			}
		}
		r.judge(e, n)
		return
	}
}

func (r fmRule) judge(e *eval, n Node) {
	if n.FabricManager == "" {
		e.unknown("fabric_manager: version unknown")
		return
	}
	if r.same {
		// The real rule is string equality: Fabric Manager refuses a driver
		// of any other version, the fabric stays "In Progress" and CUDA
		// fails with error 802.
		if strings.TrimSpace(n.FabricManager) == strings.TrimSpace(n.Driver) {
			e.ok()
			return
		}
		e.violate(Violation{
			Kind: KindFabricManager, Rule: r.ref.String(), Component: "node", Field: "fabric_manager",
			Have: n.FabricManager, Want: n.Driver,
			Reason: because(r.reason, fmt.Sprintf("Fabric Manager %s does not match driver %s (must be the same version)", n.FabricManager, n.Driver)),
		})
		return
	}
	if r.version.match(n.FabricManager) {
		e.ok()
		return
	}
	e.violate(Violation{
		Kind: KindFabricManager, Rule: r.ref.String(), Component: "node", Field: "fabric_manager",
		Have: n.FabricManager, Want: r.version.text,
		Reason: because(r.reason, fmt.Sprintf("Fabric Manager %s is not allowed with driver %s (allowed: %s)", n.FabricManager, n.Driver, r.version.text)),
	})
}

// anyGPU reports whether pred holds for some GPU; known is false when no GPU
// matched and at least one could not be told.
func anyGPU(n Node, pred func(GPU) (match, known bool)) (applies, known bool) {
	known = true
	for _, g := range n.GPUs {
		m, k := pred(g)
		if m {
			return true, true
		}
		if !k {
			known = false
		}
	}
	return false, known && len(n.GPUs) > 0
}

func hcaComponent(h HCA) string {
	if h.Name != "" {
		return h.Name
	}
	return h.Model
}

func (m *Matrix) evalHCAs(e *eval, n Node) {
	for _, h := range n.HCAs {
		var r *hcaRule
		for i := range m.hcas {
			if m.hcas[i].model.match(h.Model) {
				r = &m.hcas[i]
				break
			}
		}
		if r == nil {
			continue
		}
		comp := hcaComponent(h)
		label := h.Model
		if r.name != "" {
			label = fmt.Sprintf("%s (%s)", r.name, h.Model)
		}
		if h.FW == "" {
			e.unknown(fmt.Sprintf("%s: firmware unknown", comp))
			continue
		}
		if r.minFW != "" {
			if CompareVersions(haveVersion(h.FW), r.minFW) < 0 {
				e.violate(Violation{
					Kind: KindHCAFirmware, Rule: r.ref.String(), Component: comp, Field: "hca_firmware",
					Have: h.FW, Want: ">=" + r.minFW,
					Reason: because(r.reason, fmt.Sprintf("%s firmware %s is older than the minimum %s", label, h.FW, r.minFW)),
				})
				continue
			}
			e.ok()
		}
		if len(r.firmware) > 0 {
			if r.firmware.match(h.FW) {
				e.ok()
				continue
			}
			e.violate(Violation{
				Kind: KindHCAFirmware, Rule: r.ref.String(), Component: comp, Field: "hca_firmware",
				Have: h.FW, Want: r.firmware.String(),
				Reason: because(r.reason, fmt.Sprintf("%s firmware %s is not allowed (allowed: %s)", label, h.FW, r.firmware)),
			})
		}
	}
}

func (m *Matrix) evalRDMA(e *eval, n Node) {
	if len(m.rdma) == 0 || (len(n.HCAs) == 0 && n.RDMAStack == "") {
		return
	}
	switch {
	case n.RDMAStack == "":
		e.unknown("rdma_stack: unknown")
	case m.rdma.match(n.RDMAStack):
		e.ok()
	default:
		e.violate(Violation{
			Kind: KindRDMAStack, Rule: m.rdmaRef.String(), Component: "node", Field: "rdma_stack",
			Have: n.RDMAStack, Want: m.rdma.String(),
			Reason: fmt.Sprintf("RDMA stack %q is not allowed (allowed: %s)", n.RDMAStack, m.rdma),
		})
	}
}

func (m *Matrix) evalKernel(e *eval, n Node) {
	if len(m.kernels) == 0 {
		return
	}
	switch {
	case n.Kernel == "":
		e.unknown("kernel: version unknown")
	case m.kernels.match(n.Kernel):
		e.ok()
	default:
		e.violate(Violation{
			Kind: KindKernel, Rule: m.kernRef.String(), Component: "node", Field: "kernel",
			Have: n.Kernel, Want: m.kernels.String(),
			Reason: fmt.Sprintf("kernel %s is not allowed (allowed: %s)", n.Kernel, m.kernels),
		})
	}
}

// tri is a condition's outcome: it holds, it does not, or it cannot be told.
type tri int

const (
	no tri = iota
	yes
	unsure
)

func judgeSpec(s *spec, have string) tri {
	switch {
	case s == nil:
		return yes
	case have == "":
		return unsure
	case s.match(have):
		return yes
	}
	return no
}

func judgeMatcher(m *matcher, have string) tri {
	switch {
	case m == nil:
		return yes
	case strings.TrimSpace(have) == "":
		return unsure
	case m.match(have):
		return yes
	}
	return no
}

func and(a, b tri) tri {
	if a == no || b == no {
		return no
	}
	if a == unsure || b == unsure {
		return unsure
	}
	return yes
}

// eval judges a known-bad combination. Node-wide conditions are judged
// once; GPU conditions (gpu_model, vbios) must hold on one GPU together, HCA
// conditions (hca_model, hca_firmware) on one HCA together. A rule on a
// VBIOS or HCA firmware names each GPU or HCA that holds the combination; a
// rule on node-wide versions (a model only narrows it) names the node.
func (r badRule) eval(e *eval, n Node) {
	w := r.when
	t := yes
	t = and(t, judgeSpec(w.driver, n.Driver))
	t = and(t, judgeSpec(w.cuda, n.CUDA))
	t = and(t, judgeSpec(w.fabricManager, n.FabricManager))
	t = and(t, judgeSpec(w.kernel, n.Kernel))
	if w.rdmaStack != nil {
		st := unsure
		if n.RDMAStack != "" {
			st = no
			if w.rdmaStack.match(n.RDMAStack) {
				st = yes
			}
		}
		t = and(t, st)
	}
	var have []string
	add := func(cond bool, field, value string) {
		if cond {
			have = append(have, field+"="+orUnknown(value))
		}
	}
	add(w.driver != nil, "driver", n.Driver)
	add(w.cuda != nil, "cuda", n.CUDA)
	add(w.fabricManager != nil, "fabric_manager", n.FabricManager)
	add(w.kernel != nil, "kernel", n.Kernel)
	add(w.rdmaStack != nil, "rdma_stack", n.RDMAStack)

	var gpuComps, hcaComps []string
	if w.gpuModel != nil || w.vbios != nil {
		var units []unit
		for _, g := range n.GPUs {
			units = append(units, unit{
				comp: gpuComponent(g.Index),
				t:    and(judgeMatcher(w.gpuModel, g.Name), judgeSpec(w.vbios, g.VBIOS)),
				have: describe(w.gpuModel != nil, "gpu_model", g.Name, w.vbios != nil, "vbios", g.VBIOS),
			})
		}
		// No GPUs reported on a matrix-judged node means they could not be told.
		ut, comps, h := judgeUnits(units, unsure)
		t, gpuComps, have = and(t, ut), comps, append(have, h...)
	}
	if w.hcaModel != nil || w.hcaFirmware != nil {
		var units []unit
		for _, h := range n.HCAs {
			units = append(units, unit{
				comp: hcaComponent(h),
				t:    and(judgeMatcher(w.hcaModel, h.Model), judgeSpec(w.hcaFirmware, h.FW)),
				have: describe(w.hcaModel != nil, "hca_model", h.Model, w.hcaFirmware != nil, "hca_firmware", h.FW),
			})
		}
		// A node without adapters simply has none.
		ut, comps, h := judgeUnits(units, no)
		t, hcaComps, have = and(t, ut), comps, append(have, h...)
	}
	switch t {
	case no:
		e.ok()
		return
	case unsure:
		e.unknown(fmt.Sprintf("%s: cannot rule out %s (%s): some of %s unknown", r.ref.path, r.when, r.reason, r.when.fields()))
		return
	}
	components := []string{"node"}
	switch {
	case w.vbios != nil:
		components = gpuComps
	case w.hcaFirmware != nil:
		components = hcaComps
	}
	for _, c := range components {
		e.violate(Violation{
			Kind: KindKnownBad, Rule: r.ref.String(), Component: c, Field: r.when.fields(),
			Have: strings.Join(have, ", "), Want: "not " + r.when.String(),
			Reason: fmt.Sprintf("known-bad combination %s: %s", r.when, r.reason),
		})
	}
}

// unit is one GPU or HCA judged against a known-bad rule's conditions.
type unit struct {
	comp string
	t    tri
	have string
}

// judgeUnits: yes when some unit holds the combination (naming those that
// do), unsure when none does but some could not be told, empty when there
// are no units.
func judgeUnits(units []unit, empty tri) (tri, []string, []string) {
	if len(units) == 0 {
		return empty, nil, nil
	}
	var comps, have []string
	sawUnsure := false
	for _, u := range units {
		switch u.t {
		case yes:
			comps = append(comps, u.comp)
			have = appendUnique(have, u.have)
		case unsure:
			sawUnsure = true
		}
	}
	switch {
	case len(comps) > 0:
		return yes, comps, have
	case sawUnsure:
		return unsure, nil, nil
	}
	return no, nil, nil
}

func describe(a bool, an, av string, b bool, bn, bv string) string {
	var s []string
	if a {
		s = append(s, an+"="+orUnknown(av))
	}
	if b {
		s = append(s, bn+"="+orUnknown(bv))
	}
	return strings.Join(s, ", ")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func appendUnique(list []string, s string) []string {
	if s == "" || contains(list, s) {
		return list
	}
	return append(list, s)
}

// fields lists the condition names, "driver+vbios".
func (w badWhen) fields() string {
	return strings.Join(w.names(), "+")
}

func (w badWhen) names() []string {
	var f []string
	for _, k := range whenKeys {
		if w.value(k) != "" {
			f = append(f, k)
		}
	}
	return f
}

// value returns a condition's text as written, "" when absent.
func (w badWhen) value(key string) string {
	switch key {
	case "gpu_model":
		if w.gpuModel != nil {
			return w.gpuModel.text
		}
	case "vbios":
		if w.vbios != nil {
			return w.vbios.text
		}
	case "driver":
		if w.driver != nil {
			return w.driver.text
		}
	case "cuda":
		if w.cuda != nil {
			return w.cuda.text
		}
	case "fabric_manager":
		if w.fabricManager != nil {
			return w.fabricManager.text
		}
	case "kernel":
		if w.kernel != nil {
			return w.kernel.text
		}
	case "rdma_stack":
		if w.rdmaStack != nil {
			return w.rdmaStack.text
		}
	case "hca_model":
		if w.hcaModel != nil {
			return w.hcaModel.text
		}
	case "hca_firmware":
		if w.hcaFirmware != nil {
			return w.hcaFirmware.text
		}
	}
	return ""
}

// String writes the combination: "driver 550.54.14 + vbios 96.00.74.*".
func (w badWhen) String() string {
	var parts []string
	for _, k := range w.names() {
		parts = append(parts, k+" "+w.value(k))
	}
	return strings.Join(parts, " + ")
}
