package diagnosis

import (
	"fmt"
	"math"
	"slices"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// maxStageVariants bounds the stages whose imbalance is replayed in one step (the longest
// first).
const maxStageVariants = 8

// minStageExcess is the least a stage's work must exceed the mean stage's by, as a fraction,
// to be replayed as an imbalance (below it the stages' own jitter decides).
const minStageExcess = 0.03

// stages finds each rank's pipeline stage from the step's point-to-point messages: a rank
// whose first message is a send is stage 0 (it feeds the pipeline), one whose first is a
// receive is one more than its sender. It holds under 1F1B, GPipe and interleaved schedules
// alike (an interleaved rank's first message is its first chunk's). Ranks without messages
// have stage -1; so does every rank when some ranks of a pipeline cannot be placed.
func (m *model) stages(sd *stepData) {
	n := len(m.rankOf)
	m.stage = grow(m.stage, n)
	m.pred = grow(m.pred, n)
	m.nStages = 0
	any := false
	for ri := range n {
		m.stage[ri], m.pred[ri] = -1, -1
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			rec := &sd.colls[m.coll[p]]
			if !rec.p2p {
				continue
			}
			any = true
			op := &sd.ops[m.order[p]]
			if op.role == RoleSend {
				m.stage[ri] = 0
				break
			}
			m.pred[ri] = -2 // a receive whose sender is not in the step
			for i := rec.first; i < rec.first+rec.n; i++ {
				if sd.ops[i].role == RoleSend {
					m.pred[ri] = m.opRank[i]
				}
			}
			break
		}
	}
	if !any {
		return
	}
	// Each rank's stage is its sender's plus one; a chain longer than the ranks is a cycle.
	for ri := range n {
		if m.stage[ri] >= 0 || m.pred[ri] == -1 {
			continue
		}
		depth, cur := int32(0), int32(ri)
		for m.stage[cur] < 0 && m.pred[cur] >= 0 && depth <= int32(n) {
			cur = m.pred[cur]
			depth++
		}
		if m.stage[cur] < 0 || depth > int32(n) {
			clear(m.stage)
			for i := range m.stage {
				m.stage[i] = -1
			}
			m.nStages = 0
			return
		}
		// Walk again, numbering the chain from its placed end.
		base := m.stage[cur]
		k := int32(0)
		for c := int32(ri); c != cur; c = m.pred[c] {
			m.stage[c] = base + depth - k
			k++
		}
	}
	for ri := range n {
		m.nStages = max(m.nStages, m.stage[ri]+1)
	}
	// Each rank's replica: the stage-0 rank its chain of senders starts from.
	m.replica = grow(m.replica, n)
	for ri := range n {
		cur, hops := int32(ri), 0
		for m.stage[cur] > 0 && m.pred[cur] >= 0 && hops <= n {
			cur = m.pred[cur]
			hops++
		}
		m.replica[ri] = cur
	}
}

// pipelineWork reports whether the gap before position p is pipeline work: the compute of a
// microbatch (before a message, or after one).
func (m *model) pipelineWork(sd *stepData, ri, p int32) bool {
	if sd.colls[m.coll[p]].p2p {
		return true
	}
	return p > m.rankStart[ri] && sd.colls[m.coll[p-1]].p2p
}

// imbalance is one step's imbalance found by replay.
type imbalance struct {
	cause  string
	stage  int32
	cost   float64
	excess float64
	// slowest is the replica with the most work over the mean (data imbalance).
	slowest int32
	// fixTo is the stage to move work to (stage imbalance); repartition what moving its
	// excess evenly to the other stages saves, and balanced whether that was replayed with
	// the step's data balanced too.
	fixTo       int32
	repartition float64
	balanced    bool
	// partition is the partition the job's layer profiles advise (nil without them);
	// partitionMaterial whether its replayed saving reaches the step's naming bar (only then
	// does the fix recommend it).
	partition         *Partition
	partitionMaterial bool
}

// dataImbalance replays the step with each class's work split evenly over its members
// (every position at the class mean) and everything else as it was: what a balanced split
// of each global batch would save alone (base is the step replayed as it was).
//
// Uneven work is not evidence of the data by itself: on a busy host, scheduling noise makes
// a different replica slowest in every step too. The data needs a second view. On a
// pipeline job it is that a batch's length slows every stage it passes through: the replica
// with the most work over its stage's mean is the same in at least three quarters of the
// pipeline's stages (replicaAgreement). On a job without stages it is the size of each
// rank's input, when its forwards say it (training.input.size): the rank with the most work
// got more input than the mean, and work and input go together (inputAgreement). A job
// without either view gets no data_imbalance (see docs/architecture.md). A straggler is
// no data imbalance either: whatIf names the data only where balancing saves more than
// fixing the largest single rank.
func (m *model) dataImbalance(j *jobState, sd *stepData, threshold, base float64,
) (imbalance, bool) {
	if m.nStages < 2 && !m.hasInputs {
		return imbalance{}, false
	}
	n := len(m.order)
	m.baseGap = grow(m.baseGap, n)
	m.balancedGap = grow(m.balancedGap, n)
	copy(m.baseGap, m.gap)
	copy(m.balancedGap, m.baseGap)
	nr := len(m.rankOf)
	m.over = grow(m.over, nr)
	clear(m.over)
	// bound: what balancing could save at most, the summed excess of each position's
	// slowest member over the mean (the step's critical path passes each position once).
	bound := 0.0
	for _, members := range m.classes {
		if len(members) < 2 {
			continue
		}
		k := int(m.rankStart[members[0]+1] - m.rankStart[members[0]])
		var over float64
		for pos := range k {
			var sum, most float64
			for _, ri := range members {
				g := m.baseGap[m.rankStart[ri]+int32(pos)]
				sum += g
				most = max(most, g)
			}
			mean := sum / float64(len(members))
			over += most - mean
			for _, ri := range members {
				p := m.rankStart[ri] + int32(pos)
				m.balancedGap[p] = mean
				m.over[ri] += m.baseGap[p] - mean
			}
		}
		bound = max(bound, over)
	}
	if bound < threshold {
		return imbalance{}, false
	}
	var slowest int32
	var excess float64
	var ok bool
	if m.nStages >= 2 {
		slowest, excess, ok = m.replicaAgreement()
	} else {
		slowest, excess, ok = m.inputAgreement()
	}
	if !ok {
		return imbalance{}, false
	}
	cost := base - m.simulate(sd, m.balancedGap, m.replayT)
	if cost < threshold {
		return imbalance{}, false
	}
	return imbalance{cause: semconv.CauseDataImbalance, stage: -1, cost: cost, excess: excess,
		slowest: m.rankOf[slowest]}, true
}

// minInputSpread is how much the largest rank input of a step must exceed the smallest, as
// a fraction, for the inputs to explain uneven work (below it they are the same batch shape).
const minInputSpread = 0.05

// minInputCorrelation is the least correlation across ranks between a rank's work over the
// mean and its input for the inputs to explain the work.
const minInputCorrelation = 0.5

// readInputs fills m.inputs with each rank's input in the step and reports whether every
// rank's forwards gave theirs.
func (m *model) readInputs(a *Analyzer, j *jobState, sd *stepData) bool {
	nr := len(m.rankOf)
	if nr < 2 {
		return false
	}
	m.inputs = grow(m.inputs, nr)
	for ri := range m.rankOf {
		e := m.curPh[ri]
		if e == nil {
			return false
		}
		in, ok := e.inputSize()
		if !ok {
			return false
		}
		m.inputs[ri] = float64(in)
	}
	return true
}

// explainedByInput reports whether a rank's extra work in the step is its larger input's:
// the inputs differ by at least minInputSpread, and the rank's work (its gaps' sum) is less
// than bar over its input times its class's work per input element (the median peer's, the
// faster's of two). A slow rank with its usual input stays a candidate.
func (m *model) explainedByInput(ri int32, bar float64) bool {
	members := m.classes[m.classOf[ri]]
	if len(members) < 2 {
		return false
	}
	var peers []int32
	peers = sample(members, -1, peers)
	lo, hi := math.Inf(1), math.Inf(-1)
	vals := m.vals[:0]
	for _, k := range peers {
		in := m.inputs[k]
		if in <= 0 {
			return false
		}
		lo, hi = min(lo, in), max(hi, in)
		vals = append(vals, m.rankWork(k)/in)
	}
	m.vals = vals
	if hi < lo*(1+minInputSpread) {
		return false
	}
	var ratio float64
	if len(vals) == 2 {
		ratio = min(vals[0], vals[1])
	} else {
		ratio = median(vals)
	}
	return m.rankWork(ri)-ratio*m.inputs[ri] < bar
}

// rankWork is a rank's own work in the step: its gaps' sum, seconds.
func (m *model) rankWork(ri int32) float64 {
	var w float64
	for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
		w += m.gap[p]
	}
	return w
}

// inputAgreement returns the rank with the most work over its class's mean, that work over
// the mean rank's (as a fraction), and whether the step's inputs (m.inputs) explain it: they
// differ by at least minInputSpread, the rank got more than the mean input, and work over
// the mean and input correlate across the ranks by at least minInputCorrelation.
func (m *model) inputAgreement() (int32, float64, bool) {
	nr := len(m.rankOf)
	slowest := int32(0)
	lo, hi := math.Inf(1), math.Inf(-1)
	var meanIn, meanOver, work float64
	for ri := range nr {
		if m.over[ri] > m.over[slowest] {
			slowest = int32(ri)
		}
		lo, hi = min(lo, m.inputs[ri]), max(hi, m.inputs[ri])
		meanIn += m.inputs[ri] / float64(nr)
		meanOver += m.over[ri] / float64(nr)
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			work += m.balancedGap[p] / float64(nr)
		}
	}
	if lo <= 0 || hi < lo*(1+minInputSpread) || m.inputs[slowest] <= meanIn {
		return 0, 0, false
	}
	var cov, varIn, varOver float64
	for ri := range nr {
		di, do := m.inputs[ri]-meanIn, m.over[ri]-meanOver
		cov += di * do
		varIn += di * di
		varOver += do * do
	}
	if varIn <= 0 || varOver <= 0 || cov < minInputCorrelation*math.Sqrt(varIn*varOver) {
		return 0, 0, false
	}
	excess := 0.0
	if work > 0 {
		excess = m.over[slowest] / work
	}
	return slowest, excess, true
}

// replicaAgreement returns the replica (its stage-0 rank index) with the most work over its
// stages' means, that work over the mean replica's (as a fraction), and whether it was the
// slowest replica in at least three quarters of the stages that have replicas.
func (m *model) replicaAgreement() (int32, float64, bool) {
	s := int(m.nStages)
	m.stageBest = grow(m.stageBest, s)
	m.stageBestOver = grow(m.stageBestOver, s)
	m.stageMean = grow(m.stageMean, s)
	m.stageCount = grow(m.stageCount, s)
	for st := range s {
		m.stageBest[st], m.stageBestOver[st], m.stageMean[st], m.stageCount[st] = -1, 0, 0, 0
	}
	nr := len(m.rankOf)
	m.replicaOver = grow(m.replicaOver, nr)
	clear(m.replicaOver)
	for ri := range nr {
		st := m.stage[ri]
		if st < 0 {
			return 0, 0, false
		}
		m.replicaOver[m.replica[ri]] += m.over[ri]
		m.stageCount[st]++
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			m.stageMean[st] += m.balancedGap[p]
		}
		if m.stageBest[st] < 0 || m.over[ri] > m.stageBestOver[st] {
			m.stageBest[st], m.stageBestOver[st] = int32(ri), m.over[ri]
		}
	}
	slowest := int32(-1)
	for ri := range nr {
		if m.replica[ri] == int32(ri) && (slowest < 0 || m.replicaOver[ri] > m.replicaOver[slowest]) {
			slowest = int32(ri)
		}
	}
	if slowest < 0 {
		return 0, 0, false
	}
	stages, agree := 0, 0
	var work float64
	for st := range s {
		if m.stageCount[st] < 2 {
			continue
		}
		stages++
		work += m.stageMean[st] / float64(m.stageCount[st])
		if m.replica[m.stageBest[st]] == slowest {
			agree++
		}
	}
	if stages < 2 || 4*agree < 3*stages {
		return 0, 0, false
	}
	excess := 0.0
	if work > 0 {
		excess = m.replicaOver[slowest] / work
	}
	return slowest, excess, true
}

// stageImbalance compares the pipeline stages' work per step (each stage's median replica,
// from work, the gaps with every rank at its peers' reference) with the mean stage's, and
// returns the stages longer than it by minStageExcess and the cost threshold, the longest
// first, each with what its fix saves: the step replayed from gaps with that stage's excess
// moved evenly to the other stages (a repartition of the layers) against the step replayed
// from gaps as they are. gaps are the step's own, or with its data balanced where a data
// imbalance was named (balanced): uneven batches otherwise hold every stage to the slowest
// replica, and a repartition alone shows little of what it saves once they are evened out.
// Whether a stage is named is the caller's (whatIf: what the stage at the job's ideal
// saves). The scales that put every stage at the mean are left in m.scale.
func (m *model) stageImbalance(j *jobState, sd *stepData, work, gaps []float64, balanced bool,
	threshold float64,
) []imbalance {
	s := int(m.nStages)
	if s < 2 {
		return nil
	}
	for ri := range m.rankOf {
		if m.stage[ri] < 0 {
			return nil // a pipeline with ranks outside it: not one this model places
		}
	}
	m.stageWork = grow(m.stageWork, len(m.rankOf))
	for ri := range m.rankOf {
		var w float64
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			if m.pipelineWork(sd, int32(ri), p) {
				w += work[p]
			}
		}
		m.stageWork[ri] = w
	}
	stageWork := make([]float64, s)
	var total float64
	for st := range s {
		m.vals = m.vals[:0]
		for ri := range m.rankOf {
			if int(m.stage[ri]) == st {
				m.vals = append(m.vals, m.stageWork[ri])
			}
		}
		stageWork[st] = median(m.vals)
		total += stageWork[st]
	}
	mean := total / float64(s)
	if mean <= 0 {
		return nil
	}
	var longer []int
	for st := range s {
		if e := stageWork[st] - mean; e >= minStageExcess*mean && e >= threshold {
			longer = append(longer, st)
		}
	}
	slices.SortFunc(longer, func(x, y int) int { return cmpFloat(stageWork[y], stageWork[x]) })
	if len(longer) > maxStageVariants {
		longer = longer[:maxStageVariants]
	}
	if len(longer) == 0 {
		return nil
	}
	n := len(m.order)
	m.stageGap = grow(m.stageGap, n)
	m.scale = grow(m.scale, s)
	ref := m.simulate(sd, gaps, m.replayT)
	advice, advised := m.advise(j, sd, gaps, ref)
	// A verdict is what its fix saves: a partition whose replayed saving is under the step's
	// naming bar is not what the fix recommends (it then says what moving the excess would
	// save, as without profiles); it stays on the event with its saving, for the reader who
	// wants to try it (skewtrace advise says it is under the bar).
	material := advised && advice.Saving >= threshold
	var out []imbalance
	for _, st := range longer {
		excess := stageWork[st] - mean
		for o := range s {
			switch {
			case o == st:
				m.scale[o] = mean / stageWork[o]
			case stageWork[o] > 0:
				m.scale[o] = (stageWork[o] + excess/float64(s-1)) / stageWork[o]
			default:
				m.scale[o] = 1
			}
		}
		m.scaleStages(sd, gaps)
		saves := ref - m.simulate(sd, m.stageGap, m.replayT)
		if traceWhatIf != nil {
			traceWhatIf(sd.step, "stage %d work %.4f mean %.4f: repartition saves %.4f",
				st, stageWork[st], mean, saves)
		}
		to := int32(-1)
		for _, nb := range []int{st - 1, st + 1} {
			if nb >= 0 && nb < s && (to < 0 || stageWork[nb] < stageWork[to]) {
				to = int32(nb)
			}
		}
		out = append(out, imbalance{cause: semconv.CauseStageImbalance, stage: int32(st),
			excess: excess / mean, fixTo: to, repartition: max(0, saves), balanced: balanced})
		if advised {
			out[len(out)-1].partition = advice
			out[len(out)-1].partitionMaterial = material
		}
	}
	for o := range s {
		m.scale[o] = 1
		if stageWork[o] > 0 {
			m.scale[o] = mean / stageWork[o]
		}
	}
	return out
}

// scaleStages writes gaps into m.stageGap with every stage's pipeline work scaled by
// m.scale.
func (m *model) scaleStages(sd *stepData, gaps []float64) {
	copy(m.stageGap, gaps)
	for ri := range m.rankOf {
		f := m.scale[m.stage[ri]]
		for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
			if m.pipelineWork(sd, int32(ri), p) {
				m.stageGap[p] = gaps[p] * f
			}
		}
	}
}

// stageRanks lists a stage's ranks in order.
func (m *model) stageRanks(stage int32) []int {
	var out []int
	for ri, rank := range m.rankOf {
		if m.stage[ri] == stage {
			out = append(out, int(rank))
		}
	}
	slices.Sort(out)
	return out
}

// rootCause turns an imbalance into a step's root cause.
func (m *model) rootCause(im imbalance, step float64) RootCause {
	rc := RootCause{Rank: -1, Cause: im.cause, Cost: im.cost, Stage: -1, Excess: im.excess}
	if im.cause == semconv.CauseStageImbalance {
		rc.Stage = int(im.stage)
		rc.Ranks = m.stageRanks(im.stage)
	} else {
		rc.Ranks = []int{int(im.slowest)}
	}
	rc.Fix = fixText(im, step)
	rc.Partition = im.partition
	return rc
}

// fixText says what to change, in words, with what it saves.
func fixText(im imbalance, step float64) string {
	share := func(seconds float64) float64 {
		if step <= 0 {
			return 0
		}
		return 100 * seconds / step
	}
	switch im.cause {
	case semconv.CauseStageImbalance:
		move := im.excess / (1 + im.excess)
		where := "to other stages"
		if im.fixTo >= 0 {
			where = fmt.Sprintf("(its layers) to stage %d", im.fixTo)
		}
		with := ""
		if im.balanced {
			with = " once each global batch is split by work"
		}
		head := fmt.Sprintf("stage %d does %.0f%% more work than the mean stage, and the step "+
			"would be %.0f%% shorter with it as fast as the others", im.stage, 100*im.excess,
			share(im.cost))
		if im.partition != nil && im.partitionMaterial {
			return partitionText(head, im.partition, share, with)
		}
		return fmt.Sprintf("%s: moving about %.0f%% of its work %s saves about %.0f%% of the "+
			"step%s", head, 100*move, where, share(im.repartition), with)
	default:
		return fmt.Sprintf("the slowest replica did %.0f%% more work than the mean replica, "+
			"a different one each step: splitting each global batch by work (tokens, not "+
			"samples: WorkBalancedSampler for DistributedSampler, docs/rebalancing.md) saves "+
			"about %.0f%% of the step", 100*im.excess, share(im.cost))
	}
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	default:
		return 0
	}
}
