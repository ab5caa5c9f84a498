package diagnosis

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Partition is a stage partition advised from the ranks' layer profiles (pipeline.layers):
// the layers per stage now and advised, each stage's layer time per step under both, and what
// the step replay says the advised one saves.
type Partition struct {
	// Layers is the advised layers per stage; Current the layers per stage now.
	Layers, Current []int
	// Before and After are each stage's layer seconds per step (forward plus backward,
	// summed over micro-batches) now and under Layers.
	Before, After []float64
	// Saving is the replayed step's seconds saved (>= 0).
	Saving float64
	// Names are every stage's layer names, stages in order (for the fix text; not on the
	// wire).
	Names []string
}

// SplitPoints is the index of each stage's first layer after the first stage (what a
// pipeline's split points take).
func (p *Partition) SplitPoints() []int {
	var out []int
	at := 0
	for _, n := range p.Layers[:max(0, len(p.Layers)-1)] {
		at += n
		out = append(out, at)
	}
	return out
}

// LayerProfile is one rank's pipeline.layers span: its model's child modules and each one's
// forward and backward seconds in the step, summed over its micro-batches.
type LayerProfile struct {
	Step              int64
	Names             []string
	Forward, Backward []float64
	Microbatches      int
}

// MaxProfileLayers bounds the layers one profile may hold (a longer one is ignored).
const MaxProfileLayers = 4096

// maxProfiledRanks bounds the ranks of a job whose latest profile is kept.
const maxProfiledRanks = 1 << 14

// valid reports whether the profile has at least one layer, one time of each kind per layer,
// and every time finite and >= 0.
func (p *LayerProfile) valid() bool {
	n := len(p.Names)
	if n == 0 || n > MaxProfileLayers || len(p.Forward) != n || len(p.Backward) != n {
		return false
	}
	for i := range n {
		f, b := p.Forward[i], p.Backward[i]
		if !(f >= 0 && b >= 0) || math.IsInf(f, 1) || math.IsInf(b, 1) {
			return false
		}
	}
	return true
}

// profileMemory is how many of a rank's latest profiles (of the same layers) its layer costs
// are the median of: one sampled step on a busy host can hold a descheduled layer.
const profileMemory = 3

// profiles are a rank's latest layer profiles of the same layers, the latest last.
type profiles struct {
	recent []LayerProfile
}

func (h *profiles) latest() *LayerProfile { return &h.recent[len(h.recent)-1] }

// costs are each layer's forward plus backward seconds: the median over the kept profiles.
func (h *profiles) costs() []float64 {
	n := len(h.latest().Names)
	out := make([]float64, n)
	vals := make([]float64, len(h.recent))
	for i := range n {
		for k := range h.recent {
			vals[k] = h.recent[k].Forward[i] + h.recent[k].Backward[i]
		}
		out[i] = median(vals)
	}
	return out
}

// ObserveLayers records a rank's layer profile; the job keeps each rank's latest
// profileMemory of the same layers (a profile of other layers starts over).
func (a *Analyzer) ObserveLayers(job string, rank int, p LayerProfile, now int64) {
	if rank < 0 || !p.valid() {
		return
	}
	j := a.job(job, now)
	if j.layers == nil {
		j.layers = make(map[int32]*profiles)
	}
	h := j.layers[int32(rank)]
	if h == nil {
		if len(j.layers) >= maxProfiledRanks {
			return
		}
		h = &profiles{}
		j.layers[int32(rank)] = h
	}
	if len(h.recent) > 0 {
		if last := h.latest(); last.Step >= p.Step {
			return
		} else if !slices.Equal(last.Names, p.Names) {
			h.recent = h.recent[:0]
		}
	}
	if len(h.recent) == profileMemory {
		h.recent = append(h.recent[:0], h.recent[1:]...)
	}
	h.recent = append(h.recent, p)
	j.layersVersion++
}

// BestPartition returns the contiguous partition of costs into stages (each at least one
// layer) that minimizes the slowest stage's summed cost; among those, the least sum of the
// stages' squared costs, then the lexicographically smallest counts. The same dynamic
// program, tolerances and order as skewtrace.remedy.partition.best_partition: both give the
// same answer on the same costs. nil when len(costs) < stages or stages < 1.
func BestPartition(costs []float64, stages int) []int {
	n := len(costs)
	if stages < 1 || n < stages {
		return nil
	}
	prefix := make([]float64, n+1)
	for i, c := range costs {
		prefix[i+1] = prefix[i] + c
	}
	seg := func(i, j int) float64 { return prefix[j] - prefix[i] }
	inf := math.Inf(1)
	bestMax := make([][]float64, stages+1)
	for s := range bestMax {
		bestMax[s] = make([]float64, n+1)
		for i := range bestMax[s] {
			bestMax[s][i] = inf
		}
	}
	bestMax[0][0] = 0
	for s := 1; s <= stages; s++ {
		for i := s; i <= n-(stages-s); i++ {
			v := inf
			for j := s - 1; j < i; j++ {
				v = min(v, max(bestMax[s-1][j], seg(j, i)))
			}
			bestMax[s][i] = v
		}
	}
	bound := bestMax[stages][n]
	slack := 1e-9 * max(bound, 1e-300)
	type choice struct {
		sq     float64
		counts []int
		ok     bool
	}
	best := make([][]choice, stages+1)
	for s := range best {
		best[s] = make([]choice, n+1)
	}
	best[0][0] = choice{ok: true}
	for s := 1; s <= stages; s++ {
		for i := s; i <= n-(stages-s); i++ {
			var ch choice
			for j := s - 1; j < i; j++ {
				prev := best[s-1][j]
				cost := seg(j, i)
				if !prev.ok || cost > bound+slack {
					continue
				}
				sq := prev.sq + cost*cost
				if !ch.ok || sq < ch.sq-slack*bound ||
					(math.Abs(sq-ch.sq) <= slack*bound && lexLess(prev.counts, i-j, ch.counts)) {
					counts := make([]int, len(prev.counts)+1)
					copy(counts, prev.counts)
					counts[len(prev.counts)] = i - j
					ch = choice{sq: sq, counts: counts, ok: true}
				}
			}
			best[s][i] = ch
		}
	}
	if !best[stages][n].ok {
		return nil
	}
	return best[stages][n].counts
}

// lexLess reports whether prev followed by last is lexicographically less than other (of
// the same length).
func lexLess(prev []int, last int, other []int) bool {
	for k, v := range prev {
		if v != other[k] {
			return v < other[k]
		}
	}
	return last < other[len(prev)]
}

// StageCosts sums costs per stage under a partition (layers per stage, in order).
func StageCosts(costs []float64, layers []int) []float64 {
	out := make([]float64, 0, len(layers))
	at := 0
	for _, n := range layers {
		var sum float64
		for _, c := range costs[at : at+n] {
			sum += c
		}
		out = append(out, sum)
		at += n
	}
	return out
}

// advise proposes a partition of the pipeline's layers from the job's layer profiles: each
// stage's latest profile (of any of its ranks: the highest step, then the lowest rank), the
// stages' layers concatenated in order, each layer's cost its forward plus backward seconds
// (the median over that rank's latest profileMemory profiles).
// It prices the advice on the step replay: every stage's pipeline work in gaps scaled so that
// its layers' share goes from their time now to their time under the advice and the rest of
// its work stays (stageScale), against ref, the step replayed from gaps as they are. ok is false when a stage
// has no profile, or the advice is the current partition.
func (m *model) advise(j *jobState, sd *stepData, gaps []float64, ref float64) (*Partition, bool) {
	s := int(m.nStages)
	if s < 2 || len(j.layers) == 0 {
		return nil, false
	}
	pick := make([]int32, s)
	for st := range pick {
		pick[st] = -1
	}
	for ri, rank := range m.rankOf {
		st := m.stage[ri]
		h, ok := j.layers[rank]
		if st < 0 || !ok {
			continue
		}
		cur := pick[st]
		if cur < 0 {
			pick[st] = rank
			continue
		}
		p, q := h.latest(), j.layers[cur].latest()
		if p.Step > q.Step || (p.Step == q.Step && rank < cur) {
			pick[st] = rank
		}
	}
	for _, rank := range pick {
		if rank < 0 {
			return nil, false
		}
	}
	// The partition depends on the profiles alone: computed again only when a profile came
	// or the stages' ranks changed (the dynamic program is O(layers^2 x stages)).
	c := j.advice
	if c == nil || c.version != j.layersVersion || !slices.Equal(c.pick, pick) {
		c = &adviceCache{version: j.layersVersion, pick: pick}
		j.advice = c
		c.part = partitionOf(j, pick)
	}
	if c.part == nil {
		return nil, false
	}
	adv := *c.part
	// Each stage's pipeline work in the step (its median replica's), of which its layers are
	// Before: the rest (messages' host side, the schedule's own work) stays with the stage.
	m.scale = grow(m.scale, s)
	for st := range s {
		m.vals = m.vals[:0]
		for ri := range m.rankOf {
			if int(m.stage[ri]) != st {
				continue
			}
			var w float64
			for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
				if m.pipelineWork(sd, int32(ri), p) {
					w += gaps[p]
				}
			}
			m.vals = append(m.vals, w)
		}
		m.scale[st] = stageScale(median(m.vals), adv.Before[st], adv.After[st])
	}
	m.stageGap = grow(m.stageGap, len(m.order))
	m.scaleStages(sd, gaps)
	adv.Saving = max(0, ref-m.simulate(sd, m.stageGap, m.replayT))
	return &adv, true
}

// adviceCache is a job's partition (without its saving) for the profiles of version
// layersVersion and the stages' ranks pick; part is nil where there is no advice.
type adviceCache struct {
	version uint64
	pick    []int32
	part    *Partition
}

// maxAdviceWork bounds layers^2 x stages of the partition's dynamic program (about 130 ms at
// the bound on the build machine, BenchmarkBestPartition's 1024x32; once per profile taken,
// not per step): a larger pipeline gets no advice.
const maxAdviceWork = 1 << 25

// partitionOf is the partition of the picked ranks' layers, nil when it is the current one
// or the pipeline is past maxAdviceWork.
func partitionOf(j *jobState, pick []int32) *Partition {
	s := len(pick)
	adv := &Partition{Current: make([]int, s)}
	var costs []float64
	for st, rank := range pick {
		h := j.layers[rank]
		adv.Current[st] = len(h.latest().Names)
		adv.Names = append(adv.Names, h.latest().Names...)
		costs = append(costs, h.costs()...)
	}
	if n := len(costs); n*n*s > maxAdviceWork {
		return nil
	}
	adv.Layers = BestPartition(costs, s)
	if adv.Layers == nil || slices.Equal(adv.Layers, adv.Current) {
		return nil
	}
	adv.Before = StageCosts(costs, adv.Current)
	adv.After = StageCosts(costs, adv.Layers)
	return adv
}

// maxFixText bounds a fix text with a partition in it: the summaries' strings are read back
// only up to max_attribute_length (256 by default).
const maxFixText = 256

// partitionText is the advice in words: layers per stage advised and now, the split points
// and the replayed saving; past maxFixText (many stages) the current split is left out, then
// the counts too (training.imbalance.partition holds them).
func partitionText(head string, p *Partition, share func(float64) float64, with string) string {
	layers, points := joinInts(p.Layers, "/"), joinInts(p.SplitPoints(), ",")
	saves := fmt.Sprintf("save about %.0f%% of the step%s", share(p.Saving), with)
	for _, text := range []string{
		fmt.Sprintf("%s: %s layers per stage (split points %s) instead of %s %s", head, layers,
			points, joinInts(p.Current, "/"), saves),
		fmt.Sprintf("%s: %s layers per stage (split points %s) %s", head, layers, points, saves),
	} {
		if len(text) <= maxFixText {
			return text
		}
	}
	return fmt.Sprintf("%s: the partition its layer times advise saves about %.0f%% of the "+
		"step%s", head, share(p.Saving), with)
}

func joinInts(v []int, sep string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, sep)
}

// stageScale is the factor on a stage's pipeline work (work seconds in the step) that moves
// its layers' time from before to after and keeps the rest: (work - before + after) / work.
// Where the profile's layers take all of the work or more (a profile from a slower step),
// the layers are taken as the whole work: after / before.
func stageScale(work, before, after float64) float64 {
	switch {
	case before <= 0:
		return 1
	case work > before:
		return (work - before + after) / work
	default:
		return after / before
	}
}
