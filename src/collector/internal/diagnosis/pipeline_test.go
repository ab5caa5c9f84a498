package diagnosis_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// pipelineShape is one layout of the pipeline generator.
type pipelineShape struct {
	name                                   string
	stages, replicas, microbatches, chunks int
	async                                  bool
}

var pipelineShapes = []pipelineShape{
	{"1f1b-4x4", 4, 4, 8, 1, false},
	{"1f1b-async-4x2", 4, 2, 8, 1, true},
	{"interleaved-4x2", 4, 2, 8, 2, false},
	{"pipeline-only-4", 4, 1, 8, 1, false},
	{"2x8", 2, 8, 4, 1, true},
	{"8x2", 8, 2, 16, 1, false},
	// Data parallel only (one stage): the data's evidence is the forwards' input sizes.
	{"dp-only-8", 1, 8, 4, 1, false},
	{"dp-only-2", 1, 2, 4, 1, false},
}

// pipelineCase is one fault of the generator with its truth: what the verdict must say and
// the ideal step the replayed slowdown must be within 10% of (the what-if analysis' ideal:
// every forward and backward at the median of its kind over the step's ranks).
type pipelineCase struct {
	name string
	// set configures the fault and returns the check of the last step's verdict and the
	// ideal step time at a step after the onset.
	set func(p *fixture.Pipeline) (check func(t *testing.T, r diagnosis.StepResult),
		ideal func(step int) time.Duration)
}

const pipelineOnset = 5

var pipelineCases = []pipelineCase{
	{"healthy", func(p *fixture.Pipeline) (func(*testing.T, diagnosis.StepResult),
		func(int) time.Duration) {
		return func(t *testing.T, r diagnosis.StepResult) {
				if len(r.Flagged) != 0 || len(r.Imbalances) != 0 || len(r.Suspects) != 0 {
					t.Errorf("healthy: flagged %v imbalances %+v suspects %v", flagged(r),
						r.Imbalances, suspects(r))
				}
			}, func(step int) time.Duration {
				return p.Ideal(step, nil, false)
			}
	}},
	{"slow-worker", func(p *fixture.Pipeline) (func(*testing.T, diagnosis.StepResult),
		func(int) time.Duration) {
		replica := p.Replicas / 2
		slow := p.RankOf(0, replica)
		p.Work = func(step, stage, d, _ int) float64 {
			if step >= pipelineOnset && stage == 0 && d == replica {
				return 2.4
			}
			return 1
		}
		return func(t *testing.T, r diagnosis.StepResult) {
				if got := flagged(r); len(got) != 1 || got[slow] != semconv.CauseCompute {
					t.Errorf("slow worker rank %d: flagged %v, roots %+v", slow, got,
						r.RootCauses)
				}
				if len(r.Imbalances) != 0 {
					t.Errorf("slow worker: imbalances %+v", r.Imbalances)
				}
			}, func(step int) time.Duration {
				return p.Ideal(step, nil, false)
			}
	}},
	{"long-stage", func(p *fixture.Pipeline) (func(*testing.T, diagnosis.StepResult),
		func(int) time.Duration) {
		last := p.Stages - 1
		for k := range p.Chunks {
			vs := k*p.Stages + last
			p.Forward[vs] = p.Forward[vs] * 21 / 10
			p.Backward[vs] = p.Backward[vs] * 14 / 10
		}
		return func(t *testing.T, r diagnosis.StepResult) {
				if len(r.Flagged) != 0 {
					t.Errorf("long stage: flagged ranks %v", flagged(r))
				}
				if len(r.Imbalances) != 1 || r.Imbalances[0].Cause != semconv.CauseStageImbalance ||
					r.Imbalances[0].Stage != last {
					t.Fatalf("long stage %d: imbalances %+v, roots %+v", last, r.Imbalances,
						r.RootCauses)
				}
				im := r.Imbalances[0]
				want := make([]int, 0, p.Replicas)
				for d := range p.Replicas {
					want = append(want, p.RankOf(last, d))
				}
				if !slices.Equal(im.Ranks, want) {
					t.Errorf("stage ranks %v, want %v", im.Ranks, want)
				}
				if !strings.Contains(im.Fix, fmt.Sprintf("to stage %d", last-1)) {
					t.Errorf("fix %q does not name stage %d", im.Fix, last-1)
				}
			}, func(step int) time.Duration {
				return p.Ideal(step, nil, true)
			}
	}},
	{"data-imbalance", func(p *fixture.Pipeline) (func(*testing.T, diagnosis.StepResult),
		func(int) time.Duration) {
		// Each microbatch's sequence length, per step and replica: the same through every
		// stage of its pipeline.
		work := func(step, _, d, mb int) float64 {
			r := rand.New(rand.NewPCG(uint64(step), uint64(d*1000+mb)))
			return 0.6 + 1.2*r.Float64()*r.Float64()
		}
		p.Work = work
		// Each forward says its input (tokens), as the instrumentation records it.
		p.Input = func(step, d, mb int) int64 { return int64(math.Round(1024 * work(step, 0, d, mb))) }
		return func(t *testing.T, r diagnosis.StepResult) {
				if len(r.Flagged) != 0 {
					t.Errorf("data imbalance: flagged ranks %v", flagged(r))
				}
				if len(r.Imbalances) != 1 || r.Imbalances[0].Cause != semconv.CauseDataImbalance {
					t.Fatalf("data imbalance: imbalances %+v, roots %+v", r.Imbalances,
						r.RootCauses)
				}
				// The fix names the remedy, within the 256 characters a summary keeps.
				if fix := r.Imbalances[0].Fix; !strings.Contains(fix, "WorkBalancedSampler") ||
					len(fix) > 256 {
					t.Errorf("data imbalance fix %q (%d characters)", fix, len(fix))
				}
			}, func(step int) time.Duration {
				return p.Ideal(step, p.MedianWork(work), false)
			}
	}},
	{"slow-link", func(p *fixture.Pipeline) (func(*testing.T, diagnosis.StepResult),
		func(int) time.Duration) {
		// The NIC of the host of stage 1's first replica sends and receives at a tenth of
		// its speed from the onset.
		host := p.Ranks[p.RankOf(1, 0)].Host
		p.SlowLink = func(step, from, to int) float64 {
			if step >= pipelineOnset && (p.Ranks[from].Host == host) != (p.Ranks[to].Host == host) {
				return 10
			}
			return 1
		}
		return func(t *testing.T, r diagnosis.StepResult) {
				named := false
				for _, s := range r.Suspects {
					named = named || s.Host == host || s.Name == host
				}
				if !named {
					t.Errorf("slow link of %s: suspects %v, flagged %v, roots %+v", host,
						suspects(r), flagged(r), r.RootCauses)
				}
				for rank, cause := range flagged(r) {
					if cause != semconv.CauseNetwork {
						t.Errorf("slow link: rank %d flagged %s", rank, cause)
					}
				}
				if len(r.Imbalances) != 0 {
					t.Errorf("slow link: imbalances %+v", r.Imbalances)
				}
			}, func(step int) time.Duration {
				return p.Ideal(step, nil, false)
			}
	}},
}

// TestPipelineJobsReplayedCost is the generator's table: each fault on each layout gets the
// right verdict, the replayed slowdown (training.job.slowdown) is within 10% of the
// generator's own actual over ideal step time, and the replay of every step reproduces the
// measured step within 2%.
func TestPipelineJobsReplayedCost(t *testing.T) {
	const steps = 24
	for _, shape := range pipelineShapes {
		for _, c := range pipelineCases {
			if c.name == "data-imbalance" && shape.replicas < 2 {
				continue
			}
			if shape.stages == 1 && (c.name == "long-stage" || c.name == "slow-link") {
				continue // no stages, no messages
			}
			t.Run(shape.name+"/"+c.name, func(t *testing.T) {
				p := fixture.NewPipeline(shape.stages, shape.replicas, shape.microbatches,
					shape.chunks, 11)
				p.AsyncP2P = shape.async
				if shape.replicas == 1 {
					// A pipeline-only job: one stage per host, so messages cross NICs.
					p.Ranks = fixture.LeafSpine(len(p.Ranks), 1, 4)
				}
				rng := rand.New(rand.NewPCG(3, 4))
				for i := range p.Ranks {
					p.Ranks[i].ClockOffset = time.Duration(rng.IntN(4000)-2000) * time.Millisecond
				}
				// Every forward says its input; the same size everywhere unless the case
				// varies it (equal inputs are no evidence of the data).
				p.Input = func(int, int, int) int64 { return 1024 }
				check, ideal := c.set(p)
				if os.Getenv("SKEWTRACE_TRACE_WHATIF") != "" {
					diagnosis.TraceWhatIf(func(step int64, format string, args ...any) {
						if step == steps-1 {
							t.Logf("step %d: %s", step, fmt.Sprintf(format, args...))
						}
					})
					defer diagnosis.TraceWhatIf(nil)
				}
				results := run(t, p, join.DefaultConfig(), steps)
				last := results[steps-1]
				if last.Ranks != len(p.Ranks) {
					t.Errorf("step ranks %d, want %d", last.Ranks, len(p.Ranks))
				}
				check(t, last)
				var truth float64
				for s := steps - 8; s < steps; s++ {
					truth += float64(p.Actual(s)) / float64(ideal(s)) / 8
				}
				t.Logf("table: %s | %s | %.3f | %.3f | %.4f", shape.name, c.name, last.Slowdown, truth,
					maxReplayError(results))
				// The self-check: the replay fed the measured durations is the measured step.
				if e := maxReplayError(results); e > 0.02 {
					t.Errorf("replay error up to %.1f%% of the measured step, want < 2%%", 100*e)
				}
				if math.Abs(last.Slowdown-truth) > 0.1*truth {
					t.Errorf("slowdown %.3f, truth %.3f (whatif %.3f of %.3f s); roots %+v",
						last.Slowdown, truth, last.WhatIf, last.Duration, last.RootCauses)
				}
			})
		}
	}
}

// maxReplayError is the largest self-check error of the steps that had one.
func maxReplayError(results []diagnosis.StepResult) float64 {
	worst := 0.0
	for _, r := range results {
		if r.ReplayChecked {
			worst = max(worst, r.ReplayError)
		}
	}
	return worst
}

// TestLongStepWaitsForEveryRank: a pipeline step whose ranks' spans come seconds apart (the
// last stage's a microbatch's forward after the first's) is not analyzed after one quiet
// analysis_delay with only some ranks in: it waits until every rank ended the step.
func TestLongStepWaitsForEveryRank(t *testing.T) {
	p := fixture.NewPipeline(4, 2, 4, 1, 5)
	cfg := join.DefaultConfig()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := join.New[int](cfg, clock)
	var results []diagnosis.StepResult
	for s := range 3 {
		var later []*fixture.Batch
		for _, b := range p.Step(s) {
			if fixture.Spans(b.Traces)[0].Rank() < 4 {
				feed(t, e, b.Traces)
			} else {
				later = append(later, b)
			}
		}
		clock.now = clock.now.Add(3 * cfg.AnalysisDelay)
		if got := e.Analyze(false); len(got) != 0 {
			t.Fatalf("step %d analyzed with stages 0-1 only: %d ranks", s, got[0].Ranks)
		}
		for _, b := range later {
			feed(t, e, b.Traces)
		}
		clock.now = clock.now.Add(cfg.AnalysisDelay + time.Millisecond)
		results = append(results, clone(e.Analyze(false))...)
	}
	if len(results) != 3 {
		t.Fatalf("%d results for 3 steps", len(results))
	}
	for _, r := range results {
		if r.Ranks != 8 {
			t.Errorf("step %d analyzed with %d ranks, want 8", r.Step, r.Ranks)
		}
	}
}

// TestStepOfARankThatNeverEndsIsAnalyzedAfterTwiceTheStepTime: the wait for ranks is
// bounded by the job's own step time.
func TestStepOfARankThatNeverEndsIsAnalyzedAfterTwiceTheStepTime(t *testing.T) {
	p := fixture.NewPipeline(2, 2, 4, 1, 5)
	for i := range p.Forward {
		p.Forward[i], p.Backward[i] = 500*time.Millisecond, time.Second
	}
	cfg := join.DefaultConfig()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := join.New[int](cfg, clock)
	for s := range 4 {
		for _, b := range p.Step(s) {
			feed(t, e, b.Traces)
		}
		clock.now = clock.now.Add(cfg.AnalysisDelay + time.Millisecond)
		if got := e.Analyze(false); len(got) != 1 {
			t.Fatalf("step %d: %d results", s, len(got))
		}
	}
	// Step 4: rank 3's train.step never comes (its collectives did).
	for _, b := range p.Step(4) {
		td := b.Traces
		if fixture.Spans(td)[0].Rank() == 3 {
			rs := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans()
			rs.RemoveIf(func(s ptrace.Span) bool { return s.Name() == semconv.SpanStep })
		}
		feed(t, e, td)
	}
	clock.now = clock.now.Add(cfg.AnalysisDelay + time.Millisecond)
	if got := e.Analyze(false); len(got) != 0 {
		t.Fatalf("step 4 analyzed before rank 3 ended it or the wait passed")
	}
	clock.now = clock.now.Add(time.Minute)
	if got := e.Analyze(false); len(got) != 1 || got[0].Ranks != 4 {
		t.Fatalf("step 4 not analyzed after the bounded wait: %v", got)
	}
}

// TestDataImbalanceWithoutStagesNeedsInputsThatExplainTheWork: on a data-parallel job
// without stages the forwards' input sizes are the data's only view. Work that follows them
// is a data_imbalance (above); work that varies while the inputs do not follow it, or with
// no inputs recorded, is none; a slow worker among varying inputs is still flagged for its
// compute.
func TestDataImbalanceWithoutStagesNeedsInputsThatExplainTheWork(t *testing.T) {
	const steps = 24
	tokens := func(step, d, mb int) float64 {
		r := rand.New(rand.NewPCG(uint64(step), uint64(d*1000+mb)))
		return 0.6 + 1.2*r.Float64()*r.Float64()
	}
	cases := []struct {
		name  string
		set   func(p *fixture.Pipeline)
		check func(t *testing.T, r diagnosis.StepResult)
	}{
		{"inputs vary, work does not follow them", func(p *fixture.Pipeline) {
			p.Work = func(step, _, d, mb int) float64 { return tokens(step+1000, d, mb) }
			p.Input = func(step, d, mb int) int64 { return int64(1024 * tokens(step, d, mb)) }
		}, func(t *testing.T, r diagnosis.StepResult) {
			for _, im := range r.Imbalances {
				t.Errorf("imbalance %+v from inputs that do not explain the work", im)
			}
		}},
		{"work varies, no inputs recorded", func(p *fixture.Pipeline) {
			p.Work = func(step, _, d, mb int) float64 { return tokens(step, d, mb) }
			p.Input = nil
		}, func(t *testing.T, r diagnosis.StepResult) {
			for _, im := range r.Imbalances {
				t.Errorf("imbalance %+v without inputs", im)
			}
		}},
		{"slow worker among varying inputs", func(p *fixture.Pipeline) {
			p.Work = func(step, _, d, mb int) float64 {
				w := tokens(step, d, mb)
				if step >= pipelineOnset && d == 3 {
					w *= 2.4
				}
				return w
			}
			p.Input = func(step, d, mb int) int64 { return int64(1024 * tokens(step, d, mb)) }
		}, func(t *testing.T, r diagnosis.StepResult) {
			if got := flagged(r); len(got) != 1 || got[3] != semconv.CauseCompute {
				t.Errorf("slow worker rank 3: flagged %v, roots %+v", got, r.RootCauses)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := fixture.NewPipeline(1, 8, 4, 1, 11)
			c.set(p)
			results := run(t, p, join.DefaultConfig(), steps)
			c.check(t, results[steps-1])
		})
	}
}

// TestGroupPhases: each data-parallel group's communication phases, one per op, from its
// members' own clocks (offsets of up to 2 s between hosts change nothing), with the switches
// and hosts it spans. A 2-stage job of 2 replicas on hosts of one GPU, two hosts a leaf:
// stage 0 (ranks 0, 1) sits behind leaf0, stage 1 (ranks 2, 3) behind leaf1; each stage's
// reduce-scatter (4 ms), optimizer (3 ms) and all-gather (4 ms) come after its 4
// microbatches.
func TestGroupPhases(t *testing.T) {
	p := fixture.NewPipeline(2, 2, 4, 1, 7)
	p.Ranks = fixture.LeafSpine(len(p.Ranks), 1, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range p.Ranks {
		p.Ranks[i].ClockOffset = time.Duration(rng.IntN(4000)-2000) * time.Millisecond
	}
	results := run(t, p, join.DefaultConfig(), 8)
	groups := results[len(results)-1].Groups
	if len(groups) != 4 {
		t.Fatalf("groups %+v, want dp0 and dp1, each an all-gather and a reduce-scatter phase"+
			" (messages are no group's phase)", groups)
	}
	for i, g := range groups {
		stage := i / 2
		op := []string{semconv.OpAllGather, semconv.OpReduceScatter}[i%2]
		if g.PG != fmt.Sprintf("dp%d", stage) || g.Op != op {
			t.Fatalf("phase %d is %s %s, want dp%d %s", i, g.PG, g.Op, stage, op)
		}
		hosts := fmt.Sprintf("node%d,node%d", 2*stage, 2*stage+1)
		if g.Switches != fmt.Sprintf("leaf%d", stage) || g.Hosts != hosts {
			t.Errorf("%s %s: switches %q hosts %q", g.PG, g.Op, g.Switches, g.Hosts)
		}
		if math.Abs(g.Duration-0.004) > 0.0005 {
			t.Errorf("%s %s: phase lasts %.4f s, want 0.004", g.PG, g.Op, g.Duration)
		}
		// After its own microbatches' compute: 4 x (10 + 20) ms and the messages at least.
		if g.Start < 0.12 || g.Start > 0.25 {
			t.Errorf("%s %s: phase starts %.4f s into the step", g.PG, g.Op, g.Start)
		}
	}
	// The all-gather follows the reduce-scatter and the optimizer: 4 + 3 ms later.
	for stage := range 2 {
		gap := groups[2*stage].Start - groups[2*stage+1].Start
		if math.Abs(gap-0.007) > 0.0005 {
			t.Errorf("dp%d: all-gather %.4f s after the reduce-scatter, want 0.007", stage, gap)
		}
	}
}
