package diagnosis

import (
	"slices"
	"strings"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// MaxGroupPhases bounds the groups whose phase one step reports (the longest phases first):
// a 4096-rank job has hundreds of tensor-parallel groups, and a controller looking for
// collisions on shared links wants the long ones.
const MaxGroupPhases = 64

// maxGroupSwitches bounds the switches listed for one group (a group behind more is behind
// "many", and crosses uplinks whatever they are).
const maxGroupSwitches = 8

// GroupPhase is one process group's communication phase in one step: when its members'
// collectives begin after their own step start and how long they last, each on its own
// clock (no host clock is trusted), at the median member.
type GroupPhase struct {
	PG string
	// Start is the median member's first collective launch after its train.step start,
	// seconds; Duration from that launch to its last collective's end.
	Start, Duration float64
	// Switches are the members' leaf switches, sorted and comma separated.
	Switches string
}

// groupScratch is the scratch space of groupPhases, reused from step to step.
type groupScratch struct {
	count, offset, colls []int32
	stepStart            []int64
	first, last          []int64
	touched              []int32
	starts, durations    []float64
	switches             []string
	names                []string
}

// groupPhases reports the step's process groups' communication phases (point-to-point
// messages are not a group's phase). It reads the model of the step just analyzed.
func (a *Analyzer) groupPhases(j *jobState, sd *stepData) []GroupPhase {
	m, g := &a.model, &a.groups
	nGroups, nRanks := len(m.pgIDs), len(m.rankOf)
	if nGroups == 0 || nRanks < 2 {
		return nil
	}
	// Each group's collectives, bucketed by group.
	g.count = grow(g.count, nGroups+1)
	clear(g.count)
	g.names = grow(g.names, nGroups)
	for c := range sd.colls {
		rec := &sd.colls[c]
		if rec.p2p || rec.n < 2 {
			continue
		}
		g.count[m.pgID[c]+1]++
		g.names[m.pgID[c]] = rec.pg
	}
	for i := 1; i <= nGroups; i++ {
		g.count[i] += g.count[i-1]
	}
	g.offset = append(g.offset[:0], g.count[:nGroups]...)
	g.colls = grow(g.colls, int(g.count[nGroups]))
	for c := range sd.colls {
		rec := &sd.colls[c]
		if rec.p2p || rec.n < 2 {
			continue
		}
		id := m.pgID[c]
		g.colls[g.offset[id]] = int32(c)
		g.offset[id]++
	}
	// Each rank's step start on its own clock (0: unknown).
	g.stepStart = grow(g.stepStart, nRanks)
	for ri, rank := range m.rankOf {
		g.stepStart[ri] = 0
		if e := a.phases.get(j.name, sd.step, rank); e != nil {
			if iv, ok := e.get(PhaseStep); ok {
				g.stepStart[ri] = iv.start
			}
		}
	}
	g.first = grow(g.first, nRanks)
	g.last = grow(g.last, nRanks)
	for ri := range nRanks {
		g.first[ri], g.last[ri] = -1, -1
	}
	var out []GroupPhase
	for id := range nGroups {
		from, to := g.count[id], g.count[id+1]
		if from == to {
			continue
		}
		g.touched = g.touched[:0]
		for _, c := range g.colls[from:to] {
			rec := &sd.colls[c]
			for i := rec.first; i < rec.first+rec.n; i++ {
				op := &sd.ops[i]
				ri := m.rankIdx[op.rank]
				if g.first[ri] < 0 {
					g.touched = append(g.touched, ri)
					g.first[ri], g.last[ri] = op.start, op.end
					continue
				}
				g.first[ri] = min(g.first[ri], op.start)
				g.last[ri] = max(g.last[ri], op.end)
			}
		}
		g.starts, g.durations, g.switches = g.starts[:0], g.durations[:0], g.switches[:0]
		for _, ri := range g.touched {
			if s := g.stepStart[ri]; s > 0 && g.first[ri] >= s && len(g.starts) < maxPeerSample {
				g.starts = append(g.starts, float64(g.first[ri]-s)/1e9)
				g.durations = append(g.durations, float64(g.last[ri]-g.first[ri])/1e9)
			}
			sw := j.topology[m.rankOf[ri]].Switch
			if sw == "" {
				sw = semconv.UnknownTopology
			}
			if !slices.Contains(g.switches, sw) && len(g.switches) <= maxGroupSwitches {
				g.switches = append(g.switches, sw)
			}
			g.first[ri], g.last[ri] = -1, -1
		}
		if len(g.starts) < 2 {
			continue
		}
		slices.Sort(g.switches)
		switches := strings.Join(g.switches, ",")
		if len(g.switches) > maxGroupSwitches {
			switches = "many"
		}
		out = append(out, GroupPhase{PG: g.names[id], Start: median(g.starts),
			Duration: median(g.durations), Switches: switches})
	}
	if len(out) > MaxGroupPhases {
		slices.SortFunc(out, func(x, y GroupPhase) int { return cmpFloat(y.Duration, x.Duration) })
		out = out[:MaxGroupPhases]
	}
	slices.SortFunc(out, func(x, y GroupPhase) int { return strings.Compare(x.PG, y.PG) })
	return out
}
