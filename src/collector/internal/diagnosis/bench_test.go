package diagnosis_test

import (
	"fmt"
	"runtime"
	"sort"
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
	return st
}

// BenchmarkPipelineReplay is the join engine and the step analysis (the replay with stages,
// messages and imbalances) on pipeline jobs, beside the target the join engine has.
func BenchmarkPipelineReplay(b *testing.B) {
	for _, ranks := range []int{8, 64, 512, 4096} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			steps := pipelineBenchJob(b, ranks)
			perLap := 0
			for _, st := range steps {
				perLap += len(st.arrivals)
			}
			b.ReportAllocs()
			b.ResetTimer()
			spans, analyzed, _ := replay(b, steps)
			b.StopTimer()
			perSecond := float64(spans) / b.Elapsed().Seconds()
			b.ReportMetric(perSecond, "spans/s")
			b.ReportMetric(perSecond/targetSpansPerSecond, "x_target")
			if analyzed == 0 {
				b.Fatal("no step analyzed")
			}
			b.Logf("join + pipeline replay, %d ranks (%.0f collective spans per rank per step), "+
				"GOMAXPROCS=%d: %.0f spans/s; target >= %d (%.2fx); %d steps analyzed",
				ranks, float64(perLap)/float64(pipelineBenchSteps*ranks), runtime.GOMAXPROCS(0),
				perSecond, targetSpansPerSecond, perSecond/targetSpansPerSecond, analyzed)
		})
	}
}

// replay runs the steps through a join engine with analysis, in laps (renumbered steps and
// sequence numbers), until b.N collective spans were added. It returns the spans added, the
// steps analyzed and how many of those located a suspect link.
func replay(b *testing.B, steps []pipelineStep) (spans, analyzed, located int) {
	cfg := join.DefaultConfig()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := join.New[int](cfg, clock)
	out := make([]*join.Released[int], 0, 4)
	for lap := int64(0); spans < b.N; lap++ {
		for s, st := range steps {
			step := lap*int64(len(steps)) + int64(s)
			for _, ph := range st.phases {
				ph.Step = step
				e.AddPhase(ph)
			}
			for _, a := range st.arrivals {
				a.Step = step
				a.Seq += lap * 1_000_000
				_, out = e.Add(&a, out[:0])
				for _, r := range out {
					e.Recycle(r)
				}
				spans++
			}
			clock.now = clock.now.Add(cfg.AnalysisDelay + time.Millisecond)
			for _, r := range e.Analyze(false) {
				analyzed++
				if len(r.Suspects) > 0 {
					located++
				}
			}
		}
	}
	return spans, analyzed, located
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
			b.ResetTimer()
			spans, analyzed, located := replay(b, steps)
			b.StopTimer()
			b.ReportMetric(float64(spans)/b.Elapsed().Seconds(), "spans/s")
			if analyzed > slowLinkBenchSteps && located == 0 {
				b.Fatalf("%d steps analyzed, none located the slow NIC", analyzed)
			}
		})
	}
}
