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

// maxGroupSwitches and maxGroupHosts bound the switches and hosts listed for one group (a
// group behind more is behind "many", and crosses uplinks whatever they are).
const (
	maxGroupSwitches = 8
	maxGroupHosts    = 16
)

// GroupPhase is one communication phase of one process group in one step: when its
// members' collectives of one op begin after their own step start and how long they last,
// each on its own clock (no host clock is trusted), at the median member. A group with an
// all-gather before forward and a reduce-scatter after backward has two phases.
type GroupPhase struct {
	PG, Op string
	// Start is the median member's first collective launch after its train.step start,
	// seconds; Duration from that launch to its last collective's end.
	Start, Duration float64
	// Switches and Hosts are the members' leaf switches and hosts, sorted and comma
	// separated ("many" past maxGroupSwitches, maxGroupHosts): groups that share a host are
	// tied (its ranks step together), groups behind several switches cross their uplinks.
	Switches, Hosts string
}

// groupOpKey is one op of one group in the step being analyzed.
type groupOpKey struct {
	pg int32
	op string
}

// groupScratch is the scratch space of groupPhases, reused from step to step.
type groupScratch struct {
	ids                  map[groupOpKey]int32
	keys                 []groupOpKey
	id                   []int32 // each collective's phase id, -1 for none
	count, offset, colls []int32
	stepStart            []int64
	first, last          []int64
	touched              []int32
	starts, durations    []float64
	switches, hosts      []string
}

// groupPhases reports the step's process groups' communication phases (point-to-point
// messages are not a group's phase). It reads the model of the step just analyzed.
func (a *Analyzer) groupPhases(j *jobState, sd *stepData) []GroupPhase {
	m, g := &a.model, &a.groups
	nRanks := len(m.rankOf)
	if len(sd.colls) == 0 || nRanks < 2 {
		return nil
	}
	// Each (group, op)'s collectives, bucketed.
	if g.ids == nil {
		g.ids = make(map[groupOpKey]int32)
	}
	clear(g.ids)
	g.keys = g.keys[:0]
	g.id = grow(g.id, len(sd.colls))
	for c := range sd.colls {
		rec := &sd.colls[c]
		g.id[c] = -1
		if rec.p2p || rec.n < 2 {
			continue
		}
		k := groupOpKey{pg: m.pgID[c], op: rec.op}
		id, ok := g.ids[k]
		if !ok {
			id = int32(len(g.keys))
			g.ids[k] = id
			g.keys = append(g.keys, k)
		}
		g.id[c] = id
	}
	nGroups := len(g.keys)
	if nGroups == 0 {
		return nil
	}
	g.count = grow(g.count, nGroups+1)
	clear(g.count)
	for c := range sd.colls {
		if id := g.id[c]; id >= 0 {
			g.count[id+1]++
		}
	}
	for i := 1; i <= nGroups; i++ {
		g.count[i] += g.count[i-1]
	}
	g.offset = append(g.offset[:0], g.count[:nGroups]...)
	g.colls = grow(g.colls, int(g.count[nGroups]))
	for c := range sd.colls {
		if id := g.id[c]; id >= 0 {
			g.colls[g.offset[id]] = int32(c)
			g.offset[id]++
		}
	}
	// Each rank's step start on its own clock (0: unknown).
	g.stepStart = grow(g.stepStart, nRanks)
	for ri := range m.rankOf {
		g.stepStart[ri] = 0
		if e := m.curPh[ri]; e != nil {
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
				ri := m.opRank[i]
				if g.first[ri] < 0 {
					g.touched = append(g.touched, ri)
					g.first[ri], g.last[ri] = op.start, op.end
					continue
				}
				g.first[ri] = min(g.first[ri], op.start)
				g.last[ri] = max(g.last[ri], op.end)
			}
		}
		g.starts, g.durations = g.starts[:0], g.durations[:0]
		g.switches, g.hosts = g.switches[:0], g.hosts[:0]
		for _, ri := range g.touched {
			if s := g.stepStart[ri]; s > 0 && g.first[ri] >= s && len(g.starts) < maxPeerSample {
				g.starts = append(g.starts, float64(g.first[ri]-s)/1e9)
				g.durations = append(g.durations, float64(g.last[ri]-g.first[ri])/1e9)
			}
			topo := j.topology.at(m.rankOf[ri])
			g.switches = addName(g.switches, topo.Switch, maxGroupSwitches)
			g.hosts = addName(g.hosts, topo.Host, maxGroupHosts)
			g.first[ri], g.last[ri] = -1, -1
		}
		if len(g.starts) < 2 {
			continue
		}
		k := g.keys[id]
		out = append(out, GroupPhase{PG: sd.colls[g.colls[from]].pg, Op: k.op,
			Start: median(g.starts), Duration: median(g.durations),
			Switches: joinNames(g.switches, maxGroupSwitches),
			Hosts:    joinNames(g.hosts, maxGroupHosts)})
	}
	if len(out) > MaxGroupPhases {
		slices.SortFunc(out, func(x, y GroupPhase) int { return cmpFloat(y.Duration, x.Duration) })
		out = out[:MaxGroupPhases]
	}
	slices.SortFunc(out, func(x, y GroupPhase) int {
		if c := strings.Compare(x.PG, y.PG); c != 0 {
			return c
		}
		return strings.Compare(x.Op, y.Op)
	})
	return out
}

// addName adds a topology name (unknown when empty) to a set of at most limit+1 names.
func addName(names []string, name string, limit int) []string {
	if name == "" {
		name = semconv.UnknownTopology
	}
	if len(names) <= limit && !slices.Contains(names, name) {
		names = append(names, name)
	}
	return names
}

// joinNames is the names sorted and comma separated, "many" past limit.
func joinNames(names []string, limit int) string {
	if len(names) > limit {
		return "many"
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}
