package join

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// targetSpansPerSecond is the join engine's target: 1,000,000 collective spans per second on
// one core (run with -cpu 1).
const targetSpansPerSecond = 1_000_000

// benchSteps is how many steps the fixture holds; benchRounds the (intra, cross, world)
// rounds per step: 30 collectives per rank per step, as in a large job.
const (
	benchSteps  = 4
	benchRounds = 10
)

// benchArrivals builds benchSteps steps of a job of `ranks` ranks with three groups (groups
// of 8 ranks, groups across them, the world) run benchRounds times per step, in the order a
// collector sees them (collective by collective, member by member). Each rank's arrivals
// follow its own jittered work; one rank per step is 20 ms slow, so that the step analysis
// replays its cost. It returns the arrivals and the sequence numbers per group per step.
func benchArrivals(ranks int) ([]Arrival[int], int64) {
	rng := rand.New(rand.NewPCG(1, 2))
	inner := min(8, ranks)
	outer := ranks / inner
	free := make([]int64, ranks)
	for i := range free {
		free[i] = base
	}
	seqs := make(map[string]int64)
	var arrivals []Arrival[int]
	collective := func(step int64, pg string, members []int, transfer int64) {
		latest := int64(0)
		starts := make([]int64, len(members))
		for i, m := range members {
			starts[i] = free[m] + int64(rng.IntN(200_000))
			latest = max(latest, starts[i])
		}
		end := latest + transfer
		for i, m := range members {
			arrivals = append(arrivals, Arrival[int]{
				Key:    Key{Job: "bench-job", PG: pg, Seq: seqs[pg]},
				Op:     "all_reduce",
				PGSize: len(members),
				Step:   step,
				Rank:   m,
				Topology: Topology{Host: fmt.Sprintf("node%d", m/8),
					Switch: fmt.Sprintf("leaf%d", m/64), NIC: "mlx5_0"},
				StartUnixNano: starts[i],
				EndUnixNano:   end,
				Bytes:         25 << 20,
				Ref:           m,
			})
			free[m] = end
		}
		seqs[pg]++
	}
	for step := range int64(benchSteps) {
		slow := int(step*7) % ranks
		for r := range ranks {
			free[r] += int64(30 * time.Millisecond)
			if r == slow {
				free[r] += int64(20 * time.Millisecond)
			}
		}
		for range benchRounds {
			for g := range outer {
				members := make([]int, inner)
				for i := range members {
					members[i] = g*inner + i
				}
				collective(step, fmt.Sprintf("intra%d", g), members, 200_000)
			}
			if outer > 1 {
				for p := range inner {
					members := make([]int, outer)
					for i := range members {
						members[i] = i*inner + p
					}
					collective(step, fmt.Sprintf("cross%d", p), members, 400_000)
				}
			}
			members := make([]int, ranks)
			for i := range members {
				members[i] = i
			}
			collective(step, "default", members, 600_000)
		}
	}
	return arrivals, benchRounds * benchSteps
}

func benchmarkJoin(b *testing.B, ranks int) {
	arrivals, seqsPerLap := benchArrivals(ranks)
	cfg := DefaultConfig()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := New[int](cfg, clock)
	out := make([]*Released[int], 0, 4)
	baseline := naiveGroupingRate(arrivals, ranks)
	perStep := len(arrivals) / benchSteps
	b.ReportAllocs()
	b.ResetTimer()
	released, analyzed := 0, 0
	for i := range b.N {
		k := i % len(arrivals)
		lap := int64(i / len(arrivals))
		a := arrivals[k]
		// Each lap joins new collectives of new steps.
		a.Seq += lap * seqsPerLap
		a.Step += lap * benchSteps
		_, out = e.Add(&a, out[:0])
		for _, r := range out {
			released++
			e.Recycle(r)
		}
		if (k+1)%perStep == 0 {
			// A step's spans are in: the next one starts after analysis_delay.
			clock.now = clock.now.Add(cfg.AnalysisDelay + time.Millisecond)
			analyzed += len(e.Analyze(false))
		}
	}
	b.StopTimer()
	perSecond := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(perSecond, "spans/s")
	b.ReportMetric(perSecond/targetSpansPerSecond, "x_target")
	b.ReportMetric(perSecond/baseline, "x_naive_grouping")
	if b.N > 2*len(arrivals) && (released == 0 || analyzed == 0) {
		b.Fatalf("released %d collectives, analyzed %d steps", released, analyzed)
	}
	b.Logf("join engine + step analysis, %d ranks (30 collectives per rank per step), "+
		"GOMAXPROCS=%d: %.0f collective spans/s; target >= %d (%.2fx); baseline naive map "+
		"grouping in the same run %.0f spans/s (engine = %.2fx of it); %d steps analyzed",
		ranks, runtime.GOMAXPROCS(0), perSecond, targetSpansPerSecond,
		perSecond/targetSpansPerSecond, baseline, perSecond/baseline, analyzed)
}

// naiveGroupingRate measures the least a join can do, in the same run as the engine: append
// each span's duration to a map entry per key and drop the entry when it is full. The engine's
// rate as a ratio of it shows the cost of the figures, verdicts and bounds.
func naiveGroupingRate(arrivals []Arrival[int], ranks int) float64 {
	groups := make(map[Key][]float64)
	n := 2 * len(arrivals)
	if n < 1_000_000 {
		n = 1_000_000
	}
	start := time.Now()
	for i := range n {
		a := arrivals[i%len(arrivals)]
		a.Seq = int64(i / ranks)
		g := append(groups[a.Key], float64(a.EndUnixNano-a.StartUnixNano))
		if len(g) == a.PGSize {
			delete(groups, a.Key)
			continue
		}
		groups[a.Key] = g
	}
	return float64(n) / time.Since(start).Seconds()
}

func BenchmarkJoin(b *testing.B) {
	for _, ranks := range []int{8, 64, 512, 4096} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) { benchmarkJoin(b, ranks) })
	}
}
