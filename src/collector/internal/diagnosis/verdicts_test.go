package diagnosis_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
)

// throughSummary writes a step result as the processor does and reads it back as the
// verdict processor does.
func throughSummary(t *testing.T, r diagnosis.StepResult) diagnosis.StepResult {
	t.Helper()
	td := ptrace.NewTraces()
	spanio.AppendSummary(td, &r)
	rs := td.ResourceSpans().At(0)
	got, ok := spanio.ReadSummary(rs.ScopeSpans().At(0).Spans().At(0), rs.Resource(), 256)
	if !ok {
		t.Fatalf("step %d: summary unreadable", r.Step)
	}
	return got
}

// verdictJobs are jobs whose flags exercise every part of the flag state: a rank (with its
// cause vote), a located NIC and its ranks, a derived switch, a stage and the data.
func verdictJobs() map[string]func() (stepper, int) {
	jobs := map[string]func() (stepper, int){
		"compute": func() (stepper, int) {
			job := sixteenRanks(5)
			job.ExtraForward = func(step, rank int) time.Duration {
				if rank == 9 && step >= 6 {
					return 8 * time.Millisecond
				}
				return 0
			}
			return job, 24
		},
		"nic": func() (stepper, int) {
			job := sixteenRanks(3)
			job.SlowLink = func(step int, members []fixture.Rank) float64 {
				if step >= 6 && onHost(members, "node3") {
					return 3
				}
				return 1
			}
			return job, 24
		},
	}
	for _, c := range pipelineCases {
		if c.name == "healthy" {
			continue
		}
		jobs["pipeline-"+c.name] = func() (stepper, int) {
			p := fixture.NewPipeline(4, 4, 8, 1, 11)
			c.set(p)
			return p, 20
		}
	}
	return jobs
}

// The gateway's tier-2 instances analyze the steps routed to them and defer the flags;
// Verdicts, given every step's summary (from two instances, out of order within its
// reorder wait), decides exactly the flags one instance that saw every step decided.
func TestVerdictsFromSummariesEqualOneInstancesFlags(t *testing.T) {
	for name, build := range verdictJobs() {
		t.Run(name, func(t *testing.T) {
			job, steps := build()
			local := run(t, job, join.DefaultConfig(), steps)
			job, _ = build()
			cfg := join.DefaultConfig()
			cfg.FlagDecision = diagnosis.FlagDecisionDeferred
			deferred := run(t, job, cfg, steps)

			anyFlag := false
			for _, r := range local {
				anyFlag = anyFlag || len(r.Flagged)+len(r.Suspects)+len(r.Imbalances) > 0
			}
			if !anyFlag {
				t.Fatal("the job flagged nothing on one instance: the comparison would be empty")
			}
			// Two instances take alternate steps; instance B is a little behind, so each of
			// its steps arrives after the next step of instance A.
			order := arrivalOrder(steps)
			v := diagnosis.NewVerdicts(cfg.Config, 5*time.Second)
			now := time.Unix(1_700_000_000, 0)
			var decided []diagnosis.StepResult
			for _, s := range order {
				r := deferred[s]
				if !r.Deferred || len(r.Flagged)+len(r.Suspects)+len(r.Imbalances) != 0 {
					t.Fatalf("step %d: deferred analysis wrote flags: %+v", s, r)
				}
				now = now.Add(100 * time.Millisecond)
				decided = v.Add(throughSummary(t, r), now, decided)
			}
			decided = v.Ready(now, true, decided)
			if len(decided) != steps {
				t.Fatalf("%d steps decided of %d", len(decided), steps)
			}
			st := v.Stats()
			if st.Late != 0 || st.Reordered == 0 || st.Decided != int64(steps) {
				t.Errorf("stats %+v: want every step decided in order, some reordered", st)
			}
			for i, got := range decided {
				want := local[i]
				if got.Step != want.Step {
					t.Fatalf("decision %d is step %d, want %d", i, got.Step, want.Step)
				}
				if !reflect.DeepEqual(got.Flagged, want.Flagged) ||
					!reflect.DeepEqual(got.Suspects, want.Suspects) ||
					!reflect.DeepEqual(got.Imbalances, want.Imbalances) ||
					got.Slowdown != want.Slowdown || got.Deferred {
					t.Fatalf("step %d from summaries:\n flagged %+v suspects %+v imbalances %+v "+
						"slowdown %g\none instance:\n flagged %+v suspects %+v imbalances %+v "+
						"slowdown %g", got.Step, got.Flagged, got.Suspects, got.Imbalances,
						got.Slowdown, want.Flagged, want.Suspects, want.Imbalances, want.Slowdown)
				}
			}
		})
	}
}

// arrivalOrder is the order summaries reach the verdict stage: odd steps (instance B) one
// step late.
func arrivalOrder(steps int) []int {
	var order []int
	for s := 0; s < steps; s += 2 {
		if s+2 < steps {
			order = append(order, s+2)
		}
		if s+1 < steps {
			order = append(order, s+1)
		}
	}
	return append([]int{0}, order...)
}

// A step whose summary never comes holds the next ones for reorder_wait only; a step that
// comes after its successors were decided is still decided (counted late), a summary sent
// twice is counted and dropped, and a job past max_jobs is forgotten with its waiting steps
// counted.
func TestVerdictsWaitBoundedAndCountWhatTheyDrop(t *testing.T) {
	cfg := diagnosis.DefaultConfig()
	cfg.MaxJobs = 1
	v := diagnosis.NewVerdicts(cfg, 2*time.Second)
	now := time.Unix(1_700_000_000, 0)
	step := func(s int64) diagnosis.StepResult {
		return diagnosis.StepResult{Job: "a", Step: s, Duration: 1, WhatIf: 1,
			RootCauses: []diagnosis.RootCause{{Rank: 3, Cause: semconv.CauseCompute, Cost: 0.2,
				Stage: -1}}}
	}
	var out []diagnosis.StepResult
	out = v.Add(step(0), now, out)
	out = v.Add(step(2), now, out) // step 1 lost
	out = v.Add(step(3), now, out)
	if len(out) != 1 {
		t.Fatalf("decided %d steps, want only step 0 before the wait", len(out))
	}
	out = v.Ready(now.Add(time.Second), false, out)
	if len(out) != 1 || v.Pending() != 2 {
		t.Fatalf("decided %d, pending %d within the wait", len(out), v.Pending())
	}
	out = v.Ready(now.Add(2*time.Second), false, out)
	if len(out) != 3 || out[1].Step != 2 || out[2].Step != 3 {
		t.Fatalf("after the wait: %v", out)
	}
	out = v.Add(step(1), now, out) // late
	out = v.Add(step(3), now, out) // a retried export
	if len(out) != 4 || out[3].Step != 1 {
		t.Fatalf("late step: %v", out)
	}
	var flags []string
	for _, r := range out {
		flags = append(flags, fmt.Sprint(flagged(r)))
	}
	// Warm-up (2 steps), then K=4 of W=8: the fourth root cause after it flags rank 3.
	out = v.Add(step(4), now, out)
	out = v.Add(step(5), now, out)
	if got := flagged(out[len(out)-1]); got[3] != semconv.CauseCompute {
		t.Errorf("rank 3 not flagged after 4 root causes past the warm-up: %v (%v)", got, flags)
	}
	out = v.Add(step(7), now, out)
	v.Add(diagnosis.StepResult{Job: "b", Step: 0}, now, nil)
	st := v.Stats()
	want := diagnosis.VerdictStats{Decided: 7, Late: 1, Reordered: 3, Duplicates: 1,
		JobsDropped: 1, StepsDropped: 1}
	if st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
}
