package diagnosis

import (
	"math"
	"slices"
	"time"
)

// maxStepWait bounds how long a step waits for ranks that have not ended it (step_timeout,
// or twice the job's step time when that is longer).
const maxStepWait = 5 * time.Minute

// maxTrackedRanks bounds the per-job per-rank state (topology, carry-over between steps,
// singleton history); ranks beyond it are analyzed without it.
const maxTrackedRanks = 1 << 16

// opRec is one member span held for analysis.
type opRec struct {
	rank       int32
	role       Role
	async      bool
	start, end int64
}

// collRec is one released collective held for analysis; its members are
// ops[first : first+n].
type collRec struct {
	pg           string
	op           string
	seq          int64
	bytes        int64
	pgSize       int32
	first, n     int32
	missingRanks int32
	p2p          bool
	missing      []int32
}

// stepData is one open step of one job.
type stepData struct {
	step         int64
	lastActivity int64
	// pending counts this step's collectives still waiting for members in the join engine.
	pending int
	// ended is set once every rank expected in the step has ended it (see ranksEnded).
	ended bool
	colls []collRec
	ops   []opRec
}

// carry is what one rank's previous analyzed step leaves for the next.
type carry struct {
	step int64
	// lastEnd is the rank's clock at the end of its last span (the one that ended last).
	lastEnd int64
	// exit is that span's end on the previous step's virtual timeline, relative to the
	// step's latest exit (<= 0).
	exit float64
}

// jobState is everything the analyzer keeps about one job.
type jobState struct {
	name     string
	open     map[int64]*stepData
	analyzed int64 // highest analyzed step, -1 before the first
	// stepsSeen counts the steps analyzed; the first warmupSteps teach no usual work.
	stepsSeen int
	lastUsed  int64

	topology rankTable[Topology]
	carry    map[int32]carry
	// history holds every rank's own gaps per position in the step (the reference of a rank
	// without peers, and a cap on the peers' reference of the others).
	history map[int32][]ewma
	// work holds every rank's own time in data loading and compute per step, learned from
	// steps it was not late in: what its causes are measured against besides its peers.
	work map[int32]*workHistory

	groupBaselines map[groupKey]*transferBaseline
	classBaselines map[classKey]*transferBaseline
	groupClasses   map[string]groupClass
	// refs are the transfer references Slowdown read since the baselines last changed:
	// each collective released asks, and a pipeline pair's sixteen messages a step ask
	// alike (three lookups by strings each).
	refs map[slowdownKey]float64
	// lastRefKey and lastRef are the last reference Slowdown read (valid while lastRefValid:
	// until the baselines change).
	lastRefKey   slowdownKey
	lastRef      float64
	lastRefValid bool

	// flags is the job's flag state (decided here unless flag_decision is deferred: then
	// kept for the analysis' own use, and the summaries leave the flags to a verdict stage).
	flags flagState
	// replayError is the moving average of the replay's self-check error.
	replayError ewma
	// stepTime is the job's usual step duration (seconds), which bounds how long a step
	// waits for ranks that have not ended it.
	stepTime ewma
	// jitter is the job's step-to-step noise: the last jitterSteps changes of its step
	// duration from one analyzed step to the next (after its first warmupSteps), and
	// lastDuration the duration they are measured from (0 none).
	jitter       [jitterSteps]float64
	jitterLen    int
	jitterPos    int
	lastDuration float64
	// latest is the highest step each rank had a collective or a phase in.
	latest rankTable[int64]
	// world is the job's world size (training.world_size of its ranks' resources; 0 while
	// unknown): a step is complete once every rank of it has ended the step.
	world int
	// layers holds each rank's latest layer profiles (pipeline.layers), nil before one.
	layers map[int32]*profiles
	// layersVersion counts the profiles taken; advice is the partition last advised.
	layersVersion uint64
	advice        *adviceCache
	// activity counts the collectives observed: past max_jobs the job with the least goes,
	// so a training job keeps its state however many one-off job ids arrive.
	activity int64
}

// workHistory is a rank's usual time in dataloader.fetch, in compute phases and outside
// every phase (its host-side work) per step.
type workHistory struct {
	fetch, compute, host ewma
}

// ewma is an exponentially weighted mean and mean absolute deviation.
type ewma struct {
	mean    float64
	dev     float64
	samples int
}

// add weighs v by alpha, or by 1/n while fewer than 1/alpha samples were seen: the first
// samples are averaged, so neither the mean nor the deviation rests on the first one.
func (e *ewma) add(v, alpha float64) {
	if e.samples == 0 {
		e.mean = v
	} else {
		a := max(alpha, 1/float64(e.samples+1))
		e.dev += a * (math.Abs(v-e.mean) - e.dev)
		e.mean += a * (v - e.mean)
	}
	e.samples++
}

// Stats are the analyzer's own counters.
type Stats struct {
	OpenSteps     int
	HeldSpans     int
	PhaseEntries  int
	StepsAnalyzed int64
	// StepsForced counts steps analyzed before analysis_delay because a bound was reached.
	StepsForced int64
	// LateSpans counts collective spans released after their step was analyzed.
	LateSpans int64
	// ModelBreaks counts steps whose spans did not form a consistent order (a cycle broken).
	ModelBreaks int64
}

// Analyzer is the step analysis of every job. It is not safe for concurrent use.
type Analyzer struct {
	cfg     Config
	jobs    map[string]*jobState
	phases  phaseCache
	heldOps int
	stats   Stats
	model   model
	groups  groupScratch
	results []StepResult
	// freeStep are analyzed steps kept for their buffers, freeOps their ops' capacity.
	freeStep []*stepData
	freeOps  int
	// cur and curJob are the step and job of the collective being observed (nil when its
	// step was already analyzed: its members are late).
	cur    *stepData
	curJob *jobState
	// lastJob is the job last looked up by name (lookup): the join hands the analyzer one
	// job's collectives in runs, each looked up by name several times.
	lastJob *jobState
	// asked and askedRanks are eachRankEnded's scratch: a bit per rank asked, and the ranks.
	asked      []uint64
	askedRanks []int32
}

// maxFreeSteps and maxFreeOps bound the analyzed steps kept for their buffers: at most
// four, holding at most 1<<19 ops in all (about 12 MB of ops and as much of collectives;
// a 4096-rank pipeline step holds 204,800 ops, its buffers grown past 1<<18 by append).
const (
	maxFreeSteps = 4
	maxFreeOps   = 1 << 19
)

// New returns an analyzer; cfg must have passed Check.
func New(cfg Config) *Analyzer {
	return &Analyzer{
		cfg:    cfg,
		jobs:   make(map[string]*jobState),
		phases: newPhaseCache(cfg.MaxPhaseEntries),
	}
}

// Stats returns the analyzer's counters.
func (a *Analyzer) Stats() Stats {
	s := a.stats
	s.HeldSpans = a.heldOps
	s.PhaseEntries = a.phases.len()
	for _, j := range a.jobs {
		s.OpenSteps += len(j.open)
	}
	return s
}

// lookup returns the job of that name, nil when it has no state.
func (a *Analyzer) lookup(name string) *jobState {
	if j := a.lastJob; j != nil && j.name == name {
		return j
	}
	j := a.jobs[name]
	if j != nil {
		a.lastJob = j
	}
	return j
}

func (a *Analyzer) job(name string, now int64) *jobState {
	if j := a.lookup(name); j != nil {
		j.lastUsed = now
		return j
	}
	if len(a.jobs) >= a.cfg.MaxJobs {
		var victim *jobState
		for _, j := range a.jobs {
			if victim == nil || j.activity < victim.activity ||
				(j.activity == victim.activity && j.lastUsed < victim.lastUsed) {
				victim = j
			}
		}
		a.dropJob(victim.name)
	}
	a.phases.known(name)
	j := &jobState{
		name:           name,
		open:           make(map[int64]*stepData),
		analyzed:       -1,
		lastUsed:       now,
		carry:          make(map[int32]carry),
		history:        make(map[int32][]ewma),
		work:           make(map[int32]*workHistory),
		groupBaselines: make(map[groupKey]*transferBaseline),
		classBaselines: make(map[classKey]*transferBaseline),
		groupClasses:   make(map[string]groupClass),
		flags:          newFlagState(),
	}
	a.jobs[name] = j
	a.lastJob = j
	return j
}

func (a *Analyzer) dropJob(name string) {
	j := a.jobs[name]
	if j == nil {
		return
	}
	for _, sd := range j.open {
		a.heldOps -= len(sd.ops)
	}
	delete(a.jobs, name)
	if a.lastJob == j {
		a.lastJob = nil
	}
	a.phases.forget(name)
}

// openStep returns the job's open step, creating it; nil when the step was already analyzed.
func (a *Analyzer) openStep(j *jobState, step int64, now int64) *stepData {
	if sd, ok := j.open[step]; ok {
		return sd
	}
	if step <= j.analyzed {
		return nil
	}
	var sd *stepData
	if n := len(a.freeStep); n > 0 {
		sd = a.freeStep[n-1]
		a.freeStep = a.freeStep[:n-1]
		a.freeOps -= cap(sd.ops)
	} else {
		sd = &stepData{}
	}
	sd.step = step
	sd.lastActivity = now
	sd.pending = 0
	sd.ended = false
	sd.colls = sd.colls[:0]
	sd.ops = sd.ops[:0]
	j.open[step] = sd
	return sd
}

// NotePending tells the analyzer that a collective of (job, step) started waiting for its
// members in the join engine: the step is not analyzed before it is released.
func (a *Analyzer) NotePending(job string, step int64, now time.Time) {
	ns := now.UnixNano()
	if sd := a.openStep(a.job(job, ns), step, ns); sd != nil {
		sd.pending++
		sd.lastActivity = ns
	}
}

// ObserveCollective records a released collective; AddMember must follow for each member
// span, then EndCollective. wasPending says whether NotePending was called for it.
func (a *Analyzer) ObserveCollective(c *Collective, wasPending bool, now time.Time) {
	ns := now.UnixNano()
	j := a.job(c.Job, ns)
	sd := a.openStep(j, c.Step, ns)
	a.cur, a.curJob = nil, nil
	if sd == nil {
		return
	}
	j.activity++
	if wasPending && sd.pending > 0 {
		sd.pending--
	}
	sd.lastActivity = ns
	rec := collRec{
		pg:           c.PG,
		op:           c.Op,
		seq:          c.Seq,
		bytes:        c.Bytes,
		pgSize:       int32(c.PGSize),
		first:        int32(len(sd.ops)),
		p2p:          c.P2P,
		missingRanks: int32(c.MissingRanks),
	}
	for _, m := range c.Missing {
		rec.missing = append(rec.missing, int32(m))
	}
	sd.colls = append(sd.colls, rec)
	a.cur, a.curJob = sd, j
}

// AddMember records one member span of the collective being observed.
func (a *Analyzer) AddMember(s *Span) {
	sd := a.cur
	if sd == nil {
		a.stats.LateSpans++
		return
	}
	rec := &sd.colls[len(sd.colls)-1]
	sd.ops = append(sd.ops, opRec{
		rank:  int32(s.Rank),
		role:  s.Role,
		async: s.Async,
		start: s.StartUnixNano,
		end:   s.EndUnixNano,
	})
	rec.n++
	a.heldOps++
	j := a.curJob
	j.sawRank(int32(s.Rank), sd.step)
	if t, ok := j.topology.get(int32(s.Rank)); (!ok && j.topology.len() < maxTrackedRanks) ||
		(ok && t != s.Topology) {
		j.topology.set(int32(s.Rank), s.Topology)
	}
}

// EndCollective ends the collective being observed.
func (a *Analyzer) EndCollective() {
	a.cur, a.curJob = nil, nil
}

// ObservePhase records one rank's phase span (its own clock) and, for a forward, its input
// size (training.input.size; 0 when not given).
func (a *Analyzer) ObservePhase(job string, step int64, rank int, kind PhaseKind,
	start, end, input int64,
) {
	if end < start || rank < 0 || kind >= NumPhaseKinds {
		return
	}
	a.phases.add(job, step, int32(rank), kind, start, end, input)
	if j := a.lookup(job); j != nil {
		j.sawRank(int32(rank), step)
	}
}

// maxWorld bounds the world size a job's completeness is checked against (a larger value
// is taken as unknown: the ranks with spans decide, as without one).
const maxWorld = 1 << 20

// NoteWorld records a job's world size from a rank's resource (training.world_size).
func (a *Analyzer) NoteWorld(job string, world int, now time.Time) {
	if world <= 0 || world > maxWorld {
		return
	}
	j := a.lookup(job)
	if j == nil {
		j = a.job(job, now.UnixNano())
	}
	j.world = world
}

// sawRank notes that a rank reached a step.
func (j *jobState) sawRank(rank int32, step int64) {
	if last, ok := j.latest.get(rank); ok {
		if step > last {
			j.latest.set(rank, step)
		}
	} else if j.latest.len() < maxTrackedRanks {
		j.latest.set(rank, step)
	}
}

// ranksEnded reports whether every rank expected in the step has ended it: its train.step
// span arrived, or it reached a later step. The ranks expected are the step's own and those
// of the job's previous analyzed step. A pipeline stage's collectives come seconds apart in
// a long step, so a quiet spell of analysis_delay does not mean the step is over.
func (a *Analyzer) ranksEnded(j *jobState, sd *stepData) bool {
	if sd.ended {
		return true
	}
	ended := func(rank int32) bool {
		if last, ok := j.latest.get(rank); ok && last > sd.step {
			return true
		}
		if e := a.phases.get(j.name, sd.step, rank); e != nil {
			_, ok := e.get(PhaseStep)
			return ok
		}
		return false
	}
	if !a.eachRankEnded(sd, ended) {
		return false
	}
	for rank, c := range j.carry {
		if c.step == j.analyzed && !ended(rank) {
			return false
		}
	}
	// Every rank of the world, not only those whose spans arrived: a pipeline's later stages
	// export after the first ones (each rank's own batches, seconds apart), and a step read
	// before they arrive misses them all.
	for rank := range int32(j.world) {
		if !ended(rank) {
			return false
		}
	}
	sd.ended = true
	return true
}

// absentRanks lists the ranks of the world that did not end the step (see ranksEnded), at
// most maxAbsentNamed of them, and how many there were.
func (a *Analyzer) absentRanks(j *jobState, sd *stepData) ([]int, int) {
	var out []int
	n := 0
	for rank := range int32(j.world) {
		if last, ok := j.latest.get(rank); ok && last > sd.step {
			continue
		}
		if e := a.phases.get(j.name, sd.step, rank); e != nil {
			if _, ok := e.get(PhaseStep); ok {
				continue
			}
		}
		n++
		if len(out) < maxAbsentNamed {
			out = append(out, int(rank))
		}
	}
	return out, n
}

// maxAbsentNamed bounds the ranks a step summary names as absent.
const maxAbsentNamed = 64

// maxAskedRank bounds the ranks eachRankEnded keeps a bit for (128 KB of them at most);
// a larger rank is asked at each of its spans.
const maxAskedRank = 1 << 20

// eachRankEnded reports whether ended holds for every rank of the step's spans, asking once
// per rank (a step holds each rank's tens of spans; ended is two lookups).
func (a *Analyzer) eachRankEnded(sd *stepData, ended func(int32) bool) bool {
	all := true
	for i := range sd.ops {
		rank := sd.ops[i].rank
		if rank < 0 || rank >= maxAskedRank {
			if !ended(rank) {
				all = false
				break
			}
			continue
		}
		word, bit := int(rank>>6), uint64(1)<<(rank&63)
		if word >= len(a.asked) {
			a.asked = append(a.asked, make([]uint64, word+1-len(a.asked))...)
		}
		if a.asked[word]&bit != 0 {
			continue
		}
		a.asked[word] |= bit
		a.askedRanks = append(a.askedRanks, rank)
		if !ended(rank) {
			all = false
			break
		}
	}
	for _, rank := range a.askedRanks {
		a.asked[rank>>6] = 0
	}
	a.askedRanks = a.askedRanks[:0]
	return all
}

// stepWait is how long a step whose collectives were all released waits for ranks that
// have not ended it: step_timeout, or twice the job's usual step time when that is longer
// (at most maxStepWait), and at least analysis_delay.
func (a *Analyzer) stepWait(j *jobState) int64 {
	wait := int64(a.cfg.StepTimeout)
	if j.stepTime.samples > 0 {
		wait = max(wait, min(int64(maxStepWait), int64(2*j.stepTime.mean*1e9)))
	}
	return max(int64(a.cfg.AnalysisDelay), wait)
}

// Close analyzes the steps that are due and returns their results (valid until the next
// call). A step is due when none of its collectives is pending and analysis_delay has
// passed since its last activity; steps of a job are analyzed in order, and the oldest
// are analyzed at once when max_open_steps or max_step_ops is reached. drain analyzes
// every open step (at shutdown).
func (a *Analyzer) Close(now time.Time, drain bool) []StepResult {
	ns := now.UnixNano()
	a.results = a.results[:0]
	delay := int64(a.cfg.AnalysisDelay)
	var steps []int64
	for _, j := range a.jobs {
		if len(j.open) == 0 {
			continue
		}
		steps = steps[:0]
		for s := range j.open {
			steps = append(steps, s)
		}
		slices.Sort(steps)
		for i, s := range steps {
			sd := j.open[s]
			idle := ns - sd.lastActivity
			due := sd.pending == 0 && idle >= delay &&
				(a.ranksEnded(j, sd) || idle >= a.stepWait(j))
			forced := !due && (drain || len(steps)-i > a.cfg.MaxOpenSteps ||
				a.heldOps > a.cfg.MaxStepOps)
			if !due && !forced {
				break
			}
			a.analyze(j, sd, forced)
		}
	}
	return a.results
}

func (a *Analyzer) analyze(j *jobState, sd *stepData, forced bool) {
	complete := a.ranksEnded(j, sd)
	delete(j.open, sd.step)
	if sd.step > j.analyzed {
		j.analyzed = sd.step
		a.phases.setAnalyzed(j.name, j.analyzed)
	}
	a.heldOps -= len(sd.ops)
	a.stats.StepsAnalyzed++
	if forced {
		a.stats.StepsForced++
	}
	if len(sd.ops) > 0 {
		res := a.model.run(a, j, sd)
		res.Groups = a.groupPhases(j, sd)
		res.Forced = forced
		res.World = j.world
		if !complete && j.world > 0 {
			res.AbsentRanks, res.Absent = a.absentRanks(j, sd)
		}
		a.results = append(a.results, res)
	}
	for i := range sd.colls {
		sd.colls[i].missing = nil
	}
	if len(a.freeStep) < maxFreeSteps && a.freeOps+cap(sd.ops) <= maxFreeOps {
		a.freeOps += cap(sd.ops)
		a.freeStep = append(a.freeStep, sd)
	}
}

// Flag returns the current verdict of a rank of a job (ok false when it is not flagged).
func (a *Analyzer) Flag(job string, rank int) (RankFlag, bool) {
	j := a.lookup(job)
	if j == nil {
		return RankFlag{}, false
	}
	t := j.flags.ranks[int32(rank)]
	if t == nil || !t.flagged {
		return RankFlag{}, false
	}
	return t.flag(int32(rank)), true
}

// HasFlags reports whether any rank of the job is flagged.
func (a *Analyzer) HasFlags(job string) bool {
	j := a.lookup(job)
	if j == nil {
		return false
	}
	return j.flags.flaggedRanks > 0
}
