package diagnosis

import (
	"math"
	"slices"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// maxCausePeers bounds the peers whose phases are read for one cause.
const maxCausePeers = 15

// ownWork is how much of a rank's own work (its gaps) in the step lay inside each kind of
// phase span, and outside all of them (its host-side work), on its own clock: the spans of
// this step and the previous one (a slow optimizer.step ends one step and delays the start
// of the next). Where the rank's phase entries hold their spans, each gap is overlapped
// with them; else with each kind's interval (first start to last end), which on a pipeline
// rank covers most of the step and leaves no host time to see.
type ownWork struct {
	fetch, compute, host float64
	ok                   bool
}

func overlap(a0, a1, b0, b1 int64) int64 {
	lo, hi := max(a0, b0), min(a1, b1)
	return max(0, hi-lo)
}

func (m *model) ownWork(a *Analyzer, j *jobState, sd *stepData, ri int32) ownWork {
	entries := [2]*phaseEntry{m.curPh[ri], m.prevPh[ri]}
	var w ownWork
	var fetch, compute, total int64
	for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
		g0, g1 := m.refOwn[p], sd.ops[m.order[p]].start
		total += max(0, g1-g0)
	}
	if spans, ok := m.rankSpans(ri); ok {
		w.ok = true
		k := 0
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			g0, g1 := m.refOwn[p], sd.ops[m.order[p]].start
			if g1 <= g0 {
				continue
			}
			for k < len(spans) && spans[k].end() <= g0 {
				k++
			}
			for i := k; i < len(spans) && spans[i].start < g1; i++ {
				o := overlap(g0, g1, spans[i].start, spans[i].end())
				if spans[i].kind == PhaseFetch {
					fetch += o
				} else {
					compute += o
				}
			}
		}
	} else {
		for _, e := range entries {
			if e == nil {
				continue
			}
			w.ok = true
			for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
				g0, g1 := m.refOwn[p], sd.ops[m.order[p]].start
				if g1 <= g0 {
					continue
				}
				for _, kind := range [...]PhaseKind{PhaseFetch, PhaseForward, PhaseBackward,
					PhaseOptimizer} {
					iv, ok := e.get(kind)
					if !ok {
						continue
					}
					o := overlap(g0, g1, iv.start, iv.end)
					if kind == PhaseFetch {
						fetch += o
					} else {
						compute += o
					}
				}
			}
		}
	}
	w.fetch, w.compute = float64(fetch)/1e9, float64(compute)/1e9
	w.host = max(0, float64(total-fetch-compute)/1e9)
	return w
}

// rankSpans returns the rank's phase spans of this step and the previous one sorted by
// start (m.spanScratch, valid until the next call), ok false where its entry of this step
// is missing or lost its spans.
func (m *model) rankSpans(ri int32) ([]phaseSpan, bool) {
	cur, prev := m.curPh[ri], m.prevPh[ri]
	if cur == nil || cur.spansLost {
		return nil, false
	}
	m.spanScratch = append(m.spanScratch[:0], cur.spans...)
	if prev != nil && !prev.spansLost {
		m.spanScratch = append(m.spanScratch, prev.spans...)
	}
	slices.SortFunc(m.spanScratch, func(x, y phaseSpan) int { return cmpInt64(x.start, y.start) })
	return m.spanScratch, true
}

// hostWorkBefore says where the rank's longest stretch of own time outside every phase span
// sat in the step: the span it preceded (a phase, or the collective the gap ended at).
func (m *model) hostWorkBefore(sd *stepData, ri int32) string {
	spans, ok := m.rankSpans(ri)
	if !ok {
		return ""
	}
	best, where := int64(0), ""
	k := 0
	for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
		g0, g1 := m.refOwn[p], sd.ops[m.order[p]].start
		if g1 <= g0 {
			continue
		}
		for k < len(spans) && spans[k].end() <= g0 {
			k++
		}
		edge := g0
		for i := k; i < len(spans) && spans[i].start < g1; i++ {
			if hole := spans[i].start - edge; hole > best {
				best, where = hole, phaseSpanName(spans[i].kind)
			}
			edge = max(edge, spans[i].end())
		}
		if hole := g1 - edge; hole > best {
			rec := &sd.colls[m.coll[p]]
			best, where = hole, collectiveSpanName(rec)
		}
	}
	return where
}

// phaseSpanName is the span name of a data or compute phase kind.
func phaseSpanName(k PhaseKind) string {
	switch k {
	case PhaseFetch:
		return semconv.SpanDataloaderFetch
	case PhaseForward:
		return semconv.SpanForward
	case PhaseBackward:
		return semconv.SpanBackward
	default:
		return semconv.SpanOptimizerStep
	}
}

// collectiveSpanName is the span name of a collective (collective.<op>; a message's side is
// collective.send or collective.recv, which its op names).
func collectiveSpanName(rec *collRec) string {
	return semconv.SpanCollectivePrefix + rec.op
}

// learnUsual adds a sample to a rank's usual time unless it is far above it: a rank that
// stays slow (a rack whose ranks are each other's peers, so that none stands out as a
// candidate in every step) must keep reading as slow, not learn its slowness as usual.
func learnUsual(h *ewma, v float64) {
	if h.samples < minHistorySamples || v <= 1.5*h.mean+1e-3 {
		h.add(v, historyAlpha)
	}
}

// learnWork updates the work history of the ranks that were not candidates in this step.
func (m *model) learnWork(a *Analyzer, j *jobState, sd *stepData, candidate []bool) {
	for ri := range m.rankOf {
		if candidate[ri] {
			continue
		}
		rank := m.rankOf[ri]
		h := j.work[rank]
		if h == nil {
			if len(j.work) >= maxTrackedRanks {
				continue
			}
			h = &workHistory{}
			j.work[rank] = h
		}
		w := m.ownWork(a, j, sd, int32(ri))
		if w.ok {
			learnUsual(&h.fetch, w.fetch)
			learnUsual(&h.compute, w.compute)
			learnUsual(&h.host, w.host)
		}
	}
}

// cause says what the rank's excess own work was: data when its time inside
// dataloader.fetch exceeds its peers' median by cause_min_fraction of its excess, compute
// when its time inside forward, backward and optimizer.step does, host_work when its time
// outside every phase span does (with where the longest stretch of it sat); else unknown.
// Of several that qualify, the largest.
func (m *model) cause(a *Analyzer, j *jobState, sd *stepData, ri int32) (string, string) {
	own := m.ownWork(a, j, sd, ri)
	if !own.ok {
		return semconv.CauseUnknown, ""
	}
	var peers []int32
	peers = sample(m.classes[m.classOf[ri]], ri, peers)
	if len(peers) > maxCausePeers {
		stride := (len(peers) + maxCausePeers - 1) / maxCausePeers
		kept := peers[:0]
		for i := 0; i < len(peers); i += stride {
			kept = append(kept, peers[i])
		}
		peers = kept
	}
	var fetches, computes, hosts []float64
	for _, pi := range peers {
		w := m.ownWork(a, j, sd, pi)
		if w.ok {
			fetches = append(fetches, w.fetch)
			computes = append(computes, w.compute)
			hosts = append(hosts, w.host)
		}
	}
	refFetch, refCompute, refHost := math.Inf(1), math.Inf(1), math.Inf(1)
	if len(fetches) > 0 {
		refFetch, refCompute, refHost = median(fetches), median(computes), median(hosts)
	}
	// Its own usual work caps the peers' (peers slowed down together are no reference);
	// without either, the phases its excess lay in say what it was.
	if h := j.work[m.rankOf[ri]]; h != nil && h.fetch.samples >= minHistorySamples {
		refFetch, refCompute = min(refFetch, h.fetch.mean), min(refCompute, h.compute.mean)
		if h.host.samples >= minHistorySamples {
			refHost = min(refHost, h.host.mean)
		}
	}
	data, compute, host := own.fetch, own.compute, 0.0
	if !math.IsInf(refFetch, 1) {
		data, compute = own.fetch-refFetch, own.compute-refCompute
	}
	if !math.IsInf(refHost, 1) {
		// Host time needs a reference: without one, the gaps between phases of any rank
		// (launches, the Python between them) would read as its own excess.
		host = own.host - refHost
	}
	need := a.cfg.CauseMinFraction * m.excess[ri]
	switch {
	case data >= need && data >= compute && data >= host:
		return semconv.CauseData, ""
	case compute >= need && compute >= host:
		return semconv.CauseCompute, ""
	case host >= need:
		return semconv.CauseHostWork, m.hostWorkBefore(sd, ri)
	default:
		return semconv.CauseUnknown, ""
	}
}
