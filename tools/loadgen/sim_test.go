package main

import (
	"context"
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
