package spanio

import (
	"reflect"
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

func TestImbalancesRoundTripThroughTheSummary(t *testing.T) {
	res := diagnosis.StepResult{
		Job: "job", Step: 7, Duration: 1.2, WhatIf: 0.9, Slowdown: 1.3, EndUnixNano: 5e9,
		ReplayError: 0.004, ReplayChecked: true,
		RootCauses: []diagnosis.RootCause{
			{Rank: -1, Cause: semconv.CauseStageImbalance, Cost: 0.2, Stage: 3,
				Ranks: []int{12, 13}, Excess: 0.4, Fix: "move work"},
			{Rank: -1, Cause: semconv.CauseDataImbalance, Cost: 0.1, Stage: -1, Excess: 0.3,
				Fix: "split by tokens"},
		},
		Imbalances: []diagnosis.ImbalanceFlag{{Cause: semconv.CauseStageImbalance, Stage: 3,
			Ranks: []int{12, 13}, Excess: 0.4, Cost: 0.18, Fix: "move work"}},
	}
	td := ptrace.NewTraces()
	AppendSummary(td, &res)
	rs := td.ResourceSpans().At(0)
	got, ok := ReadSummary(rs.ScopeSpans().At(0).Spans().At(0), rs.Resource(), 256)
	if !ok {
		t.Fatal("summary unreadable")
	}
	if !reflect.DeepEqual(got.RootCauses, res.RootCauses) {
		t.Errorf("root causes\n got %+v\nwant %+v", got.RootCauses, res.RootCauses)
	}
	if !got.ReplayChecked || got.ReplayError != res.ReplayError {
		t.Errorf("replay error %v %g, want %g", got.ReplayChecked, got.ReplayError, res.ReplayError)
	}
	if !reflect.DeepEqual(got.Imbalances, res.Imbalances) {
		t.Errorf("imbalances\n got %+v\nwant %+v", got.Imbalances, res.Imbalances)
	}
}

func TestMalformedImbalanceRanksAreCut(t *testing.T) {
	if got := parseRanks("1,2,x,4"); !reflect.DeepEqual(got, []int{1, 2}) {
		t.Errorf("parseRanks = %v", got)
	}
	if got := parseRanks("-1"); got != nil {
		t.Errorf("parseRanks(-1) = %v", got)
	}
}
