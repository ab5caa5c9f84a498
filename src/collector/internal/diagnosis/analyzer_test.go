package diagnosis

import (
	"testing"
	"time"
)

func TestBoundsForceAnalysisAndCountLateSpans(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxOpenSteps = 2
	a := New(cfg)
	now := time.Unix(1_700_000_000, 0)
	for step := range int64(5) {
		c := Collective{Job: "job", PG: "default", Seq: step, Step: step, Op: "all_reduce",
			PGSize: 2}
		a.ObserveCollective(&c, false, now)
		for rank := range 2 {
			a.AddMember(&Span{Rank: rank, StartUnixNano: 0, EndUnixNano: 1000})
		}
		a.EndCollective()
	}
	results := a.Close(now, false)
	if len(results) != 3 || !results[0].Forced || results[0].Step != 0 {
		t.Fatalf("forced results %+v, want steps 0-2 forced", results)
	}
	c := Collective{Job: "job", PG: "default", Seq: 9, Step: 1, Op: "all_reduce", PGSize: 2}
	a.ObserveCollective(&c, false, now)
	a.AddMember(&Span{Rank: 0, StartUnixNano: 0, EndUnixNano: 1000})
	a.EndCollective()
	if s := a.Stats(); s.LateSpans != 1 || s.StepsForced != 3 || s.OpenSteps != 2 {
		t.Errorf("stats %+v", s)
	}
}

// TestManyMissingRanksAreADeliveryGapNotStragglers: one rank missing from a step's
// collective is a root cause (cause unknown); 40 of 256 missing at once (more than
// max(4, 256/32)) is a gap in delivery, and none of them is blamed.
func TestManyMissingRanksAreADeliveryGapNotStragglers(t *testing.T) {
	const world = 256
	for _, tc := range []struct {
		missing int
		blamed  bool
	}{{1, true}, {8, true}, {40, false}} {
		a := New(DefaultConfig())
		now := time.Unix(1_700_000_000, 0)
		c := Collective{Job: "job", PG: "default", Seq: 0, Step: 0, Op: "all_reduce",
			PGSize: world, MissingRanks: tc.missing}
		for r := world - tc.missing; r < world; r++ {
			c.Missing = append(c.Missing, r)
		}
		a.ObserveCollective(&c, false, now)
		for rank := range world - tc.missing {
			a.AddMember(&Span{Rank: rank, StartUnixNano: 0, EndUnixNano: 1000})
		}
		a.EndCollective()
		results := a.Close(now.Add(time.Minute), true)
		if len(results) != 1 {
			t.Fatalf("%d missing: %d results", tc.missing, len(results))
		}
		blamed := 0
		for _, rc := range results[0].RootCauses {
			if rc.Rank >= world-tc.missing {
				blamed++
			}
		}
		if tc.blamed && blamed != tc.missing || !tc.blamed && blamed != 0 {
			t.Errorf("%d missing: %d blamed (want all: %v)", tc.missing, blamed, tc.blamed)
		}
	}
}
