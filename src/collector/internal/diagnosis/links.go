package diagnosis

import (
	"math"
	"slices"
	"sort"
)

// minBaselineSamples is how many transfers a group's baseline needs before it is a
// reference.
const minBaselineSamples = 5

// minClassSamples is how many steps a class baseline needs before it is a reference.
const minClassSamples = 3

// baselineAlpha is the EWMA weight of a new transfer sample.
const baselineAlpha = 0.1

// resetRun is how many samples in a row below a transfer baseline's mean by more than its
// deviation, and below half of it, start the baseline over at their level.
const resetRun = 3

// transferBaseline is a transfer's reference: an ewma that starts over once resetRun samples
// in a row lay below half its mean and below its mean by more than its deviation. The
// transfers got faster for good: a job's first steps on a loaded host (1.9 s falling to
// 0.16 s over ten steps) had been learned as a link's usual time, averaged as they are while
// a baseline is young, and a NIC throttled to a quarter two steps after them read 2.2 times
// that reference, within four of its inflated deviations: never slow. The fresh baseline
// keeps the old one's samples (it stands as a reference at once) and its relative deviation
// (as noisy a transfer, in proportion, as it was: a small message's reference falling to its
// fastest readings must not make every millisecond of a busy host's jitter read as slow).
type transferBaseline struct {
	ewma
	// low holds the run of samples below the baseline as it stood before the run (before:
	// the run is judged against it, not against the mean it is pulling down).
	low    [resetRun]float64
	nLow   int
	before ewma
}

// add learns v. A sample counts toward starting over only if it lies below the baseline by
// minDrop too (min_transfer_excess: a reference wrong by less cannot turn a transfer slow or
// healthy; a small message read at its fastest three times in a row must not make its usual
// readings slow, which, not learned, would keep them slow).
func (b *transferBaseline) add(v, minDrop float64) {
	if b.nLow == 0 {
		b.before = b.ewma
	}
	ref := &b.before
	below := ref.samples >= minBaselineSamples && v < ref.mean-ref.dev && v < ref.mean/2 &&
		ref.mean-v >= minDrop
	b.ewma.add(v, baselineAlpha)
	if !below {
		b.nLow = 0
		return
	}
	b.low[b.nLow] = v
	b.nLow++
	if b.nLow < resetRun {
		return
	}
	var fresh ewma
	for _, x := range b.low {
		fresh.add(x, baselineAlpha)
	}
	if ref.mean > 0 {
		fresh.dev = max(fresh.dev, ref.dev/ref.mean*fresh.mean)
	}
	fresh.samples = b.samples
	b.ewma, b.nLow = fresh, 0
}

// healthyFactor: a transfer at most this many times its reference is healthy evidence.
const healthyFactor = 1.5

// maxBaselinesPerJob bounds a job's transfer baselines; past it they start over.
const maxBaselinesPerJob = 4096

// maxAmbiguous is how many equally good suspects of one kind may be named for one set of
// slow groups; more than that and the groups cannot tell them apart, so none is named.
const maxAmbiguous = 2

// maxCover bounds the suspects located in one step (independent slow links).
const maxCover = 4

// transferNoiseK: a slow transfer exceeds its reference by at least this many mean absolute
// deviations of the transfers it was learned from (on a busy host a small message's
// transfer varies by milliseconds; that is not a slow link).
const transferNoiseK = 4

// healthyBytesRatio: a transfer is healthy evidence against a link only if it moved at least
// 1/healthyBytesRatio of the bytes of the smallest slow transfer of the step. A link that lost
// bandwidth delays large messages and hardly small ones (a 4-byte all-reduce of a loss, a
// message that fits in a socket buffer): they cannot clear it.
const healthyBytesRatio = 4

// groupKey is a process group's collectives of one shape.
type groupKey struct {
	pg    string
	op    string
	bytes int64
}

// classKey is a shape of collective across groups: the same operation, size and group
// size over as many hosts and switches (an intra-switch group is not compared with one
// that crosses the spine).
type classKey struct {
	op       string
	bytes    int64
	pgSize   int32
	hosts    int32
	switches int32
	p2p      bool
}

type groupClass struct {
	key     classKey
	members int32
}

// classStep is one class's collectives in the step being analyzed.
type classStep struct {
	key classKey
	// vals are the transfers, groups the groups (pg ids) they came from.
	vals   []float64
	groups map[int32]struct{}
	// quartile is the class's lower quartile in the step (with hasQuartile: three groups
	// or more); baseline its history (read once per step: baselineRead).
	quartile     float64
	hasQuartile  bool
	baseline     *transferBaseline
	baselineRead bool
}

// groupShape is what transfers last read for a group (a pg id) in the step: its class and
// baseline for collectives of n members, op and bytes. A group's collectives repeat one
// shape (a pipeline pair's sixteen messages a step), and each read was two or three map
// lookups by strings.
type groupShape struct {
	set   bool
	n     int32
	op    string
	bytes int64
	class *classStep
	base  *transferBaseline
	// learned is the baseline the learning found or made for the shape, while no clear
	// of the baselines came after it (learnedEpoch).
	learned      *transferBaseline
	learnedEpoch int
}

type linkScratch struct {
	refT    []float64
	slow    []bool
	healthy []bool
	// classOf and groupBase are each complete collective's class and group baseline.
	classOf   []*classStep
	groupBase []*transferBaseline
	shapes    []groupShape
	hasRef    []bool
	// per group (pg id)
	groupSlow, groupHealthy, groupSeen []bool
	groupDoubt                         []bool
	groupExcess                        []float64 // seconds its slow transfers lost in the step
	groupColl                          []int32   // a collective of the group in the step
	elements                           map[string]int32
	elemName                           []Suspect
	elemSlow, elemHealthy              []int32
	elemMark                           []int32
	elemGroups                         [][]int32
	covered                            []bool
	byClass                            map[classKey]*classStep
}

// classOfGroup returns the class of the group a complete collective belongs to, from its
// members' topology (cached per group while its membership size holds).
func (m *model) classOfGroup(j *jobState, sd *stepData, c int) classKey {
	rec := &sd.colls[c]
	if gc, ok := j.groupClasses[rec.pg]; ok && gc.members == rec.n &&
		gc.key.op == rec.op && gc.key.bytes == rec.bytes {
		return gc.key
	}
	hosts, switches := m.distinctPlaces(j, sd, rec)
	key := classKey{op: rec.op, bytes: rec.bytes, pgSize: rec.pgSize,
		hosts: hosts, switches: switches, p2p: rec.p2p}
	if len(j.groupClasses) < maxBaselinesPerJob {
		j.groupClasses[rec.pg] = groupClass{key: key, members: rec.n}
	}
	return key
}

// smallGroup is the most members whose distinct hosts and switches are counted by scanning
// (a message's two, a node's eight) instead of in maps: a job with more groups than the
// class cache holds (a 4096-rank pipeline's six thousand pairs) counts some every step.
const smallGroup = 16

// distinctPlaces counts the distinct hosts and switches of a collective's members.
func (m *model) distinctPlaces(j *jobState, sd *stepData, rec *collRec) (int32, int32) {
	if rec.n <= smallGroup {
		var hosts, switches [smallGroup]string
		nh, ns := 0, 0
		for i := rec.first; i < rec.first+rec.n; i++ {
			t := j.topology.at(sd.ops[i].rank)
			if !slices.Contains(hosts[:nh], t.Host) {
				hosts[nh] = t.Host
				nh++
			}
			if !slices.Contains(switches[:ns], t.Switch) {
				switches[ns] = t.Switch
				ns++
			}
		}
		return int32(nh), int32(ns)
	}
	hosts := make(map[string]struct{})
	switches := make(map[string]struct{})
	for i := rec.first; i < rec.first+rec.n; i++ {
		t := j.topology.at(sd.ops[i].rank)
		hosts[t.Host] = struct{}{}
		switches[t.Switch] = struct{}{}
	}
	return int32(len(hosts)), int32(len(switches))
}

func complete(rec *collRec) bool {
	return rec.missingRanks == 0 && rec.n >= rec.pgSize
}

// transfers classifies each complete collective's transfer as slow, healthy or neither
// against its reference: the lowest of its group's history, its class's history, and the
// median of its class in this step (with three or more groups in the class).
func (m *model) transfers(a *Analyzer, j *jobState, sd *stepData) {
	// The baselines change here, and only here: the references Slowdown read go.
	clear(j.refs)
	j.lastRefValid = false
	l := &m.links
	n := len(sd.colls)
	l.refT = grow(l.refT, n)
	l.slow = grow(l.slow, n)
	l.healthy = grow(l.healthy, n)
	l.hasRef = grow(l.hasRef, n)
	l.classOf = grow(l.classOf, n)
	l.groupBase = grow(l.groupBase, n)
	clear(l.slow)
	clear(l.healthy)
	clear(l.hasRef)
	if l.byClass == nil {
		l.byClass = make(map[classKey]*classStep)
	}
	for _, cs := range l.byClass {
		cs.vals = cs.vals[:0]
		clear(cs.groups)
		cs.hasQuartile, cs.baseline, cs.baselineRead = false, nil, false
	}
	l.shapes = grow(l.shapes, len(m.pgIDs))
	clear(l.shapes)
	for c := range sd.colls {
		rec := &sd.colls[c]
		if !complete(rec) {
			continue
		}
		// Nothing this loop reads changes before the baselines are learned below, so a
		// group's shape read once stands for its other collectives of that shape.
		g := m.pgID[c]
		sh := &l.shapes[g]
		if !sh.set || sh.n != rec.n || sh.op != rec.op || sh.bytes != rec.bytes {
			key := m.classOfGroup(j, sd, c)
			cs := l.byClass[key]
			if cs == nil {
				cs = &classStep{key: key, groups: make(map[int32]struct{})}
				l.byClass[key] = cs
			}
			*sh = groupShape{set: true, n: rec.n, op: rec.op, bytes: rec.bytes, class: cs,
				base: j.groupBaselines[groupKey{pg: rec.pg, op: rec.op, bytes: rec.bytes}]}
		}
		l.classOf[c], l.groupBase[c] = sh.class, sh.base
		sh.class.vals = append(sh.class.vals, m.transfer[c])
		sh.class.groups[g] = struct{}{}
	}
	// The class reference is its lower quartile, not its median: one slow node spreads
	// over as many groups of a class as it has ranks (half of them in a small job).
	for _, cs := range l.byClass {
		if len(cs.groups) >= 3 {
			cs.quartile, cs.hasQuartile = lowerQuartile(cs.vals), true
		}
	}
	minExcess := a.cfg.MinTransferExcess.Seconds()
	for c := range sd.colls {
		rec := &sd.colls[c]
		if !complete(rec) {
			continue
		}
		ref := math.Inf(1)
		noise := 0.0
		if b := l.groupBase[c]; b != nil && b.samples >= minBaselineSamples {
			ref = b.mean
			noise = b.dev
		}
		cs := l.classOf[c]
		fromPeers := false
		if cs.hasQuartile {
			ref = min(ref, cs.quartile)
			fromPeers = true
		}
		if !cs.baselineRead {
			cs.baseline, cs.baselineRead = j.classBaselines[cs.key], true
		}
		if b := cs.baseline; b != nil && b.samples >= minClassSamples {
			ref = min(ref, b.mean)
			noise = max(noise, b.dev)
			fromPeers = true
		}
		if math.IsInf(ref, 1) {
			continue
		}
		t := m.transfer[c]
		l.refT[c] = ref
		l.hasRef[c] = true
		excess := t - ref
		switch {
		case t >= a.cfg.NetworkFactor*ref && excess >= max(minExcess, transferNoiseK*noise):
			l.slow[c] = true
		case fromPeers && (t <= healthyFactor*ref || excess < minExcess):
			// Only a comparison with other groups says healthy: a group's own history
			// may have been learned while its link was already slow.
			l.healthy[c] = true
		}
	}
	// Learn after judging, and not from slow transfers: a link that stays slow must keep
	// reading as slow.
	// A baseline read above is the one in the map until the map starts over (epoch counts
	// the times it did); one found or made here, until it starts over again. (A job with
	// more groups than the map holds starts it over every step.)
	epoch := 0
	for c := range sd.colls {
		rec := &sd.colls[c]
		if !complete(rec) || l.slow[c] {
			continue
		}
		b := l.groupBase[c]
		if b == nil || epoch > 0 {
			sh := &l.shapes[m.pgID[c]]
			same := sh.n == rec.n && sh.op == rec.op && sh.bytes == rec.bytes
			if same && sh.learned != nil && sh.learnedEpoch == epoch {
				b = sh.learned
			} else {
				gk := groupKey{pg: rec.pg, op: rec.op, bytes: rec.bytes}
				b = j.groupBaselines[gk]
				if b == nil {
					if len(j.groupBaselines) >= maxBaselinesPerJob {
						clear(j.groupBaselines)
						epoch++
					}
					b = &transferBaseline{}
					j.groupBaselines[gk] = b
				}
				if same {
					sh.learned, sh.learnedEpoch = b, epoch
				}
			}
		}
		b.add(m.transfer[c], minExcess)
	}
	for _, cs := range l.byClass {
		if !cs.hasQuartile {
			continue
		}
		med := cs.quartile
		b := j.classBaselines[cs.key]
		if b == nil {
			if len(j.classBaselines) >= maxBaselinesPerJob {
				clear(j.classBaselines)
			}
			b = &transferBaseline{}
			j.classBaselines[cs.key] = b
		}
		// The class median is robust to one slow group; it still should not learn a
		// step where most of the class was slow.
		if b.samples < minClassSamples || med <= a.cfg.NetworkFactor*b.mean {
			b.add(med, minExcess)
		}
	}
}

// lowerQuartile returns the value at (len-1)/4 of vals in sorted order (sort.Float64s's:
// NaNs first), reordering vals in place: found by selection, not by sorting them (a class
// of a 4096-rank pipeline's messages holds thousands a step).
func lowerQuartile(vals []float64) float64 {
	return selectKth(vals, (len(vals)-1)/4)
}

// floatLess is sort.Float64s's order.
func floatLess(x, y float64) bool { return x < y || (math.IsNaN(x) && !math.IsNaN(y)) }

// selectKth returns the k-th smallest of vals in floatLess's order (quickselect, the
// median of three as pivot), reordering vals.
func selectKth(vals []float64, k int) float64 {
	lo, hi := 0, len(vals)-1
	for hi-lo > 16 {
		mid := lo + (hi-lo)/2
		// Order lo, mid, hi; the median goes to hi-1 as the pivot.
		if floatLess(vals[mid], vals[lo]) {
			vals[mid], vals[lo] = vals[lo], vals[mid]
		}
		if floatLess(vals[hi], vals[lo]) {
			vals[hi], vals[lo] = vals[lo], vals[hi]
		}
		if floatLess(vals[hi], vals[mid]) {
			vals[hi], vals[mid] = vals[mid], vals[hi]
		}
		vals[mid], vals[hi-1] = vals[hi-1], vals[mid]
		pivot := vals[hi-1]
		i, j := lo, hi-1
		for {
			for i++; floatLess(vals[i], pivot); i++ {
			}
			for j--; floatLess(pivot, vals[j]); j-- {
			}
			if i >= j {
				break
			}
			vals[i], vals[j] = vals[j], vals[i]
		}
		vals[i], vals[hi-1] = vals[hi-1], vals[i]
		switch {
		case k < i:
			hi = i - 1
		case k > i:
			lo = i + 1
		default:
			return vals[i]
		}
	}
	// A short run: insertion sort.
	for i := lo + 1; i <= hi; i++ {
		for j := i; j > lo && floatLess(vals[j], vals[j-1]); j-- {
			vals[j], vals[j-1] = vals[j-1], vals[j]
		}
	}
	return vals[k]
}

// Slowdown returns a collective's transfer over its reference as known from the job's
// history (0 when there is none yet): what is written on the span at release, before its
// step is analyzed.
func (a *Analyzer) Slowdown(job, pg, op string, bytes int64, members int, transfer float64) float64 {
	j := a.lookup(job)
	if j == nil {
		return 0
	}
	k := slowdownKey{pg: pg, op: op, bytes: bytes, members: members}
	var ref float64
	if j.lastRefValid && k == j.lastRefKey {
		// A group's collectives come in runs (a pipeline pair's messages): the last one's
		// reference, as j.refs holds it.
		ref = j.lastRef
	} else {
		var ok bool
		ref, ok = j.refs[k]
		if !ok {
			ref = j.transferRef(&k)
			if j.refs == nil {
				j.refs = make(map[slowdownKey]float64)
			}
			if len(j.refs) >= maxSlowdownRefs {
				clear(j.refs)
			}
			j.refs[k] = ref
		}
		j.lastRefKey, j.lastRef, j.lastRefValid = k, ref, true
	}
	if math.IsInf(ref, 1) || ref <= 0 {
		return 0
	}
	return transfer / ref
}

// maxSlowdownRefs bounds the references Slowdown remembers between analyses (a job's
// groups: more than its baselines hold, a 4096-rank pipeline has six thousand pairs).
const maxSlowdownRefs = 1 << 14

// slowdownKey is what a collective's reference for Slowdown depends on besides the job's
// baselines.
type slowdownKey struct {
	pg, op  string
	bytes   int64
	members int
}

// transferRef is the reference of a collective's transfer in the job's baselines: the
// lower of its group's and its class's, +Inf without either.
func (j *jobState) transferRef(k *slowdownKey) float64 {
	ref := math.Inf(1)
	if b := j.groupBaselines[groupKey{pg: k.pg, op: k.op, bytes: k.bytes}]; b != nil &&
		b.samples >= minBaselineSamples {
		ref = b.mean
	}
	if gc, ok := j.groupClasses[k.pg]; ok && gc.members == int32(k.members) && gc.key.op == k.op &&
		gc.key.bytes == k.bytes {
		if b := j.classBaselines[gc.key]; b != nil && b.samples >= minClassSamples {
			ref = min(ref, b.mean)
		}
	}
	return ref
}

// element kinds in the order a tie between them is broken (the most specific first).
func (m *model) element(name Suspect) int32 {
	l := &m.links
	id := name.ID()
	e, ok := l.elements[id]
	if !ok {
		e = int32(len(l.elemName))
		l.elements[id] = e
		l.elemName = append(l.elemName, name)
		l.elemSlow = append(l.elemSlow, 0)
		l.elemHealthy = append(l.elemHealthy, 0)
		l.elemMark = append(l.elemMark, -1)
		l.elemGroups = append(l.elemGroups, nil)
	}
	return e
}

// locate names the links that explain the slow groups of the step: the elements (a host's
// NIC, a host, a switch's uplink, a switch) contained in slow groups and in no healthy
// group, greedily until every slow group is explained: first the element whose slow groups
// lost the most time (the sum of their transfers' excess over their references), the most
// specific on a tie. Weighing by the time lost, not by the number of groups, keeps a link
// that slows many transfers a lot ahead of a NIC that shares a few of them with transfers
// slowed a little by a busy host. It returns each suspect with the collectives it explains.
//
// It runs on what transfers judged, in four phases: judgeGroups folds the transfers into
// slow and healthy groups; markElements counts, per element of the fabric, the slow and
// healthy groups that use it; cover chooses the suspects; explainedCollectives attaches
// their slow collectives.
func (m *model) locate(j *jobState, sd *stepData) []located {
	if !m.judgeGroups(sd) {
		return nil
	}
	// Set logic needs healthy groups to tell elements apart: with none (a job of one group,
	// or every group slow), every element the slow groups share would qualify, so nothing
	// is named.
	if !m.links.anyHealthyGroup() {
		return nil
	}
	slowGroups := m.markElements(j, sd)
	out := m.links.cover(slowGroups)
	m.explainedCollectives(sd, out)
	if traceWhatIf != nil {
		l := &m.links
		for c := range sd.colls {
			if !l.hasRef[c] {
				continue
			}
			rec := &sd.colls[c]
			var ranks []int32
			for i := rec.first; i < rec.first+rec.n; i++ {
				ranks = append(ranks, sd.ops[i].rank)
			}
			traceWhatIf(sd.step, "link %s %s %d B ranks %v: transfer %.4f ref %.4f slow %v healthy %v",
				rec.pg, rec.op, rec.bytes, ranks, m.transfer[c], l.refT[c], l.slow[c], l.healthy[c])
		}
		for _, o := range out {
			traceWhatIf(sd.step, "located %s (%d groups)", o.suspect.ID(), len(o.groups))
		}
	}
	sort.Slice(out, func(x, y int) bool { return out[x].suspect.ID() < out[y].suspect.ID() })
	return out
}

// judgeGroups folds the step's judged transfers into its groups (by pg id): a group is slow
// when one of its transfers was slow (groupExcess sums what they lost), and healthy evidence
// when one of its transfers large enough to show the slow links was healthy and none of
// those was in between (neither healthy nor slow). It reports whether any group is slow.
func (m *model) judgeGroups(sd *stepData) bool {
	l := &m.links
	nGroups := len(m.pgIDs)
	l.groupSlow = grow(l.groupSlow, nGroups)
	l.groupHealthy = grow(l.groupHealthy, nGroups)
	l.groupSeen = grow(l.groupSeen, nGroups)
	l.groupColl = grow(l.groupColl, nGroups)
	clear(l.groupSlow)
	clear(l.groupSeen)
	clear(l.groupHealthy)
	l.groupDoubt = grow(l.groupDoubt, nGroups)
	clear(l.groupDoubt)
	l.groupExcess = grow(l.groupExcess, nGroups)
	clear(l.groupExcess)
	anySlow := false
	slowBytes := int64(math.MaxInt64)
	for c := range sd.colls {
		if l.hasRef[c] && l.slow[c] {
			slowBytes = min(slowBytes, sd.colls[c].bytes)
		}
	}
	for c := range sd.colls {
		if !l.hasRef[c] {
			continue
		}
		g := m.pgID[c]
		l.groupSeen[g] = true
		l.groupColl[g] = int32(c)
		large := sd.colls[c].bytes*healthyBytesRatio >= slowBytes
		switch {
		case l.slow[c]:
			l.groupSlow[g] = true
			l.groupExcess[g] += m.transfer[c] - l.refT[c]
			anySlow = true
		case large && l.healthy[c]:
			l.groupHealthy[g] = true
		case large:
			l.groupDoubt[g] = true
		}
	}
	for g := range nGroups {
		l.groupHealthy[g] = l.groupHealthy[g] && !l.groupDoubt[g]
	}
	return anySlow
}

// healthyGroup reports whether group g is healthy evidence (seen, healthy and not slow).
func (l *linkScratch) healthyGroup(g int) bool {
	return l.groupSeen[g] && l.groupHealthy[g] && !l.groupSlow[g]
}

// anyHealthyGroup reports whether some group of the step is healthy evidence.
func (l *linkScratch) anyHealthyGroup() bool {
	for g := range l.groupSeen {
		if l.healthyGroup(g) {
			return true
		}
	}
	return false
}

// markElements resets the element tables and marks, for every slow and every healthy group,
// the elements its members use (see markGroup). It returns the slow groups.
func (m *model) markElements(j *jobState, sd *stepData) []int32 {
	l := &m.links
	if l.elements == nil {
		l.elements = make(map[string]int32)
	}
	clear(l.elements)
	l.elemName = l.elemName[:0]
	l.elemSlow = l.elemSlow[:0]
	l.elemHealthy = l.elemHealthy[:0]
	l.elemMark = l.elemMark[:0]
	for i := range l.elemGroups {
		l.elemGroups[i] = l.elemGroups[i][:0]
	}
	l.elemGroups = l.elemGroups[:0]
	var slowGroups []int32
	for g := range l.groupSlow {
		slow, healthy := l.groupSlow[g], l.healthyGroup(g)
		if !slow && !healthy {
			continue
		}
		if slow {
			slowGroups = append(slowGroups, int32(g))
		}
		m.markGroup(j, sd, int32(g), slow)
	}
	return slowGroups
}

// markGroup marks the elements the members of group g use (from the topology of its
// collective groupColl[g]): each member's host and, when the group spans hosts, its NIC;
// each switch and, when the group spans switches, their uplinks. A slow group counts in
// elemSlow and is listed in elemGroups, a healthy one counts in elemHealthy; each element
// counts a group once.
func (m *model) markGroup(j *jobState, sd *stepData, g int32, slow bool) {
	l := &m.links
	rec := &sd.colls[l.groupColl[g]]
	switches := make(map[string]struct{})
	hosts := make(map[string]struct{})
	for i := rec.first; i < rec.first+rec.n; i++ {
		t := j.topology.at(sd.ops[i].rank)
		if knownName(t.Switch) {
			switches[t.Switch] = struct{}{}
		}
		hosts[t.Host] = struct{}{}
	}
	// A group inside one host does not use the host's NICs (NVLink, PCIe, shared
	// memory): it says nothing about them.
	usesNICs := len(hosts) > 1
	for i := rec.first; i < rec.first+rec.n; i++ {
		t := j.topology.at(sd.ops[i].rank)
		if !knownName(t.Host) {
			continue
		}
		if knownName(t.NIC) && usesNICs {
			m.markElement(Suspect{Kind: SuspectNIC, Name: t.NIC, Host: t.Host}, g, slow)
		}
		m.markElement(Suspect{Kind: SuspectHost, Name: t.Host}, g, slow)
	}
	for s := range switches {
		if len(switches) > 1 {
			m.markElement(Suspect{Kind: SuspectUplink, Name: s}, g, slow)
		}
		m.markElement(Suspect{Kind: SuspectSwitch, Name: s}, g, slow)
	}
}

// markElement counts group g for element s, once per group.
func (m *model) markElement(s Suspect, g int32, slow bool) {
	l := &m.links
	e := m.element(s)
	if l.elemMark[e] == g {
		return
	}
	l.elemMark[e] = g
	if slow {
		l.elemSlow[e]++
		l.elemGroups[e] = append(l.elemGroups[e], g)
	} else {
		l.elemHealthy[e]++
	}
}

// cover chooses the suspects that explain slowGroups, greedily: each round names the
// elements of no healthy group whose uncovered slow groups lost the most time (see
// bestElements), and covers their groups; at most maxCover rounds, and none once more
// than maxAmbiguous elements tie. Each suspect comes with the groups it newly covered.
func (l *linkScratch) cover(slowGroups []int32) []located {
	l.covered = grow(l.covered, len(l.groupSlow))
	clear(l.covered)
	remaining := len(slowGroups)
	var out []located
	var tied []int32
	for round := 0; round < maxCover && remaining > 0; round++ {
		var best float64
		best, tied = l.bestElements(tied[:0])
		if best <= 0 {
			break
		}
		// A NIC and its host explain the same groups; when every NIC of the host is
		// implicated the host is the better name (NIC and host tie: the NIC wins in
		// bestElements).
		if len(tied) > maxAmbiguous {
			break
		}
		for _, e := range tied {
			loc := located{suspect: l.elemName[e]}
			for _, g := range l.elemGroups[e] {
				if !l.covered[g] {
					loc.groups = append(loc.groups, g)
				}
			}
			out = append(out, loc)
		}
		for _, e := range tied {
			for _, g := range l.elemGroups[e] {
				if !l.covered[g] {
					l.covered[g] = true
					remaining--
				}
			}
		}
	}
	return out
}

// outweighFactor: an element in a healthy group is named all the same where the slow groups
// it is in lost at least this many times what those of the best element in no healthy group
// lost, and hold all of that element's (it explains everything the other does, and much
// more). A NIC slowed in one direction shows healthy messages in the other: on the demo's
// fabric, messages into a rank behind a NIC throttled to a quarter were quick (only its
// sends queue), and the set logic named instead, for eleven steps, the NIC of a healthy
// neighbour whose two slow messages were with that rank.
const outweighFactor = 4

// bestElements scores each element in no healthy group by the time its uncovered slow
// groups lost, and appends to tied the elements of the best score (equal within a relative
// 1e-9) of the most specific kind among those. An element in a healthy group that outweighs
// them (see outweighFactor) is chosen instead. It returns the best score (0 when no element
// covers an uncovered group) and tied.
func (l *linkScratch) bestElements(tied []int32) (float64, []int32) {
	best, tied := l.bestHealthyFree(tied)
	if best <= 0 {
		// Nothing to outweigh: an element of a healthy group alone is never named (with no
		// rival in no healthy group, the set logic has nothing to tell it from).
		return best, tied
	}
	// The most specific element in a healthy group that outweighs them, if any.
	pick, pickLost, pickKind := int32(-1), 0.0, SuspectKind(255)
	for e := range l.elemName {
		if l.elemHealthy[e] == 0 || l.elemSlow[e] == 0 {
			continue
		}
		lost := l.uncoveredLost(int32(e))
		kind := l.elemName[e].Kind
		if lost <= 0 || lost < outweighFactor*best || !l.holdsGroupsOf(int32(e), tied) {
			continue
		}
		if kind < pickKind || (kind == pickKind && lost > pickLost) {
			pick, pickLost, pickKind = int32(e), lost, kind
		}
	}
	if pick >= 0 {
		return pickLost, append(tied[:0], pick)
	}
	return best, tied
}

// uncoveredLost is the time element e's uncovered slow groups lost (0 when it covers none).
func (l *linkScratch) uncoveredLost(e int32) float64 {
	lost := 0.0
	for _, g := range l.elemGroups[e] {
		if !l.covered[g] {
			lost += max(l.groupExcess[g], 1e-12)
		}
	}
	return lost
}

// holdsGroupsOf reports whether element e is in every uncovered slow group of the elements
// others.
func (l *linkScratch) holdsGroupsOf(e int32, others []int32) bool {
	for _, o := range others {
		for _, g := range l.elemGroups[o] {
			if !l.covered[g] && !slices.Contains(l.elemGroups[e], g) {
				return false
			}
		}
	}
	return true
}

// bestHealthyFree is bestElements over the elements in no healthy group.
func (l *linkScratch) bestHealthyFree(tied []int32) (float64, []int32) {
	best, bestKind := 0.0, SuspectKind(255)
	for e := range l.elemName {
		if l.elemHealthy[e] > 0 || l.elemSlow[e] == 0 {
			continue
		}
		lost := l.uncoveredLost(int32(e)) // 0 only when it covers no uncovered group
		kind := l.elemName[e].Kind
		same := math.Abs(lost-best) <= 1e-9*max(lost, best)
		switch {
		case lost == 0:
		case (lost > best && !same) || (same && kind < bestKind):
			best, bestKind = lost, kind
			tied = append(tied[:0], int32(e))
		case same && kind == bestKind:
			tied = append(tied, int32(e))
		}
	}
	return best, tied
}

// explainedCollectives attaches to each located suspect the slow collectives of the groups
// it explains.
func (m *model) explainedCollectives(sd *stepData, out []located) {
	l := &m.links
	for i := range out {
		for c := range sd.colls {
			if l.slow[c] && containsInt32(out[i].groups, m.pgID[c]) {
				out[i].colls = append(out[i].colls, int32(c))
			}
		}
	}
}

// located is a suspect with the slow groups and collectives it explains.
type located struct {
	suspect Suspect
	groups  []int32
	colls   []int32
}

func containsInt32(list []int32, v int32) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
