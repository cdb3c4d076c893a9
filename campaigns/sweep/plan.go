package sweep

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"sort"
)

// pairUp splits nodes into disjoint pairs; left holds the node without a
// partner when the count is odd (or every node when fewer than two).
//
// Leaf-aware (leafOf known and more than one leaf): the first pass walks
// the leaf pairs in round-robin order (every leaf's distance-1 neighbour,
// then distance 2, ...) and takes one pair for each while both leaves
// have nodes, so as many leaf-to-leaf paths as possible carry one test: a
// bad path then shows as a slow pair. It skips a leaf pair that would
// strand the largest leaf (more nodes than all others together). Then the
// two leaves with the most nodes left are paired until at most one leaf
// has nodes; those pair among themselves. So every pair crosses leaves
// that can. The seed permutes leaves and nodes, so another night
// covers other paths when there are fewer pairs than paths.
func pairUp(nodes []string, leafOf func(string) string, leafAware bool, seed uint64) (pairs [][2]string, left []string) {
	rng := rand.New(rand.NewPCG(seed, 0x9a17))
	if !leafAware {
		return pairRandom(nodes, rng)
	}
	byLeaf := map[string][]string{}
	var leaves []string
	for _, n := range nodes {
		l := leafOf(n)
		if _, ok := byLeaf[l]; !ok {
			leaves = append(leaves, l)
		}
		byLeaf[l] = append(byLeaf[l], n)
	}
	if len(leaves) < 2 {
		return pairRandom(nodes, rng)
	}
	sort.Strings(leaves)
	rng.Shuffle(len(leaves), func(i, j int) { leaves[i], leaves[j] = leaves[j], leaves[i] })
	queues := make([][]string, len(leaves))
	for i, l := range leaves {
		q := append([]string(nil), byLeaf[l]...)
		sort.Strings(q)
		rng.Shuffle(len(q), func(a, b int) { q[a], q[b] = q[b], q[a] })
		queues[i] = q
	}
	take := func(i int) string {
		n := queues[i][0]
		queues[i] = queues[i][1:]
		return n
	}
	m := len(leaves)
	remaining := len(nodes)
	// wouldStrand: pairing two leaves that are not the largest would leave
	// the largest with more nodes than all others together, which then
	// pair on their own leaf. Cross-leaf pairs come before path coverage.
	wouldStrand := func(k, j int) bool {
		big := 0
		for _, q := range queues {
			big = max(big, len(q))
		}
		return len(queues[k]) < big && len(queues[j]) < big && 2*big > remaining-2
	}
	for d := 1; d <= m/2; d++ {
		for k := range m {
			j := (k + d) % m
			if 2*d == m && k >= d {
				continue // distance m/2 pairs each leaf pair twice
			}
			if len(queues[k]) > 0 && len(queues[j]) > 0 && !wouldStrand(k, j) {
				pairs = append(pairs, [2]string{take(k), take(j)})
				remaining -= 2
			}
		}
	}
	for {
		a, b := -1, -1
		for i := range queues {
			switch {
			case len(queues[i]) == 0:
			case a < 0 || len(queues[i]) > len(queues[a]):
				a, b = i, a
			case b < 0 || len(queues[i]) > len(queues[b]):
				b = i
			}
		}
		if b < 0 {
			if a >= 0 {
				p, l := pairRandom(queues[a], rng)
				pairs = append(pairs, p...)
				left = append(left, l...)
			}
			return pairs, left
		}
		pairs = append(pairs, [2]string{take(a), take(b)})
		remaining -= 2
	}
}

func pairRandom(nodes []string, rng *rand.Rand) (pairs [][2]string, left []string) {
	s := append([]string(nil), nodes...)
	sort.Strings(s)
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	for i := 0; i+1 < len(s); i += 2 {
		pairs = append(pairs, [2]string{s[i], s[i+1]})
	}
	if len(s)%2 == 1 {
		left = append(left, s[len(s)-1])
	}
	return pairs, left
}

// waveCap bounds the waves of one phase: repeats, plus for localisation
// waves that wait for a reference to come free.
func waveCap(spec Spec, p Phase) int {
	n := 2 + spec.maxRepeats()
	if p == PhaseLocalise {
		n += 2
	}
	return n
}

// planNext returns the phase and wave to run after the current one, with
// its tests (Seq not yet set); PhaseDone and nil when the sweep is over.
func planNext(rec *Record, a *analysis) (Phase, int, []TestRecord) {
	phase, wave := rec.Phase, rec.Wave
	if phase == "" {
		phase, wave = PhaseIntra, -1
	}
	for phase != PhaseDone {
		if wave+1 < waveCap(a.spec, phase) {
			if ts := planWave(rec, a, phase, wave+1); len(ts) > 0 {
				return phase, wave + 1, ts
			}
		}
		phase, wave = nextPhase(phase), -1
	}
	return PhaseDone, 0, nil
}

func nextPhase(p Phase) Phase {
	switch p {
	case PhaseIntra:
		return PhaseInter
	case PhaseInter:
		return PhaseLocalise
	}
	return PhaseDone
}

func planWave(rec *Record, a *analysis, p Phase, wave int) []TestRecord {
	switch p {
	case PhaseIntra:
		return planIntra(a, wave)
	case PhaseInter:
		return planInter(rec, a, wave)
	case PhaseLocalise:
		return planLocalise(rec, a, wave)
	}
	return nil
}

func newTest(p Phase, wave int, purpose Purpose, series string, nodes ...string) TestRecord {
	return TestRecord{Phase: p, Wave: wave, Purpose: purpose, Series: series, Nodes: nodes, State: TestPlanned}
}

func planIntra(a *analysis, wave int) []TestRecord {
	var out []TestRecord
	for _, n := range a.order {
		key := "single:" + n
		s := a.series[key]
		if (wave == 0 && s == nil) || (s != nil && s.dec == decPending && a.lost[n] == nil) {
			out = append(out, newTest(PhaseIntra, wave, PurposeSingle, key, n))
		}
	}
	return out
}

func planInter(rec *Record, a *analysis, wave int) []TestRecord {
	var out []TestRecord
	if wave > 0 {
		for _, s := range a.pairs {
			ns := s.tests[0].Nodes
			if s.dec == decPending && a.lost[ns[0]] == nil && a.lost[ns[1]] == nil {
				out = append(out, newTest(PhaseInter, wave, PurposePair, s.key, ns...))
			}
		}
		return out
	}
	// Pairs form within one SKU: a 2-node baseline is a SKU's.
	bySKU := map[string][]string{}
	var skus []string
	for _, n := range a.order {
		if !a.interEligible(n) || a.pairOf[n] != nil {
			continue
		}
		sku := a.nodes[n].SKU
		if _, ok := bySKU[sku]; !ok {
			skus = append(skus, sku)
		}
		bySKU[sku] = append(bySKU[sku], n)
	}
	sort.Strings(skus)
	leafOf := func(n string) string { return a.leaf[n] }
	for _, sku := range skus {
		pairs, _ := pairUp(bySKU[sku], leafOf, !a.spec.IgnoreLeaves, rec.Seed)
		for _, p := range pairs {
			out = append(out, newTest(PhaseInter, 0, PurposePair, "pair:"+linkKey(p[0], p[1]), p[0], p[1]))
		}
	}
	return out
}

// planLocalise pairs each node under test with a reference that passed,
// on its own leaf when one is free (the test then crosses no
// leaf-to-leaf path), and each slow pair's path with two references, one
// on each leaf. A reference serves one test per wave; a node whose leaf
// has references, all taken, waits for the next wave. A leaf with no
// reference at all (every pair from it was slow) pairs its suspects with
// each other: a fine result clears both, and they serve as references in
// the next wave.
func planLocalise(rec *Record, a *analysis, wave int) []TestRecord {
	members, leftovers, paths := a.locSubjects()
	subject := map[string]bool{}
	purpose := map[string]Purpose{}
	var subjects []string
	for _, n := range members {
		if !subject[n] {
			subject[n], purpose[n] = true, PurposeMember
			subjects = append(subjects, n)
		}
	}
	for _, n := range leftovers {
		if !subject[n] {
			subject[n], purpose[n] = true, PurposeLeftover
			subjects = append(subjects, n)
		}
	}
	// References, in an order the seed varies. A suspect found fine in an
	// earlier wave is one too.
	var refs []string
	for _, n := range a.order {
		if a.reference(n) && (!subject[n] || a.verified(n)) {
			refs = append(refs, n)
		}
	}
	rank := func(n string) uint64 { return hashSeed(rec.Seed, n) }
	sort.Slice(refs, func(i, j int) bool {
		ri, rj := rank(refs[i]), rank(refs[j])
		if ri != rj {
			return ri < rj
		}
		return refs[i] < refs[j]
	})
	// A 2-node baseline is one SKU's: references are of the subject's SKU.
	sku := func(n string) string { return a.nodes[n].SKU }
	place := func(skuName, leaf string) string { return skuName + "\x00" + leaf }
	byPlace := map[string][]string{}
	bySKU := map[string][]string{}
	isRef := map[string]bool{}
	for _, r := range refs {
		byPlace[place(sku(r), a.leaf[r])] = append(byPlace[place(sku(r), a.leaf[r])], r)
		bySKU[sku(r)] = append(bySKU[sku(r)], r)
		isRef[r] = true
	}
	used := map[string]bool{}
	free := func(n string) bool { return isRef[n] && !used[n] }
	firstFree := func(cands []string) string {
		for _, c := range cands {
			if free(c) {
				return c
			}
		}
		return ""
	}
	good := a.goodPaths()
	var out []TestRecord
	add := func(n, ref, cross string) {
		used[n], used[ref] = true, true
		t := newTest(PhaseLocalise, wave, purpose[n], "loc:"+n, n, ref)
		t.Cross = cross
		out = append(out, t)
	}

	// Repeats first, against the same partners when they are free.
	var need []string
	for _, n := range subjects {
		if a.lost[n] != nil || used[n] {
			continue
		}
		if s := a.loc(n); s != nil {
			if s.dec == decPending {
				if len(s.done) > 0 && free(s.done[len(s.done)-1].Nodes[1]) {
					last := s.done[len(s.done)-1]
					add(n, last.Nodes[1], last.Cross)
				} else {
					need = append(need, n)
				}
			}
			continue
		}
		if a.cleared[n] {
			continue
		}
		if m := a.mutualOf[n]; m != nil && m.dec == decPending {
			ns := m.tests[0].Nodes
			if a.lost[ns[0]] == nil && a.lost[ns[1]] == nil && !used[ns[0]] && !used[ns[1]] {
				used[ns[0]], used[ns[1]] = true, true
				out = append(out, newTest(PhaseLocalise, wave, PurposeMutual, m.key, ns...))
			}
			continue
		}
		need = append(need, n)
	}
	// A reference on the node's own leaf, else across a path a fine pair
	// vouched for.
	noRef := map[string][]string{}
	var noRefLeaves []string
	for _, n := range need {
		leaf := a.leaf[n]
		local := byPlace[place(sku(n), leaf)]
		if ref := firstFree(local); ref != "" {
			add(n, ref, "")
			continue
		}
		if len(local) > 0 {
			continue // all taken this wave: the next one
		}
		found := false
		for _, r := range bySKU[sku(n)] {
			if free(r) && good[linkKey(leaf, a.leaf[r])] {
				add(n, r, linkKey(leaf, a.leaf[r]))
				found = true
				break
			}
		}
		if !found {
			if _, ok := noRef[leaf]; !ok {
				noRefLeaves = append(noRefLeaves, leaf)
			}
			noRef[leaf] = append(noRef[leaf], n)
		}
	}
	// No reference on the leaf: suspects of the leaf test each other,
	// once; whoever is left takes any free reference.
	for _, leaf := range noRefLeaves {
		var fresh, rest []string
		// Suspects pair within one SKU too.
		sort.SliceStable(noRef[leaf], func(i, j int) bool { return sku(noRef[leaf][i]) < sku(noRef[leaf][j]) })
		for _, n := range noRef[leaf] {
			if a.mutualOf[n] == nil {
				fresh = append(fresh, n)
			} else {
				rest = append(rest, n)
			}
		}
		for i := 0; i < len(fresh); i++ {
			if i+1 == len(fresh) || sku(fresh[i]) != sku(fresh[i+1]) {
				rest = append(rest, fresh[i])
				continue
			}
			x, y := fresh[i], fresh[i+1]
			i++
			used[x], used[y] = true, true
			out = append(out, newTest(PhaseLocalise, wave, PurposeMutual, "mutual:"+linkKey(x, y), x, y))
		}
		for _, n := range rest {
			if r := firstFree(bySKU[sku(n)]); r != "" {
				add(n, r, linkKey(leaf, a.leaf[r]))
			}
		}
	}
	for _, k := range paths {
		key := "path:" + k
		s := a.series[key]
		if s != nil && s.dec != decPending {
			continue
		}
		la, lb := splitKey(k)
		skuName := sku(a.pathPair[k])
		p, q := "", ""
		if s != nil && len(s.done) > 0 {
			prev := s.done[len(s.done)-1].Nodes
			if free(prev[0]) && free(prev[1]) {
				p, q = prev[0], prev[1]
			}
		}
		if p == "" {
			if p = firstFree(byPlace[place(skuName, la)]); p == "" {
				continue
			}
			used[p] = true
			if q = firstFree(byPlace[place(skuName, lb)]); q == "" {
				used[p] = false
				continue
			}
		}
		used[p], used[q] = true, true
		out = append(out, newTest(PhaseLocalise, wave, PurposeProbe, key, p, q))
	}
	return out
}

// hashSeed orders nodes by a hash of the seed and the name.
func hashSeed(seed uint64, name string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	h.Write([]byte(name))
	return h.Sum64()
}
