package diagnosis_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
)

// recordedVerdict is one step's verdict as tests/expected_verdicts.py writes it.
type recordedVerdict struct {
	Flags      map[string]string `json:"flags"`
	Suspects   []string          `json:"suspects"`
	Imbalances []string          `json:"imbalances"`
}

type recordedSegment struct {
	Steps [2]int64 `json:"steps"`
	recordedVerdict
}

func verdictOf(r diagnosis.StepResult) recordedVerdict {
	v := recordedVerdict{Flags: map[string]string{}, Suspects: []string{}, Imbalances: []string{}}
	for rank, cause := range flagged(r) {
		v.Flags[strconv.Itoa(rank)] = cause
	}
	v.Suspects = append(v.Suspects, suspects(r)...)
	for _, im := range r.Imbalances {
		s := fmt.Sprintf("%s ranks %s", im.Cause, spanio.FormatRanks(im.Ranks))
		if im.Cause == semconv.CauseStageImbalance {
			s = fmt.Sprintf("%s stage %d ranks %s", im.Cause, im.Stage, spanio.FormatRanks(im.Ranks))
		}
		v.Imbalances = append(v.Imbalances, s)
	}
	slices.Sort(v.Imbalances)
	return v
}

func sameVerdict(a, b recordedVerdict) bool {
	return maps.Equal(a.Flags, b.Flags) && slices.Equal(a.Suspects, b.Suspects) &&
		slices.Equal(a.Imbalances, b.Imbalances)
}

// TestRecordedVerdicts plays every recorded live job with exact expectations
// (tests/data/recorded/{main_job,frameworks,demo}: jobs.json, expected.json, written by
// tests/expected_verdicts.py) through the join engine and the step analysis, and compares
// every step's flags, suspects and imbalances with its expectation: a rule change that moves
// a verdict fails here, without the binary. tests/test_recorded_verdicts.py plays the same
// files through the built Collector.
func TestRecordedVerdicts(t *testing.T) {
	for _, kind := range []string{"main_job", "frameworks", "demo"} {
		dir := filepath.Join("../../../../tests/data/recorded", kind)
		raw, err := os.ReadFile(filepath.Join(dir, "expected.json"))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		var expected map[string]struct {
			Steps    int               `json:"steps"`
			Segments []recordedSegment `json:"segments"`
		}
		if err := json.Unmarshal(raw, &expected); err != nil {
			t.Fatal(err)
		}
		for _, name := range slices.Sorted(maps.Keys(expected)) {
			want := expected[name]
			t.Run(kind+"/"+name, func(t *testing.T) {
				results := replayRecording(t, filepath.Join(dir, name+".jsonl.gz"), join.DefaultConfig())
				if len(results) != want.Steps {
					t.Fatalf("%d steps analyzed, want %d", len(results), want.Steps)
				}
				byStep := make(map[int64]recordedVerdict, len(results))
				for _, r := range results {
					byStep[r.Step] = verdictOf(r)
				}
				for _, seg := range want.Segments {
					for step := seg.Steps[0]; step <= seg.Steps[1]; step++ {
						got, ok := byStep[step]
						if !ok {
							t.Errorf("step %d: not analyzed", step)
							continue
						}
						wantV := seg.recordedVerdict
						if wantV.Flags == nil {
							wantV.Flags = map[string]string{}
						}
						if !sameVerdict(got, wantV) {
							t.Errorf("step %d: got %+v, want %+v", step, got, wantV)
						}
					}
				}
			})
		}
	}
}
