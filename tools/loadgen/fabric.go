package main

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The job model behind `loadgen simulate`: N = nodes x gpus-per-node ranks, nodes behind leaf
// switches of nodes-per-leaf, leaves joined by a spine. docs/simulator.md states the
// equations; this file is pure (no clock, no I/O): a step's per-rank delays in, the step's
// per-rank timeline out, deterministic for a seed.
//
// Process groups: tensor-parallel groups are the ranks of one node (one all_gather in the
// middle of forward, over NVLink, never on the fabric); data-parallel group g is local rank g
// of every node (gpus-per-node groups, "rails"), with K gradient buckets per step that DDP
// launches during backward and that run one after another per group.
//
// With DPSets = S > 1 the nodes form S sets (node n in set n mod S, as the stages of a
// pipeline or two halves of a job would), each with its own data-parallel groups (local rank
// l of the set's nodes), and a world all-reduce before the optimizer syncs the sets every
// step. With Gather > 0 every data-parallel group starts its step with a blocking all_gather
// (a ZeRO-3/FSDP parameter gather) before forward.
//
// A transfer (a gather, or a bucket's all-reduce) starts once its last member arrived and the
// group's previous transfer finished; it needs Transfer (Gather) at full rate. Its rate is the
// smallest of: its slowest member NIC's factor, its slowest leaf uplink's factor, and (when
// the group spans two or more leaves, so its ring crosses the spine) its share of the spine
// uplinks, SpineCapacity / spine-crossing transfers in flight (processor sharing: k flows on
// an uplink that carries C at full rate each get min(1, C / k); two equal transfers that
// overlap entirely on an uplink of capacity 1 both take twice as long, the collision cost),
// where the spine loses capacity to traffic parked by ranks that arrived early:
//
//	spine(t) = SpineCapacity / (1 + ParkedPenalty * waiting(t) / ranks)
//
// with waiting(t) the ranks that reached a spine-crossing bucket whose transfer has not
// started (NCCL has already pushed their first chunks, which sit in switch buffers and pause
// the links other groups are using). ParkedPenalty = 0 turns this off; then a collective
// costs the same whenever its members arrive, and pacing early ranks cannot shorten a step.

// SimConfig is the simulated job. Durations are means; Jitter is the relative standard
// deviation of every per-rank phase draw.
type SimConfig struct {
	JobID        string
	Nodes        int
	GPUsPerNode  int
	NodesPerLeaf int
	Buckets      int // DDP gradient all-reduces per step in every data-parallel group
	BatchPerRank int // samples per rank per step, for throughput
	Seed         uint64

	Fetch      time.Duration
	Forward    time.Duration
	Backward   time.Duration
	Optimizer  time.Duration
	Transfer   time.Duration // one bucket's all-reduce at full rate
	TPTransfer time.Duration // the tensor-parallel all_gather inside a node

	Jitter          float64 // per-rank, per-phase relative stddev
	NodeSpeedSpread float64 // stddev of each node's persistent compute-time factor around 1
	SlowNodes       []Slowdown
	StallProb       float64       // chance per rank and step of a data-loader stall
	StallMean       time.Duration // mean of an (exponential) stall
	SlowNICs        []Slowdown    // Index: rank; Factor: the NIC's rate (0.5: half speed)
	SlowUplinks     []Slowdown    // Index: leaf; Factor: the uplink's rate
	SpineCapacity   float64       // full-rate transfers a spine uplink carries at once
	ParkedPenalty   float64       // spine capacity lost to early ranks' parked traffic (above)
	DPSets          int           // sets of nodes with data-parallel groups of their own (above)
	Gather          time.Duration // each data-parallel group's all_gather before forward (0: none)
}

// Slowdown is one INDEX:FACTOR of -slow-node, -slow-nic or -slow-uplink.
type Slowdown struct {
	Index  int
	Factor float64
}

// ParseSlowdowns reads "I:F,I:F" (an empty string is none).
func ParseSlowdowns(flagName, text string) ([]Slowdown, error) {
	if text == "" {
		return nil, nil
	}
	var out []Slowdown
	for _, part := range strings.Split(text, ",") {
		index, factor, ok := strings.Cut(part, ":")
		i, err1 := strconv.Atoi(index)
		f, err2 := strconv.ParseFloat(factor, 64)
		if !ok || err1 != nil || err2 != nil || i < 0 || !(f > 0) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("-%s %q: want INDEX:FACTOR[,INDEX:FACTOR] with FACTOR > 0",
				flagName, part)
		}
		out = append(out, Slowdown{Index: i, Factor: f})
	}
	return out, nil
}

// DefaultSimConfig is 8 nodes of 8 GPUs, 8 nodes per leaf, a spine that carries half of the 8
// rails' transfers at full rate (2:1 oversubscribed when every rail transfers at once).
func DefaultSimConfig() SimConfig {
	return SimConfig{
		JobID:           "sim",
		Nodes:           8,
		GPUsPerNode:     8,
		NodesPerLeaf:    8,
		Buckets:         4,
		BatchPerRank:    32,
		Seed:            1,
		Fetch:           20 * time.Millisecond,
		Forward:         100 * time.Millisecond,
		Backward:        200 * time.Millisecond,
		Optimizer:       20 * time.Millisecond,
		Transfer:        20 * time.Millisecond,
		TPTransfer:      4 * time.Millisecond,
		Jitter:          0.03,
		NodeSpeedSpread: 0.05,
		StallProb:       0.0015,
		StallMean:       150 * time.Millisecond,
		SpineCapacity:   4,
		ParkedPenalty:   1,
		DPSets:          1,
	}
}

// Ranks is the world size.
func (c *SimConfig) Ranks() int { return c.Nodes * c.GPUsPerNode }

// Groups is how many data-parallel groups the job has: one per local rank in each set.
func (c *SimConfig) Groups() int { return c.DPSets * c.GPUsPerNode }

// GroupOf is rank r's data-parallel group.
func (c *SimConfig) GroupOf(r int) int {
	return (r/c.GPUsPerNode)%c.DPSets*c.GPUsPerNode + r%c.GPUsPerNode
}

// Leaves is how many leaf switches the job's nodes sit behind.
func (c *SimConfig) Leaves() int { return (c.Nodes + c.NodesPerLeaf - 1) / c.NodesPerLeaf }

// Validate names the flag of each bad field.
func (c *SimConfig) Validate() error {
	var errs []error
	positive := []struct {
		name  string
		value time.Duration
	}{
		{"fetch", c.Fetch}, {"forward", c.Forward}, {"backward", c.Backward},
		{"optimizer", c.Optimizer}, {"transfer", c.Transfer}, {"tp-transfer", c.TPTransfer},
	}
	for _, p := range positive {
		if p.value <= 0 {
			errs = append(errs, fmt.Errorf("-%s must be > 0, got %s", p.name, p.value))
		}
	}
	switch {
	case c.JobID == "":
		errs = append(errs, errors.New("-job must not be empty"))
	case c.Nodes < 1:
		errs = append(errs, fmt.Errorf("-nodes must be >= 1, got %d", c.Nodes))
	case c.GPUsPerNode < 1:
		errs = append(errs, fmt.Errorf("-gpus-per-node must be >= 1, got %d", c.GPUsPerNode))
	case c.NodesPerLeaf < 1:
		errs = append(errs, fmt.Errorf("-nodes-per-leaf must be >= 1, got %d", c.NodesPerLeaf))
	case c.Buckets < 1:
		errs = append(errs, fmt.Errorf("-buckets must be >= 1, got %d", c.Buckets))
	case c.BatchPerRank < 1:
		errs = append(errs, fmt.Errorf("-batch-per-rank must be >= 1, got %d", c.BatchPerRank))
	case c.DPSets < 1 || c.DPSets > c.Nodes:
		errs = append(errs, fmt.Errorf("-dp-sets must be in [1, -nodes], got %d", c.DPSets))
	}
	if c.Gather < 0 {
		errs = append(errs, fmt.Errorf("-gather must be >= 0, got %s", c.Gather))
	}
	if c.Jitter < 0 || c.Jitter > 0.3 {
		errs = append(errs, fmt.Errorf("-jitter must be in [0, 0.3], got %g", c.Jitter))
	}
	if c.NodeSpeedSpread < 0 || c.NodeSpeedSpread > 0.3 {
		errs = append(errs, fmt.Errorf("-node-speed-spread must be in [0, 0.3], got %g",
			c.NodeSpeedSpread))
	}
	if c.StallProb < 0 || c.StallProb > 1 || c.StallMean < 0 {
		errs = append(errs, fmt.Errorf("-stall-prob must be in [0, 1] and -stall-mean >= 0, got %g, %s",
			c.StallProb, c.StallMean))
	}
	if !(c.SpineCapacity > 0) {
		errs = append(errs, fmt.Errorf("-spine-capacity must be > 0, got %g", c.SpineCapacity))
	}
	if c.ParkedPenalty < 0 {
		errs = append(errs, fmt.Errorf("-parked-penalty must be >= 0, got %g", c.ParkedPenalty))
	}
	for _, s := range c.SlowNodes {
		if s.Index >= c.Nodes {
			errs = append(errs, fmt.Errorf("-slow-node %d is outside -nodes=%d", s.Index, c.Nodes))
		}
	}
	for _, s := range c.SlowNICs {
		if s.Index >= c.Ranks() {
			errs = append(errs, fmt.Errorf("-slow-nic rank %d is outside %d ranks", s.Index, c.Ranks()))
		}
	}
	for _, s := range c.SlowUplinks {
		if s.Index >= c.Leaves() {
			errs = append(errs, fmt.Errorf("-slow-uplink leaf %d is outside %d leaves", s.Index,
				c.Leaves()))
		}
	}
	return errors.Join(errs...)
}

// RankStep is one rank's step in model time (seconds since the simulation's start).
type RankStep struct {
	Start, FetchEnd float64
	Delay           float64 // pacing delay applied after the fetch, before forward
	// The data-parallel group's all_gather before forward (-gather; all 0 without one):
	// this rank's arrival (FetchEnd + Delay), and the group's transfer start and end.
	GatherArrival, GatherStart, GatherEnd float64
	ForwardStart                          float64 // FetchEnd + Delay, or GatherEnd with a gather
	TPArrival, TPEnd                      float64 // the all_gather in the middle of forward
	ForwardEnd                            float64
	ComputeEnd                            float64 // end of backward's compute
	BucketArrival                         []float64
	BucketStart                           []float64 // when the group's transfer began (all members arrived)
	BucketEnd                             []float64
	BackwardEnd                           float64
	WorldEnd                              float64 // -dp-sets > 1: the world all-reduce before the optimizer (its arrival is BackwardEnd)
	StepEnd                               float64 // the end of optimizer.step
	Stalled                               bool
}

// SimStep is the whole job's step.
type SimStep struct {
	Index int
	Ranks []RankStep
	End   float64 // the last rank's optimizer end: when the job finished this step
	// The collision cost: each transfer's duration over its duration alone (at its group's
	// own NIC and uplink rate, with nothing else on the spine), summed, and how many.
	StretchSum float64
	Transfers  int
}

// Model plays the job one step at a time.
type Model struct {
	cfg      SimConfig
	rng      *rand.Rand
	speed    []float64 // per node, multiplies forward and backward
	nicRate  []float64 // per rank
	members  [][]int   // per data-parallel group: its ranks
	rateOfDP []float64 // per data-parallel group: its slowest NIC and uplink
	crosses  []bool    // per data-parallel group: its members sit under two leaves or more
	cursor   []float64 // per rank: when its next step starts
	step     int
}

// NewModel draws the job's persistent properties (node speeds) from the seed.
func NewModel(cfg SimConfig) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{
		cfg:      cfg,
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0x51a1)),
		speed:    make([]float64, cfg.Nodes),
		nicRate:  make([]float64, cfg.Ranks()),
		members:  make([][]int, cfg.Groups()),
		rateOfDP: make([]float64, cfg.Groups()),
		crosses:  make([]bool, cfg.Groups()),
		cursor:   make([]float64, cfg.Ranks()),
	}
	// Node speeds from their own stream, so that they do not depend on the step draws.
	speedRNG := rand.New(rand.NewPCG(cfg.Seed, 0x5bee))
	for n := range m.speed {
		m.speed[n] = math.Max(0.5, 1+cfg.NodeSpeedSpread*speedRNG.NormFloat64())
	}
	for _, s := range cfg.SlowNodes {
		m.speed[s.Index] *= s.Factor
	}
	for r := range m.nicRate {
		m.nicRate[r] = 1
	}
	for _, s := range cfg.SlowNICs {
		m.nicRate[s.Index] = math.Min(1, s.Factor)
	}
	uplink := make([]float64, cfg.Leaves())
	for l := range uplink {
		uplink[l] = 1
	}
	for _, s := range cfg.SlowUplinks {
		uplink[s.Index] = math.Min(1, s.Factor)
	}
	for r := range cfg.Ranks() {
		g := cfg.GroupOf(r)
		m.members[g] = append(m.members[g], r)
	}
	for g, members := range m.members {
		firstLeaf := members[0] / cfg.GPUsPerNode / cfg.NodesPerLeaf
		for _, r := range members {
			m.crosses[g] = m.crosses[g] || r/cfg.GPUsPerNode/cfg.NodesPerLeaf != firstLeaf
		}
		rate := 1.0
		for _, r := range members {
			rate = math.Min(rate, m.nicRate[r])
			if m.crosses[g] {
				rate = math.Min(rate, uplink[r/cfg.GPUsPerNode/cfg.NodesPerLeaf])
			}
		}
		m.rateOfDP[g] = rate
	}
	return m, nil
}

// NodeSpeed is node n's persistent compute-time factor (above 1: slower).
func (m *Model) NodeSpeed(n int) float64 { return m.speed[n] }

// Members is data-parallel group g's ranks.
func (m *Model) Members(g int) []int { return m.members[g] }

func (m *Model) draw(mean time.Duration) float64 {
	return math.Max(0.1, 1+m.cfg.Jitter*m.rng.NormFloat64()) * mean.Seconds()
}

// Next plays the next step with delays[rank] seconds of pacing (nil: none).
func (m *Model) Next(delays []float64) SimStep {
	cfg := &m.cfg
	ranks := cfg.Ranks()
	out := SimStep{Index: m.step, Ranks: make([]RankStep, ranks)}
	m.step++
	forward := make([]float64, ranks)
	backward := make([]float64, ranks)
	for r := range out.Ranks {
		rs := &out.Ranks[r]
		node := r / cfg.GPUsPerNode
		rs.Start = m.cursor[r]
		fetch := m.draw(cfg.Fetch)
		if cfg.StallProb > 0 && m.rng.Float64() < cfg.StallProb {
			fetch += m.rng.ExpFloat64() * cfg.StallMean.Seconds()
			rs.Stalled = true
		}
		rs.FetchEnd = rs.Start + fetch
		if delays != nil && delays[r] > 0 {
			rs.Delay = delays[r]
		}
		rs.ForwardStart = rs.FetchEnd + rs.Delay
		forward[r] = m.draw(cfg.Forward) * m.speed[node]
		backward[r] = m.draw(cfg.Backward) * m.speed[node]
	}
	if cfg.Gather > 0 {
		m.playGathers(&out)
	}
	for r := range out.Ranks {
		rs := &out.Ranks[r]
		rs.TPArrival = rs.ForwardStart + forward[r]/2
		rs.ForwardEnd = forward[r] / 2 // the second half, added after the all_gather below
	}
	// Tensor parallel: the node's ranks leave the all_gather together.
	for node := range cfg.Nodes {
		members := out.Ranks[node*cfg.GPUsPerNode : (node+1)*cfg.GPUsPerNode]
		last := members[0].TPArrival
		for i := range members {
			last = math.Max(last, members[i].TPArrival)
		}
		end := last + m.draw(cfg.TPTransfer)
		for i := range members {
			members[i].TPEnd = end
			members[i].ForwardEnd += end
		}
	}
	for r := range out.Ranks {
		rs := &out.Ranks[r]
		rs.ComputeEnd = rs.ForwardEnd + backward[r]
		rs.BucketArrival = make([]float64, cfg.Buckets)
		rs.BucketStart = make([]float64, cfg.Buckets)
		rs.BucketEnd = make([]float64, cfg.Buckets)
		for k := range cfg.Buckets {
			rs.BucketArrival[k] = rs.ForwardEnd + backward[r]*float64(k+1)/float64(cfg.Buckets)
		}
	}
	m.playBuckets(&out)
	world := 0.0
	for r := range out.Ranks {
		rs := &out.Ranks[r]
		rs.BackwardEnd = math.Max(rs.ComputeEnd, rs.BucketEnd[cfg.Buckets-1])
		world = math.Max(world, rs.BackwardEnd)
	}
	for r := range out.Ranks {
		rs := &out.Ranks[r]
		optimizerStart := rs.BackwardEnd
		if cfg.DPSets > 1 {
			// The sets share no data-parallel group: a world all-reduce (the gradient norm's,
			// say) keeps them in one step. Small: its transfer is not modelled.
			rs.WorldEnd = world
			optimizerStart = world
		}
		rs.StepEnd = optimizerStart + m.draw(cfg.Optimizer)
		m.cursor[r] = rs.StepEnd
		out.End = math.Max(out.End, rs.StepEnd)
	}
	return out
}

// playGathers runs every data-parallel group's all_gather (its members' arrival: after the
// fetch and the pacing delay) and starts each rank's forward when its group's gather ends.
func (m *Model) playGathers(st *SimStep) {
	ready := make([][]float64, len(m.members))
	for g, members := range m.members {
		ready[g] = []float64{math.Inf(-1)}
		for _, r := range members {
			rs := &st.Ranks[r]
			rs.GatherArrival = rs.ForwardStart
			ready[g][0] = math.Max(ready[g][0], rs.GatherArrival)
		}
	}
	starts, ends := m.play(ready, m.cfg.Gather.Seconds(), nil)
	for g, members := range m.members {
		for _, r := range members {
			rs := &st.Ranks[r]
			rs.GatherStart, rs.GatherEnd, rs.ForwardStart = starts[g][0], ends[g][0], ends[g][0]
		}
	}
	m.noteStretch(st, starts, ends, m.cfg.Gather.Seconds())
}

// playBuckets runs the data-parallel groups' bucket all-reduces (ready once their last
// member reached them) and writes each member's bucket start and end times.
func (m *Model) playBuckets(st *SimStep) {
	cfg := &m.cfg
	ready := make([][]float64, len(m.members))
	for g, members := range m.members {
		ready[g] = make([]float64, cfg.Buckets)
		for k := range cfg.Buckets {
			ready[g][k] = math.Inf(-1)
			for _, r := range members {
				ready[g][k] = math.Max(ready[g][k], st.Ranks[r].BucketArrival[k])
			}
		}
	}
	// Arrivals matter only through the parked count, and only when buckets cross the spine.
	var arrivals []arrival
	if slices.Contains(m.crosses, true) && cfg.ParkedPenalty > 0 {
		arrivals = make([]arrival, 0, len(st.Ranks)*cfg.Buckets)
		for r := range st.Ranks {
			for k, at := range st.Ranks[r].BucketArrival {
				arrivals = append(arrivals, arrival{at, cfg.GroupOf(r), k})
			}
		}
		slices.SortFunc(arrivals, func(a, b arrival) int { return cmp.Compare(a.at, b.at) })
	}
	starts, ends := m.play(ready, cfg.Transfer.Seconds(), arrivals)
	for g, members := range m.members {
		for _, r := range members {
			copy(st.Ranks[r].BucketStart, starts[g])
			copy(st.Ranks[r].BucketEnd, ends[g])
		}
	}
	m.noteStretch(st, starts, ends, cfg.Transfer.Seconds())
}

// noteStretch adds each transfer's duration over its duration alone to the step's sums.
func (m *Model) noteStretch(st *SimStep, starts, ends [][]float64, work float64) {
	for g := range starts {
		alone := work / m.rateOfDP[g]
		for k := range starts[g] {
			st.StretchSum += (ends[g][k] - starts[g][k]) / alone
			st.Transfers++
		}
	}
}

// transfer is one data-parallel group's transfer in flight.
type transfer struct {
	group, index int
	remaining    float64 // seconds of work at full rate
}

// arrival is one rank reaching a group's index-th transfer (for the parked count).
type arrival struct {
	at           float64
	group, index int
}

// play runs chains of transfers through the fabric: group g's transfer k can start at
// ready[g][k] and after the group's transfer k-1 ended (one stream per group), and needs
// work seconds at full rate. An event loop over arrivals (sorted by time; nil: no parked
// traffic), starts and completions, with every transfer's rate constant between two events.
// It returns each transfer's start and end.
func (m *Model) play(ready [][]float64, work float64, arrivals []arrival) (starts, ends [][]float64) {
	groups := len(ready)
	starts = make([][]float64, groups)
	ends = make([][]float64, groups)
	arrived := make([][]int, groups) // members that reached each transfer
	total := 0
	for g := range groups {
		starts[g] = make([]float64, len(ready[g]))
		ends[g] = make([]float64, len(ready[g]))
		arrived[g] = make([]int, len(ready[g]))
		total += len(ready[g])
	}
	nextArrival := 0
	next := make([]int, groups) // each group's next transfer
	busy := make([]bool, groups)
	var active []transfer
	t := math.Inf(1)
	for g := range groups {
		if len(ready[g]) > 0 {
			t = math.Min(t, ready[g][0])
		}
	}
	if len(arrivals) > 0 {
		t = math.Min(t, arrivals[0].at)
	}
	done := 0
	for done < total {
		// Events at time t: arrivals, then starts of every transfer that can start.
		for nextArrival < len(arrivals) && arrivals[nextArrival].at <= t {
			a := arrivals[nextArrival]
			arrived[a.group][a.index]++
			nextArrival++
		}
		for g := range groups {
			if k := next[g]; !busy[g] && k < len(ready[g]) && ready[g][k] <= t {
				busy[g] = true
				starts[g][k] = t
				active = append(active, transfer{group: g, index: k, remaining: work})
			}
		}
		// Parked: members of an idle group that reached its next transfer before its last
		// member did (a busy group's next transfer queues behind the one on its stream).
		parked := 0
		for g := range groups {
			if k := next[g]; !busy[g] && k < len(ready[g]) {
				parked += arrived[g][k]
			}
		}
		rates := m.rates(active, parked)
		// The next event: an arrival, a transfer becoming ready, or a completion.
		upcoming := math.Inf(1)
		if nextArrival < len(arrivals) {
			upcoming = arrivals[nextArrival].at
		}
		for g := range groups {
			if k := next[g]; !busy[g] && k < len(ready[g]) {
				upcoming = math.Min(upcoming, ready[g][k])
			}
		}
		for i, tr := range active {
			upcoming = math.Min(upcoming, t+tr.remaining/rates[i])
		}
		kept := active[:0]
		for i, tr := range active {
			finishes := t+tr.remaining/rates[i] <= upcoming+1e-12
			tr.remaining -= rates[i] * (upcoming - t)
			if finishes {
				ends[tr.group][tr.index] = upcoming
				busy[tr.group] = false
				next[tr.group]++
				done++
				continue
			}
			kept = append(kept, tr)
		}
		active = kept
		t = upcoming
	}
	return starts, ends
}

// rates is each active transfer's rate (1: full speed) given how many ranks are parked:
// transfers of groups that cross the spine share its uplinks equally (processor sharing).
func (m *Model) rates(active []transfer, parked int) []float64 {
	out := make([]float64, len(active))
	crossing := 0
	for _, tr := range active {
		if m.crosses[tr.group] {
			crossing++
		}
	}
	spineShare := math.Inf(1)
	if crossing > 0 {
		capacity := m.cfg.SpineCapacity /
			(1 + m.cfg.ParkedPenalty*float64(parked)/float64(m.cfg.Ranks()))
		spineShare = capacity / float64(crossing)
	}
	for i, tr := range active {
		out[i] = m.rateOfDP[tr.group]
		if m.crosses[tr.group] {
			out[i] = math.Min(out[i], spineShare)
		}
	}
	return out
}
