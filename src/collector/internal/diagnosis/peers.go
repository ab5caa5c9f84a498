package diagnosis

import (
	"hash/maphash"
	"slices"
)

// maxPeerSample bounds the peers read for one median: a median over an evenly spread
// sample of 63 peers is as good as over 4095, at a 60th of the cost.
const maxPeerSample = 63

// minHistorySamples is how many steps a rank without peers needs before its own history
// can stand in for them.
const minHistorySamples = 3

// warmupSteps is how many of a job's first analyzed steps teach the ranks' usual work
// (data loading, compute) nothing.
const warmupSteps = 2

// historyAlpha is the EWMA weight of a new gap sample in a rank's own history.
const historyAlpha = 0.2

var seqSeed = maphash.MakeSeed()

// classify groups ranks whose spans in the step form the same sequence (operation, group
// size, role, async): ranks with the same role in the job (the data-parallel replicas of a
// pipeline stage, or every rank of an SPMD job) are each other's peers.
func (m *model) classify(sd *stepData) {
	clear(m.classIdx)
	for i := range m.classes {
		m.classes[i] = m.classes[i][:0]
	}
	m.classes = m.classes[:0]
	var h maphash.Hash
	h.SetSeed(seqSeed)
	for ri := range m.rankOf {
		h.Reset()
		// Ranks of different pipeline stages are no peers, whatever their spans.
		st := m.stage[ri]
		h.Write([]byte{byte(st), byte(st >> 8), byte(st >> 16), 0xfe})
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			rec := &sd.colls[m.coll[p]]
			op := &sd.ops[m.order[p]]
			h.WriteString(rec.op)
			var b [6]byte
			b[0] = byte(rec.pgSize)
			b[1] = byte(rec.pgSize >> 8)
			b[2] = byte(rec.pgSize >> 16)
			b[3] = byte(op.role)
			if op.async {
				b[4] = 1
			}
			b[5] = 0xff
			h.Write(b[:])
		}
		key := h.Sum64()
		ci, ok := m.classIdx[key]
		if !ok {
			ci = int32(len(m.classes))
			m.classIdx[key] = ci
			if len(m.classes) < cap(m.classes) {
				m.classes = m.classes[:ci+1]
			} else {
				m.classes = append(m.classes, nil)
			}
		}
		m.classes[ci] = append(m.classes[ci], int32(ri))
		m.classOf[ri] = ci
	}
}

// sample returns up to maxPeerSample members of a class, evenly spread, excluding skip.
func sample(members []int32, skip int32, dst []int32) []int32 {
	dst = dst[:0]
	stride := 1
	if len(members) > maxPeerSample {
		stride = (len(members) + maxPeerSample - 1) / maxPeerSample
	}
	for i := 0; i < len(members); i += stride {
		if members[i] != skip {
			dst = append(dst, members[i])
		}
	}
	return dst
}

// references sets each position's peer reference gap and each rank's excess: the median
// gap of its class at the same position (the faster of two peers), capped by the rank's own
// history (the only reference of a rank without peers). It also sets m.medGap, the plain
// median of the class at each position (the faster of two; a rank without peers its own gap
// capped by its history as above): the job's ideal of a step without pipeline stages, where
// every rank of a class runs the same program and that median is the median of its kind.
func (m *model) references(j *jobState) {
	var peers []int32
	m.medGap = grow(m.medGap, len(m.order))
	defer func() {
		for _, members := range m.classes {
			if len(members) == 1 {
				ri := members[0]
				copy(m.medGap[m.rankStart[ri]:m.rankStart[ri+1]], m.refGap[m.rankStart[ri]:m.rankStart[ri+1]])
			}
		}
	}()
	for _, members := range m.classes {
		n := int(m.rankStart[members[0]+1] - m.rankStart[members[0]])
		if len(members) == 1 {
			ri := members[0]
			hist := j.history[m.rankOf[ri]]
			for k := range n {
				p := m.rankStart[ri] + int32(k)
				m.refGap[p] = m.gap[p]
				if len(hist) == n && hist[k].samples >= minHistorySamples {
					m.refGap[p] = min(m.gap[p], hist[k].mean)
				}
			}
			continue
		}
		peers = sample(members, -1, peers)
		for k := range n {
			vals := m.vals[:0]
			for _, ri := range peers {
				vals = append(vals, m.gap[m.rankStart[ri]+int32(k)])
			}
			m.vals = vals
			var ref float64
			if len(vals) == 2 {
				ref = min(vals[0], vals[1])
			} else {
				ref = median(vals)
			}
			// Of two, the faster: the mean of a straggler and its one peer is no usual speed.
			med := ref
			if len(vals) > 2 {
				med = median(vals)
			}
			for _, ri := range members {
				m.refGap[m.rankStart[ri]+int32(k)] = ref
				m.medGap[m.rankStart[ri]+int32(k)] = med
			}
		}
		// Peers that all slowed down together (a rack, the replicas of one stage) are no
		// reference for each other: each rank's own history caps its reference too.
		for _, ri := range members {
			hist := j.history[m.rankOf[ri]]
			if len(hist) != n {
				continue
			}
			for k := range n {
				if hist[k].samples >= minHistorySamples {
					p := m.rankStart[ri] + int32(k)
					m.refGap[p] = min(m.refGap[p], hist[k].mean)
				}
			}
		}
	}
	for ri := range m.rankOf {
		var excess float64
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			excess += max(0, m.gap[p]-m.refGap[p])
		}
		m.excess[ri] = excess
	}
}

// learnHistory updates every rank's own history from gaps that were not excessive (a rank
// that stays slow must keep reading as slow).
func (m *model) learnHistory(j *jobState) {
	for ri := range m.rankOf {
		rank := m.rankOf[ri]
		n := int(m.rankStart[ri+1] - m.rankStart[ri])
		hist := j.history[rank]
		if len(hist) != n {
			if len(j.history) >= maxTrackedRanks {
				continue
			}
			hist = make([]ewma, n)
			j.history[rank] = hist
		}
		for k := range n {
			learnUsual(&hist[k], m.gap[m.rankStart[ri]+int32(k)])
		}
	}
}

// median sorts vals in place.
func median(vals []float64) float64 {
	if len(vals) == 0 {
		return 0
	}
	slices.Sort(vals)
	mid := len(vals) / 2
	if len(vals)%2 == 0 {
		return (vals[mid-1] + vals[mid]) / 2
	}
	return vals[mid]
}
