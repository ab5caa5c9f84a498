package join

import (
	"math"
	"slices"
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// MaxRanks bounds rank and pg_size values: anything larger is malformed input, and the
// per-collective rank bitset stays small.
const MaxRanks = 1 << 20

// MaxMissingNamed bounds the ranks named in Released.Missing (MissingRanks has the count),
// so one lost node of a 4096-rank job does not make a 20 KB attribute on every span.
const MaxMissingNamed = 256

// recycleLimit bounds the free lists; beyond it released objects go to the GC.
const recycleLimit = 1024

// Member slices start at preallocMembers and grow with arrivals (never past pg_size), and the
// set of ranks seen grows with the members too (rankSet), so that memory follows the spans
// actually buffered (max_buffered_spans), not the pg_size or the rank numbers a span claims.
// The free lists hold at most recycleMembersBudget members' worth of slices in total (about
// 3 MB).
const (
	preallocMembers      = 64
	recycleMembersBudget = 1 << 14
)

// heldMember is a pending member: what its Member is computed from at release, in 48 bytes
// (with a two-word Ref) instead of a Member's ~170. At thousands of ranks the engine holds
// about one step of every rank's collective members (4096 ranks x 29 collectives: ~119,000).
type heldMember[R any] struct {
	start, end int64
	// topology is interned (Engine.topology): ranks of a host share one.
	topology *Topology
	rank     int32
	async    bool
	role     diagnosis.Role
	ref      R
}

// maxTopologies bounds the interned topologies; past it the table starts over (members
// keep theirs). The table outlives the spans that brought its entries, so it is kept small
// (a job's distinct (host, switch, NIC) up to 8192 ranks; at most ~6 MB of strings at the
// default max_attribute_length, whatever a sender cycles through).
const maxTopologies = 1 << 13

type pending[R any] struct {
	key Key
	// hash is the key's (hashKey), computed once at its first arrival.
	hash       uint64
	op         string
	step       int64
	pgSize     int
	bytes      int64
	p2p        bool
	opened     int64
	deadline   int64
	members    []heldMember[R]
	seen       rankSet
	prev, next *pending[R]
}

func (p *pending[R]) has(rank int) bool { return p.seen.has(rank) }

func (p *pending[R]) mark(rank int) { p.seen.add(rank) }

// Engine joins collective spans across ranks. See the package comment.
type Engine[R any] struct {
	cfg   Config
	clock Clock

	pending keyTable[*pending[R]]
	// oldest and newest are the ends of a list of pending collectives in first-arrival
	// order, which is also deadline order, so expiry and eviction pop from the front.
	oldest, newest *pending[R]
	buffered       int

	// recently released keys, so that a member arriving after its collective was
	// released is passed through as late instead of opening a collective that never fills.
	// A key counts as released only for the same step and for 2 x wait_timeout: a job
	// restarted under the same id (TorchElastic keeps its run id) starts its sequence
	// numbers over, and its collectives must join again.
	recent releasedSet

	analysis *diagnosis.Analyzer
	// startedAt and lastSeen tell a member that is late from one that is missing: a rank
	// that delivered any span within wait_timeout is alive, and collectives wait for it up to
	// max_wait; so do collectives that began within startup_grace.
	startedAt int64
	lastSeen  map[string]*liveTable
	// seenJob and seenRanks are the job touch last recorded and its entry of lastSeen.
	seenJob   string
	seenRanks *liveTable
	liveRanks int
	// denseLive is the slice entries the live tables may still grow by (maxDenseLive in
	// all, until the memory starts over).
	denseLive int
	// groupMembers are the ranks of each non-default group's last complete collective, used
	// to name the missing ranks of an incomplete one.
	groupMembers map[groupRef][]int
	steps        []diagnosis.StepResult

	freePending  []*pending[R]
	freeReleased []*Released[R]
	// freeMembers is the member capacity parked in the free lists.
	freeMembers int
	scratchEnds []int64
	scratchVals []float64
	// topologies interns the members' topologies.
	topologies map[Topology]*Topology
	// rankTopologies is each rank's last interned topology (below maxRankTopologies).
	rankTopologies []*Topology
	// hasher hashes the arrivals' keys (hashKey).
	hasher keyHasher

	stats Stats
}

// New returns an engine; cfg must have passed Validate.
func New[R any](cfg Config, clock Clock) *Engine[R] {
	return &Engine[R]{
		cfg:          cfg,
		clock:        clock,
		pending:      newKeyTable[*pending[R]](0),
		recent:       newReleasedSet(2 * cfg.MaxPending),
		analysis:     diagnosis.New(cfg.Config),
		groupMembers: make(map[groupRef][]int),
		startedAt:    clock.Now().UnixNano(),
		lastSeen:     make(map[string]*liveTable),
		denseLive:    maxDenseLive,
		topologies:   make(map[Topology]*Topology),
	}
}

// maxRankTopologies bounds the ranks whose last topology topology keeps by rank (64 KB of
// pointers at most).
const maxRankTopologies = 1 << 13

// topology returns the interned copy of t, a rank's: each rank's last one is kept by rank,
// and compared before the table is asked (a rank's spans carry one topology, whose strings
// its batch's resource shares; hashing them was 8% of the join on pipeline messages).
func (e *Engine[R]) topology(rank int, t *Topology) *Topology {
	if rank < len(e.rankTopologies) {
		if p := e.rankTopologies[rank]; p != nil && *p == *t {
			return p
		}
	}
	p, ok := e.topologies[*t]
	if !ok {
		if len(e.topologies) >= maxTopologies {
			clear(e.topologies)
		}
		p = new(Topology)
		*p = *t
		e.topologies[*t] = p
	}
	if rank < maxRankTopologies {
		if rank >= len(e.rankTopologies) {
			e.rankTopologies = append(e.rankTopologies,
				make([]*Topology, rank+1-len(e.rankTopologies))...)
		}
		e.rankTopologies[rank] = p
	}
	return p
}

// maxLiveRanks bounds the (job, rank) pairs whose last delivery is remembered; past it the
// memory starts over (ranks then count as silent until they deliver again).
const maxLiveRanks = 1 << 18

// forgetLive starts the memory of the ranks' deliveries over.
func (e *Engine[R]) forgetLive() {
	clear(e.lastSeen)
	e.liveRanks = 0
	e.denseLive = maxDenseLive
}

// touch records that a rank of a job delivered a span now.
func (e *Engine[R]) touch(job string, rank int, now int64) {
	ranks := e.seenRanks
	if ranks == nil || job != e.seenJob {
		ranks = e.lastSeen[job]
	}
	if ranks == nil {
		if e.liveRanks >= maxLiveRanks {
			e.forgetLive()
		}
		ranks = &liveTable{}
		e.lastSeen[job] = ranks
	}
	// The entry is written, and a rank it added is counted (the memory starting over
	// first when it is full).
	if ranks.set(int32(rank), now, &e.denseLive) {
		if e.liveRanks >= maxLiveRanks {
			e.forgetLive()
			ranks = &liveTable{}
			ranks.set(int32(rank), now, &e.denseLive)
			e.lastSeen[job] = ranks
		}
		e.liveRanks++
	}
	e.seenJob, e.seenRanks = job, ranks
}

// Stats returns the engine's counters.
func (e *Engine[R]) Stats() Stats {
	s := e.stats
	s.Pending = e.pending.len()
	s.BufferedSpans = e.buffered
	s.Analysis = e.analysis.Stats()
	return s
}

// Add joins one arrival. Collectives it releases (the one it completes, or the oldest ones
// it evicts to stay within bounds) are appended to out. A rejected arrival is not kept: the
// caller forwards its span unannotated and counts the outcome.
func (e *Engine[R]) Add(a *Arrival[R], out []*Released[R]) (Outcome, []*Released[R]) {
	// A zero duration is a timer's resolution (a receive whose message was already in,
	// recorded in microseconds), not bad input; only an end before the start is.
	if a.EndUnixNano < a.StartUnixNano {
		return e.reject(RejectedBadDuration), out
	}
	if a.PGSize < 1 || a.PGSize > MaxRanks || (a.WorldSize > 0 && a.PGSize > a.WorldSize) {
		return e.reject(RejectedPGSizeMismatch), out
	}
	if a.Rank < 0 || a.Rank >= MaxRanks || (a.WorldSize > 0 && a.Rank >= a.WorldSize) ||
		(a.PG == semconv.DefaultPG && a.Rank >= a.PGSize) {
		return e.reject(RejectedRankOutOfGroup), out
	}
	now := e.clock.Now().UnixNano()
	e.touch(a.Job, a.Rank, now)
	if a.WorldSize > 0 {
		e.analysis.NoteWorld(a.Job, a.WorldSize, time.Unix(0, now))
	}
	h := e.hasher.hash(&a.Key)
	p, ok := e.pending.get(h, &a.Key)
	if ok {
		if a.PGSize != p.pgSize {
			return e.reject(RejectedPGSizeMismatch), out
		}
		if p.has(a.Rank) {
			return e.reject(RejectedDuplicate), out
		}
	} else {
		if released, ok := e.recent.find(h, &a.Key); ok {
			// A member of a released collective: late, not a new collective (unless the job
			// restarted under the same id, at another step, or long after).
			if released.step == a.Step && now-released.at <= e.lateWindow() {
				return e.reject(RejectedLate), out
			}
			e.recent.forget(h, &a.Key)
		}
		for e.pending.len() >= e.cfg.MaxPending {
			out = append(out, e.release(e.oldest, ReleasedEvicted))
		}
	}
	for e.buffered >= e.cfg.MaxBufferedSpans {
		victim := e.oldest
		out = append(out, e.release(victim, ReleasedEvicted))
		if victim == p {
			// The arrival's own collective was the oldest: it is gone, and this member
			// is as late as any other arrival after a release.
			return e.reject(RejectedLate), out
		}
	}
	if p == nil {
		p = e.open(a, h)
	}
	p.mark(a.Rank)
	if len(p.members) == cap(p.members) {
		// Grow as append would, but never past pg_size: a 4096-member collective whose slice
		// append grew by 1.25 held up to a quarter more than its members.
		grown := make([]heldMember[R], len(p.members), min(p.pgSize, max(preallocMembers, 2*cap(p.members))))
		copy(grown, p.members)
		p.members = grown
	}
	p.members = append(p.members, heldMember[R]{
		start:    a.StartUnixNano,
		end:      a.EndUnixNano,
		topology: e.topology(a.Rank, &a.Topology),
		rank:     int32(a.Rank),
		async:    a.Async,
		role:     a.Role,
		ref:      a.Ref,
	})
	e.buffered++
	e.stats.Accepted++
	if len(p.members) == p.pgSize {
		out = append(out, e.release(p, ReleasedComplete))
	}
	return Accepted, out
}

func (e *Engine[R]) reject(o Outcome) Outcome {
	e.stats.Rejected[o]++
	return o
}

func (e *Engine[R]) open(a *Arrival[R], hash uint64) *pending[R] {
	var p *pending[R]
	if n := len(e.freePending); n > 0 {
		p = e.freePending[n-1]
		e.freePending = e.freePending[:n-1]
		e.freeMembers -= cap(p.members)
	} else {
		p = &pending[R]{}
	}
	p.key = a.Key
	// The hasher's copies of the job and group strings (equal to the arrival's: it hashed
	// them last): the collectives of a run of one group then share them, and the analysis
	// compares them by pointer (each arrival's own strings are elsewhere in memory).
	p.key.Job, p.key.PG = e.hasher.job, e.hasher.pg
	p.hash = hash
	p.op = a.Op
	p.step = a.Step
	p.pgSize = a.PGSize
	p.bytes = a.Bytes
	p.p2p = a.P2P
	now := e.clock.Now()
	p.opened = now.UnixNano()
	p.deadline = p.opened + int64(e.cfg.WaitTimeout)
	e.analysis.NotePending(a.Job, a.Step, now)
	if p.members == nil {
		p.members = make([]heldMember[R], 0, min(a.PGSize, preallocMembers))
	}
	e.pending.set(hash, &a.Key, p)
	e.appendPending(p)
	return p
}

// appendPending puts p at the newest end of the pending list (deadline order: every
// deadline there is at most now + wait_timeout).
func (e *Engine[R]) appendPending(p *pending[R]) {
	p.prev = e.newest
	p.next = nil
	if e.newest != nil {
		e.newest.next = p
	} else {
		e.oldest = p
	}
	e.newest = p
}

// lateWindow is how long a released collective's key is remembered as released for its
// step: its late members are rejected as late within it.
func (e *Engine[R]) lateWindow() int64 {
	return max(2*int64(e.cfg.WaitTimeout), int64(e.cfg.MaxWait))
}

// keepWaiting reports whether a collective past its deadline should wait on: it is younger
// than max_wait, and either the component started less than startup_grace ago (its ranks
// may not have delivered their backlog yet) or one of its missing ranks delivered a span
// within wait_timeout (alive, only behind).
func (e *Engine[R]) keepWaiting(p *pending[R], now int64) bool {
	if now-p.opened >= int64(e.cfg.MaxWait) {
		return false
	}
	if now-e.startedAt < int64(e.cfg.StartupGrace) {
		return true
	}
	live := e.lastSeen[p.key.Job]
	if live == nil {
		live = &liveTable{}
	}
	alive := func(rank int) bool {
		seen, ok := live.get(int32(rank))
		return ok && now-seen <= int64(e.cfg.WaitTimeout)
	}
	if p.key.PG == semconv.DefaultPG && !p.p2p {
		// The ranks that delivered anything, not every rank below pg_size (which a span
		// may claim to be a million).
		waiting := false
		live.each(func(rank int32, seen int64) bool {
			if int(rank) < p.pgSize && now-seen <= int64(e.cfg.WaitTimeout) && !p.has(int(rank)) {
				waiting = true
			}
			return !waiting
		})
		return waiting
	}
	for _, rank := range e.groupMembers[groupRef{job: p.key.Job, pg: p.key.PG}] {
		if !p.has(rank) && alive(rank) {
			return true
		}
	}
	return false
}

func (e *Engine[R]) unlink(p *pending[R]) {
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		e.oldest = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		e.newest = p.prev
	}
	p.prev, p.next = nil, nil
}

// Expire releases the collectives whose wait_timeout has passed, appending them to out; a
// collective whose missing members are alive (or that began within startup_grace) waits
// another wait_timeout, up to max_wait.
func (e *Engine[R]) Expire(out []*Released[R]) []*Released[R] {
	now := e.clock.Now().UnixNano()
	for e.oldest != nil && e.oldest.deadline <= now {
		p := e.oldest
		if e.keepWaiting(p, now) {
			e.unlink(p)
			p.deadline = now + int64(e.cfg.WaitTimeout)
			e.appendPending(p)
			e.stats.Extended++
			continue
		}
		reason := ReleasedTimeout
		if p.opened-e.startedAt < int64(e.cfg.StartupGrace) {
			reason = ReleasedPartial
		}
		out = append(out, e.release(p, reason))
	}
	return out
}

// Drain releases every pending collective (at shutdown), appending them to out.
func (e *Engine[R]) Drain(out []*Released[R]) []*Released[R] {
	for e.oldest != nil {
		out = append(out, e.release(e.oldest, ReleasedShutdown))
	}
	return out
}

// Recycle hands a Released back once the caller is done with it (optional; it saves
// allocations). The caller must not touch r afterwards.
func (e *Engine[R]) Recycle(r *Released[R]) {
	if len(e.freeReleased) >= recycleLimit ||
		e.freeMembers+cap(r.Members) > recycleMembersBudget {
		return
	}
	clear(r.Members)
	r.Members = r.Members[:0]
	r.Missing = r.Missing[:0]
	e.freeMembers += cap(r.Members)
	e.freeReleased = append(e.freeReleased, r)
}

func (e *Engine[R]) newReleased() *Released[R] {
	if n := len(e.freeReleased); n > 0 {
		r := e.freeReleased[n-1]
		e.freeReleased = e.freeReleased[:n-1]
		e.freeMembers -= cap(r.Members)
		return r
	}
	return &Released[R]{}
}

func (e *Engine[R]) rememberReleased(k *Key, hash uint64, step int64) {
	if len(e.recent.ring) == 0 {
		return
	}
	e.recent.add(k, hash, step, e.clock.Now().UnixNano())
}

// release removes p from the pending set and computes its figures and verdicts.
func (e *Engine[R]) release(p *pending[R], reason ReleaseReason) *Released[R] {
	e.pending.remove(p.hash, &p.key)
	e.unlink(p)
	e.rememberReleased(&p.key, p.hash, p.step)
	n := len(p.members)
	e.buffered -= n

	r := e.newReleased()
	r.Key = p.key
	r.Op = p.op
	r.Step = p.step
	r.PGSize = p.pgSize
	r.Reason = reason
	r.Members = slices.Grow(r.Members[:0], n)[:n]
	for i := range p.members {
		h := &p.members[i]
		r.Members[i] = Member[R]{
			Span: diagnosis.Span{
				Rank:          int(h.rank),
				Topology:      *h.topology,
				StartUnixNano: h.start,
				EndUnixNano:   h.end,
				Async:         h.async,
				Role:          h.role,
			},
			Duration: float64(h.end-h.start) / 1e9,
			Ref:      h.ref,
		}
	}
	clear(p.members)
	p.members = p.members[:0]
	r.MissingRanks = p.pgSize - n
	r.Missing = r.Missing[:0]
	if r.MissingRanks > 0 {
		r.Missing = e.nameMissing(p, r.Missing)
	}
	switch {
	case r.MissingRanks == 0:
		e.stats.ReleasedComplete++
	default:
		e.stats.ReleasedIncomplete++
	}
	if reason == ReleasedEvicted {
		e.stats.Evicted++
	}

	r.P2P = p.p2p
	lateIdx := e.measure(r)
	if r.MissingRanks == 0 && p.key.PG != semconv.DefaultPG && !p.p2p {
		e.rememberMembers(p.key, r.Members)
	}
	e.observe(r, p.bytes)
	e.judge(r, lateIdx, p.bytes)

	if len(e.freePending) < recycleLimit &&
		e.freeMembers+cap(p.members) <= recycleMembersBudget {
		p.seen.reset()
		e.freeMembers += cap(p.members)
		e.freePending = append(e.freePending, p)
	}
	return r
}

// measure fills skew, transfer, lateness, wait and clock offsets, and returns the index of
// the last arrival (the member with the shortest duration; ties go to the lowest rank), or
// -1 when there are no members.
func (e *Engine[R]) measure(r *Released[R]) int {
	members := r.Members
	if len(members) == 0 {
		return -1
	}
	minDur, maxDur := math.Inf(1), math.Inf(-1)
	lateIdx := -1
	for i := range members {
		d := members[i].Duration
		if d < minDur || (d == minDur && members[i].Rank < members[lateIdx].Rank) {
			minDur = d
			lateIdx = i
		}
		if d > maxDur {
			maxDur = d
		}
	}
	r.Skew = maxDur - minDur
	r.Transfer = minDur

	// A blocking collective ends at nearly the same true time on every member, so each
	// host's end time against the members' median end time is its clock offset.
	ends := e.scratchEnds[:0]
	for i := range members {
		ends = append(ends, members[i].EndUnixNano)
	}
	slices.Sort(ends)
	mid := len(ends) / 2
	median := float64(ends[mid])
	if len(ends)%2 == 0 {
		median = (float64(ends[mid-1]) + float64(ends[mid])) / 2
	}
	e.scratchEnds = ends

	for i := range members {
		m := &members[i]
		m.Lateness = maxDur - m.Duration
		m.Wait = m.Duration - minDur
		m.ClockOffset = (float64(m.EndUnixNano) - median) / 1e9
	}
	return lateIdx
}

func (e *Engine[R]) nameMissing(p *pending[R], dst []int) []int {
	if p.key.PG == semconv.DefaultPG {
		for rank := 0; rank < p.pgSize && len(dst) < MaxMissingNamed; rank++ {
			if !p.has(rank) {
				dst = append(dst, rank)
			}
		}
		return dst
	}
	for _, rank := range e.groupMembers[groupRef{job: p.key.Job, pg: p.key.PG}] {
		if len(dst) >= MaxMissingNamed {
			break
		}
		if !p.has(rank) {
			dst = append(dst, rank)
		}
	}
	return dst
}

// AddPhase records one rank's phase span for the step analysis' causes.
func (e *Engine[R]) AddPhase(ph Phase) {
	if ph.Rank < 0 || ph.Rank >= MaxRanks {
		return
	}
	now := e.clock.Now()
	e.touch(ph.Job, ph.Rank, now.UnixNano())
	if ph.WorldSize > 0 {
		e.analysis.NoteWorld(ph.Job, ph.WorldSize, now)
	}
	e.analysis.ObservePhase(ph.Job, ph.Step, ph.Rank, ph.Kind, ph.StartUnixNano, ph.EndUnixNano,
		ph.InputSize)
}

// Analyze runs the step analysis of the steps that are due (every open step when drain is
// set, at shutdown). The results are valid until the next call.
func (e *Engine[R]) Analyze(drain bool) []diagnosis.StepResult {
	e.steps = e.analysis.Close(e.clock.Now(), drain)
	return e.steps
}

type groupRef struct {
	job, pg string
}

// maxRememberedGroups bounds the remembered group memberships; past it they start over.
const maxRememberedGroups = 1 << 16

// rememberMembers keeps the ranks of a complete collective of a non-default group so an
// incomplete one can name its missing ranks.
func (e *Engine[R]) rememberMembers(k Key, members []Member[R]) {
	ref := groupRef{job: k.Job, pg: k.PG}
	known := e.groupMembers[ref]
	if len(known) == len(members) {
		return
	}
	if known == nil && len(e.groupMembers) >= maxRememberedGroups {
		clear(e.groupMembers)
	}
	known = known[:0]
	for i := range members {
		known = append(known, members[i].Rank)
	}
	slices.Sort(known)
	e.groupMembers[ref] = known
}

// observe hands a released collective to the step analysis.
func (e *Engine[R]) observe(r *Released[R], bytes int64) {
	c := diagnosis.Collective{
		Job:          r.Job,
		PG:           r.PG,
		Seq:          r.Seq,
		Step:         r.Step,
		Op:           r.Op,
		Bytes:        bytes,
		PGSize:       r.PGSize,
		P2P:          r.P2P,
		MissingRanks: r.MissingRanks,
	}
	if r.Reason.CountsAsMissing() {
		c.Missing = r.Missing
	}
	e.analysis.ObserveCollective(&c, true, e.clock.Now())
	for i := range r.Members {
		e.analysis.AddMember(&r.Members[i].Span)
	}
	e.analysis.EndCollective()
}

// judge gives each member its verdict from the job's flags: straggler for a flagged rank
// that was the late one here, unchanged for a flagged rank that was not, clear otherwise;
// and writes the transfer's slowdown against the job's history.
func (e *Engine[R]) judge(r *Released[R], lateIdx int, bytes int64) {
	if r.MissingRanks == 0 && len(r.Members) >= 2 {
		r.Slowdown = e.analysis.Slowdown(r.Job, r.PG, r.Op, bytes, len(r.Members), r.Transfer)
	}
	flags := e.analysis.HasFlags(r.Job)
	for i := range r.Members {
		m := &r.Members[i]
		m.Verdict = VerdictClear
		if !flags {
			continue
		}
		if f, ok := e.analysis.Flag(r.Job, m.Rank); ok {
			m.Verdict = VerdictUnchanged
			if i == lateIdx && m.Lateness > 0 {
				m.Verdict = VerdictStraggler
				m.Cause = f.Cause
				m.Domain = f.Domain
			}
		}
	}
}

// AddLayers records one rank's layer profile (pipeline.layers) for the stage partition advice.
func (e *Engine[R]) AddLayers(job string, rank int, p diagnosis.LayerProfile) {
	if rank < 0 || rank >= MaxRanks {
		return
	}
	e.analysis.ObserveLayers(job, rank, p, e.clock.Now().UnixNano())
}
