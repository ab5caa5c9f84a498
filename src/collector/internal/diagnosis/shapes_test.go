package diagnosis_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// The shapes of the three recorded production 3D-parallel jobs of issue 45, on the pipeline
// generator (its sends are eager): one slow worker in stage 0 beside a last stage 6% longer
// than the others; a heavy stage with sequence lengths that vary per batch; a long last
// stage. Each names what fixing saves, and its slowdown is within 10% of the excess of the
// generator's own what-if (every op at the median of its kind).

func msDur(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

func TestRecordedShapeSlowWorkerBesideALongerLastStage(t *testing.T) {
	p := fixture.NewPipeline(4, 4, 32, 1, 5)
	for vs := range 4 {
		p.Forward[vs], p.Backward[vs] = msDur(218), msDur(383)
	}
	p.Forward[3], p.Backward[3] = msDur(232), msDur(396)
	p.Fetch, p.Opt = msDur(5), msDur(60)
	p.P2P, p.ReduceScatter, p.AllGather = msDur(3), msDur(120), msDur(120)
	p.Jitter = msDur(4)
	p.Work = func(step, stage, replica, _ int) float64 {
		if stage == 0 && replica == 0 {
			return 2.4
		}
		return 1
	}
	const steps = 14
	results := run(t, p, join.DefaultConfig(), steps)
	last := results[steps-1]
	if got := flagged(last); len(got) != 1 || got[0] != semconv.CauseCompute {
		t.Errorf("flagged %v, want rank 0 for compute alone; roots %+v", got, last.RootCauses)
	}
	if len(last.Imbalances) != 0 {
		t.Errorf("imbalances %+v, want none (fixing the last stage alone saves nothing)",
			last.Imbalances)
	}
	for _, r := range results[2:] {
		for _, rc := range r.RootCauses {
			if rc.Rank != 0 {
				t.Errorf("step %d: root cause %+v besides rank 0", r.Step, rc)
			}
		}
	}
	checkSlowdown(t, p, results, p.KindIdeal)
}

func TestRecordedShapeHeavyStageWithSequenceImbalance(t *testing.T) {
	p := fixture.NewPipeline(2, 32, 8, 1, 7)
	p.Forward[0], p.Backward[0] = msDur(146), msDur(289)
	p.Forward[1], p.Backward[1] = msDur(260), msDur(425)
	p.Fetch, p.Opt = msDur(5), msDur(40)
	p.P2P, p.ReduceScatter, p.AllGather = msDur(3), msDur(80), msDur(80)
	p.Jitter = msDur(3)
	work := func(step, _, d, mb int) float64 {
		r := rand.New(rand.NewPCG(uint64(step), uint64(d*1000+mb)))
		return math.Exp(0.25 * r.NormFloat64())
	}
	p.Work = work
	const steps = 14
	results := run(t, p, join.DefaultConfig(), steps)
	last := results[steps-1]
	if got := flagged(last); len(got) != 0 {
		t.Errorf("flagged %v, want no rank; roots %+v", got, last.RootCauses)
	}
	var stage, data bool
	for _, im := range last.Imbalances {
		stage = stage || (im.Cause == semconv.CauseStageImbalance && im.Stage == 1)
		data = data || im.Cause == semconv.CauseDataImbalance
	}
	if !stage || !data || len(last.Imbalances) != 2 {
		t.Errorf("imbalances %+v, want stage 1 and the data; roots %+v", last.Imbalances,
			last.RootCauses)
	}
	checkSlowdown(t, p, results, p.KindIdeal)
}

func TestRecordedShapeLongLastStage(t *testing.T) {
	p := fixture.NewPipeline(4, 2, 8, 1, 9)
	p.Forward[3] = p.Forward[3] * 21 / 10
	p.Backward[3] = p.Backward[3] * 14 / 10
	const steps = 14
	results := run(t, p, join.DefaultConfig(), steps)
	last := results[steps-1]
	if got := flagged(last); len(got) != 0 {
		t.Errorf("flagged %v, want no rank; roots %+v", got, last.RootCauses)
	}
	if len(last.Imbalances) != 1 || last.Imbalances[0].Stage != 3 {
		t.Errorf("imbalances %+v, want stage 3", last.Imbalances)
	}
	checkSlowdown(t, p, results, p.KindIdeal)
}

// checkSlowdown compares each analyzed step's slowdown (duration over what-if) after the
// first two with the generator's own, within a tenth of its excess and 0.02.
func checkSlowdown(t *testing.T, p *fixture.Pipeline, results []diagnosis.StepResult,
	ideal func(step int) time.Duration,
) {
	t.Helper()
	for _, r := range results[3:] {
		truth := float64(p.Actual(int(r.Step))) / float64(ideal(int(r.Step)))
		got := r.Duration / r.WhatIf
		t.Logf("step %d: slowdown %.3f, truth %.3f; roots %d", r.Step, got, truth, len(r.RootCauses))
		if math.Abs(got-truth) > 0.1*(truth-1)+0.02 {
			t.Errorf("step %d: slowdown %.3f, truth %.3f", r.Step, got, truth)
		}
	}
}

// TestStepWaitsForEveryRankOfTheWorld sends each rank's spans of a step in a request of its
// own, stage 0's ranks first, spread over six seconds (the SDK's batch processor exports
// each rank on its own schedule), and gets every step analyzed with all 64 ranks and the
// same verdicts as when each step arrives at once. The messages between the stages are left
// out, so that nothing pends while stage 1's ranks are on their way (the join of a step's
// collectives is no evidence that its ranks are all in: only the world size is).
func TestStepWaitsForEveryRankOfTheWorld(t *testing.T) {
	job := func() *fixture.Pipeline {
		p := fixture.NewPipeline(2, 32, 8, 1, 7)
		p.Forward[0], p.Backward[0] = msDur(146), msDur(289)
		p.Forward[1], p.Backward[1] = msDur(260), msDur(425)
		p.Jitter = msDur(3)
		p.Work = func(step, _, d, mb int) float64 {
			r := rand.New(rand.NewPCG(uint64(step), uint64(d*1000+mb)))
			return math.Exp(0.25 * r.NormFloat64())
		}
		return p
	}
	const steps = 10
	cfg := join.DefaultConfig()
	var atOnce []diagnosis.StepResult
	{
		p := job()
		clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
		e := join.New[int](cfg, clock)
		for s := range steps {
			for _, b := range withoutMessages(p.Step(s)) {
				feed(t, e, b.Traces)
			}
			clock.now = clock.now.Add(cfg.AnalysisDelay + time.Millisecond)
			atOnce = append(atOnce, clone(e.Analyze(false))...)
		}
	}

	p := job()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := join.New[int](cfg, clock)
	var spread []diagnosis.StepResult
	for s := range steps {
		batches := withoutMessages(p.Step(s))
		slices.SortFunc(batches, func(x, y *fixture.Batch) int {
			return fixture.Spans(x.Traces)[0].Rank() - fixture.Spans(y.Traces)[0].Rank()
		})
		for _, b := range batches {
			feed(t, e, b.Traces)
			clock.now = clock.now.Add(6 * time.Second / time.Duration(len(batches)))
			for _, r := range clone(e.Analyze(false)) {
				if r.Step == int64(s) && r.Ranks != len(p.Ranks) {
					t.Fatalf("step %d analyzed with %d of %d ranks", s, r.Ranks, len(p.Ranks))
				}
				spread = append(spread, r)
			}
		}
	}
	clock.now = clock.now.Add(cfg.AnalysisDelay + time.Millisecond)
	spread = append(spread, clone(e.Analyze(true))...)
	if len(spread) != steps {
		t.Fatalf("%d results for %d steps", len(spread), steps)
	}
	for i := range spread {
		a, b := atOnce[i], spread[i]
		if a.Ranks != b.Ranks || a.Duration != b.Duration || a.WhatIf != b.WhatIf ||
			len(a.RootCauses) != len(b.RootCauses) || len(a.Imbalances) != len(b.Imbalances) ||
			len(a.Flagged) != len(b.Flagged) {
			t.Errorf("step %d: spread %d ranks %.4f/%.4f roots %+v imbalances %+v; at once %d "+
				"ranks %.4f/%.4f roots %+v imbalances %+v", a.Step, b.Ranks, b.Duration, b.WhatIf,
				b.RootCauses, b.Imbalances, a.Ranks, a.Duration, a.WhatIf, a.RootCauses, a.Imbalances)
		}
	}
}

// withoutMessages drops the point-to-point spans of the batches.
func withoutMessages(batches []*fixture.Batch) []*fixture.Batch {
	for _, b := range batches {
		rss := b.Traces.ResourceSpans()
		for i := range rss.Len() {
			sss := rss.At(i).ScopeSpans()
			for k := range sss.Len() {
				sss.At(k).Spans().RemoveIf(func(sp ptrace.Span) bool {
					return sp.Name() == semconv.SpanCollectivePrefix+"send" ||
						sp.Name() == semconv.SpanCollectivePrefix+"recv"
				})
			}
		}
	}
	return batches
}

// TestHostWorkIsNamedWithWhereItSat: a rank that spends 60 ms of every step between its
// batch and its forward, in no phase span (a sleep in the training loop), is flagged for
// its own host-side work before its forward, not "unknown"; on 2, 4 and 8 ranks.
func TestHostWorkIsNamedWithWhereItSat(t *testing.T) {
	for _, n := range []int{2, 4, 8} {
		ranks := fixture.LeafSpine(n, 2, 2)
		job := fixture.NewJob(ranks, []fixture.Coll{fixture.World(n, 4<<20, 6*time.Millisecond)}, 3)
		slow := n - 1
		job.HostWork = func(step, rank int) time.Duration {
			if rank == slow && step >= 3 {
				return 60 * time.Millisecond
			}
			return 0
		}
		results := run(t, job, join.DefaultConfig(), 14)
		last := results[len(results)-1]
		got := flagged(last)
		if len(got) != 1 || got[slow] != semconv.CauseHostWork {
			t.Errorf("%d ranks: flagged %v, want rank %d for host_work; roots %+v", n, got, slow,
				last.RootCauses)
			continue
		}
		for _, f := range last.Flagged {
			if f.Before != semconv.SpanForward {
				t.Errorf("%d ranks: host work before %q, want %q", n, f.Before, semconv.SpanForward)
			}
		}
	}
}

// A 4096-rank pipeline (4 stages x 1024 replicas, 4 microbatches) fed rank by rank, stage 0's
// ranks first: each step's tens of thousands of point-to-point messages wait for their
// receivers at once. With the join's default bounds every span is accepted (at max_pending
// 4096 collectives were released incomplete and their later members rejected as late), all
// 4096 ranks are counted, and the slow worker alone is named.
func TestFourThousandRanksOfAPipelineWaitAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("4096 ranks")
	}
	p := fixture.NewPipeline(4, 1024, 4, 1, 42)
	p.Jitter = msDur(0.2)
	slow := p.RankOf(2, 700)
	p.Work = func(step, stage, replica, _ int) float64 {
		if stage == 2 && replica == 700 {
			return 1.5
		}
		return 1
	}
	results := run(t, p, join.DefaultConfig(), 5)
	for _, r := range results {
		if r.Ranks != 4096 || r.Absent != 0 {
			t.Fatalf("step %d: %d ranks, %d absent, want 4096 and none", r.Step, r.Ranks, r.Absent)
		}
		if r.Step < 2 {
			continue
		}
		if len(r.RootCauses) != 1 || r.RootCauses[0].Rank != slow ||
			r.RootCauses[0].Cause != semconv.CauseCompute {
			t.Errorf("step %d: root causes %+v, want rank %d for compute alone", r.Step,
				r.RootCauses, slow)
		}
	}
	checkSlowdown(t, p, results, p.KindIdeal)
}
