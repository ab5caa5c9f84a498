package diagnosis

import (
	"math/bits"
	"sort"
	"strconv"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// causeMemory is how many of a rank's latest per-step causes vote on its cause.
const causeMemory = 8

// track is the flag state of one rank of a job.
type track struct {
	// hist has bit i set when the rank was a root cause i analyzed steps ago.
	hist    uint64
	flagged bool
	topo    Topology
	// recent holds its latest per-step causes; the reported cause is the most common
	// known one, so one step whose phases were missing does not flip it.
	recent    [causeMemory]string
	recentPos int
	cause     string
	cost      float64
	suspect   string
	// before is where its own time sat in the latest step it was named host_work.
	before string
}

func (t *track) vote(cause string) {
	t.recent[t.recentPos] = cause
	t.recentPos = (t.recentPos + 1) % causeMemory
	best, bestCount := semconv.CauseUnknown, 0
	for i := range causeMemory {
		// Walk from the most recent so that ties go to it.
		c := t.recent[(t.recentPos-1-i+causeMemory)%causeMemory]
		if c == "" || c == semconv.CauseUnknown {
			continue
		}
		n := 0
		for _, other := range t.recent {
			if other == c {
				n++
			}
		}
		if n > bestCount {
			best, bestCount = c, n
		}
	}
	t.cause = best
}

func (t *track) flag(rank int32) RankFlag {
	f := RankFlag{Rank: int(rank), Topology: t.topo, Cause: t.cause, Cost: t.cost,
		Domain: t.suspect}
	if t.cause == semconv.CauseHostWork {
		f.Before = t.before
	}
	return f
}

// suspectTrack is the flag state of one located suspect of a job.
type suspectTrack struct {
	suspect Suspect
	hist    uint64
	flagged bool
	cost    float64
}

// flagRule applies K of W with hysteresis to a history word whose bit 0 is the latest step,
// and returns the history to keep: a flag that clears forgets the namings before it, so that
// flagging again takes K new ones (the steps of a fault just ended, still in the window,
// made one naming after it a flag again in make demo).
func flagRule(hist uint64, flagged bool, cfg *Config) (bool, uint64) {
	clearMask := uint64(1)<<cfg.ClearSteps - 1
	switch {
	case !flagged:
		return hist&1 != 0 && bits.OnesCount64(hist) >= cfg.FlagK, hist
	case hist&clearMask != 0:
		return true, hist
	default:
		return false, 0
	}
}

// costAlpha is the weight of a step in the flagged costs' moving averages: about the flag
// window's worth of steps.
func costAlpha(cfg *Config) float64 { return 2 / float64(cfg.FlagWindow+1) }

// flagState is what a job's flags are decided from: the K-of-W histories of its ranks,
// suspects and imbalances, and the moving slowdown. The analyzer keeps one per job, and so
// does Verdicts (from step summaries, for the gateway).
type flagState struct {
	// steps counts the steps decided; the first warmupSteps vote for no flag.
	steps int
	ranks map[int32]*track
	// flaggedRanks counts the ranks flagged (set by decide, where flags change).
	flaggedRanks int
	suspects     map[string]*suspectTrack
	// imbalances holds the flag state of the job's stage and data imbalances.
	imbalances map[string]*imbalanceTrack
	slowdown   ewma
}

func newFlagState() flagState {
	return flagState{
		ranks:      make(map[int32]*track),
		suspects:   make(map[string]*suspectTrack),
		imbalances: make(map[string]*imbalanceTrack),
	}
}

// decide pushes one analyzed step (its root causes, duration and what-if) into the job's
// flags and sets the step's Flagged, Suspects, Imbalances and Slowdown after it. It reads
// only what a step summary carries, so a verdict stage decides from summaries exactly as
// the analyzer would: located links are the root causes without a rank, and a
// data_imbalance names its step's slowest replica.
func (j *flagState) decide(cfg *Config, res *StepResult) {
	var located []SuspectCost
	slowest := int32(-1)
	for i := range res.RootCauses {
		rc := &res.RootCauses[i]
		switch {
		case rc.Rank < 0 && rc.Suspect != nil && rc.Cause == semconv.CauseNetwork:
			located = append(located, SuspectCost{Suspect: *rc.Suspect, Cost: rc.Cost})
		case rc.Cause == semconv.CauseDataImbalance && len(rc.Ranks) > 0:
			slowest = int32(rc.Ranks[0])
		}
	}
	res.Flagged, res.Suspects = updateFlags(cfg, j, res.RootCauses, located)
	res.Imbalances = updateImbalances(cfg, j, res.RootCauses, slowest)
	if res.WhatIf > 0 {
		j.slowdown.add(res.Duration/res.WhatIf, costAlpha(cfg))
	}
	res.Slowdown = j.slowdown.mean
	res.Deferred = false
	j.steps++
}

// updateFlags pushes one step's root causes into the job's flag state and returns the
// flagged ranks and suspects after it.
func updateFlags(cfg *Config, j *flagState, roots []RootCause, located []SuspectCost,
) ([]RankFlag, []SuspectFlag) {
	window := uint64(1)<<cfg.FlagWindow - 1
	alpha := costAlpha(cfg)
	// A job's first warmupSteps analyzed steps vote for no flag: what is slow there (lazy
	// initialisation, first connections of each group, allocator growth) ends by itself,
	// and with the two after them it flagged a healthy rank at the job's start for
	// ClearSteps steps. Their root causes are still reported on the steps' summaries.
	if j.steps < warmupSteps {
		roots, located = nil, nil
	}
	for _, t := range j.ranks {
		t.hist = (t.hist << 1) & window
		t.cost *= 1 - alpha
	}
	for _, s := range j.suspects {
		s.hist = (s.hist << 1) & window
		s.cost *= 1 - alpha
	}
	for _, rc := range roots {
		if rc.Rank < 0 {
			continue
		}
		t := j.ranks[int32(rc.Rank)]
		if t == nil {
			if len(j.ranks) >= maxTrackedRanks {
				continue
			}
			t = &track{}
			j.ranks[int32(rc.Rank)] = t
		}
		t.hist |= 1
		t.cost += alpha * rc.Cost
		t.topo = rc.Topology
		t.vote(rc.Cause)
		if rc.Cause == semconv.CauseHostWork && rc.Before != "" {
			t.before = rc.Before
		}
		t.suspect = ""
		if rc.Cause == semconv.CauseNetwork && rc.Suspect != nil {
			t.suspect = rc.Suspect.ID()
		}
	}
	for _, sc := range located {
		id := sc.Suspect.ID()
		s := j.suspects[id]
		if s == nil {
			if len(j.suspects) >= maxBaselinesPerJob {
				continue
			}
			s = &suspectTrack{suspect: sc.Suspect}
			j.suspects[id] = s
		}
		s.hist |= 1
		s.cost += alpha * sc.Cost
	}
	var flagged []RankFlag
	for rank, t := range j.ranks {
		t.flagged, t.hist = flagRule(t.hist, t.flagged, cfg)
		if !t.flagged && t.hist == 0 {
			delete(j.ranks, rank)
			continue
		}
		if t.flagged {
			flagged = append(flagged, t.flag(rank))
		}
	}
	j.flaggedRanks = len(flagged)
	var suspects []SuspectFlag
	for id, s := range j.suspects {
		s.flagged, s.hist = flagRule(s.hist, s.flagged, cfg)
		if !s.flagged && s.hist == 0 {
			delete(j.suspects, id)
			continue
		}
		if s.flagged {
			suspects = append(suspects, SuspectFlag{Suspect: s.suspect, Cost: s.cost})
		}
	}
	suspects = append(suspects, derivedSuspects(flagged)...)
	assignDomains(flagged, suspects)
	sort.Slice(flagged, func(x, y int) bool { return flagged[x].Rank < flagged[y].Rank })
	sort.Slice(suspects, func(x, y int) bool { return suspects[x].ID() < suspects[y].ID() })
	for i := range flagged {
		if t := j.ranks[int32(flagged[i].Rank)]; t != nil {
			t.suspect = flagged[i].Domain
		}
	}
	return flagged, suspects
}

// SuspectCost is a suspect located in one step with what it cost.
type SuspectCost struct {
	Suspect
	Cost float64
}

// derivedSuspects names what flagged ranks share: a switch when flagged ranks sit on two
// or more of its hosts, else a host when two or more of its ranks are flagged for their own
// work (ranks flagged for their NIC are explained by it already).
func derivedSuspects(flagged []RankFlag) []SuspectFlag {
	switchHosts := make(map[string]map[string]struct{})
	switchCost := make(map[string]float64)
	hostRanks := make(map[string]int)
	hostCost := make(map[string]float64)
	for _, f := range flagged {
		if knownName(f.Switch) && knownName(f.Host) {
			hosts := switchHosts[f.Switch]
			if hosts == nil {
				hosts = make(map[string]struct{})
				switchHosts[f.Switch] = hosts
			}
			hosts[f.Host] = struct{}{}
			switchCost[f.Switch] = max(switchCost[f.Switch], f.Cost)
		}
		if knownName(f.Host) && f.Cause != semconv.CauseNetwork {
			hostRanks[f.Host]++
			hostCost[f.Host] = max(hostCost[f.Host], f.Cost)
		}
	}
	var out []SuspectFlag
	covered := make(map[string]bool)
	for sw, hosts := range switchHosts {
		if len(hosts) >= 2 {
			out = append(out, SuspectFlag{Suspect: Suspect{Kind: SuspectSwitch, Name: sw},
				Cost: switchCost[sw], Derived: true})
			for h := range hosts {
				covered[h] = true
			}
		}
	}
	for host, n := range hostRanks {
		// A switch already named says more than each of its hosts.
		if n >= 2 && !covered[host] {
			out = append(out, SuspectFlag{Suspect: Suspect{Kind: SuspectHost, Name: host},
				Cost: hostCost[host], Derived: true})
		}
	}
	return out
}

// assignDomains gives each flagged rank the most telling suspect it belongs to: its own
// link for a network cause; else a switch its flagged peers share; else its host.
func assignDomains(flagged []RankFlag, suspects []SuspectFlag) {
	byID := make(map[string]bool, len(suspects))
	for _, s := range suspects {
		byID[s.ID()] = true
	}
	for i := range flagged {
		f := &flagged[i]
		if f.Cause == semconv.CauseNetwork && f.Domain != "" {
			continue
		}
		f.Domain = ""
		sw := Suspect{Kind: SuspectSwitch, Name: f.Switch}.ID()
		host := Suspect{Kind: SuspectHost, Name: f.Host}.ID()
		switch {
		case knownName(f.Switch) && byID[sw]:
			f.Domain = sw
		case knownName(f.Host) && byID[host]:
			f.Domain = host
		}
	}
}

// imbalanceTrack is the flag state of one imbalance of a job (a stage's, or the data's).
type imbalanceTrack struct {
	hist    uint64
	flagged bool
	cost    float64
	last    RootCause
	// slowest holds the replica that was slowest in each of the latest data-imbalanced
	// steps: one replica slowest in nearly all of them is a straggler, not the data.
	slowest    [maxFlagWindow]int32
	slowestLen int
	slowestPos int
}

// persistentRank reports whether one replica was the slowest in at least seven eighths of
// the latest imbalanced steps (four or more): a straggler, not the data. (With two replicas
// the data alone makes one of them the slowest in more than half of them often.)
func (t *imbalanceTrack) persistentRank() bool {
	if t.slowestLen < 4 {
		return false
	}
	for i := range t.slowestLen {
		n := 0
		for k := range t.slowestLen {
			if t.slowest[k] == t.slowest[i] {
				n++
			}
		}
		if 8*n >= 7*t.slowestLen {
			return true
		}
	}
	return false
}

// imbalanceKey names an imbalance's track: "data", or "stage:<n>".
func imbalanceKey(rc *RootCause) string {
	if rc.Cause == semconv.CauseStageImbalance {
		return "stage:" + strconv.Itoa(rc.Stage)
	}
	return rc.Cause
}

// updateImbalances pushes one step's imbalances into the job's flag state (K of W with
// hysteresis, as ranks) and returns the flagged imbalances after it. slowest is the step's
// slowest replica when its data was imbalanced.
func updateImbalances(cfg *Config, j *flagState, roots []RootCause, slowest int32,
) []ImbalanceFlag {
	window := uint64(1)<<cfg.FlagWindow - 1
	alpha := costAlpha(cfg)
	if j.steps < warmupSteps {
		roots = nil
	}
	for _, t := range j.imbalances {
		t.hist = (t.hist << 1) & window
		t.cost *= 1 - alpha
	}
	for i := range roots {
		rc := &roots[i]
		if rc.Cause != semconv.CauseStageImbalance && rc.Cause != semconv.CauseDataImbalance {
			continue
		}
		key := imbalanceKey(rc)
		t := j.imbalances[key]
		if t == nil {
			if len(j.imbalances) >= maxBaselinesPerJob {
				continue
			}
			t = &imbalanceTrack{}
			j.imbalances[key] = t
		}
		t.hist |= 1
		t.cost += alpha * rc.Cost
		t.last = *rc
		if rc.Cause == semconv.CauseDataImbalance {
			t.slowest[t.slowestPos] = slowest
			t.slowestPos = (t.slowestPos + 1) % cfg.FlagWindow
			t.slowestLen = min(t.slowestLen+1, cfg.FlagWindow)
		}
	}
	var out []ImbalanceFlag
	for key, t := range j.imbalances {
		t.flagged, t.hist = flagRule(t.hist, t.flagged, cfg)
		if t.last.Cause == semconv.CauseDataImbalance && t.persistentRank() {
			t.flagged = false
		}
		if !t.flagged && t.hist == 0 {
			delete(j.imbalances, key)
			continue
		}
		if t.flagged {
			im := ImbalanceFlag{Cause: t.last.Cause, Stage: t.last.Stage, Ranks: t.last.Ranks,
				Excess: t.last.Excess, Cost: t.cost, Fix: t.last.Fix, Partition: t.last.Partition}
			if im.Cause == semconv.CauseDataImbalance {
				im.Ranks = nil // no rank is the data's: the slowest differs from step to step
			}
			out = append(out, im)
		}
	}
	sort.Slice(out, func(x, y int) bool {
		if out[x].Cause != out[y].Cause {
			return out[x].Cause < out[y].Cause
		}
		return out[x].Stage < out[y].Stage
	})
	return out
}
