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

// times are each layer's forward and backward seconds: each the median over the kept
// profiles.
func (h *profiles) times() (forward, backward []float64) {
	n := len(h.latest().Names)
	forward, backward = make([]float64, n), make([]float64, n)
	vals := make([]float64, len(h.recent))
	for i := range n {
		for k := range h.recent {
			vals[k] = h.recent[k].Forward[i]
		}
		forward[i] = median(vals)
		for k := range h.recent {
			vals[k] = h.recent[k].Backward[i]
		}
		backward[i] = median(vals)
	}
	return forward, backward
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
	bound, _ := leastSlowest(costs, stages)
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

// MaxTies is the most partitions with the least slowest stage AdvisePartition replays.
const MaxTies = 512

// relTol is the relative tolerance under which two costs or two replayed steps are equal.
const relTol = 1e-9

// leastSlowest is the least possible slowest stage of costs in stages, and tail[s][i]: the
// least slowest stage of layers i.. in s stages (+Inf where impossible); the dynamic program
// of skewtrace.remedy.partition._bound_and_suffix. stages >= 1 and len(costs) >= stages.
func leastSlowest(costs []float64, stages int) (float64, [][]float64) {
	n := len(costs)
	suffix := make([]float64, n+1)
	for i := n - 1; i >= 0; i-- {
		suffix[i] = suffix[i+1] + costs[i]
	}
	inf := math.Inf(1)
	tail := make([][]float64, stages+1)
	for s := range tail {
		tail[s] = make([]float64, n+1)
		for i := range tail[s] {
			tail[s][i] = inf
		}
	}
	tail[0][n] = 0
	for s := 1; s <= stages; s++ {
		for i := n - s; i >= 0; i-- {
			best := inf
			for j := i + 1; j <= n-(s-1); j++ {
				best = min(best, max(suffix[i]-suffix[j], tail[s-1][j]))
			}
			tail[s][i] = best
		}
	}
	return tail[stages][0], tail
}

// TiedPartitions lists every contiguous partition of costs into stages whose slowest stage is
// the least possible (within relTol), in lexicographic order of the counts, at most limit of
// them: skewtrace.remedy.partition.tied_partitions.
func TiedPartitions(costs []float64, stages, limit int) [][]int {
	n := len(costs)
	if stages < 1 || n < stages {
		return nil
	}
	bound, tail := leastSlowest(costs, stages)
	slack := relTol * max(bound, 1e-300)
	var out [][]int
	counts := make([]int, 0, stages)
	var walk func(i, left int)
	walk = func(i, left int) {
		if len(out) >= limit {
			return
		}
		if left == 0 {
			if i == n {
				out = append(out, slices.Clone(counts))
			}
			return
		}
		cost := 0.0
		for j := i + 1; j <= n-(left-1); j++ {
			cost += costs[j-1]
			if cost > bound+slack {
				break
			}
			if tail[left-1][j] > bound+slack {
				continue
			}
			counts = append(counts, j-i)
			walk(j, left-1)
			counts = counts[:len(counts)-1]
			if len(out) >= limit {
				return
			}
		}
	}
	walk(0, stages)
	return out
}

// AdvisePartition is the advice from each layer's forward and backward seconds per step
// (summed over its microbatches): among the partitions with the least slowest stage of
// forward plus backward (TiedPartitions, with BestPartition's where they were capped), the
// one whose 1F1B step Replay1F1B replays shortest; then the least sum of squared stage costs, then the smallest
// counts. skewtrace.remedy.partition.advise_partition: both give the same answer.
func AdvisePartition(forward, backward []float64, stages, microbatches int, transfer float64) []int {
	n := len(forward)
	if len(backward) != n || stages < 1 || n < stages || microbatches < 1 {
		return nil
	}
	costs := make([]float64, n)
	for i := range n {
		costs[i] = forward[i] + backward[i]
	}
	candidates := TiedPartitions(costs, stages, MaxTies)
	if len(candidates) >= MaxTies { // capped: the most even may not be among those enumerated
		even := BestPartition(costs, stages)
		if even != nil && !slices.ContainsFunc(candidates, func(c []int) bool { return slices.Equal(c, even) }) {
			candidates = append(candidates, even)
		}
	}
	slices.SortFunc(candidates, slices.Compare[[]int])
	var best []int
	var bestPrice, bestSq float64
	m := float64(microbatches)
	for _, layers := range candidates {
		f, b := StageCosts(forward, layers), StageCosts(backward, layers)
		for i := range f {
			f[i] /= m
			b[i] /= m
		}
		price := Replay1F1B(f, b, microbatches, transfer)
		var sq float64
		for _, c := range StageCosts(costs, layers) {
			sq += c * c
		}
		if best == nil || rankedBefore(price, sq, layers, bestPrice, bestSq, best) {
			best, bestPrice, bestSq = layers, price, sq
		}
	}
	return best
}

// rankedBefore: a shorter replay, then a smaller sum of squares (each beyond relTol), then
// smaller counts.
func rankedBefore(price, sq float64, layers []int, bestPrice, bestSq float64, best []int) bool {
	for _, pair := range [][2]float64{{price, bestPrice}, {sq, bestSq}} {
		x, y := pair[0], pair[1]
		if math.Abs(x-y) > relTol*max(math.Abs(x), math.Abs(y), 1e-300) {
			return x < y
		}
	}
	return slices.Compare(layers, best) < 0
}

// Replay1F1B is one step of 1F1B from each stage's forward and backward seconds per
// micro-batch: skewtrace.remedy.partition.replay_1f1b (the same schedule and dependencies).
func Replay1F1B(forward, backward []float64, microbatches int, transfer float64) float64 {
	stages := len(forward)
	if stages < 1 || len(backward) != stages || microbatches < 1 {
		return 0
	}
	type op struct {
		backward bool
		mb       int
	}
	programs := make([][]op, stages)
	for s := range stages {
		warm := min(stages-s-1, microbatches)
		var prog []op
		for m := range warm {
			prog = append(prog, op{false, m})
		}
		f, b := warm, 0
		for f < microbatches {
			prog = append(prog, op{false, f}, op{true, b})
			f++
			b++
		}
		for m := b; m < microbatches; m++ {
			prog = append(prog, op{true, m})
		}
		programs[s] = prog
	}
	nan := math.NaN()
	fend := make([][]float64, stages)
	bend := make([][]float64, stages)
	for s := range stages {
		fend[s] = make([]float64, microbatches)
		bend[s] = make([]float64, microbatches)
		for m := range microbatches {
			fend[s][m], bend[s][m] = nan, nan
		}
	}
	free := make([]float64, stages)
	pos := make([]int, stages)
	remaining := 0
	for _, p := range programs {
		remaining += len(p)
	}
	for remaining > 0 {
		progressed := false
		for s := range stages {
			for pos[s] < len(programs[s]) {
				o := programs[s][pos[s]]
				var dep, duration float64
				if !o.backward {
					dep, duration = 0, forward[s]
					if s > 0 {
						dep = fend[s-1][o.mb] + transfer
					}
				} else {
					duration = backward[s]
					if s == stages-1 {
						dep = fend[s][o.mb]
					} else {
						dep = bend[s+1][o.mb] + transfer
					}
				}
				if math.IsNaN(dep) {
					break
				}
				free[s] = max(free[s], dep) + duration
				if o.backward {
					bend[s][o.mb] = free[s]
				} else {
					fend[s][o.mb] = free[s]
				}
				pos[s]++
				remaining--
				progressed = true
			}
		}
		if !progressed {
			return math.NaN()
		}
	}
	return slices.Max(free)
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
	var forward, backward, costs []float64
	microbatches := 1
	for st, rank := range pick {
		h := j.layers[rank]
		adv.Current[st] = len(h.latest().Names)
		adv.Names = append(adv.Names, h.latest().Names...)
		f, b := h.times()
		forward, backward = append(forward, f...), append(backward, b...)
		microbatches = max(microbatches, h.latest().Microbatches)
	}
	for i := range forward {
		costs = append(costs, forward[i]+backward[i])
	}
	if n := len(costs); n*n*s > maxAdviceWork {
		return nil
	}
	// The transfer between stages is not in the profiles: the replay that ranks the tied
	// partitions takes none (it ranks by where the stages' work lies, not its messages).
	adv.Layers = AdvisePartition(forward, backward, s, microbatches, 0)
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
