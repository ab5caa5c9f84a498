package diagnosis

import (
	"math"
	"slices"
	"sort"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// outlierMADs is how many robust standard deviations (1.4826 x MAD) of the step's
// per-rank excess a rank's excess must stand above the median to be a candidate.
const outlierMADs = 4

// maxSpreadSample bounds the ranks read for the excess spread.
const maxSpreadSample = 255

// smallWorld is the most ranks a step may have for a rank that stands out alone to be a
// candidate however the others spread: its excess stands above the other ranks' median by
// the bar their own spread sets, and above each of them by the cost threshold. In a step of
// three or four ranks, one peer with a middling excess (a rank the host descheduled) is the
// median, or half of it, and moves the MAD with it, enough to hide the straggler behind it:
// excess {37, 1, 99, 13} ms in a 4-rank FSDP2 x TP step beside a CPU hog sets a bar of 106
// ms above a median of 25 over all ranks; over the straggler's peers the bar is 68 above 13,
// and the straggler stands 62 above the next rank. A group that is slow together (a pipeline
// replica with more data) has no lone outlier, and the bar over all ranks keeps it out as
// before. From five ranks on, one elevated peer moves neither the median nor the MAD much,
// and the bar over all ranks decides alone (the lone test there named ranks of a 6-rank job
// beside the hog for a few ms of descheduling that its own step times did not show).
const smallWorld = 4

// maxCandidates bounds the ranks whose cost is replayed in one step (the ones with the
// most excess work first).
const maxCandidates = 8

// run analyzes one step and updates the job's state.
func (m *model) run(a *Analyzer, j *jobState, sd *stepData) StepResult {
	m.reset(sd)
	m.readPhases(a, j, sd)
	m.breaks, m.stuck = 0, false
	m.timeline(a, j, sd)
	m.stages(sd)
	m.classify(sd)
	m.references(j)

	res := StepResult{Job: j.name, Step: sd.step, Ranks: len(m.rankOf),
		Collectives: len(sd.colls)}
	// A step with pacing holds is replayed as it was read (the waits for a held rank would
	// read as lags and transfers, keeping the holds' cost the replay leaves out).
	m.settling = !m.held
	exit := m.simulate(sd, m.gap, m.replayT)
	if m.settling && m.eagerBySize(sd) {
		exit = m.simulate(sd, m.gap, m.replayT)
	}
	m.settling = false
	m.actualEnd = grow(m.actualEnd, len(m.ps))
	for p := range m.ps {
		m.actualEnd[p] = m.ps[p].end
	}
	if e, ok := m.replayError(a, j, sd); ok {
		j.replayError.add(e, historyAlpha)
		res.ReplayError = e
		res.ReplayChecked = true
	}
	maxEntry := math.Inf(-1)
	for ri := range m.rankOf {
		maxEntry = max(maxEntry, m.entry[ri])
	}
	res.Duration = max(0, exit-maxEntry)
	res.EndUnixNano = m.medianEnd(sd)
	res.WhatIf = res.Duration
	threshold := max(a.cfg.MinCost.Seconds(), a.cfg.MinCostFraction*res.Duration)
	// A rank or a link must also save more than the job's step time moves by from one step
	// to the next anyway: on two shared cores a rank descheduled for 10 ms, or a message a
	// descheduled sender held up, saves 5-8% of a 150 ms step now and then, and four such
	// namings in eight steps flagged a healthy rank of the demo for the network.
	rankThreshold := max(threshold, jitterFactor*j.stepJitter())
	if !j.jitterKnown() {
		// No measure of the noise yet (a job's first steps after its warm-up): twice the bar.
		// The demo's 150 ms steps named a healthy rank's link for 6-19 ms in four of its
		// first seven steps.
		rankThreshold = 2 * threshold
	}
	res.MinSaving = rankThreshold

	// Candidates: ranks whose own work exceeded their peers' by more than the threshold,
	// and stand out from the spread every rank's jitter adds up to in this step: beyond
	// outlierMADs robust standard deviations (MAD) of the ranks' excess from its median.
	noise, spread := m.excessSpread()
	bar := max(threshold, outlierMADs*spread)
	small := len(m.rankOf) >= 3 && len(m.rankOf) <= smallWorld
	// Without stages, the forwards' input sizes are the data's view: a rank whose extra
	// work its larger input explains is no candidate (its work is the data's, weighed by
	// dataImbalance).
	m.hasInputs = m.nStages < 2 && m.readInputs(a, j, sd)
	var candidates []int32
	for ri := range m.rankOf {
		bar := bar
		outlier := m.excess[ri]-noise >= bar
		if !outlier && small {
			next, med, spread := m.others(ri)
			bar = max(threshold, outlierMADs*spread)
			outlier = m.excess[ri]-med >= bar && m.excess[ri]-next >= threshold
		}
		if outlier && !(m.hasInputs && m.explainedByInput(int32(ri), bar)) {
			candidates = append(candidates, int32(ri))
		}
	}
	if traceWhatIf != nil {
		for ri := range m.rankOf {
			traceWhatIf(sd.step, "rank %d stage %d class %d spans %d excess %.4f noise %.4f bar %.4f",
				m.rankOf[ri], m.stage[ri], m.classOf[ri], m.rankStart[ri+1]-m.rankStart[ri],
				m.excess[ri], noise, bar)
		}
	}
	sort.Slice(candidates, func(x, y int) bool {
		return m.excess[candidates[x]] > m.excess[candidates[y]]
	})
	if len(candidates) > maxCandidates {
		candidates = candidates[:maxCandidates]
	}

	m.transfers(a, j, sd)
	for c := range sd.colls {
		if m.links.slow[c] {
			res.SlowCollectives++
		}
	}
	located := m.locate(j, sd)

	roots := m.whatIf(a, j, sd, candidates, located, threshold, rankThreshold, exit,
		&res)
	if len(roots) > 0 {
		res.Attribution = m.attribute(sd, exit, threshold, roots)
	}
	roots = append(roots, m.missing(j, sd, roots)...)
	sort.SliceStable(roots, func(x, y int) bool { return roots[x].Cost > roots[y].Cost })
	res.RootCauses = roots
	if m.breaks > 0 || m.stuck {
		a.stats.ModelBreaks++
	}

	j.flags.decide(&a.cfg, &res)
	if a.cfg.FlagDecision == FlagDecisionDeferred {
		res.Deferred = true
		res.Flagged, res.Suspects, res.Imbalances = nil, nil, nil
	}
	j.stepTime.add(res.Duration, historyAlpha)
	j.noteDuration(res.Duration)
	// A job's first steps (allocations, connections, kernels compiled) are not any rank's
	// usual work: learned, they would make a rank whose compute slows down later read as
	// usual, its cause unknown. A rank alone in its class (one pipeline stage) has only its
	// own gap history for a reference: a high start learned there hides a stage that slows
	// down in the steps after it.
	if j.stepsSeen >= warmupSteps {
		m.learnHistory(j)
		m.candidate = grow(m.candidate, len(m.rankOf))
		clear(m.candidate)
		for _, ri := range candidates {
			m.candidate[ri] = true
		}
		m.learnWork(a, j, sd, m.candidate)
	}
	j.stepsSeen++
	m.carryOver(j, sd, exit)
	return res
}

// Confusion margins of whatIf: a rank is named only where fixing it saves at least
// rankOfStage of what fixing its whole stage saves (else the stage is the problem), and a
// stage or the data only where fixing it saves more than setOverRank times what fixing the
// largest single rank in it saves (else that rank is); with a data imbalance named, a rank
// or a stage also needs rankOfData of its saving (a replica slowest by its data is no
// straggler, and a stage at the job's ideal has its replicas evened out too).
const (
	rankOfStage = 0.8
	setOverRank = 1.25
	rankOfData  = 0.5
)

// whatIf replays the step with contributors fixed and returns the root causes. Every cost
// is what fixing that contributor alone saves from the step as it was (the step replayed
// with only its work or transfers at their reference), so that a verdict is what its fix
// saves: a stage six percent longer than the others behind a worker twice as slow saves
// nothing, and is not named. Ranks that hold the step up together (two stragglers in
// parallel, neither of which alone shortens it) are each also costed by what leaving it
// out of their joint fix adds. A rank's reference is its peers' (it runs as they do once
// fixed); a stage's is the job's ideal (kinds.go); the data's is each class position at
// its class mean (each global batch split evenly); a link's its transfers' reference.
//
// The step's what-if (res.WhatIf) is the step with everything at the job's ideal: the
// what-if analysis' ideal step, whatever was named.
func (m *model) whatIf(a *Analyzer, j *jobState, sd *stepData, candidates []int32,
	located []located, threshold, rankThreshold, exit float64, res *StepResult,
) []RootCause {
	n := len(m.order)
	m.idealGap = grow(m.idealGap, n)
	m.variantGap = grow(m.variantGap, n)
	for p := range n {
		m.idealGap[p] = min(m.gap[p], m.refGap[p])
	}
	pipeline := m.nStages >= 2
	if pipeline {
		m.readContents(sd)
		m.kindIdeal()
	} else {
		m.jobGap = grow(m.jobGap, n)
		copy(m.jobGap, m.medGap)
	}
	nc := len(sd.colls)
	m.idealT = grow(m.idealT, nc)
	m.variantT = grow(m.variantT, nc)
	for c := range nc {
		m.idealT[c] = m.replayT[c]
		if m.links.hasRef[c] {
			m.idealT[c] = min(m.replayT[c], m.links.refT[c])
		}
	}
	// The ideal step's transfers: as measured, but where the link analysis found one slow,
	// at its link's reference. A transfer is read from the replay (the part of a span after
	// its last member arrived), not measured: a message whose receive was posted after it
	// arrived reads as nothing, and a reference below the measured one would be an
	// artifact of the reading, not a faster fabric.
	m.jobT = grow(m.jobT, nc)
	for c := range nc {
		m.jobT[c] = m.replayT[c]
		if m.links.slow[c] {
			m.jobT[c] = m.idealT[c]
		}
	}
	base := m.simulate(sd, m.gap, m.replayT)
	full := m.simulate(sd, m.jobGap, m.jobT)
	res.WhatIf = min(res.Duration, max(0, res.Duration-(base-full)))

	// Ranks, each fixed alone; then, among several, what each adds to their joint fix.
	costs := make([]float64, len(candidates))
	for i, ri := range candidates {
		copy(m.variantGap, m.gap)
		m.fixRank(ri, m.variantGap, m.idealGap)
		costs[i] = base - m.simulate(sd, m.variantGap, m.replayT)
	}
	if len(candidates) > 1 {
		copy(m.variantGap, m.gap)
		for _, ri := range candidates {
			m.fixRank(ri, m.variantGap, m.idealGap)
		}
		joint := m.simulate(sd, m.variantGap, m.replayT)
		for i, ri := range candidates {
			m.fixRank(ri, m.variantGap, m.gap)
			costs[i] = max(costs[i], m.simulate(sd, m.variantGap, m.replayT)-joint)
			m.fixRank(ri, m.variantGap, m.idealGap)
		}
	}
	// Stages, each at the job's ideal alone.
	var stageSave []float64
	if pipeline {
		stageSave = make([]float64, m.nStages)
		for st := range m.nStages {
			copy(m.variantGap, m.gap)
			for ri := range m.rankOf {
				if m.stage[ri] == st {
					m.fixRank(int32(ri), m.variantGap, m.jobGap)
				}
			}
			stageSave[st] = base - m.simulate(sd, m.variantGap, m.replayT)
		}
	}
	largestIn := func(stage int32) float64 {
		most := 0.0
		for i, ri := range candidates {
			if stage < 0 || m.stage[ri] == stage {
				most = max(most, costs[i])
			}
		}
		return most
	}

	if traceWhatIf != nil {
		for i, ri := range candidates {
			traceWhatIf(sd.step, "candidate rank %d stage %d excess %.4f cost %.4f",
				m.rankOf[ri], m.stage[ri], m.excess[ri], costs[i])
		}
		traceWhatIf(sd.step, "step %.4f base %.4f ideal %.4f threshold %.4f stages %v",
			res.Duration, base, full, threshold, stageSave)
		var slow int
		var sr, si float64
		for c := range nc {
			if m.links.slow[c] {
				slow++
			}
			sr, si = sr+m.replayT[c], si+m.idealT[c]
		}
		traceWhatIf(sd.step, "transfers %d slow %d: replayed %.4f ideal %.4f; ideal gaps alone "+
			"%.4f, ideal transfers alone %.4f", nc, slow, sr, si,
			m.simulate(sd, m.jobGap, m.replayT), m.simulate(sd, m.gap, m.jobT))
	}
	var roots []RootCause
	data, hasData := m.dataImbalance(j, sd, threshold, base)
	if traceWhatIf != nil {
		traceWhatIf(sd.step, "data %v cost %.4f largest rank %.4f", hasData, data.cost,
			largestIn(-1))
	}
	hasData = hasData && data.cost > setOverRank*largestIn(-1)
	if hasData {
		roots = append(roots, m.rootCause(data, res.Duration))
	}
	if pipeline {
		gaps := m.gap
		if hasData {
			gaps = m.balancedGap
		}
		for _, im := range m.stageImbalance(j, sd, m.idealGap, gaps, hasData, threshold) {
			// Named where the stage at the job's ideal (as fast as the other stages) saves
			// what a root cause must, more than its largest rank; and a stage's fix evens out
			// its replicas too, so beside a data imbalance it needs half of what that saves.
			// Its cost is that saving; its fix text quotes the repartition's.
			save := stageSave[im.stage]
			if save >= threshold && save > setOverRank*largestIn(im.stage) &&
				(!hasData || save >= rankOfData*data.cost) {
				im.cost = save
				roots = append(roots, m.rootCause(im, res.Duration))
			}
		}
	}
	for i, ri := range candidates {
		cost := costs[i]
		if cost < rankThreshold || (pipeline && m.stage[ri] >= 0 && cost < rankOfStage*stageSave[m.stage[ri]]) ||
			(hasData && cost < rankOfData*data.cost) {
			continue
		}
		rank := m.rankOf[ri]
		cause, before := m.cause(a, j, sd, ri)
		roots = append(roots, RootCause{Rank: int(rank), Topology: j.topology.at(rank),
			Cause: cause, Before: before, Cost: cost, Stage: -1})
	}
	for _, loc := range located {
		copy(m.variantT, m.replayT)
		for _, c := range loc.colls {
			m.variantT[c] = m.idealT[c]
		}
		cost := base - m.simulate(sd, m.gap, m.variantT)
		if cost < rankThreshold {
			continue
		}
		suspect := loc.suspect
		roots = append(roots, RootCause{Rank: -1, Cause: semconv.CauseNetwork, Cost: cost,
			Suspect: &suspect, Stage: -1})
		roots = m.linkRanks(j, suspect, cost, roots)
	}
	return roots
}

// jitterSteps is how many of a job's step-to-step changes of duration its jitter reads.
const jitterSteps = 16

// noteDuration records an analyzed step's duration for the job's jitter (not its first
// warmupSteps: allocations and first connections make them long).
func (j *jobState) noteDuration(d float64) {
	if j.stepsSeen < warmupSteps {
		return
	}
	if j.lastDuration > 0 {
		j.jitter[j.jitterPos] = math.Abs(d - j.lastDuration)
		j.jitterPos = (j.jitterPos + 1) % jitterSteps
		j.jitterLen = min(j.jitterLen+1, jitterSteps)
	}
	j.lastDuration = d
}

// jitterFactor: a rank or a link must save this many times the job's step jitter (the
// median change of its step time between consecutive steps, about one standard deviation of
// its noise): at one, the demo's healthy ranks were named for 7-11 ms of 140 ms steps often
// enough after its fault to be flagged.
const jitterFactor = 2

// minJitterSamples is how many step-to-step changes a job's jitter needs to be known.
const minJitterSamples = 4

// jitterKnown reports whether the job has minJitterSamples changes of its step duration.
func (j *jobState) jitterKnown() bool { return j.jitterLen >= minJitterSamples }

// stepJitter is the median change of the job's step duration from one analyzed step to the
// next over its last jitterSteps (0 before it has four): how much a step moves by anyway.
// Consecutive changes, not the spread of durations: a fault's onset is one large change,
// and does not make every step after it read as noise.
func (j *jobState) stepJitter() float64 {
	if !j.jitterKnown() {
		return 0
	}
	vals := j.jitter // a copy: median sorts it
	return median(vals[:j.jitterLen])
}

// traceWhatIf, when set (tests), is told what whatIf weighed in each step.
var traceWhatIf func(step int64, format string, args ...any)

// fixRank writes the rank's gaps from src into gaps.
func (m *model) fixRank(ri int32, gaps, src []float64) {
	for p := m.rankStart[ri]; p < m.rankStart[ri+1]; p++ {
		gaps[p] = src[p]
	}
}

// linkRanks makes the ranks behind a located NIC or host root causes with cause network
// (a rank already blamed for its own work more expensively keeps that cause).
func (m *model) linkRanks(j *jobState, s Suspect, cost float64, roots []RootCause) []RootCause {
	if s.Kind != SuspectNIC && s.Kind != SuspectHost {
		return roots
	}
	for _, rank := range m.rankOf {
		t := j.topology.at(rank)
		if t.Host != s.Host && !(s.Kind == SuspectHost && t.Host == s.Name) {
			continue
		}
		if s.Kind == SuspectNIC && t.NIC != s.Name {
			continue
		}
		existing := -1
		for i := range roots {
			if roots[i].Rank == int(rank) {
				existing = i
			}
		}
		rc := RootCause{Rank: int(rank), Topology: t, Cause: semconv.CauseNetwork, Cost: cost,
			Suspect: &s}
		switch {
		case existing < 0:
			roots = append(roots, rc)
		case roots[existing].Cost < cost:
			roots[existing] = rc
		}
	}
	return roots
}

// missing makes the ranks that never arrived at a collective of the step root causes
// (cause unknown; the strongest straggler signal there is), unless so many are missing at
// once that it is a gap in delivery, not stragglers: more than max(4, ranks/32) distinct
// ranks (a collector that fell behind its input released a 4096-rank step's collectives
// without 240 ranks whose spans were still queued, and blamed them all). The collectives
// stay counted incomplete and the ranks missing (training.collective.incomplete,
// training.rank.missing).
func (m *model) missing(j *jobState, sd *stepData, roots []RootCause) []RootCause {
	var out []RootCause
	seen := make(map[int32]bool)
	for _, rc := range roots {
		seen[int32(rc.Rank)] = true
	}
	absent := make(map[int32]bool)
	for c := range sd.colls {
		for _, rank := range sd.colls[c].missing {
			absent[rank] = true
			if seen[rank] {
				continue
			}
			seen[rank] = true
			out = append(out, RootCause{Rank: int(rank), Topology: j.topology.at(rank),
				Cause: semconv.CauseUnknown})
		}
	}
	if len(absent) > maxMissingRoots(len(m.rankOf)+len(absent)) {
		return nil
	}
	return out
}

// maxMissingRoots is how many ranks of a step of the given size may be missing and still be
// root causes.
func maxMissingRoots(ranks int) int {
	return max(4, ranks/32)
}

// excessSpread returns the median of the ranks' excess and its robust standard deviation
// (1.4826 x the median absolute deviation), over an evenly spread sample of ranks. Two ranks
// have no median that is not half the straggler's own excess, nor a spread that is not the
// other half: there the least excess is the noise and the cost threshold (and the flags' K
// of W steps) the only bar.
func (m *model) excessSpread() (float64, float64) {
	n := len(m.rankOf)
	if n < 3 {
		least := math.Inf(1)
		for ri := range n {
			least = min(least, m.excess[ri])
		}
		if math.IsInf(least, 1) {
			least = 0
		}
		return least, 0
	}
	stride := 1
	if n > maxSpreadSample {
		stride = (n + maxSpreadSample - 1) / maxSpreadSample
	}
	m.vals = m.vals[:0]
	for ri := 0; ri < n; ri += stride {
		m.vals = append(m.vals, m.excess[ri])
	}
	return robustSpread(m.vals)
}

// robustSpread returns the median of vals and its robust standard deviation (1.4826 x the
// median absolute deviation); vals is reordered and overwritten.
func robustSpread(vals []float64) (float64, float64) {
	med := median(vals)
	for i := range vals {
		vals[i] = math.Abs(vals[i] - med)
	}
	return med, 1.4826 * median(vals)
}

// others returns the largest excess of every rank but ri, and those ranks' median excess
// and its robust standard deviation (as excessSpread's; a step of at least three ranks).
func (m *model) others(ri int) (float64, float64, float64) {
	m.vals = m.vals[:0]
	next := math.Inf(-1)
	for k := range m.rankOf {
		if k != ri {
			m.vals = append(m.vals, m.excess[k])
			next = max(next, m.excess[k])
		}
	}
	med, spread := robustSpread(m.vals)
	return next, med, spread
}

// medianEnd is the median over ranks of their last span's end (own clocks).
func (m *model) medianEnd(sd *stepData) int64 {
	m.vals = m.vals[:0]
	for ri := range m.rankOf {
		m.vals = append(m.vals, float64(sd.ops[m.order[m.lastEnd[ri]]].end))
	}
	return int64(median(m.vals))
}

// replayError is the self-check of the replay: how far the replayed step, fed the measured
// gaps and transfers, is from the measured one. Each rank's period (the end of its last span
// in this step minus the end of its last span in the previous one) is read on its own clock
// and on the replayed timeline; the error is the difference of the two medians over ranks,
// as a fraction of the measured one. ok is false without two consecutive steps of a rank,
// and in a step the pacer held a rank in (the replay leaves holds out on purpose).
func (m *model) replayError(a *Analyzer, j *jobState, sd *stepData) (float64, bool) {
	measured, replayed := m.vals[:0], m.scratch[:0]
	for ri := range m.rankOf {
		if m.prevEnd[ri] == 0 {
			continue
		}
		p := m.lastEnd[ri]
		from, to := m.prevEnd[ri], sd.ops[m.order[p]].end
		// The pacer's holds are not the rank's work: the replay leaves them out, and with
		// them whatever the other ranks waited for them. A step with holds is not checked.
		if delayWithin(m.curPh[ri], from, to) > 0 || delayWithin(m.prevPh[ri], from, to) > 0 {
			return 0, false
		}
		measured = append(measured, float64(to-from)/1e9)
		replayed = append(replayed, m.actualEnd[p]-m.prevExit[ri])
	}
	m.vals, m.scratch = measured, replayed
	if len(measured) == 0 {
		return 0, false
	}
	want := median(measured)
	if want <= 0 {
		return 0, false
	}
	return math.Abs(median(replayed)-want) / want, true
}

// carryOver keeps, per rank, where the step left it for the next step's entry.
func (m *model) carryOver(j *jobState, sd *stepData, exit float64) {
	for ri, rank := range m.rankOf {
		if _, ok := j.carry[rank]; !ok && len(j.carry) >= maxTrackedRanks {
			continue
		}
		p := m.lastEnd[ri]
		j.carry[rank] = carry{
			step:    sd.step,
			lastEnd: sd.ops[m.order[p]].end,
			exit:    m.actualEnd[p] - exit,
		}
	}
}

// attributionFloor is the least a kind of work must save, as a fraction of the step's cost
// threshold, to be listed (what saves less is the replay's rounding).
const attributionFloor = 0.1

// attribute replays the step with one kind of work at its reference at a time (the what-if
// analysis' S_t): the ranks' own work between collectives (every gap at the job's ideal:
// see kinds.go; without stages its peers' median, balanced across replicas when the step's
// data was imbalanced), and each collective op's transfers (at their reference where the
// link analysis has one). It runs after whatIf, whose idealT, balancedGap and stage scales
// it reads.
func (m *model) attribute(sd *stepData, exit, threshold float64, roots []RootCause) []Saving {
	floor := attributionFloor * threshold
	var out []Saving
	n := len(m.order)
	data := false
	for i := range roots {
		data = data || roots[i].Cause == semconv.CauseDataImbalance
	}
	// The job's ideal work: a pipeline's has every op at its kind's median (stages and
	// replicas balanced already); without stages each gap is at its peers' reference, and an
	// imbalanced step's work balanced as well.
	copy(m.variantGap, m.jobGap)
	if data && m.nStages < 2 {
		for p := range n {
			m.variantGap[p] = min(m.variantGap[p], m.balancedGap[p])
		}
	}
	if saves := exit - m.simulate(sd, m.variantGap, m.replayT); saves >= floor {
		out = append(out, Saving{Kind: semconv.AttributionCompute, Saves: saves})
	}
	// The op kinds whose transfers exceed their references by at least floor in all (a
	// replay cannot save more than the durations it shortens), in order of first appearance.
	var kinds []string
	var excess []float64
	for c := range sd.colls {
		if d := m.replayT[c] - m.idealT[c]; d > 0 {
			k := opKind(&sd.colls[c])
			i := slices.Index(kinds, k)
			if i < 0 {
				kinds, excess = append(kinds, k), append(excess, 0)
				i = len(kinds) - 1
			}
			excess[i] += d
		}
	}
	for i, kind := range kinds {
		if excess[i] < floor {
			continue
		}
		copy(m.variantT, m.replayT)
		for c := range sd.colls {
			if opKind(&sd.colls[c]) == kind {
				m.variantT[c] = m.idealT[c]
			}
		}
		if saves := exit - m.simulate(sd, m.gap, m.variantT); saves >= floor {
			out = append(out, Saving{Kind: kind, Saves: saves})
		}
	}
	sort.SliceStable(out, func(x, y int) bool { return out[x].Saves > out[y].Saves })
	return out
}

// opKind is a collective's kind for attribution: its op, or send_recv for a message.
func opKind(c *collRec) string {
	if c.p2p {
		return semconv.OpSendRecv
	}
	return c.op
}
