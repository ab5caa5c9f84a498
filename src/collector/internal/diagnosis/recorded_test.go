package diagnosis_test

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
)

// readRecording reads a recording (gzipped OTLP/JSON lines, one request a line: see
// tests/span_replay.py) into its requests, in order.
func readRecording(t *testing.T, path string) []ptrace.Traces {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	scanner := bufio.NewScanner(gz)
	scanner.Buffer(make([]byte, 1<<20), 1<<30)
	var out []ptrace.Traces
	var u ptrace.JSONUnmarshaler
	for scanner.Scan() {
		if len(scanner.Bytes()) == 0 {
			continue
		}
		td, err := u.UnmarshalTraces(scanner.Bytes())
		if err != nil {
			t.Fatalf("%s: line %d: %v", path, len(out)+1, err)
		}
		out = append(out, td)
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// feedRequest runs one request through spanio and the join engine as the processor does
// (its phases first, then its collectives), every scope of every resource.
func feedRequest(t *testing.T, e *join.Engine[int], td ptrace.Traces, rejected map[string]int) {
	t.Helper()
	rss := td.ResourceSpans()
	for pass := range 2 {
		for i := range rss.Len() {
			res := spanio.ParseResource(rss.At(i).Resource(), 256)
			sss := rss.At(i).ScopeSpans()
			for s := range sss.Len() {
				spans := sss.At(s).Spans()
				for k := range spans.Len() {
					span := spans.At(k)
					kind, phase := spanio.Classify(span.Name())
					switch {
					case pass == 0 && kind == spanio.KindPhase:
						if ph, ok := spanio.ParsePhase(span, &res, phase); ok {
							e.AddPhase(ph)
						}
					case pass == 1 && kind == spanio.KindCollective:
						var a join.Arrival[int]
						if reason := spanio.ParseCollective(span, &res, &a); reason != "" {
							rejected[reason]++
							continue
						}
						o, out := e.Add(&a, nil)
						if o != join.Accepted {
							rejected[o.Reason()]++
						}
						if len(out) > 0 {
							for _, r := range out {
								e.Recycle(r)
							}
						}
					}
				}
			}
		}
	}
}

// replayRecording plays a recording's requests through a join engine on a fake clock (each
// request a millisecond after the last, the analysis run after each) and returns every
// step's analysis.
func replayRecording(t *testing.T, path string, cfg join.Config) []diagnosis.StepResult {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := join.New[int](cfg, clock)
	var out []diagnosis.StepResult
	rejected := make(map[string]int)
	defer func() {
		if len(rejected) > 0 {
			t.Logf("%s: spans rejected by reason: %v", path, rejected)
		}
	}()
	for _, td := range readRecording(t, path) {
		feedRequest(t, e, td, rejected)
		clock.now = clock.now.Add(time.Millisecond)
		out = append(out, clone(e.Analyze(false))...)
	}
	clock.now = clock.now.Add(time.Hour)
	out = append(out, clone(e.Analyze(true))...)
	return out
}

// TestDebugRecording prints what the analysis weighed in each step of the recording
// SKEWTRACE_DEBUG_RECORDING names (skipped without it): a tool for looking into a verdict.
func TestDebugRecording(t *testing.T) {
	path := os.Getenv("SKEWTRACE_DEBUG_RECORDING")
	if path == "" {
		t.Skip("SKEWTRACE_DEBUG_RECORDING not set")
	}
	diagnosis.TraceWhatIf(func(step int64, format string, args ...any) {
		fmt.Printf("step %d: %s\n", step, fmt.Sprintf(format, args...))
	})
	defer diagnosis.TraceWhatIf(nil)
	for _, r := range replayRecording(t, path, join.DefaultConfig()) {
		fmt.Printf("step %d: %d ranks, %.4f s, what-if %.4f; roots %+v\n  flags %v imbalances %+v\n",
			r.Step, r.Ranks, r.Duration, r.WhatIf, r.RootCauses, flagged(r), r.Imbalances)
	}
}

// whatIfRecordings is where tests/whatif/record.py writes the corpus recordings.
const whatIfRecordings = "../../../../tests/data/recorded/whatif"

// oracleAnswers is a recording's <job>.oracle.json: the reference replay's answer per step.
type oracleAnswers struct {
	Job              string `json:"job"`
	GeneratorVersion string `json:"generator_version"`
	Steps            []struct {
		Step     int64             `json:"step"`
		Slowdown float64           `json:"slowdown"`
		Workers  map[string]string `json:"workers"`
		Stages   []int             `json:"stages"`
		Data     bool              `json:"data"`
	} `json:"steps"`
}

// TestRecordedWhatIfCorpus plays each recorded what-if corpus job (tests/whatif/record.py)
// through the join engine and the step analysis and compares every step with the answer of
// the reference replay written apart from this package (tests/whatif/oracle.py): the ranks
// named with their cause, the stages, the data, and the slowdown within a tenth of the
// oracle's excess. tests/test_whatif_corpus.py does the same through the built Collector on
// the whole corpus; this one fails a rule change in seconds.
func TestRecordedWhatIfCorpus(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(whatIfRecordings, "*.oracle.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no recordings in %s (tests/whatif/record.py writes them): %v", whatIfRecordings, err)
	}
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var want oracleAnswers
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		t.Run(want.Job, func(t *testing.T) {
			results := replayRecording(t, filepath.Join(whatIfRecordings, want.Job+".jsonl.gz"),
				join.DefaultConfig())
			got := make(map[int64]diagnosis.StepResult, len(results))
			for _, r := range results {
				got[r.Step] = r
			}
			for _, w := range want.Steps {
				r, ok := got[w.Step]
				if !ok {
					t.Errorf("step %d not analyzed", w.Step)
					continue
				}
				ranks := make(map[string]string)
				var stages []int
				data := false
				for _, rc := range r.RootCauses {
					switch {
					case rc.Rank >= 0:
						ranks[strconv.Itoa(rc.Rank)] = rc.Cause
					case rc.Cause == semconv.CauseStageImbalance:
						stages = append(stages, rc.Stage)
					case rc.Cause == semconv.CauseDataImbalance:
						data = true
					}
				}
				slices.Sort(stages)
				if !maps.Equal(ranks, w.Workers) || !slices.Equal(stages, w.Stages) || data != w.Data {
					t.Errorf("step %d: named %v stages %v data %v; oracle %v stages %v data %v",
						w.Step, ranks, stages, data, w.Workers, w.Stages, w.Data)
				}
				if s := r.Duration / r.WhatIf; math.Abs(s-w.Slowdown) > 0.1*(w.Slowdown-1)+0.02 {
					t.Errorf("step %d: slowdown %.3f, oracle %.3f", w.Step, s, w.Slowdown)
				}
			}
		})
	}
}

// TestRecordedLivePipelineEndsAndNamesTheSlowStage plays a recording of
// tests/test_instrumentation_multiproc.py's torch pipelining job (three gloo ranks, one
// stage each, four microbatches, stage 1 sleeping in its forwards from step 7; recorded
// with tests/data/recorded/record-collector.yaml): its messages, posted back to back within
// a millisecond, once made the replay wait forever on a batch it was in, holding the
// Collector's lock. Every step is analyzed, nobody is named before step 7, and rank 1 is
// named for compute in every step from 7 on and flagged from flag_k steps later.
func TestRecordedLivePipelineEndsAndNamesTheSlowStage(t *testing.T) {
	cfg := join.DefaultConfig()
	results := replayRecording(t, "../../../../tests/data/recorded/frameworks/pipelining_gloo_slow_stage.jsonl.gz", cfg)
	if len(results) != 16 {
		t.Fatalf("%d steps analyzed, want 16", len(results))
	}
	for _, r := range results {
		roots := make(map[int]string)
		for _, rc := range r.RootCauses {
			roots[rc.Rank] = rc.Cause
		}
		switch {
		case r.Step < 7 && len(roots) != 0:
			t.Errorf("step %d: roots %v before the slowdown", r.Step, roots)
		case r.Step >= 7 && (len(roots) != 1 || roots[1] != semconv.CauseCompute):
			t.Errorf("step %d: roots %v, want rank 1 for compute", r.Step, roots)
		}
		if want := r.Step >= 7+int64(cfg.FlagK)-1; want != (flagged(r)[1] == semconv.CauseCompute) ||
			len(flagged(r)) > 1 {
			t.Errorf("step %d: flagged %v", r.Step, flagged(r))
		}
	}
}
