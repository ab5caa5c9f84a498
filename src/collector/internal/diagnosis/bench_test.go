package diagnosis_test

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
)

// targetSpansPerSecond is the join engine's target for join plus analysis on one core.
const targetSpansPerSecond = 1_000_000

// pipelineBenchSteps are the steps the benchmark's fixture holds (replayed in laps).
const pipelineBenchSteps = 3

// pipelineStep is one generated step, parsed as the processor would parse it.
type pipelineStep struct {
	phases   []join.Phase
	arrivals []join.Arrival[int]
}

// pipelineBenchJob generates steps of a 4-stage 1F1B job of `ranks` ranks (ranks/4
// data-parallel replicas, 16 microbatches: 32-64 messages per rank, a reduce-scatter and an
// all-gather per stage; one replica's first stage 2x slow), parsed into phases and
// collective arrivals in a collector's order (each collective's members together).
func pipelineBenchJob(b *testing.B, ranks int) []pipelineStep {
	p := fixture.NewPipeline(4, ranks/4, 16, 1, 1)
	p.Work = func(_, stage, d, _ int) float64 {
		if stage == 0 && d == 0 {
			return 2
		}
		return 1
	}
	var out []pipelineStep
	for s := range pipelineBenchSteps {
		out = append(out, parseStep(b, p.Step(s)))
	}
	return out
}

// parseStep parses one step's batches into phases and collective arrivals in a collector's
// order (each collective's members together).
func parseStep(b *testing.B, batches []*fixture.Batch) pipelineStep {
	var st pipelineStep
	for _, batch := range batches {
		rss := batch.Traces.ResourceSpans()
		for i := range rss.Len() {
			res := spanio.ParseResource(rss.At(i).Resource(), 256)
			spans := rss.At(i).ScopeSpans().At(0).Spans()
			for k := range spans.Len() {
				span := spans.At(k)
				kind, phase := spanio.Classify(span.Name())
				switch kind {
				case spanio.KindPhase:
					if ph, ok := spanio.ParsePhase(span, &res, phase); ok {
						st.phases = append(st.phases, ph)
					}
				case spanio.KindCollective:
					var a join.Arrival[int]
					if reason := spanio.ParseCollective(span, &res, &a); reason != "" {
						b.Fatalf("fixture span %s: %s", span.Name(), reason)
					}
					st.arrivals = append(st.arrivals, a)
				}
			}
		}
	}
	sort.SliceStable(st.arrivals, func(x, y int) bool {
		ax, ay := &st.arrivals[x], &st.arrivals[y]
		if ax.PG != ay.PG {
			return ax.PG < ay.PG
		}
		return ax.Seq < ay.Seq
	})
	// A message's group string is built by spanio as it parses the span, right before the
	// processor adds it: lay the strings out in the order they are added, as a collector
	// has them (parsed ahead and sorted, reading each was a cache miss no collector has).
	for i := range st.arrivals {
		st.arrivals[i].PG = strings.Clone(st.arrivals[i].PG)
	}
	return st
}

// minSteadyLaps is how many laps of the fixture's steps the measured (steady-state) part of
// a replay benchmark runs at least, after one cold lap that is timed apart: the cold lap
// grows the engine's and the analysis' buffers and pays the first garbage collections over
// the fixture's heap, which a Collector running for hours does not. (At 4096 ranks one lap
// of a pipeline job is 614,400 spans, and b.N=1 was one cold lap.)
const minSteadyLaps = 3

// BenchmarkPipelineReplay is the join engine and the step analysis (the replay with stages,
// messages and imbalances) on pipeline jobs, beside the target the join engine has. spans/s
// (and ns/op, per span) are the steady state: at least minSteadyLaps laps after a cold one,
// whose own rate is cold_spans/s.
func BenchmarkPipelineReplay(b *testing.B) {
	for _, ranks := range []int{8, 64, 512, 4096} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			steps := pipelineBenchJob(b, ranks)
			perLap := 0
			for _, st := range steps {
				perLap += len(st.arrivals)
			}
			b.ReportAllocs()
			res := measureReplay(b, steps)
			perSecond := res.steadyRate()
			b.ReportMetric(perSecond, "spans/s")
			b.ReportMetric(res.coldRate(), "cold_spans/s")
			b.ReportMetric(perSecond/targetSpansPerSecond, "x_target")
			if res.analyzed == 0 {
				b.Fatal("no step analyzed")
			}
			b.Logf("join + pipeline replay, %d ranks (%.0f collective spans per rank per step), "+
				"GOMAXPROCS=%d: steady state %.0f spans/s (%d laps of %d steps after a cold one, "+
				"%d spans); target >= %d (%.2fx); cold first lap %.0f spans/s (%d spans); %d "+
				"steps analyzed",
				ranks, float64(perLap)/float64(pipelineBenchSteps*ranks), runtime.GOMAXPROCS(0),
				perSecond, res.steadyLaps, len(steps), res.steadySpans, targetSpansPerSecond,
				perSecond/targetSpansPerSecond, res.coldRate(), res.coldSpans, res.analyzed)
		})
	}
}

// replayResult is what measureReplay measured.
type replayResult struct {
	coldSpans, steadySpans int
	coldTime, steadyTime   time.Duration
	steadyLaps             int
	// analyzed counts the steps analyzed, located those that located a suspect link.
	analyzed, located int
}

func (r *replayResult) coldRate() float64 { return float64(r.coldSpans) / r.coldTime.Seconds() }

func (r *replayResult) steadyRate() float64 {
	return float64(r.steadySpans) / r.steadyTime.Seconds()
}

// measureReplay replays the steps through a join engine with analysis: one cold lap, timed
// apart, then laps until at least b.N collective spans and minSteadyLaps laps were added
// (the benchmark's timer and its ns/op, B/op and allocs/op, per span, cover these only).
func measureReplay(b *testing.B, steps []pipelineStep) replayResult {
	var res replayResult
	r := newReplayer(steps)
	b.StopTimer()
	start := time.Now()
	res.coldSpans = r.lap()
	res.coldTime = time.Since(start)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	b.StartTimer()
	for res.steadySpans < b.N || res.steadyLaps < minSteadyLaps {
		res.steadySpans += r.lap()
		res.steadyLaps++
	}
	b.StopTimer()
	res.steadyTime = b.Elapsed()
	runtime.ReadMemStats(&after)
	n := float64(res.steadySpans)
	b.ReportMetric(float64(res.steadyTime.Nanoseconds())/n, "ns/op")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/op")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/op")
	res.analyzed, res.located = r.analyzed, r.located
	return res
}

// replayer runs a fixture's steps through a join engine with analysis, in laps (renumbered
// steps and sequence numbers).
type replayer struct {
	steps []pipelineStep
	cfg   join.Config
	clock *fakeClock
	e     *join.Engine[int]
	out   []*join.Released[int]
	laps  int64
	// analyzed counts the steps analyzed, located those that located a suspect link.
	analyzed, located int
}

func newReplayer(steps []pipelineStep) *replayer {
	cfg := join.DefaultConfig()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	return &replayer{steps: steps, cfg: cfg, clock: clock, e: join.New[int](cfg, clock),
		out: make([]*join.Released[int], 0, 4)}
}

// lap adds every step once and returns the collective spans added.
func (r *replayer) lap() int {
	spans := 0
	lap := r.laps
	for s, st := range r.steps {
		step := lap*int64(len(r.steps)) + int64(s)
		for _, ph := range st.phases {
			ph.Step = step
			r.e.AddPhase(ph)
		}
		for _, a := range st.arrivals {
			a.Step = step
			a.Seq += lap * 1_000_000
			_, r.out = r.e.Add(&a, r.out[:0])
			for _, rel := range r.out {
				r.e.Recycle(rel)
			}
			spans++
		}
		r.clock.now = r.clock.now.Add(r.cfg.AnalysisDelay + time.Millisecond)
		for _, res := range r.e.Analyze(false) {
			r.analyzed++
			if len(res.Suspects) > 0 {
				r.located++
			}
		}
	}
	r.laps++
	return spans
}

// slowLinkBenchSteps are the steps the slow-link benchmark's fixture holds.
const slowLinkBenchSteps = 8

// BenchmarkSlowLinkReplay is the join engine and the step analysis on a leaf-spine job
// (intra-switch, cross-switch and world all-reduces) whose one NIC is 3x slow: every step
// judges transfers and locates the link (transfers, locate).
func BenchmarkSlowLinkReplay(b *testing.B) {
	for _, ranks := range []int{16, 256} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			job := fixture.NewJob(fixture.LeafSpine(ranks, 2, 2), fixture.IntraCrossWorld(ranks, 4), 3)
			job.SlowLink = func(_ int, members []fixture.Rank) float64 {
				for _, m := range members {
					if m.Host == "node3" {
						return 3
					}
				}
				return 1
			}
			steps := make([]pipelineStep, slowLinkBenchSteps)
			for s := range steps {
				steps[s] = parseStep(b, job.Step(s))
			}
			b.ReportAllocs()
			res := measureReplay(b, steps)
			b.ReportMetric(res.steadyRate(), "spans/s")
			b.ReportMetric(res.coldRate(), "cold_spans/s")
			if res.analyzed > slowLinkBenchSteps && res.located == 0 {
				b.Fatalf("%d steps analyzed, none located the slow NIC", res.analyzed)
			}
		})
	}
}
