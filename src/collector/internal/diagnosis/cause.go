package diagnosis

import (
	"math"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// maxCausePeers bounds the peers whose phases are read for one cause.
const maxCausePeers = 15

// ownWork is how much of a rank's own work (its gaps) in the step lay inside each kind of
// phase span, on its own clock: the spans of this step and the previous one (a slow
// optimizer.step ends one step and delays the start of the next).
type ownWork struct {
	fetch, compute float64
	ok             bool
}

func overlap(a0, a1, b0, b1 int64) int64 {
	lo, hi := max(a0, b0), min(a1, b1)
	return max(0, hi-lo)
}

func (m *model) ownWork(a *Analyzer, j *jobState, sd *stepData, ri int32) ownWork {
	entries := [2]*phaseEntry{m.curPh[ri], m.prevPh[ri]}
	var w ownWork
	var fetch, compute int64
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
	w.fetch, w.compute = float64(fetch)/1e9, float64(compute)/1e9
	return w
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
		}
	}
}

// cause says what the rank's excess own work was: data when its time inside
// dataloader.fetch exceeds its peers' median by cause_min_fraction of its excess, compute
// when its time inside forward, backward and optimizer.step does; else unknown.
func (m *model) cause(a *Analyzer, j *jobState, sd *stepData, ri int32) string {
	own := m.ownWork(a, j, sd, ri)
	if !own.ok {
		return semconv.CauseUnknown
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
	var fetches, computes []float64
	for _, pi := range peers {
		w := m.ownWork(a, j, sd, pi)
		if w.ok {
			fetches = append(fetches, w.fetch)
			computes = append(computes, w.compute)
		}
	}
	refFetch, refCompute := math.Inf(1), math.Inf(1)
	if len(fetches) > 0 {
		refFetch, refCompute = median(fetches), median(computes)
	}
	// Its own usual work caps the peers' (peers slowed down together are no reference);
	// without either, the phases its excess lay in say what it was.
	if h := j.work[m.rankOf[ri]]; h != nil && h.fetch.samples >= minHistorySamples {
		refFetch, refCompute = min(refFetch, h.fetch.mean), min(refCompute, h.compute.mean)
	}
	data, compute := own.fetch, own.compute
	if !math.IsInf(refFetch, 1) {
		data, compute = own.fetch-refFetch, own.compute-refCompute
	}
	need := a.cfg.CauseMinFraction * m.excess[ri]
	switch {
	case data >= need && data >= compute:
		return semconv.CauseData
	case compute >= need:
		return semconv.CauseCompute
	default:
		return semconv.CauseUnknown
	}
}
