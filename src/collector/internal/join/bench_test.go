package join

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// targetSpansPerSecond is the join engine's target: 1,000,000 collective spans per second on
// one core (run with -cpu 1).
const targetSpansPerSecond = 1_000_000

// benchArrivals builds `collectives` collectives of `ranks` members where one rank in eight
// collectives arrives 20 ms late, in the order a collector sees them (member by member).
func benchArrivals(ranks, collectives int) []Arrival[int] {
	arrivals := make([]Arrival[int], 0, ranks*collectives)
	for c := range collectives {
		for rank := range ranks {
			d := 30 * time.Millisecond
			if c%8 == 0 && rank == c%ranks {
				d = 10 * time.Millisecond
			}
			end := base + int64(c)*int64(time.Millisecond) + int64(rank%3)*1000
			arrivals = append(arrivals, Arrival[int]{
				Key:           Key{Job: "bench-job", PG: "default", Seq: int64(c)},
				Op:            "all_reduce",
				PGSize:        ranks,
				Step:          int64(c / 4),
				Rank:          rank,
				Topology:      Topology{Host: "node", Switch: "leaf0", NIC: "mlx5_0"},
				StartUnixNano: end - int64(d),
				EndUnixNano:   end,
				Bytes:         25 << 20,
				Ref:           rank,
			})
		}
	}
	return arrivals
}

func benchmarkJoin(b *testing.B, ranks int) {
	const collectives = 256
	arrivals := benchArrivals(ranks, collectives)
	cfg := DefaultConfig()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := New[int](cfg, clock)
	out := make([]*Released[int], 0, 4)
	baseline := naiveGroupingRate(arrivals, ranks)
	b.ReportAllocs()
	b.ResetTimer()
	released := 0
	for i := range b.N {
		a := &arrivals[i%len(arrivals)]
		// Each lap over the fixture joins new collectives (a new seq range).
		a.Seq = int64(i/ranks) + 0
		_, out = e.Add(a, out[:0])
		for _, r := range out {
			released++
			e.Recycle(r)
		}
	}
	b.StopTimer()
	perSecond := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(perSecond, "spans/s")
	b.ReportMetric(perSecond/targetSpansPerSecond, "x_target")
	b.ReportMetric(perSecond/baseline, "x_naive_grouping")
	if b.N > 10*ranks && released == 0 {
		b.Fatal("nothing released")
	}
	b.Logf("join engine, %d ranks, GOMAXPROCS=%d: %.0f collective spans/s; target >= %d "+
		"(%.2fx); baseline naive map grouping in the same run %.0f spans/s (engine = %.2fx of it)",
		ranks, runtime.GOMAXPROCS(0), perSecond, targetSpansPerSecond,
		perSecond/targetSpansPerSecond, baseline, perSecond/baseline)
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
	for _, ranks := range []int{8, 256, 4096} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) { benchmarkJoin(b, ranks) })
	}
}
