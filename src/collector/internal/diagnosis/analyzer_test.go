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
