package diagnosis

import (
	"math"
	"slices"
)

// The job-wide ideal of a pipeline step (the what-if analysis' idealization: "Understanding
// Stragglers in Large Model Training Using What-if Analysis", OSDI'25). Each op is set to the
// median of its kind over every worker of the step, not to its own stage's: a stage that
// holds more layers than the others is excess against that ideal, where against its own
// replicas it is not. The step model has gaps, not ops: a pipeline rank's gap between two
// messages holds one forward or backward (or a fetch and a forward, or a whole optimizer
// step), which its phase spans say. So each gap is split into the phase spans that lay in
// it (by their midpoint, on the rank's clock) and the rest, the rank's own host time:
//
//	ideal gap = Σ over its phase spans of the median duration of that span's kind in the step
//	          + the median host time of the step's gaps with the same phase spans (counts)
//
// A gap whose rank sent no phase spans (or more than maxPhaseSpans) is at its class's median
// (m.medGap). Jobs without pipeline stages are at that everywhere: there every rank runs the
// same program, and the class's median at each position is the median of its kind.

// numContentKinds counts the phase kinds a gap is split into: fetch, forward, backward,
// optimizer (PhaseFetch..PhaseOptimizer).
const numContentKinds = 4

// gapContent is what lay in one gap: per phase kind, the spans' count and summed duration
// (seconds), and the largest stretch of the gap outside every phase span with what followed
// it (a phase kind, or -1: the gap's collective).
type gapContent struct {
	n         [numContentKinds]int32
	dur       [numContentKinds]float64
	hole      float64
	holeAfter int8
}

// phased is the gap's time inside phase spans, seconds.
func (g *gapContent) phased() float64 {
	var d float64
	for k := range numContentKinds {
		d += g.dur[k]
	}
	return d
}

// signature identifies a gap's phase counts (the kind of its host time).
func (g *gapContent) signature() uint64 {
	var s uint64
	for k := range numContentKinds {
		s = s<<16 | uint64(min(g.n[k], math.MaxUint16))
	}
	return s
}

// contentScratch is readContents' and kindIdeal's scratch, reused from step to step.
type contentScratch struct {
	content []gapContent
	// known marks the ranks whose phase spans were read (their gaps have a content).
	known []bool
	spans []phaseSpan
	// kindMedian is each phase kind's median span duration in the step (seconds; NaN none).
	kindMedian [numContentKinds]float64
	byKind     [numContentKinds][]float64
	hostBySig  map[uint64][]float64
	hostMedian map[uint64]float64
}

// readContents splits every gap of the step into the phase spans that lay in it (see the
// comment above), for the ranks whose phase entries hold their spans. It reads m.curPh,
// m.prevPh, m.refOwn and the spans' launches, after timeline.
func (m *model) readContents(sd *stepData) {
	c := &m.kinds
	n := len(m.order)
	c.content = grow(c.content, n)
	clear(c.content)
	c.known = grow(c.known, len(m.rankOf))
	for ri := range m.rankOf {
		c.known[ri] = false
		cur, prev := m.curPh[ri], m.prevPh[ri]
		if cur == nil || cur.spansLost || len(cur.spans) == 0 {
			continue
		}
		c.spans = append(c.spans[:0], cur.spans...)
		if prev != nil && !prev.spansLost {
			c.spans = append(c.spans, prev.spans...)
		}
		slices.SortFunc(c.spans, func(x, y phaseSpan) int {
			return cmpInt64(x.start+int64(x.dur)/2, y.start+int64(y.dur)/2)
		})
		c.known[ri] = true
		k := 0
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			g0, g1 := m.refOwn[p], sd.ops[m.order[p]].start
			gc := &c.content[p]
			gc.holeAfter = -1
			edge := g0 // the end of the last phase span in the gap so far
			for k < len(c.spans) && c.spans[k].start+int64(c.spans[k].dur)/2 < g0 {
				k++
			}
			for k < len(c.spans) && c.spans[k].start+int64(c.spans[k].dur)/2 < g1 {
				s := c.spans[k]
				kind := s.kind - PhaseFetch
				gc.n[kind]++
				gc.dur[kind] += float64(s.dur) / 1e9
				if hole := float64(s.start-edge) / 1e9; hole > gc.hole {
					gc.hole, gc.holeAfter = hole, int8(kind)
				}
				edge = max(edge, s.end())
				k++
			}
			if hole := float64(g1-edge) / 1e9; hole > gc.hole {
				gc.hole, gc.holeAfter = hole, -1
			}
		}
	}
}

// maxKindSample bounds the ranks whose spans give a kind's median (evenly spread).
const maxKindSample = 255

// kindIdeal sets m.jobGap: each gap of a pipeline step at its job-wide ideal (see above),
// its class's median (m.medGap) where the rank's phase spans are unknown. It runs after
// readContents and references.
func (m *model) kindIdeal() {
	c := &m.kinds
	n := len(m.order)
	m.jobGap = grow(m.jobGap, n)
	copy(m.jobGap, m.medGap)
	nr := len(m.rankOf)
	stride := 1
	if nr > maxKindSample {
		stride = (nr + maxKindSample - 1) / maxKindSample
	}
	for k := range numContentKinds {
		c.byKind[k] = c.byKind[k][:0]
	}
	if c.hostBySig == nil {
		c.hostBySig = make(map[uint64][]float64)
		c.hostMedian = make(map[uint64]float64)
	}
	for sig, v := range c.hostBySig {
		c.hostBySig[sig] = v[:0]
	}
	clear(c.hostMedian)
	any := false
	for ri := 0; ri < nr; ri += stride {
		if !c.known[ri] {
			continue
		}
		any = true
		for _, s := range m.curPh[ri].spans {
			c.byKind[s.kind-PhaseFetch] = append(c.byKind[s.kind-PhaseFetch], float64(s.dur)/1e9)
		}
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			gc := &c.content[p]
			sig := gc.signature()
			c.hostBySig[sig] = append(c.hostBySig[sig], max(0, m.gap[p]-gc.phased()))
		}
	}
	if !any {
		return
	}
	for k := range numContentKinds {
		c.kindMedian[k] = math.NaN()
		if len(c.byKind[k]) > 0 {
			c.kindMedian[k] = median(c.byKind[k])
		}
	}
	for sig, v := range c.hostBySig {
		if len(v) > 0 {
			c.hostMedian[sig] = median(v)
		}
	}
	for ri := range nr {
		if !c.known[ri] {
			continue
		}
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			gc := &c.content[p]
			host, ok := c.hostMedian[gc.signature()]
			if !ok {
				host = max(0, m.gap[p]-gc.phased())
			}
			ideal := host
			for k := range numContentKinds {
				if gc.n[k] == 0 {
					continue
				}
				med := c.kindMedian[k]
				if math.IsNaN(med) {
					med = gc.dur[k] / float64(gc.n[k])
				}
				ideal += float64(gc.n[k]) * med
			}
			m.jobGap[p] = ideal
		}
	}
}
