package join

import (
	"slices"
	"sort"
	"strings"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// minBaselineSamples is how many transfers a (job, pg, op, bytes) baseline needs before a
// transfer above it can name the network.
const minBaselineSamples = 5

// baselineAlpha is the EWMA weight of a new transfer sample.
const baselineAlpha = 0.1

// maxCausePeers bounds the peers whose phases are read for one cause; a median over an
// evenly spread sample of 63 peers is as good as over 4095, at a 60th of the cost.
const maxCausePeers = 63

type baselineKey struct {
	pg    string
	op    string
	bytes int64
}

type ewma struct {
	mean    float64
	samples int
}

// causeMemory is how many of a flagged rank's latest per-collective causes vote on its cause.
const causeMemory = 8

type flagState struct {
	cause string
	Topology
	// recent holds the rank's latest per-collective causes while flagged. The reported
	// cause is the most common known one among them, so a collective released before the
	// late rank's phase spans arrived (cause unknown) does not flip a compute straggler to
	// unknown and back.
	recent    [causeMemory]string
	recentPos int
}

// vote records one collective's cause and returns the rank's cause: the most common known
// cause among its recent ones (ties go to the most recent), else unknown.
func (fs *flagState) vote(cause string) string {
	fs.recent[fs.recentPos] = cause
	fs.recentPos = (fs.recentPos + 1) % causeMemory
	best, bestCount := semconv.CauseUnknown, 0
	for i := range causeMemory {
		// Walk from the most recent so that ties go to it.
		c := fs.recent[(fs.recentPos-1-i+causeMemory)%causeMemory]
		if c == "" || c == semconv.CauseUnknown {
			continue
		}
		n := 0
		for _, other := range fs.recent {
			if other == c {
				n++
			}
		}
		if n > bestCount {
			best, bestCount = c, n
		}
	}
	return best
}

// jobState is the verdict state of one job.
type jobState struct {
	// window holds the late rank (-1 for none) of the job's last flag_window collectives.
	window    []int32
	windowPos int
	lateCount map[int32]int32
	flagged   map[int32]*flagState
	// stepDuration is each rank's latest train.step duration in seconds.
	stepDuration map[int32]float64
	// pgMembers are the ranks of each non-default group's last complete collective, used
	// to name the missing ranks of an incomplete one.
	pgMembers map[string][]int
	baselines map[baselineKey]*ewma
	lastUsed  int64
}

func newJobState(window int) *jobState {
	j := &jobState{
		window:       make([]int32, window),
		lateCount:    make(map[int32]int32),
		flagged:      make(map[int32]*flagState),
		stepDuration: make(map[int32]float64),
		pgMembers:    make(map[string][]int),
		baselines:    make(map[baselineKey]*ewma),
	}
	for i := range j.window {
		j.window[i] = -1
	}
	return j
}

// rememberMembers keeps the ranks of a complete collective of a non-default group so an
// incomplete one can name its missing ranks.
func rememberMembers[R any](j *jobState, pg string, members []Member[R]) {
	known := j.pgMembers[pg]
	if len(known) == len(members) {
		return
	}
	known = known[:0]
	for i := range members {
		known = append(known, members[i].Rank)
	}
	slices.Sort(known)
	j.pgMembers[pg] = known
}

// job returns the state of a job, forgetting the least recently used one beyond max_jobs.
func (e *Engine[R]) job(name string) *jobState {
	now := e.clock.Now().UnixNano()
	if j, ok := e.jobs[name]; ok {
		j.lastUsed = now
		return j
	}
	if len(e.jobs) >= e.cfg.MaxJobs {
		var lruName string
		lru := int64(1<<63 - 1)
		for n, j := range e.jobs {
			if j.lastUsed < lru {
				lru, lruName = j.lastUsed, n
			}
		}
		delete(e.jobs, lruName)
	}
	j := newJobState(e.cfg.FlagWindow)
	j.lastUsed = now
	e.jobs[name] = j
	return j
}

// judge pushes the collective's late rank (if any) into the job's window, updates the flags
// with hysteresis, and sets each member's verdict, cause and domain.
func (e *Engine[R]) judge(job *jobState, r *Released[R], lateIdx int, bytes int64) {
	lateRank := int32(-1)
	switch {
	case r.MissingRanks == 1 && len(r.Missing) == 1:
		// A rank that never arrived is the strongest straggler signal of all.
		lateRank = int32(r.Missing[0])
		lateIdx = -1
	case lateIdx >= 0 && len(r.Members) >= 2:
		late := &r.Members[lateIdx]
		threshold := e.cfg.MinLateness.Seconds()
		relative := e.cfg.MinLatenessFraction * job.stepDuration[int32(late.Rank)]
		if relative > threshold {
			threshold = relative
		}
		if late.Lateness > threshold {
			lateRank = int32(late.Rank)
		} else {
			lateIdx = -1
		}
	default:
		lateIdx = -1
	}

	leaving := job.window[job.windowPos]
	job.window[job.windowPos] = lateRank
	job.windowPos++
	if job.windowPos == len(job.window) {
		job.windowPos = 0
	}
	if leaving >= 0 {
		count := job.lateCount[leaving] - 1
		if count <= 0 {
			delete(job.lateCount, leaving)
		} else {
			job.lateCount[leaving] = count
		}
		if _, flagged := job.flagged[leaving]; flagged && int(count) <= e.cfg.ClearK {
			delete(job.flagged, leaving)
		}
	}
	if lateRank >= 0 {
		count := job.lateCount[lateRank] + 1
		job.lateCount[lateRank] = count
		if _, flagged := job.flagged[lateRank]; !flagged && int(count) >= e.cfg.FlagK {
			job.flagged[lateRank] = &flagState{cause: semconv.CauseUnknown}
		}
	}

	var baseline *ewma
	if len(r.Members) > 0 {
		bk := baselineKey{pg: r.PG, op: r.Op, bytes: bytes}
		baseline = job.baselines[bk]
		if baseline == nil && r.MissingRanks == 0 {
			if len(job.baselines) >= maxBaselinesPerJob {
				clear(job.baselines)
			}
			baseline = &ewma{}
			job.baselines[bk] = baseline
		}
	}

	if lateIdx >= 0 {
		if fs, flagged := job.flagged[lateRank]; flagged {
			late := &r.Members[lateIdx]
			fs.Topology = late.Topology
			fs.cause = fs.vote(e.cause(r, lateIdx, baseline))
			late.Verdict = VerdictStraggler
			late.Cause = fs.cause
			late.Domain = domainFor(late.Topology, job)
		}
	}
	for i := range r.Members {
		m := &r.Members[i]
		if m.Verdict == VerdictStraggler {
			continue
		}
		m.Verdict = VerdictClear
		if len(job.flagged) > 0 {
			if _, flagged := job.flagged[int32(m.Rank)]; flagged {
				m.Verdict = VerdictUnchanged
			}
		}
	}

	// The baseline learns after the comparison, only from complete collectives, and not from
	// transfers it would call slow: a link that stays slow must keep reading as slow.
	if baseline != nil && r.MissingRanks == 0 && (baseline.samples < minBaselineSamples ||
		r.Transfer <= e.cfg.NetworkFactor*baseline.mean) {
		if baseline.samples == 0 {
			baseline.mean = r.Transfer
		} else {
			baseline.mean += baselineAlpha * (r.Transfer - baseline.mean)
		}
		baseline.samples++
	}
}

// maxBaselinesPerJob bounds the (pg, op, bytes) transfer baselines of one job; past it they
// start over (a job with that many distinct shapes has no useful baseline anyway).
const maxBaselinesPerJob = 4096

// cause compares the late rank's phases in this step with its peers' medians (excess =
// own - median, counted when positive). Data is the dataloader.fetch excess; compute is the
// sum of the forward, optimizer.step (this step's and the previous one's) and backward
// excesses, backward taken net of the rank's longest collective wait in the step (with DDP,
// backward ends with waiting for the last gradient all-reduce, which inflates the early
// ranks' backward by the straggler's lateness).
//
// Backward is also where a rank held up by its own slow transfers shows, so it cannot tell
// compute from network. When the transfer (min duration) is above network_factor times its
// rolling baseline, the network is named unless data or compute outside backward explains
// cause_min_fraction of the lateness. Otherwise the larger of data and compute names the
// cause when it explains cause_min_fraction of the lateness; else unknown.
//
// It uses the phase spans that have arrived by release time: the instrumentation exports a
// step's phases with or before its collectives in the usual case, and the components feed
// each batch's phase spans to the engine before its collectives.
func (e *Engine[R]) cause(r *Released[R], lateIdx int, baseline *ewma) string {
	members := r.Members
	late := &members[lateIdx]
	own := candidatePhases(e.phases.get(r.Job, r.Step, late.Rank),
		e.phases.get(r.Job, r.Step-1, late.Rank))

	stride := 1
	if len(members)-1 > maxCausePeers {
		stride = (len(members) - 1 + maxCausePeers - 1) / maxCausePeers
	}
	var peers [maxCausePeers + 1][numCandidates]phaseValue
	npeers := 0
	for i := 0; i < len(members) && npeers < len(peers); i += stride {
		if i == lateIdx {
			continue
		}
		peers[npeers] = candidatePhases(e.phases.get(r.Job, r.Step, members[i].Rank),
			e.phases.get(r.Job, r.Step-1, members[i].Rank))
		npeers++
	}

	var excess [numCandidates]float64
	for c := range numCandidates {
		if !own[c].ok {
			continue
		}
		vals := e.scratchVals[:0]
		for p := range npeers {
			if peers[p][c].ok {
				vals = append(vals, peers[p][c].value)
			}
		}
		e.scratchVals = vals
		if len(vals) > 0 {
			excess[c] = max(0, own[c].value-median(vals))
		}
	}
	data := excess[candFetch]
	computeOutsideBackward := excess[candForward] + excess[candOptimizer] +
		excess[candPrevOptimizer]
	compute := computeOutsideBackward + excess[candBackwardNet]
	need := e.cfg.CauseMinFraction * late.Lateness

	if baseline != nil && baseline.samples >= minBaselineSamples &&
		r.Transfer > e.cfg.NetworkFactor*baseline.mean {
		switch {
		case data >= need && data >= computeOutsideBackward:
			return semconv.CauseData
		case computeOutsideBackward >= need:
			return semconv.CauseCompute
		default:
			return semconv.CauseNetwork
		}
	}
	switch {
	case data >= need && data >= compute:
		return semconv.CauseData
	case compute >= need:
		return semconv.CauseCompute
	default:
		return semconv.CauseUnknown
	}
}

// median sorts vals in place.
func median(vals []float64) float64 {
	sort.Float64s(vals)
	mid := len(vals) / 2
	if len(vals)%2 == 0 {
		return (vals[mid-1] + vals[mid]) / 2
	}
	return vals[mid]
}

type phaseValue struct {
	value float64
	ok    bool
}

// The candidate phases for a cause. Backward is taken net of the rank's longest collective
// wait in the step (see cause). The previous step's optimizer.step is a candidate because a
// slow optimizer makes a rank late to the first collective of the next step.
const (
	candFetch = iota
	candForward
	candBackwardNet
	candOptimizer
	candPrevOptimizer
	numCandidates
)

func candidatePhases(cur, prev *phaseEntry) [numCandidates]phaseValue {
	var out [numCandidates]phaseValue
	if cur != nil {
		out[candFetch] = cur.value(PhaseFetch)
		out[candForward] = cur.value(PhaseForward)
		if b := cur.value(PhaseBackward); b.ok {
			out[candBackwardNet] = phaseValue{value: max(0, b.value-cur.maxCollectiveWait),
				ok: true}
		}
		out[candOptimizer] = cur.value(PhaseOptimizer)
	}
	if prev != nil {
		out[candPrevOptimizer] = prev.value(PhaseOptimizer)
	}
	return out
}

// SuspectedDomains returns the domains the given flagged ranks share: "nic:<name>" when at
// least two of them use the same NIC of the same host, "switch:<name>" when at least two sit
// behind the same switch. Unknown or empty names never count. The result is sorted.
func SuspectedDomains(flagged []Topology) []string {
	if len(flagged) < 2 {
		return nil
	}
	switches := make(map[string]int)
	nics := make(map[[2]string]int)
	for _, t := range flagged {
		if known(t.Switch) {
			switches[t.Switch]++
		}
		if known(t.NIC) {
			nics[[2]string{t.Host, t.NIC}]++
		}
	}
	var out []string
	for name, n := range switches {
		if n >= 2 {
			out = append(out, "switch:"+name)
		}
	}
	for hostNIC, n := range nics {
		if n >= 2 {
			out = append(out, "nic:"+hostNIC[1])
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// DomainOf returns the most specific suspected domain t belongs to ("" when none).
func DomainOf(t Topology, suspected []string) string {
	if known(t.NIC) && slices.Contains(suspected, "nic:"+t.NIC) {
		return "nic:" + t.NIC
	}
	if known(t.Switch) && slices.Contains(suspected, "switch:"+t.Switch) {
		return "switch:" + t.Switch
	}
	return ""
}

// DomainKind splits "switch:x" / "nic:y" into the attribute key and the name.
func DomainKind(domain string) (attrKey, name string, ok bool) {
	if name, found := strings.CutPrefix(domain, "switch:"); found {
		return semconv.AttrSwitch, name, true
	}
	if name, found := strings.CutPrefix(domain, "nic:"); found {
		return semconv.AttrNIC, name, true
	}
	return "", "", false
}

func known(name string) bool {
	return name != "" && name != semconv.UnknownTopology
}

func domainFor(t Topology, job *jobState) string {
	if len(job.flagged) < 2 {
		return ""
	}
	flagged := make([]Topology, 0, len(job.flagged))
	for _, fs := range job.flagged {
		flagged = append(flagged, fs.Topology)
	}
	return DomainOf(t, SuspectedDomains(flagged))
}
