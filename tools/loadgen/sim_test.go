package main

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

func smallSim(t *testing.T, edit func(*SimConfig)) *Model {
	t.Helper()
	cfg := DefaultSimConfig()
	cfg.Nodes, cfg.GPUsPerNode, cfg.NodesPerLeaf = 4, 4, 2
	if edit != nil {
		edit(&cfg)
	}
	m, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func bucketDurations(st SimStep) []float64 {
	var out []float64
	for _, rs := range st.Ranks {
		for k := range rs.BucketEnd {
			out = append(out, rs.BucketEnd[k]-rs.BucketStart[k])
		}
	}
	return out
}

func TestSimSameSeedSameJob(t *testing.T) {
	a, b := smallSim(t, nil), smallSim(t, nil)
	c := smallSim(t, func(c *SimConfig) { c.Seed = 2 })
	for range 5 {
		sa, sb, sc := a.Next(nil), b.Next(nil), c.Next(nil)
		if !reflect.DeepEqual(sa, sb) {
			t.Fatalf("step %d differs between two models with one seed", sa.Index)
		}
		if reflect.DeepEqual(sa, sc) {
			t.Fatalf("step %d is the same under another seed", sa.Index)
		}
	}
}

func TestSimCollectiveEndsTogetherAfterTheLastArrival(t *testing.T) {
	m := smallSim(t, nil)
	st := m.Next(nil)
	cfg := m.cfg
	for g := range cfg.GPUsPerNode {
		for k := range cfg.Buckets {
			var last float64
			end := st.Ranks[g].BucketEnd[k]
			for n := range cfg.Nodes {
				rs := st.Ranks[n*cfg.GPUsPerNode+g]
				last = max(last, rs.BucketArrival[k])
				if rs.BucketEnd[k] != end {
					t.Fatalf("group %d bucket %d ends at different times", g, k)
				}
			}
			if start := st.Ranks[g].BucketStart[k]; start < last {
				t.Fatalf("group %d bucket %d started %.6f before its last arrival %.6f", g, k, start, last)
			}
			if end-st.Ranks[g].BucketStart[k] < cfg.Transfer.Seconds()-1e-9 {
				t.Fatalf("group %d bucket %d faster than a full-rate transfer", g, k)
			}
		}
	}
}

func TestSimSpineContentionSlowsTransfers(t *testing.T) {
	mean := func(m *Model) float64 {
		var sum float64
		var n int
		for range 20 {
			for _, d := range bucketDurations(m.Next(nil)) {
				sum += d
				n++
			}
		}
		return sum / float64(n)
	}
	wide := mean(smallSim(t, func(c *SimConfig) { c.SpineCapacity = 100 }))
	narrow := mean(smallSim(t, func(c *SimConfig) { c.SpineCapacity = 1 }))
	oneLeaf := mean(smallSim(t, func(c *SimConfig) { c.SpineCapacity = 1; c.NodesPerLeaf = 4 }))
	if !(narrow > 1.5*wide) {
		t.Errorf("a spine for 1 transfer: mean bucket %.4f s, for 100: %.4f s; want slower", narrow, wide)
	}
	if oneLeaf > wide*1.0001 {
		t.Errorf("one leaf never crosses the spine, but its buckets took %.4f s (wide spine %.4f s)",
			oneLeaf, wide)
	}
	slowNIC := mean(smallSim(t, func(c *SimConfig) {
		c.SpineCapacity = 100
		c.SlowNICs = []Slowdown{{Index: 5, Factor: 0.5}}
	}))
	if !(slowNIC > wide) {
		t.Errorf("a half-speed NIC left the mean bucket at %.4f s (healthy %.4f s)", slowNIC, wide)
	}
}

func TestSimParkedRanksCostSpineCapacity(t *testing.T) {
	// Ranks that wait for a late peer park traffic on the spine: with a penalty, transfers in
	// flight meanwhile are slower than without it, for the same draws.
	edit := func(penalty float64) func(*SimConfig) {
		return func(c *SimConfig) {
			c.ParkedPenalty = penalty
			c.SlowNodes = []Slowdown{{Index: 0, Factor: 1.3}}
			c.Transfer = 60 * time.Millisecond
		}
	}
	free, costly := smallSim(t, edit(0)), smallSim(t, edit(4))
	var freeSum, costlySum float64
	for range 10 {
		for _, d := range bucketDurations(free.Next(nil)) {
			freeSum += d
		}
		for _, d := range bucketDurations(costly.Next(nil)) {
			costlySum += d
		}
	}
	if !(costlySum > freeSum) {
		t.Errorf("parked penalty 4: buckets took %.3f s in all, without: %.3f s", costlySum, freeSum)
	}
}

func TestSimDelayIsAppliedBeforeForward(t *testing.T) {
	a, b := smallSim(t, nil), smallSim(t, nil)
	delays := make([]float64, a.cfg.Ranks())
	delays[1] = 0.015
	plain, paced := a.Next(nil), b.Next(delays)
	p, q := plain.Ranks[1], paced.Ranks[1]
	if q.Delay != 0.015 || q.ForwardStart-q.FetchEnd != 0.015 || q.FetchEnd != p.FetchEnd {
		t.Fatalf("delay not applied between fetch and forward: %+v", q)
	}
	if q.TPArrival-p.TPArrival < 0.015-1e-9 {
		t.Fatalf("a delayed rank reached the all_gather %.4f s later, want 0.015", q.TPArrival-p.TPArrival)
	}
	if paced.Ranks[0].Delay != 0 {
		t.Fatalf("rank 0 got a delay it was not given")
	}
}

func TestSimSpansCarryPacingDelay(t *testing.T) {
	m := smallSim(t, nil)
	job, err := NewJob(JobConfig{JobID: "sim", Ranks: 16, GPUsPerNode: 4, NodesPerSwitch: 2,
		Collectives: 4, MissingRank: -1, Seed: 1}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	run := &simRun{cfg: m.cfg, model: m, job: job, epoch: time.Now()}
	delays := make([]float64, 16)
	delays[3] = 0.01
	versions := make([]int64, 16)
	versions[3] = 7
	td, n := run.spans(m.Next(delays), versions)
	if n != 1 {
		t.Fatalf("%d pacing.delay spans, want 1", n)
	}
	found := 0
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		rs := td.ResourceSpans().At(i)
		rank, _ := rs.Resource().Attributes().Get(attrRank)
		spans := rs.ScopeSpans().At(0).Spans()
		for k := 0; k < spans.Len(); k++ {
			s := spans.At(k)
			if s.Name() != spanPacingDelay {
				continue
			}
			found++
			d, _ := s.Attributes().Get(attrPacingDelay)
			v, _ := s.Attributes().Get(attrPacingVersion)
			if rank.Int() != 3 || d.Double() != 0.01 || v.Int() != 7 {
				t.Errorf("pacing.delay on rank %d delay %v version %v", rank.Int(), d.Double(), v.Int())
			}
		}
	}
	if found != 1 {
		t.Fatalf("found %d pacing.delay spans", found)
	}
}

func TestParseDecision(t *testing.T) {
	body := []byte(`{"job":"j","version":4,"active":true,"delays":{"2":0.02,"3":0.9},"spread":0.3}`)
	for rank, want := range map[int]float64{2: 0.02, 3: 0.05, 1: 0} {
		got, err := parseDecision(body, rank, 0.05)
		if err != nil || got.delay != want || got.version != 4 || !got.active {
			t.Errorf("rank %d: %+v, %v; want delay %g (capped at 0.05)", rank, got, err, want)
		}
	}
	inactive, err := parseDecision([]byte(`{"version":5,"active":false,"delays":{"2":0.02}}`), 2, 0.05)
	if err != nil || inactive.delay != 0 {
		t.Errorf("an inactive decision gave %+v, %v", inactive, err)
	}
	for _, bad := range []string{`[]`, `{"version":1}`, `{"version":1,"active":"yes","delays":{}}`, `nope`} {
		if _, err := parseDecision([]byte(bad), 2, 0.05); err == nil {
			t.Errorf("%s: want an error", bad)
		}
	}
}

func TestPollerAppliesDecisionsAndFailsOpen(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		if r.URL.Query().Get("job") != "j 1" {
			http.Error(w, "bad job", http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte(`{"job":"j 1","version":9,"active":true,"delays":{"1":0.012}}`))
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &pacerPoller{rank: 1, maxDelay: 0.05}
	target := srv.URL + "/v1/pacing?job=j+1"
	go p.run(ctx, srv.Client(), target, 20*time.Millisecond, 0)
	stale := time.Second
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("the delay", func() bool { d, v := p.current(time.Now(), stale); return d == 0.012 && v == 9 })
	up.Store(false)
	waitFor("failing open", func() bool { d, _ := p.current(time.Now(), stale); return d == 0 })
	up.Store(true)
	waitFor("recovery", func() bool { d, _ := p.current(time.Now(), stale); return d == 0.012 })
	// An answer older than the stale limit is no answer.
	if d, _ := p.current(time.Now().Add(2*stale), stale); d != 0 {
		t.Fatalf("a stale answer still gave %g s", d)
	}
	if p.failed.Load() == 0 || p.ok.Load() < 2 {
		t.Fatalf("polls ok %d failed %d", p.ok.Load(), p.failed.Load())
	}
}

// collisionSim is a job of two data-parallel groups (two sets of two nodes, one GPU each)
// whose rings both cross a spine that carries one full-rate transfer: every source of
// randomness off, so transfer times have known answers.
func collisionSim(t *testing.T, edit func(*SimConfig)) *Model {
	t.Helper()
	return smallSim(t, func(c *SimConfig) {
		c.Nodes, c.GPUsPerNode, c.NodesPerLeaf, c.DPSets = 4, 1, 1, 2
		c.SpineCapacity, c.ParkedPenalty = 1, 0
		c.Jitter, c.NodeSpeedSpread, c.StallProb = 0, 0, 0
		c.Gather = 100 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
}

func TestSimCollisionCostKnownAnswers(t *testing.T) {
	m := collisionSim(t, nil)
	if !m.crosses[0] || !m.crosses[1] || !reflect.DeepEqual(m.Members(1), []int{1, 3}) {
		t.Fatalf("groups %v, crossing %v: want nodes {0,2} and {1,3}, both crossing", m.members, m.crosses)
	}
	const work = 0.1
	for _, tc := range []struct {
		name   string
		second float64 // when the second group's transfer can start
		want   [2]float64
	}{
		{"full overlap takes 2x", 0, [2]float64{2 * work, 2 * work}},
		{"disjoint takes 1x", work, [2]float64{work, work}},
		// The first runs alone for half its work, then both at half rate: it ends at 1.5x,
		// the second then finishes its last half alone, 1.5x after its start.
		{"half overlap in between", work / 2, [2]float64{1.5 * work, 1.5 * work}},
	} {
		starts, ends := m.play([][]float64{{0}, {tc.second}}, work, nil)
		for g := range 2 {
			if got := ends[g][0] - starts[g][0]; math.Abs(got-tc.want[g]) > 1e-9 {
				t.Errorf("%s: group %d took %.4f s, want %.4f", tc.name, g, got, tc.want[g])
			}
		}
	}
	// Three equal flows on an uplink of capacity 2 each get 2/3 of full rate.
	wide := collisionSim(t, func(c *SimConfig) { c.Nodes, c.DPSets, c.SpineCapacity = 6, 3, 2 })
	starts, ends := wide.play([][]float64{{0}, {0}, {0}}, work, nil)
	for g := range 3 {
		if got := ends[g][0] - starts[g][0]; math.Abs(got-1.5*work) > 1e-9 {
			t.Errorf("3 flows on capacity 2: group %d took %.4f s, want %.4f", g, got, 1.5*work)
		}
	}
}

func TestSimCollisionIsPaidOnTheStepAndAnOffsetAvoidsIt(t *testing.T) {
	// Both sets gather at once: each gather takes 2x; an offset of one gather's length on
	// the second set's ranks makes them take 1x each, and the step shorter.
	together := collisionSim(t, nil).Next(nil)
	delays := []float64{0, 0.1, 0, 0.1} // set 1: nodes 1 and 3
	apart := collisionSim(t, nil).Next(delays)
	for r, want := range map[int]float64{0: 0.2, 1: 0.2} {
		rs := together.Ranks[r]
		if got := rs.GatherEnd - rs.GatherStart; math.Abs(got-want) > 1e-9 {
			t.Errorf("together: rank %d gathered for %.4f s, want %.4f", r, got, want)
		}
		if got := apart.Ranks[r].GatherEnd - apart.Ranks[r].GatherStart; math.Abs(got-0.1) > 1e-9 {
			t.Errorf("apart: rank %d gathered for %.4f s, want 0.1", r, got)
		}
	}
	if !(together.StretchSum/float64(together.Transfers) > apart.StretchSum/float64(apart.Transfers)) {
		t.Errorf("stretch together %.3f, apart %.3f: want the collision to cost",
			together.StretchSum/float64(together.Transfers), apart.StretchSum/float64(apart.Transfers))
	}
	if !(apart.End < together.End) {
		t.Errorf("the offset step ended at %.4f s, the colliding one at %.4f s", apart.End, together.End)
	}
	// The world all-reduce keeps the sets in one step: every optimizer starts together.
	for _, rs := range apart.Ranks {
		if rs.WorldEnd != apart.Ranks[0].WorldEnd || rs.WorldEnd < rs.BackwardEnd {
			t.Fatalf("world all-reduce ends at %v, want one time after every backward", rs.WorldEnd)
		}
	}
	// One set, no gather: the default job's draws and timeline are what they were.
	plain := smallSim(t, nil)
	if plain.cfg.Groups() != plain.cfg.GPUsPerNode || plain.Next(nil).Ranks[5].GatherEnd != 0 {
		t.Fatalf("the default job has %d groups or a gather", plain.cfg.Groups())
	}
}
