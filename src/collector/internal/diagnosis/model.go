package diagnosis

import (
	"fmt"
	"math"
	"slices"
)

// model is the scratch space of one step's analysis, reused from step to step. Positions
// index the step's member spans sorted by (rank, start on the rank's clock): each rank's
// spans are one contiguous run, positions rankStart[r] .. rankStart[r+1]-1.
type model struct {
	// ranks: rankIdx numbers the ranks of the step (rank indexes), through rankSlot (rank
	// index + 1 of each rank, 0 none; only while reset numbers them) below maxRankSlots
	rankIdx   map[int32]int32
	rankSlot  []int32
	opRank    []int32 // rank index of each op index
	rankOf    []int32
	rankStart []int32
	entry     []float64 // virtual time the rank became free at the start of the step
	prevEnd   []int64   // the rank's clock at its last end in the previous step (0: unknown)
	prevExit  []float64 // and where that end is on this step's timeline
	lastEnd   []int32   // position of the rank's span that ended last
	excess    []float64 // summed positive excess of the rank's gaps over its peers'
	classOf   []int32
	classes   [][]int32 // rank indexes per class of ranks with the same sequence of spans

	// positions
	order  []int32   // op index at each position
	posOf  []int32   // position of each op index
	coll   []int32   // collective index of each position
	gap    []float64 // own work before the launch, seconds
	refOwn []int64   // the rank's clock when it became free before the launch
	depEnd []int32   // position of the span whose end the launch waited for, or -1
	// batches of point-to-point spans a rank posted together (Megatron's combined sends and
	// receives): batchFirst is each position's batch's first position (-1: in none),
	// batchLast the last, by first position; depBatch the first position of the batch whose
	// every span the launch waited for (-1 none): the rank waits on the whole batch.
	batchFirst, batchLast, depBatch []int32
	// candidate marks the ranks whose excess made them root-cause candidates this step.
	candidate []bool
	prevPG    []int32   // position of the rank's previous span in the same group, or -1
	netDur    []float64 // duration after the group's previous span ended, seconds
	refGap    []float64 // the peers' median gap at the same position of the step
	medGap    []float64 // the class's plain median gap there (see references)

	// collectives
	opColl   []int32
	pgID     []int32
	transfer []float64
	// replayT is what the replay takes a collective's transfer as (see timeline); sendDur
	// a message's send duration after it could start, and eager marks the messages whose
	// send ended before the receiver came (see eagerSends).
	replayT []float64
	sendDur []float64
	eager   []bool
	// forceEager marks messages of a size the step showed the transport buffers (see
	// eagerBySize): eager whatever their timing.
	forceEager []bool
	// settling: the replay of the actual step, which reads messages' transfers (settle)
	// and members' lags (endWithLag). held: the pacer held a rank in this step; its holds
	// are left out of the replay, so the waits for it cannot be read as lags or transfers
	// there (they would keep the holds' cost in the replayed step).
	settling bool
	held     bool
	pgIDs    map[string]int32
	// pgOverlaps marks, for the rank being laid out, the groups whose collectives overlapped
	// (a launch before the previous one's end); pgLastEnd is scratch for it
	pgOverlaps []bool
	pgLastEnd  []int64

	// simulation: ps is each position's replay state, epoch the current replay's number
	// (a position is done, or launched, in the replay whose epoch it holds).
	ps               []posSim
	epoch            uint32
	cursor, waitNext []int32
	blockedOn        []int32
	// colls is each collective's replay state in one record (read together at every
	// member: apart, they were a cache miss each), in the replay's numbering (simOf, and
	// simColl of each position; see numberReplay).
	colls   []collSim
	simOf   []int32
	simColl []int32
	// tape is the order of the step's replays without settling (see replayTape), valid
	// once the first of them recorded it (tapeValid; recording while it does), with the
	// breaks it made.
	tape       []tapeEvent
	tapeValid  bool
	recording  bool
	tapeBreaks int
	queue      []int32
	breaks     int
	// stuck is set when a replay of the step could not go on (see simulate).
	stuck     bool
	actualEnd []float64

	// curPh and prevPh are each rank's phase entries of this step and the previous one (nil
	// none; see readPhases).
	curPh, prevPh []*phaseEntry
	// sortKeys is reset's scratch for ordering a rank's spans; spanScratch rankSpans'.
	sortKeys    []spanKey
	spanScratch []phaseSpan

	// what-if buffers: idealGap is each gap at its peers' reference (a rank fixed alone runs
	// as its peers do), jobGap at the job's ideal (see kinds.go; idealGap where the job has
	// no pipeline stages)
	idealGap, variantGap, jobGap []float64
	idealT, variantT, jobT       []float64
	// kinds is the split of a pipeline step's gaps into phase spans (kinds.go)
	kinds contentScratch

	// imbalances: each rank's pipeline stage (-1 none) and sender, the stages' count, the
	// gaps with work balanced across replicas or stages
	stage, pred                    []int32
	nStages                        int32
	baseGap, balancedGap, stageGap []float64
	stageWork, scale               []float64
	// data imbalance: each rank's replica (its stage-0 rank), its work over its class's
	// mean, and per stage and replica what replicaAgreement sums
	replica, stageBest, stageCount []int32
	over, replicaOver              []float64
	stageBestOver, stageMean       []float64
	// inputs is each rank's input in the step (training.input.size), where no stages are;
	// hasInputs whether every rank gave its
	inputs    []float64
	hasInputs bool

	classIdx map[uint64]int32
	vals     []float64
	scratch  []float64
	links    linkScratch
}

// posSim is one position's state in a replay, with what the replay reads of its span
// (its role, whether it is a message's send) and its lag (how long after its collective
// ended the rank saw it, seconds: measured by the replay of the actual step, kept by the
// what-ifs): read together at every member, kept apart they were a cache miss each.
type posSim struct {
	launch, net, end, lag float64
	doneAt, netAt         uint32
	role                  Role
	send                  bool
}

// collSim is one collective's state in a replay: its members (ops first..first+n-1, p2p
// for a message), how many are known (launched), the latest launch among them, its end
// once done, and the first rank waiting for it (waitHead, -1 none).
type collSim struct {
	// t is the collective's transfer in this replay (the replay's transfer[c], which the
	// replay of the actual step settles); sendDur and eager are a message's (m.sendDur,
	// m.eager), orig its index in the step (sd.colls).
	maxNet, end, t  float64
	sendDur         float64
	orig            int32
	eager           bool
	first, n, known int32
	waitHead        int32
	done, p2p       bool
}

// maxRankSlots bounds the ranks that rankIndex finds in a table indexed by rank (4 MB of it
// at most); larger ones go to a map.
const maxRankSlots = 1 << 20

// rankIndex returns the rank index of rank r in this step, numbering a rank it has not seen
// next (ranks in order of their first op).
func (m *model) rankIndex(r int32) int32 {
	if r >= 0 && int(r) < len(m.rankSlot) {
		if ri := m.rankSlot[r]; ri > 0 {
			return ri - 1
		}
		ri := int32(len(m.rankOf))
		m.rankSlot[r] = ri + 1
		m.rankOf = append(m.rankOf, r)
		return ri
	}
	ri, ok := m.rankIdx[r]
	if !ok {
		ri = int32(len(m.rankOf))
		m.rankIdx[r] = ri
		m.rankOf = append(m.rankOf, r)
	}
	return ri
}

// grow returns s with length n, reusing its capacity.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (m *model) reset(sd *stepData) {
	nOps, nColls := len(sd.ops), len(sd.colls)
	if m.rankIdx == nil {
		m.rankIdx = make(map[int32]int32)
		m.pgIDs = make(map[string]int32)
		m.classIdx = make(map[uint64]int32)
	}
	clear(m.rankIdx)
	clear(m.pgIDs)
	maxRank := int32(-1)
	for i := range sd.ops {
		maxRank = max(maxRank, sd.ops[i].rank)
	}
	if maxRank < maxRankSlots && int(maxRank) >= len(m.rankSlot) {
		m.rankSlot = make([]int32, maxRank+1)
	}
	m.rankOf = m.rankOf[:0]
	m.opColl = grow(m.opColl, nOps)
	m.pgID = grow(m.pgID, nColls)
	m.transfer = grow(m.transfer, nColls)
	m.replayT = grow(m.replayT, nColls)
	m.sendDur = grow(m.sendDur, nColls)
	m.eager = grow(m.eager, nColls)
	m.forceEager = grow(m.forceEager, nColls)
	clear(m.forceEager)
	for c := range sd.colls {
		rec := &sd.colls[c]
		for i := rec.first; i < rec.first+rec.n; i++ {
			m.opColl[i] = int32(c)
		}
		// Collectives of one group come in runs (a pipeline pair's messages, in release
		// order): the previous one's id is the likely one.
		if c > 0 && rec.pg == sd.colls[c-1].pg {
			m.pgID[c] = m.pgID[c-1]
			continue
		}
		id, ok := m.pgIDs[rec.pg]
		if !ok {
			id = int32(len(m.pgIDs))
			m.pgIDs[rec.pg] = id
		}
		m.pgID[c] = id
	}
	// Ranks are numbered in ascending order, whatever order their spans arrived in: every
	// sample over ranks (a class's peers past maxPeerSample, the spread of the excess) is
	// then the same for the same spans, so the analysis does not depend on arrival order.
	m.opRank = grow(m.opRank, nOps)
	for i := range sd.ops {
		m.rankIndex(sd.ops[i].rank)
	}
	if !slices.IsSorted(m.rankOf) {
		slices.Sort(m.rankOf)
		for ri, r := range m.rankOf {
			if r >= 0 && int(r) < len(m.rankSlot) {
				m.rankSlot[r] = int32(ri) + 1
			} else {
				m.rankIdx[r] = int32(ri)
			}
		}
	}
	for i := range sd.ops {
		m.opRank[i] = m.rankIndex(sd.ops[i].rank)
	}
	nRanks := len(m.rankOf)
	for _, r := range m.rankOf {
		if r >= 0 && int(r) < len(m.rankSlot) {
			m.rankSlot[r] = 0
		}
	}
	m.rankStart = grow(m.rankStart, nRanks+1)
	clear(m.rankStart)
	for _, ri := range m.opRank {
		m.rankStart[ri+1]++
	}
	for r := 1; r <= nRanks; r++ {
		m.rankStart[r] += m.rankStart[r-1]
	}
	m.order = grow(m.order, nOps)
	m.cursor = grow(m.cursor, nRanks)
	copy(m.cursor, m.rankStart[:nRanks])
	for i, ri := range m.opRank {
		m.order[m.cursor[ri]] = int32(i)
		m.cursor[ri]++
	}
	for ri := range nRanks {
		// A rank's spans by start, then end, then op index (a total order: one sorted
		// order), sorted on their keys copied out of the op records.
		run := m.order[m.rankStart[ri]:m.rankStart[ri+1]]
		keys := m.sortKeys[:0]
		for _, i := range run {
			keys = append(keys, spanKey{start: sd.ops[i].start, end: sd.ops[i].end, i: i})
		}
		if !slices.IsSortedFunc(keys, cmpSpanKey) {
			slices.SortFunc(keys, cmpSpanKey)
			for k := range keys {
				run[k] = keys[k].i
			}
		}
		m.sortKeys = keys
	}
	m.posOf = grow(m.posOf, nOps)
	m.coll = grow(m.coll, nOps)
	m.ps = grow(m.ps, nOps)
	for p, i := range m.order {
		m.posOf[i] = int32(p)
		m.coll[p] = m.opColl[i]
	}
	m.numberReplay(sd)
	m.tapeValid = false
	for c := range sd.colls {
		rec := &sd.colls[c]
		for i := rec.first; i < rec.first+rec.n; i++ {
			p := m.posOf[i]
			m.ps[p].role = sd.ops[i].role
			m.ps[p].send = rec.p2p && sd.ops[i].role == RoleSend
		}
	}
	m.gap = grow(m.gap, nOps)
	m.refOwn = grow(m.refOwn, nOps)
	m.depEnd = grow(m.depEnd, nOps)
	m.batchFirst = grow(m.batchFirst, nOps)
	m.batchLast = grow(m.batchLast, nOps)
	m.depBatch = grow(m.depBatch, nOps)
	m.prevPG = grow(m.prevPG, nOps)
	m.netDur = grow(m.netDur, nOps)
	for p := range m.ps {
		m.ps[p].lag = 0
	}
	m.held = false
	m.refGap = grow(m.refGap, nOps)
	m.entry = grow(m.entry, nRanks)
	m.prevEnd = grow(m.prevEnd, nRanks)
	m.prevExit = grow(m.prevExit, nRanks)
	m.lastEnd = grow(m.lastEnd, nRanks)
	m.excess = grow(m.excess, nRanks)
	m.classOf = grow(m.classOf, nRanks)
}

// numberReplay numbers the collectives for the replay in the order of their first member's
// position (simOf; the record colls[simOf[c]] is collective c's, simColl[p] position p's
// collective's) and lays out their records: each rank then reads its collectives' records
// in a few runs, where in release order each was a cache miss. The replay does not depend
// on the numbering.
func (m *model) numberReplay(sd *stepData) {
	nColls := len(sd.colls)
	m.simOf = grow(m.simOf, nColls)
	for c := range m.simOf {
		m.simOf[c] = -1
	}
	m.simColl = grow(m.simColl, len(m.order))
	m.colls = grow(m.colls, nColls)
	next := int32(0)
	number := func(c int32) int32 {
		rec := &sd.colls[c]
		s := next
		next++
		m.simOf[c] = s
		m.colls[s] = collSim{first: rec.first, n: rec.n, p2p: rec.p2p, orig: c}
		return s
	}
	for p, c := range m.coll {
		s := m.simOf[c]
		if s < 0 {
			s = number(c)
		}
		m.simColl[p] = s
	}
	for c := range nColls {
		if m.simOf[c] < 0 {
			number(int32(c))
		}
	}
}

// readPhases looks up each rank's phase entries of the step and the previous one once:
// the timeline, the causes, the replay's self-check, the imbalances and the group phases
// read them (the phase cache is not added to while a step is analyzed, so they stay valid).
func (m *model) readPhases(a *Analyzer, j *jobState, sd *stepData) {
	m.curPh = grow(m.curPh, len(m.rankOf))
	m.prevPh = grow(m.prevPh, len(m.rankOf))
	for ri, rank := range m.rankOf {
		m.curPh[ri] = a.phases.get(j.name, sd.step, rank)
		m.prevPh[ri] = a.phases.get(j.name, sd.step-1, rank)
	}
}

// markOverlapping sets m.pgOverlaps for the groups of which the rank launched a collective
// before its previous one in the group had ended (positions first..stop-1), and clears it
// for the others.
func (m *model) markOverlapping(sd *stepData, first, stop int32) {
	n := len(m.pgIDs)
	m.pgOverlaps = grow(m.pgOverlaps, n)
	m.pgLastEnd = grow(m.pgLastEnd, n)
	for p := first; p < stop; p++ {
		g := m.pgID[m.coll[p]]
		m.pgOverlaps[g], m.pgLastEnd[g] = false, math.MinInt64
	}
	for p := first; p < stop; p++ {
		g := m.pgID[m.coll[p]]
		op := &sd.ops[m.order[p]]
		if op.start < m.pgLastEnd[g] {
			m.pgOverlaps[g] = true
		}
		m.pgLastEnd[g] = max(m.pgLastEnd[g], op.end)
	}
}

// markBatches finds the batches among a rank's spans (positions first..stop-1, in start
// order): asynchronous point-to-point spans launched and ended within asyncBatchWindow of
// the first of them, two or more (Megatron's send_forward_recv_backward, recorded as one
// call): their recorded ends are the batch's, which completes when its last message does.
// Spans launched together that end apart (torch's batch_isend_irecv on gloo, whose works
// complete one by one) are each their own.
func (m *model) markBatches(sd *stepData, first, stop int32) {
	for p := first; p < stop; p++ {
		m.batchFirst[p] = -1
	}
	for p := first; p < stop; {
		op := &sd.ops[m.order[p]]
		if !op.async || !sd.colls[m.coll[p]].p2p {
			p++
			continue
		}
		last := p
		for q := p + 1; q < stop; q++ {
			qo := &sd.ops[m.order[q]]
			if qo.start-op.start > asyncBatchWindow {
				break
			}
			if m.batchedWith(sd, op, q) {
				last = q
			}
		}
		if last > p {
			for q := p; q <= last; q++ {
				if q == p || m.batchedWith(sd, op, q) {
					m.batchFirst[q] = p
				}
			}
			m.batchLast[p] = last
		}
		p = last + 1
	}
}

// batchedWith reports whether position q's span was posted in one batch with op: an
// asynchronous point-to-point span launched within asyncBatchWindow of it and before it
// ended (two short messages one after the other are no batch), and ended within
// asyncBatchWindow of it.
func (m *model) batchedWith(sd *stepData, op *opRec, q int32) bool {
	qo := &sd.ops[m.order[q]]
	return qo.async && sd.colls[m.coll[q]].p2p && qo.start < op.end &&
		abs64(qo.start-op.start) <= asyncBatchWindow && abs64(qo.end-op.end) <= asyncBatchWindow
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// batchDone reports whether every span of the batch starting at b has ended in the current
// replay; batchEnd is the latest of their ends.
func (m *model) batchDone(b int32) (int32, bool) {
	for x := b; x <= m.batchLast[b]; x++ {
		if m.batchFirst[x] == b && m.ps[x].doneAt != m.epoch {
			return x, false
		}
	}
	return -1, true
}

func (m *model) batchEnd(b int32) float64 {
	end := math.Inf(-1)
	for x := b; x <= m.batchLast[b]; x++ {
		if m.batchFirst[x] == b {
			end = max(end, m.ps[x].end)
		}
	}
	return end
}

// asyncWaitSlack is how soon after an asynchronous span's end a blocking launch must follow
// for the rank to be taken as having waited for it: 2 ms or a tenth of the launch's gap from
// its other reference, whichever is more (a launch long after the end was the rank's work),
// and a quarter of that gap for a launch of another group. The time after the end counts as
// the rank's own work either way. The next collective of the same group is DDP's next
// bucket, launched when its gradients are ready whenever the previous one ended (its
// launches come every few ms, and a wider slack takes some of them for waits and not
// others). Another group's launch right after is what follows a wait: the FSDP all-gather
// of the next layer after tensor parallel's all-reduce. A tenth was too little there on a
// busy host: an FSDP2 x TP rank beside a CPU hog, descheduled for 10 ms after its
// tensor-parallel all-reduce (88 ms of waiting for a straggler) completed, had the whole
// 98 ms counted as its own work, more than the straggler's, and was named in its place.
func asyncWaitSlack(gap int64, sameGroup bool) int64 {
	if sameGroup {
		return max(2_000_000, gap/10)
	}
	return max(2_000_000, gap/4)
}

// delayWithin is how long the pacer held the rank between from and to (0 without an entry).
func delayWithin(e *phaseEntry, from, to int64) int64 {
	if e == nil {
		return 0
	}
	iv, ok := e.get(PhaseDelay)
	if !ok {
		return 0
	}
	return min(iv.total, overlap(from, to, iv.start, iv.end))
}

// asyncEndLag is how long after the launch it let through an asynchronous span's recorded
// end may be (its completion callback runs after the waiter is woken).
const asyncEndLag = 2_000_000

// asyncBatchWindow: spans launched this soon after an asynchronous span were issued with it
// (a send and a receive of one batch_isend_irecv), not after waiting for it.
const asyncBatchWindow = 1_000_000

// spanKey is what a rank's spans are ordered by: start, end, op index.
type spanKey struct {
	start, end int64
	i          int32
}

func cmpSpanKey(x, y spanKey) int {
	switch {
	case x.start != y.start:
		return cmpInt64(x.start, y.start)
	case x.end != y.end:
		return cmpInt64(x.end, y.end)
	default:
		return int(x.i - y.i)
	}
}

func cmpInt64(x, y int64) int {
	if x < y {
		return -1
	}
	if x > y {
		return 1
	}
	return 0
}

// timeline computes each span's gap, dependencies and transfer, and each rank's entry.
func (m *model) timeline(a *Analyzer, j *jobState, sd *stepData) {
	var outstanding []int32
	type pgLast struct{ pg, pos int32 }
	var lastInPG []pgLast
	for ri := range m.rankOf {
		rank := m.rankOf[ri]
		first, stop := m.rankStart[ri], m.rankStart[ri+1]
		start0 := sd.ops[m.order[first]].start
		ref := start0
		m.entry[ri] = 0
		m.prevEnd[ri], m.prevExit[ri] = 0, 0
		if c, ok := j.carry[rank]; ok && c.step == sd.step-1 {
			// The rank was free at the end of its last span of the previous step, or at its
			// first launch in this one if that came first (an asynchronous span's
			// completion seen after the next step began).
			ref = min(c.lastEnd, start0)
			m.entry[ri] = c.exit - float64(c.lastEnd-ref)/1e9
			m.prevEnd[ri], m.prevExit[ri] = c.lastEnd, c.exit
		} else if ph := m.curPh[ri]; ph != nil {
			if iv, ok := ph.get(PhaseStep); ok && iv.start <= start0 {
				ref = iv.start
			}
		}
		cur, prev := m.curPh[ri], m.prevPh[ri]
		outstanding = outstanding[:0]
		lastInPG = lastInPG[:0]
		m.markOverlapping(sd, first, stop)
		m.markBatches(sd, first, stop)
		doneMaxEnd, doneMaxPos := int64(math.MinInt64), int32(-1)
		lastEndPos := first
		for p := first; p < stop; p++ {
			op := &sd.ops[m.order[p]]
			m.depEnd[p] = -1
			m.depBatch[p] = -1
			if p > first {
				// Blocking spans that ended before this launch: the rank waited for the
				// latest of them. An asynchronous span's end is not waited for mid-step (a
				// DDP bucket's launch does not wait for the previous bucket).
				asyncMaxEnd, asyncMaxPos := int64(math.MinInt64), int32(-1)
				kept := outstanding[:0]
				for _, q := range outstanding {
					qo := &sd.ops[m.order[q]]
					// An asynchronous span ends when its completion callback runs, which
					// can be a little after the wait that let the rank go on.
					// A span launched within asyncBatchWindow of it was issued with it
					// (batch_isend_irecv), not after waiting for it.
					if qo.async && qo.end <= op.start+asyncEndLag && qo.end > asyncMaxEnd &&
						op.start-qo.start >= asyncBatchWindow {
						asyncMaxEnd, asyncMaxPos = qo.end, q
					}
					if qo.end <= op.start {
						// A receive is a data dependency of what follows it, asynchronous
						// or not: the stage computes on the message once it is in.
						if (!qo.async || qo.role == RoleRecv) && qo.end > doneMaxEnd {
							doneMaxEnd, doneMaxPos = qo.end, q
						}
					} else {
						kept = append(kept, q)
					}
				}
				outstanding = kept
				ref = sd.ops[m.order[p-1]].start
				if doneMaxPos >= 0 && doneMaxEnd > ref {
					ref = doneMaxEnd
					m.depEnd[p] = doneMaxPos
				}
				// A span launched right after an asynchronous one completed waited for it
				// (DDP's backward returns once its last bucket is reduced, then the next
				// stage's gradient is sent): the time before is waiting, not the rank's own
				// work. Not a collective of the same group whose collectives overlap on this
				// rank: DDP's next bucket is launched when its gradients are ready, whenever
				// the previous one ends. (Tensor parallel's all-reduces of one group are
				// asynchronous too, but each is waited for at once: they never overlap.)
				if asyncMaxPos >= 0 && asyncMaxEnd > ref {
					pg := m.pgID[m.coll[p]]
					sameGroup := m.pgID[m.coll[asyncMaxPos]] == pg
					if op.start-asyncMaxEnd <= asyncWaitSlack(max(0, op.start-ref), sameGroup) &&
						!(op.async && sameGroup && m.pgOverlaps[pg]) {
						ref = asyncMaxEnd
						m.depEnd[p] = asyncMaxPos
					}
				}
			}
			// (Never a batch the launch is in: its spans ended together, after it.)
			if d := m.depEnd[p]; d >= 0 && m.batchFirst[d] >= 0 && m.batchFirst[p] != m.batchFirst[d] {
				m.depBatch[p] = m.batchFirst[d]
			}
			outstanding = append(outstanding, p)
			m.refOwn[p] = ref
			// The pacer's delays are not the rank's work: a paced rank is early, not slow.
			held := max(delayWithin(cur, ref, op.start), delayWithin(prev, ref, op.start))
			if held > 0 {
				m.held = true
			}
			m.gap[p] = float64(max(0, op.start-ref-held)) / 1e9

			pg := m.pgID[m.coll[p]]
			m.prevPG[p] = -1
			netStart := op.start
			found := false
			for k := range lastInPG {
				if lastInPG[k].pg == pg {
					q := lastInPG[k].pos
					m.prevPG[p] = q
					netStart = max(netStart, sd.ops[m.order[q]].end)
					lastInPG[k].pos = p
					found = true
					break
				}
			}
			if !found {
				lastInPG = append(lastInPG, pgLast{pg: pg, pos: p})
			}
			m.netDur[p] = float64(max(0, op.end-netStart)) / 1e9
			if op.end > sd.ops[m.order[lastEndPos]].end {
				lastEndPos = p
			}
		}
		m.lastEnd[ri] = lastEndPos
	}
	// A transfer is the shortest time a member spent in it after it could start: for a
	// message, the sender's and the receiver's alike (NCCL and gloo send once the receiver
	// posted its receive, so a send held for a late receiver was waiting, not moving bytes).
	// A message is first replayed that way, both sides ending at the later arrival plus the
	// transfer; settleMessages then reads it from the receive on the replayed timeline.
	for c := range sd.colls {
		rec := &sd.colls[c]
		t, sent := math.Inf(1), 0.0
		for i := rec.first; i < rec.first+rec.n; i++ {
			d := m.netDur[m.posOf[i]]
			t = min(t, d)
			if rec.p2p && sd.ops[i].role == RoleSend {
				sent = d
			}
		}
		if math.IsInf(t, 1) {
			t = 0
		}
		m.transfer[c] = t
		m.replayT[c] = t
		m.sendDur[c] = sent
		m.eager[c] = false
		cs := &m.colls[m.simOf[c]]
		cs.sendDur, cs.eager = sent, false
	}
}

// settle reads a message's transfer from the replay of the actual step, once its send and
// receive are both launched there. In that replay each side ends as it was measured: the
// send its own duration after its launch, the receive its own duration after its launch
// (or at the send's launch, if later). For the what-ifs, a send that ended before its
// receiver was launched did not wait for it (a small message, a buffered transport): it is
// eager, ends on its own, and its duration is the transfer. Otherwise the receive is the
// side to trust: it ends when the message is in, and the rank waits for it, while a send's
// recorded end is not (an asynchronous send's completion is seen when the rank next waits,
// tens of milliseconds late under torch.distributed.pipelining; a send held for a late
// receiver waited). The message then ends where its receive ended, and its transfer is that
// minus the later launch of the two.
func (m *model) settle(c, ps, pr int32) {
	ds, dr := m.sendDur[c], m.netDur[pr]
	ns, nr := m.ps[ps].net, m.ps[pr].net
	if m.forceEager[c] || ns+ds < nr-eagerSlack(ds) {
		m.eager[c] = true
		m.replayT[c], m.transfer[c] = ds, ds
		cs := &m.colls[m.simOf[c]]
		cs.t, cs.eager = ds, true
		return
	}
	// A message takes no longer than its send did when the receive came last: a receive
	// launched late on the replayed timeline (a rank the previous step left misplaced) that
	// in fact waited for a late send must not carry that wait into the replay, or the rank
	// would stay misplaced.
	t := max(0, nr+dr-max(ns, nr))
	if nr > ns && ds > 0 {
		t = min(t, ds)
	}
	// A side posted in a batch ends with the batch, whose other messages may have taken
	// longer: the message was in by the earlier of its two sides' ends.
	if m.batchFirst[ps] >= 0 || m.batchFirst[pr] >= 0 {
		t = max(0, min(ns+ds, nr+dr)-max(ns, nr))
	}
	m.replayT[c], m.transfer[c] = t, t
	// The replay of the actual step replays m.replayT.
	m.colls[m.simOf[c]].t = t
}

// messageEnds returns the positions of a message's send and receive (cs its replay record),
// ok false unless both were reached in the last replay.
func (m *model) messageEnds(cs *collSim) (int32, int32, bool) {
	ps, pr := m.posOf[cs.first], m.posOf[cs.first+1]
	if m.ps[ps].role == RoleRecv {
		ps, pr = pr, ps
	}
	ok := m.ps[ps].role == RoleSend && m.netSet(ps) && m.netSet(pr)
	return ps, pr, ok
}

// eagerBySize marks the messages of every size of which the step had an eager one (a send
// that ended before its receiver was launched) as eager too, where their sends were
// blocking, and reports whether it marked any that the replay of the actual step had read
// otherwise. A transport that let one send
// of a size complete before its receiver came buffers that size: its sends do not wait for
// receivers, and one whose receiver was posted while it was in flight ended when its bytes
// were out, not when the receiver took them (read so, its transfer is shorter than the wire
// time and the what-ifs make it wait for a receiver it never waited for). A rendezvous
// transport (NCCL) never shows such a send, and nothing changes.
func (m *model) eagerBySize(sd *stepData) bool {
	var sizes []int64
	for c := range sd.colls {
		if sd.colls[c].p2p && m.eager[c] && !slices.Contains(sizes, sd.colls[c].bytes) {
			sizes = append(sizes, sd.colls[c].bytes)
		}
	}
	if len(sizes) == 0 {
		return false
	}
	marked := false
	for c := range sd.colls {
		if sd.colls[c].p2p && !m.eager[c] && slices.Contains(sizes, sd.colls[c].bytes) &&
			m.blockingSend(sd, int32(c)) {
			m.forceEager[c] = true
			marked = true
		}
	}
	return marked
}

// blockingSend reports whether the message's send span was blocking: its end is when the
// rank saw the send done. An asynchronous send's end is when the rank next waited (tens of
// milliseconds late under torch.distributed.pipelining), no measure of its transfer.
func (m *model) blockingSend(sd *stepData, c int32) bool {
	rec := &sd.colls[c]
	for i := rec.first; i < rec.first+rec.n; i++ {
		if sd.ops[i].role == RoleSend {
			return !sd.ops[i].async
		}
	}
	return false
}

// eagerSlack is the margin eagerSends wants: 0.1 ms or a tenth of the send.
func eagerSlack(d float64) float64 { return max(1e-4, d/10) }

// simulate replays the step from gaps and transfers and returns the latest rank's exit
// (the end of its span that ended last) on the virtual timeline. The ends are in m.ps.
func (m *model) simulate(sd *stepData, gaps, transfer []float64) float64 {
	nColls, nRanks := len(sd.colls), len(m.rankOf)
	// A new epoch: no position is done or launched in it yet.
	m.epoch++
	if m.epoch == 0 {
		for p := range m.ps {
			m.ps[p].doneAt, m.ps[p].netAt = 0, 0
		}
		m.epoch = 1
	}
	for c := range nColls {
		cs := &m.colls[c]
		cs.known, cs.done, cs.maxNet, cs.end, cs.waitHead = 0, false, math.Inf(-1), 0, -1
		cs.t = transfer[cs.orig]
	}
	if !m.settling {
		if m.tapeValid {
			if verifyTape {
				return m.verifiedTape(sd, gaps, transfer)
			}
			return m.replayTape(sd, gaps, transfer)
		}
		// The step's first replay without settling records its order for the others.
		m.recording = true
		m.tape = m.tape[:0]
		defer m.recorded(m.breaks)
	}
	m.waitNext = grow(m.waitNext, nRanks)
	m.blockedOn = grow(m.blockedOn, nRanks)
	m.cursor = grow(m.cursor, nRanks)
	copy(m.cursor, m.rankStart[:nRanks])
	m.queue = m.queue[:0]
	for ri := range nRanks {
		m.queue = append(m.queue, int32(ri))
	}
	finished := 0
	// firstWaiting is the lowest rank that may not have finished: a finished rank stays
	// finished, so the search for the first waiting one never goes back (a pipeline's
	// what-ifs break thousands of times per step; a scan from rank 0 each time was
	// quadratic in the ranks).
	firstWaiting := 0
	for finished < nRanks {
		for len(m.queue) > 0 {
			ri := m.queue[len(m.queue)-1]
			m.queue = m.queue[:len(m.queue)-1]
			if m.advance(sd, ri, gaps, transfer) {
				finished++
			}
		}
		if finished == nRanks {
			break
		}
		// Every unfinished rank waits for a collective that cannot complete in this order
		// (spans whose order is inconsistent across ranks): release the one the first
		// waiting rank needs with the members known so far.
		m.breaks++
		for m.cursor[firstWaiting] == m.rankStart[firstWaiting+1] {
			firstWaiting++
		}
		c := m.breakAt(firstWaiting)
		if m.colls[c].done {
			// Released already, and still waited on: no release frees that rank. Any other
			// waiting rank's collective, else the replay stops here (spans no order can
			// replay: counted in ModelBreaks, never a replay that does not end).
			c = m.anyUnreleased(firstWaiting)
			if c < 0 {
				m.stuck = true
				break
			}
		}
		m.resolve(sd, c, transfer)
	}
	exit := math.Inf(-1)
	for ri := range nRanks {
		if p := m.lastEnd[ri]; m.ps[p].doneAt == m.epoch {
			exit = max(exit, m.ps[p].end)
		}
	}
	if math.IsInf(exit, -1) {
		exit = 0
	}
	return exit
}

// anyUnreleased returns the collective some unfinished rank from firstWaiting on waits
// for that is not released yet (-1 none).
func (m *model) anyUnreleased(firstWaiting int) int32 {
	for ri := firstWaiting; ri < len(m.rankOf); ri++ {
		if m.cursor[ri] == m.rankStart[ri+1] {
			continue
		}
		if c := m.blockedOn[ri]; !m.colls[c].done {
			return c
		}
	}
	return -1
}

// maxBreakScan bounds the waiting ranks breakAt looks at.
const maxBreakScan = 64

// breakAt picks the collective a replay in which every unfinished rank waits releases
// (firstWaiting is the lowest unfinished rank). A message whose send was launched and waits
// for a receiver that is itself held up goes first: a send of whose receiver the recorded
// timings say nothing (it was posted before the send ended) is taken to wait for it, and
// when a what-if moves the two apart that makes cycles the job never had (a 1F1B stage's
// send waiting on the next stage, which waits on its own send back); the transport buffered
// it, so it ends on its own (see resolve). Else the collective the first waiting rank needs.
func (m *model) breakAt(firstWaiting int) int32 {
	nRanks := len(m.rankOf)
	for ri, seen := firstWaiting, 0; ri < nRanks && seen < maxBreakScan; ri++ {
		if m.cursor[ri] == m.rankStart[ri+1] {
			continue
		}
		seen++
		c := m.blockedOn[ri]
		cs := &m.colls[c]
		if !cs.p2p || cs.done || cs.n != 2 {
			continue
		}
		ps, pr := m.posOf[cs.first], m.posOf[cs.first+1]
		if m.ps[ps].role == RoleRecv {
			ps, pr = pr, ps
		}
		if m.ps[ps].role == RoleSend && m.netSet(ps) && !m.netSet(pr) {
			return c
		}
	}
	return m.blockedOn[firstWaiting]
}

// tapeEvent is one event of a replay: the launch of position x (ri its rank where x is the
// rank's first position, else -1), or where x < 0 the resolve of collective -x-1 (the
// replay's numbering).
type tapeEvent struct {
	x, ri int32
}

// recorded ends the recording of the tape (see simulate), breaks the count before it.
func (m *model) recorded(breaks int) {
	m.recording = false
	m.tapeValid = true
	m.tapeBreaks = m.breaks - breaks
}

// replayTape is simulate without settling along the tape the step's first replay without
// settling recorded. What such a replay does, in which order, does not depend on the gaps
// and transfers: which spans wait for which, and so which rank advances when, which
// collective completes when and which the replay breaks the order at, follows from the
// step's spans and their roles alone (and the eager messages the replay of the actual step
// settled). So every replay without settling of a step launches its spans and resolves its
// collectives in the same order, computing each value as advance and resolve do; only the
// values differ. It returns the latest rank's exit as simulate does.
func (m *model) replayTape(sd *stepData, gaps, transfer []float64) float64 {
	epoch := m.epoch
	for _, ev := range m.tape {
		if ev.x < 0 {
			m.resolve(sd, -ev.x-1, transfer)
			continue
		}
		p := ev.x
		d, q := m.depEnd[p], m.prevPG[p]
		var base float64
		if ev.ri >= 0 {
			base = m.entry[ev.ri]
		} else {
			base = m.ps[p-1].launch
		}
		if d >= 0 && m.ps[d].end > base {
			base = m.ps[d].end
		}
		if b := m.depBatch[p]; b >= 0 {
			base = max(base, m.batchEnd(b))
		}
		ps := &m.ps[p]
		ps.launch = base + gaps[p]
		n := ps.launch
		if q >= 0 && m.ps[q].end-m.ps[q].lag > n {
			n = m.ps[q].end - m.ps[q].lag
		}
		ps.net = n
		ps.netAt = epoch
		cs := &m.colls[m.simColl[p]]
		if cs.done {
			ps.end = m.endWithLag(sd, p, max(cs.end, n+cs.t))
			ps.doneAt = epoch
			continue
		}
		if ps.send && cs.eager {
			ps.end = n + cs.t
			ps.doneAt = epoch
		}
		if n > cs.maxNet {
			cs.maxNet = n
		}
	}
	// No rank waited in the queue: what resolve woke is dropped.
	m.queue = m.queue[:0]
	m.breaks += m.tapeBreaks
	exit := math.Inf(-1)
	for ri := range m.rankOf {
		exit = max(exit, m.ps[m.lastEnd[ri]].end)
	}
	return exit
}

// verifyTape makes every replay along a tape run again without it and panic where an end,
// the exit or the breaks differ by a bit (tests).
var verifyTape bool

// verifiedTape is replayTape checked against simulate without the tape.
func (m *model) verifiedTape(sd *stepData, gaps, transfer []float64) float64 {
	before := m.breaks
	exit := m.replayTape(sd, gaps, transfer)
	breaks := m.breaks - before
	ends := make([]uint64, len(m.ps))
	for p := range m.ps {
		ends[p] = math.Float64bits(m.ps[p].end)
	}
	tape, tapeBreaks := slices.Clone(m.tape), m.tapeBreaks
	m.tapeValid = false
	again := m.simulate(sd, gaps, transfer)
	for p := range m.ps {
		if math.Float64bits(m.ps[p].end) != ends[p] {
			panic(fmt.Sprintf("replay along the tape: position %d ends at %v, without it at %v",
				p, math.Float64frombits(ends[p]), m.ps[p].end))
		}
	}
	if math.Float64bits(exit) != math.Float64bits(again) || m.breaks-before-breaks != breaks {
		panic(fmt.Sprintf("replay along the tape: exit %v, %d breaks; without it %v, %d", exit,
			breaks, again, m.breaks-before-breaks))
	}
	m.tape, m.tapeBreaks, m.tapeValid = tape, tapeBreaks, true
	m.breaks = before + breaks
	tapesVerified++
	return exit
}

// tapesVerified counts the replays verifiedTape checked.
var tapesVerified int

// advance moves rank ri through its spans until one waits for an unresolved end; it
// reports whether the rank finished.
func (m *model) advance(sd *stepData, ri int32, gaps, transfer []float64) bool {
	first, stop := m.rankStart[ri], m.rankStart[ri+1]
	epoch := m.epoch
	for p := m.cursor[ri]; p < stop; p++ {
		d, q := m.depEnd[p], m.prevPG[p]
		if d >= 0 && m.ps[d].doneAt != epoch {
			m.block(ri, p, m.simColl[d])
			return false
		}
		if q >= 0 && m.ps[q].doneAt != epoch {
			m.block(ri, p, m.simColl[q])
			return false
		}
		if b := m.depBatch[p]; b >= 0 {
			if x, ok := m.batchDone(b); !ok {
				m.block(ri, p, m.simColl[x])
				return false
			}
		}
		if m.recording {
			ev := tapeEvent{x: p, ri: -1}
			if p == first {
				ev.ri = ri
			}
			m.tape = append(m.tape, ev)
		}
		base := m.entry[ri]
		if p > first {
			base = m.ps[p-1].launch
		}
		if d >= 0 && m.ps[d].end > base {
			base = m.ps[d].end
		}
		if b := m.depBatch[p]; b >= 0 {
			base = max(base, m.batchEnd(b))
		}
		ps := &m.ps[p]
		ps.launch = base + gaps[p]
		n := ps.launch
		// The group's previous collective completed before this one could start: its end
		// on this rank less the lag with which the rank saw it (see endWithLag).
		if q >= 0 && m.ps[q].end-m.ps[q].lag > n {
			n = m.ps[q].end - m.ps[q].lag
		}
		ps.net = n
		ps.netAt = epoch
		c := m.simColl[p]
		cs := &m.colls[c]
		if cs.done {
			// Released early (see simulate); a member arriving after that ends after it.
			ps.end = m.endWithLag(sd, p, max(cs.end, n+cs.t))
			ps.doneAt = epoch
			continue
		}
		if ps.send && (m.settling || cs.eager) {
			// An eager send does not wait for its receiver; in the replay of the actual
			// step no send does (each ends as measured, see settle).
			d := cs.t
			if m.settling {
				d = cs.sendDur
			}
			ps.end = n + d
			ps.doneAt = epoch
			m.wake(c)
		}
		cs.known++
		if n > cs.maxNet {
			cs.maxNet = n
		}
		if cs.known == cs.n {
			m.resolve(sd, c, transfer)
		}
	}
	m.cursor[ri] = stop
	return true
}

// done reports whether position p's span ended in the current replay.
func (m *model) done(p int32) bool { return m.ps[p].doneAt == m.epoch }

// netSet reports whether position p's span was launched in the current replay.
func (m *model) netSet(p int32) bool { return m.ps[p].netAt == m.epoch }

func (m *model) block(ri, p, c int32) {
	m.cursor[ri] = p
	m.blockedOn[ri] = c
	m.waitNext[ri] = m.colls[c].waitHead
	m.colls[c].waitHead = ri
}

func (m *model) wake(c int32) {
	for ri := m.colls[c].waitHead; ri >= 0; ri = m.waitNext[ri] {
		m.queue = append(m.queue, ri)
	}
	m.colls[c].waitHead = -1
}

// endWithLag is a member's end given its collective's: later by the member's lag, how long
// after the collective completed the rank saw it complete (on a busy host, the time until
// the rank was scheduled again: milliseconds on 2 cores shared by 4 ranks). The replay of the
// actual step measures each member's lag (its launch there plus its measured duration, past
// the collective's end); the what-ifs keep it, as the rank's overhead.
func (m *model) endWithLag(sd *stepData, p int32, end float64) float64 {
	if m.settling {
		m.ps[p].lag = max(0, m.measuredEnd(sd, p)-end)
	}
	return end + m.ps[p].lag
}

// measuredEnd is where a span ended on the replayed timeline of the actual step: its launch
// there plus its duration on its rank's clock.
func (m *model) measuredEnd(sd *stepData, p int32) float64 {
	op := &sd.ops[m.order[p]]
	return m.ps[p].launch + float64(op.end-op.start)/1e9
}

// resolve ends collective c for every member whose arrival is known.
func (m *model) resolve(sd *stepData, s int32, transfer []float64) {
	cs := &m.colls[s]
	c := cs.orig
	if m.recording {
		m.tape = append(m.tape, tapeEvent{x: -s - 1})
	}
	if m.settling && cs.p2p && cs.n == 2 && cs.known == cs.n {
		if ps, pr, ok := m.messageEnds(cs); ok {
			m.settle(c, ps, pr)
			cs.done = true
			sp, rp := &m.ps[ps], &m.ps[pr]
			rp.end = max(rp.net, sp.net+cs.t)
			if !cs.eager {
				rp.end = max(sp.net, rp.net) + cs.t
			}
			rp.doneAt = m.epoch
			cs.end = rp.end
			m.wake(s)
			return
		}
	}
	if m.settling && !cs.p2p && cs.known == cs.n {
		// The transfer on the replayed timeline of the actual step: from the last arrival
		// to the first member that saw the collective complete (the others saw it later;
		// see endWithLag).
		first := math.Inf(1)
		for i := cs.first; i < cs.first+cs.n; i++ {
			first = min(first, m.measuredEnd(sd, m.posOf[i]))
		}
		transfer[c] = max(0, first-cs.maxNet)
		cs.t = transfer[c]
	}
	cs.done = true
	cs.end = cs.maxNet + cs.t
	sendEnd := math.Inf(-1)
	if cs.p2p {
		for i := cs.first; i < cs.first+cs.n; i++ {
			if p := m.posOf[i]; m.ps[p].role == RoleSend && m.done(p) {
				sendEnd = m.ps[p].end
			}
		}
	}
	for i := cs.first; i < cs.first+cs.n; i++ {
		p := m.posOf[i]
		ps := &m.ps[p]
		if ps.doneAt == m.epoch || ps.netAt != m.epoch {
			continue
		}
		switch {
		case cs.p2p && ps.role == RoleRecv && !math.IsInf(sendEnd, -1):
			ps.end = max(ps.net, sendEnd)
		case cs.p2p && ps.role == RoleSend:
			// A send ends with its message, or as long after its launch as it took, if
			// that is sooner: gloo's sends complete once the bytes are written.
			ps.end = max(ps.net, min(cs.end, ps.net+cs.sendDur))
		default:
			ps.end = m.endWithLag(sd, p, cs.end)
		}
		ps.doneAt = m.epoch
	}
	m.wake(s)
}
