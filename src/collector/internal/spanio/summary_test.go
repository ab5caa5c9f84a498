package spanio

import (
	"math"
	"reflect"
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// A step result survives the summary whole: the gateway's verdict stage decides a job's
// flags from summaries alone (diagnosis.Verdicts), so what it reads must be what the
// analysis had.
func TestStepResultRoundTripsThroughTheSummary(t *testing.T) {
	nic := diagnosis.Suspect{Kind: diagnosis.SuspectNIC, Name: "eth0", Host: "node4"}
	topo := diagnosis.Topology{Host: "node4", Switch: "leaf1", NIC: "eth0"}
	advice := &diagnosis.Partition{Layers: []int{4, 4, 5, 4}, Current: []int{4, 4, 4, 5},
		Before: []float64{4, 4, 4, 5.6}, After: []float64{4, 4, 5, 4.6}, Saving: 0.05}
	res := diagnosis.StepResult{
		Job: "job", Step: 7, Duration: 1.2, WhatIf: 0.9, Slowdown: 1.3, EndUnixNano: 5e9,
		ReplayError: 0.004, ReplayChecked: true, Ranks: 16, SlowCollectives: 3, MinSaving: 0.021,
		RootCauses: []diagnosis.RootCause{
			{Rank: -1, Cause: semconv.CauseStageImbalance, Cost: 0.2, Stage: 3,
				Ranks: []int{12, 13}, Excess: 0.4, Fix: "move work", Partition: advice},
			{Rank: 9, Topology: topo, Cause: semconv.CauseNetwork, Cost: 0.15, Stage: -1,
				Suspect: &nic},
			{Rank: -1, Cause: semconv.CauseNetwork, Cost: 0.15, Stage: -1, Suspect: &nic},
			{Rank: -1, Cause: semconv.CauseDataImbalance, Cost: 0.1, Stage: -1, Excess: 0.3,
				Ranks: []int{5}, Fix: "split by tokens"},
			{Rank: 2, Topology: topo, Cause: semconv.CauseCompute, Cost: 0.05, Stage: -1},
		},
		Attribution: []diagnosis.Saving{{Kind: semconv.AttributionCompute, Saves: 0.12},
			{Kind: semconv.OpSendRecv, Saves: 0.04}},
		Flagged: []diagnosis.RankFlag{{Rank: 9, Topology: topo, Cause: semconv.CauseNetwork,
			Cost: 0.12, Domain: nic.ID()}},
		Suspects: []diagnosis.SuspectFlag{{Suspect: nic, Cost: 0.12},
			{Suspect: diagnosis.Suspect{Kind: diagnosis.SuspectSwitch, Name: "leaf1"}, Cost: 0.1,
				Derived: true}},
		Imbalances: []diagnosis.ImbalanceFlag{{Cause: semconv.CauseStageImbalance, Stage: 3,
			Ranks: []int{12, 13}, Excess: 0.4, Cost: 0.18, Fix: "move work", Partition: advice}},
		Groups: []diagnosis.GroupPhase{{PG: "dp0", Op: semconv.OpAllReduce, Start: 0.3,
			Duration: 0.05, Switches: "leaf0,leaf1", Hosts: "node0,node4"},
			{PG: "tp2", Op: semconv.OpAllGather, Start: 0.01, Duration: 0.002, Switches: "leaf1",
				Hosts: "node4"}},
	}
	for _, deferred := range []bool{false, true} {
		res.Deferred = deferred
		td := ptrace.NewTraces()
		AppendSummary(td, &res)
		rs := td.ResourceSpans().At(0)
		got, ok := ReadSummary(rs.ScopeSpans().At(0).Spans().At(0), rs.Resource(), 256)
		if !ok {
			t.Fatal("summary unreadable")
		}
		if !reflect.DeepEqual(got, res) {
			t.Errorf("deferred=%v:\n got %+v\nwant %+v", deferred, got, res)
		}
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

// A forged or damaged group phase event is read safely: no group name, no phase; a NaN,
// infinite, negative or mistyped time reads 0, so no moving average downstream is poisoned.
func TestMalformedGroupPhasesAreCleaned(t *testing.T) {
	res := diagnosis.StepResult{Job: "job", Step: 1,
		Groups: []diagnosis.GroupPhase{{PG: "dp0", Start: 0.3, Duration: 0.05, Switches: "leaf0"},
			{PG: "dp1", Start: 0.2, Duration: 0.04}, {PG: "dp2", Start: 0.1, Duration: 0.03}}}
	td := ptrace.NewTraces()
	AppendSummary(td, &res)
	rs := td.ResourceSpans().At(0)
	span := rs.ScopeSpans().At(0).Spans().At(0)
	events := span.Events()
	for i := range events.Len() {
		a := events.At(i).Attributes()
		pg, _ := a.Get(semconv.AttrCollectivePG)
		switch pg.Str() {
		case "dp0":
			a.PutDouble(semconv.AttrGroupPhaseStart, math.NaN())
			a.PutDouble(semconv.AttrGroupPhaseDuration, math.Inf(1))
		case "dp1":
			a.PutDouble(semconv.AttrGroupPhaseStart, -4)
			a.PutStr(semconv.AttrGroupPhaseDuration, "0.04")
		case "dp2":
			a.Remove(semconv.AttrCollectivePG)
		}
	}
	got, ok := ReadSummary(span, rs.Resource(), 256)
	if !ok {
		t.Fatal("summary unreadable")
	}
	want := []diagnosis.GroupPhase{{PG: "dp0", Switches: "leaf0"}, {PG: "dp1"}}
	for i := range want {
		want[i].Op = got.Groups[i].Op // written as given (empty here), not checked
	}
	if !reflect.DeepEqual(got.Groups, want) {
		t.Errorf("groups %+v, want %+v", got.Groups, want)
	}
}
