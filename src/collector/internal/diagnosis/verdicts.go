package diagnosis

import (
	"sort"
	"time"
)

// Verdicts decides jobs' flags from their analyzed steps when the steps were analyzed in
// several places. Behind the two-tier gateway each tier-2 instance joins and analyzes the
// steps routed to it and defers the flags (flag_decision: deferred); every step summary of a
// job is routed to one Verdicts (the barrierskewverdict processor), which pushes the steps
// into the job's flag state in step order, as a single instance that saw every step would.
//
// Summaries come from instances that analyze at slightly different times, so a step can
// arrive after the next one. A step is decided when it is the next of its job, or when it
// has waited reorderWait for the steps before it (they are then decided when they come,
// counted late). A job's step 0 is next when nothing of it was decided; a job first seen
// at a later step (a Collector restarted mid-job) waits once.
type Verdicts struct {
	cfg         Config
	reorderWait int64
	jobs        map[string]*verdictJob
	stats       VerdictStats
	seq         int64
}

// VerdictStats counts what Verdicts did with the steps it was given.
type VerdictStats struct {
	// Decided counts the steps decided; Late those of them decided after a later step of
	// their job (their step came after reorder_wait), Reordered those that arrived before an
	// earlier step and were held for it.
	Decided, Late, Reordered int64
	// Duplicates counts steps given again (a retried export) and dropped.
	Duplicates int64
	// Forced counts steps decided before their turn because a job held max_open_steps.
	Forced int64
	// JobsDropped counts jobs forgotten past max_jobs, StepsDropped the steps they still
	// held.
	JobsDropped, StepsDropped int64
}

type verdictJob struct {
	flags flagState
	// last is the highest step decided, -1 before the first; done has bit i set when step
	// last-i was decided (duplicates within 64 steps are recognized).
	last    int64
	done    uint64
	pending []pendingVerdict // ascending steps
	used    int64
}

type pendingVerdict struct {
	res     StepResult
	arrived int64
}

// NewVerdicts returns an empty Verdicts that applies cfg's flag rule (flag_window, flag_k,
// clear_steps), bounds (max_open_steps per job, max_jobs) and waits up to reorderWait for
// a step's predecessors.
func NewVerdicts(cfg Config, reorderWait time.Duration) *Verdicts {
	return &Verdicts{cfg: cfg, reorderWait: int64(reorderWait), jobs: make(map[string]*verdictJob)}
}

// Stats returns the counters.
func (v *Verdicts) Stats() VerdictStats { return v.stats }

// Pending is how many steps wait for their turn.
func (v *Verdicts) Pending() int {
	n := 0
	for _, j := range v.jobs {
		n += len(j.pending)
	}
	return n
}

// Add takes one analyzed step (its result read from a summary) and appends to out the steps
// that are decided now, their flags set.
func (v *Verdicts) Add(res StepResult, now time.Time, out []StepResult) []StepResult {
	j := v.job(res.Job)
	switch {
	case j.last < 0:
		// Nothing decided yet: step 0 is next, any other waits for the ones before it.
	case res.Step <= j.last:
		if j.last-res.Step < 64 && j.done&(1<<(j.last-res.Step)) != 0 {
			v.stats.Duplicates++
			return out
		}
		v.stats.Late++
		return v.decide(j, res, out)
	}
	i := sort.Search(len(j.pending), func(k int) bool { return j.pending[k].res.Step >= res.Step })
	if i < len(j.pending) && j.pending[i].res.Step == res.Step {
		v.stats.Duplicates++
		return out
	}
	j.pending = append(j.pending, pendingVerdict{})
	copy(j.pending[i+1:], j.pending[i:])
	j.pending[i] = pendingVerdict{res: res, arrived: now.UnixNano()}
	if (j.last >= 0 && res.Step != j.last+1) || i > 0 {
		v.stats.Reordered++
	}
	return v.release(j, now.UnixNano(), false, out)
}

// Ready appends the steps whose wait is over (every waiting step when drain is set).
func (v *Verdicts) Ready(now time.Time, drain bool, out []StepResult) []StepResult {
	names := make([]string, 0, len(v.jobs))
	for name, j := range v.jobs {
		if len(j.pending) > 0 {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		out = v.release(v.jobs[name], now.UnixNano(), drain, out)
	}
	return out
}

// release decides a job's waiting steps in order while the first is next, has waited long
// enough, or the job holds too many.
func (v *Verdicts) release(j *verdictJob, now int64, drain bool, out []StepResult) []StepResult {
	for len(j.pending) > 0 {
		p := &j.pending[0]
		over := len(j.pending) > v.cfg.MaxOpenSteps
		if !drain && !over && p.res.Step != j.last+1 && now-p.arrived < v.reorderWait {
			break
		}
		if over {
			v.stats.Forced++
		}
		res := p.res
		j.pending[0] = pendingVerdict{}
		j.pending = j.pending[1:]
		out = v.decide(j, res, out)
	}
	if len(j.pending) == 0 {
		j.pending = nil
	}
	return out
}

func (v *Verdicts) decide(j *verdictJob, res StepResult, out []StepResult) []StepResult {
	j.flags.decide(&v.cfg, &res)
	switch {
	case j.last < 0:
		j.last, j.done = res.Step, 1
	case res.Step > j.last:
		shift := res.Step - j.last
		if shift >= 64 {
			j.done = 0
		} else {
			j.done <<= uint(shift)
		}
		j.done |= 1
		j.last = res.Step
	case j.last-res.Step < 64:
		j.done |= 1 << (j.last - res.Step)
	}
	v.stats.Decided++
	return append(out, res)
}

func (v *Verdicts) job(name string) *verdictJob {
	v.seq++
	if j, ok := v.jobs[name]; ok {
		j.used = v.seq
		return j
	}
	if len(v.jobs) >= v.cfg.MaxJobs {
		victim := ""
		for n, j := range v.jobs {
			if victim == "" || j.used < v.jobs[victim].used {
				victim = n
			}
		}
		v.stats.StepsDropped += int64(len(v.jobs[victim].pending))
		delete(v.jobs, victim)
		v.stats.JobsDropped++
	}
	j := &verdictJob{flags: newFlagState(), last: -1, used: v.seq}
	v.jobs[name] = j
	return j
}
