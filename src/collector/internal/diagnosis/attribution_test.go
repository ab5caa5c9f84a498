package diagnosis_test

import (
	"testing"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// The attribution names the kind of work whose fix saves the most: compute for a slow
// worker, the messages for a slow pipeline link, the all-reduces for a slow NIC. Its saving
// is of the order of what the root causes' fix saves (fixing every rank's work, or every
// transfer of a kind, is at least fixing the one behind the root cause).
func TestAttributionNamesTheKindOfWorkToFix(t *testing.T) {
	jobs := verdictJobs()
	for name, want := range map[string]string{
		"compute":                 semconv.AttributionCompute,
		"pipeline-slow-worker":    semconv.AttributionCompute,
		"pipeline-long-stage":     semconv.AttributionCompute,
		"pipeline-data-imbalance": semconv.AttributionCompute,
		"pipeline-slow-link":      semconv.OpSendRecv,
		"nic":                     semconv.OpAllReduce,
	} {
		t.Run(name, func(t *testing.T) {
			job, steps := jobs[name]()
			results := run(t, job, join.DefaultConfig(), steps)
			last := results[steps-1]
			if len(last.RootCauses) == 0 || len(last.Attribution) == 0 {
				t.Fatalf("roots %+v attribution %+v", last.RootCauses, last.Attribution)
			}
			top := last.Attribution[0]
			fixed := last.Duration - last.WhatIf
			t.Logf("%s: attribution %+v, root causes' fix saves %.4f s", name, last.Attribution,
				fixed)
			if top.Kind != want || top.Saves < 0.5*fixed {
				t.Errorf("top kind %s saving %.4f s, want %s saving at least half of %.4f s",
					top.Kind, top.Saves, want, fixed)
			}
		})
	}
}
