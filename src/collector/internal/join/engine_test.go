package join

import (
	"fmt"
	"math"
	"testing"
	"time"
	"unsafe"
)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

func newTestEngine(t *testing.T, mutate func(*Config)) (*Engine[int], *fakeClock) {
	t.Helper()
	cfg := DefaultConfig()
	// Steady state unless a test says otherwise: not just after a (re)start.
	cfg.StartupGrace = 0
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Check(); err != nil {
		t.Fatalf("config: %v", err)
	}
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	return New[int](cfg, clock), clock
}

// base is the true time every collective of a test ends at.
const base = int64(1_700_000_100) * 1e9

// arrival builds rank's span of collective seq in pg that ends at trueEnd (+ the host's clock
// offset) and lasted duration.
func arrival(pg string, pgSize int, seq int64, rank int, duration time.Duration,
	trueEnd int64, clockOffset time.Duration,
) *Arrival[int] {
	end := trueEnd + int64(clockOffset)
	return &Arrival[int]{
		Key:           Key{Job: "job", PG: pg, Seq: seq},
		Op:            "all_reduce",
		PGSize:        pgSize,
		Step:          seq,
		Rank:          rank,
		Topology:      Topology{Host: fmt.Sprintf("node%d", rank/2), Switch: "sw0", NIC: "mlx5_0"},
		StartUnixNano: end - int64(duration),
		EndUnixNano:   end,
		Bytes:         1 << 20,
		Ref:           rank,
	}
}

func addAll(t *testing.T, e *Engine[int], arrivals ...*Arrival[int]) []*Released[int] {
	t.Helper()
	var out []*Released[int]
	for _, a := range arrivals {
		var outcome Outcome
		outcome, out = e.Add(a, out)
		if outcome != Accepted {
			t.Fatalf("rank %d seq %d: outcome %q", a.Rank, a.Seq, outcome.Reason())
		}
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func memberByRank(t *testing.T, r *Released[int], rank int) *Member[int] {
	t.Helper()
	for i := range r.Members {
		if r.Members[i].Rank == rank {
			return &r.Members[i]
		}
	}
	t.Fatalf("rank %d not a member", rank)
	return nil
}

func TestCompleteCollectiveFigures(t *testing.T) {
	e, _ := newTestEngine(t, nil)
	durations := []time.Duration{40 * time.Millisecond, 30 * time.Millisecond,
		10 * time.Millisecond, 35 * time.Millisecond}
	var arrivals []*Arrival[int]
	for rank, d := range durations {
		arrivals = append(arrivals, arrival("default", 4, 0, rank, d, base, 0))
	}
	out := addAll(t, e, arrivals[:3]...)
	if len(out) != 0 {
		t.Fatalf("released before every member arrived: %d", len(out))
	}
	out = addAll(t, e, arrivals[3])
	if len(out) != 1 {
		t.Fatalf("want 1 release, got %d", len(out))
	}
	r := out[0]
	if !r.Complete() || r.Reason != ReleasedComplete {
		t.Fatalf("want complete, got reason %s missing %d", r.Reason, r.MissingRanks)
	}
	if !near(r.Skew, 0.030) || !near(r.Transfer, 0.010) {
		t.Errorf("skew %g transfer %g, want 0.030 and 0.010", r.Skew, r.Transfer)
	}
	late := memberByRank(t, r, 2)
	if !near(late.Lateness, 0.030) || !near(late.Wait, 0) {
		t.Errorf("rank 2 lateness %g wait %g", late.Lateness, late.Wait)
	}
	early := memberByRank(t, r, 0)
	if !near(early.Lateness, 0) || !near(early.Wait, 0.030) {
		t.Errorf("rank 0 lateness %g wait %g", early.Lateness, early.Wait)
	}
	if s := e.Stats(); s.Pending != 0 || s.BufferedSpans != 0 || s.ReleasedComplete != 1 {
		t.Errorf("stats after release: %+v", s)
	}
}

func TestClockShiftKeepsSkewAndLateness(t *testing.T) {
	run := func(offsets []time.Duration) ([]float64, []int, map[int]float64) {
		e, _ := newTestEngine(t, nil)
		var skews []float64
		var late []int
		offsetsByRank := map[int]float64{}
		for seq := range int64(4) {
			var arrivals []*Arrival[int]
			for rank := range 4 {
				d := 20 * time.Millisecond
				if rank == 1 {
					d = 2 * time.Millisecond // rank 1 arrives 18 ms late
				}
				end := base + seq*int64(time.Second)
				arrivals = append(arrivals, arrival("default", 4, seq, rank, d, end, offsets[rank]))
			}
			r := addAll(t, e, arrivals...)[0]
			skews = append(skews, r.Skew)
			for _, m := range r.Members {
				offsetsByRank[m.Rank] = m.ClockOffset
				if near(m.Lateness, r.Skew) {
					late = append(late, m.Rank)
				}
			}
		}
		return skews, late, offsetsByRank
	}
	skews0, late0, _ := run([]time.Duration{0, 0, 0, 0})
	shifted := []time.Duration{2 * time.Second, -2 * time.Second, 0, 1500 * time.Millisecond}
	skews1, late1, offsets := run(shifted)
	for i := range skews0 {
		if !near(skews0[i], skews1[i]) || !near(skews0[i], 0.018) {
			t.Errorf("collective %d: skew %g unshifted, %g shifted, want 0.018", i, skews0[i], skews1[i])
		}
	}
	if fmt.Sprint(late0) != fmt.Sprint(late1) || fmt.Sprint(late0) != "[1 1 1 1]" {
		t.Errorf("late ranks unshifted %v shifted %v, want rank 1 every time", late0, late1)
	}
	// The median end is the mean of the two middle offsets (0 and 1.5 s) = 0.75 s.
	want := map[int]float64{0: 1.25, 1: -2.75, 2: -0.75, 3: 0.75}
	for rank, w := range want {
		if !near(offsets[rank], w) {
			t.Errorf("rank %d clock offset %g, want %g", rank, offsets[rank], w)
		}
	}
}

func TestTimeoutNamesMissingRanks(t *testing.T) {
	e, clock := newTestEngine(t, func(c *Config) { c.WaitTimeout = time.Second })
	addAll(t, e,
		arrival("default", 4, 7, 0, 10*time.Millisecond, base, 0),
		arrival("default", 4, 7, 3, 10*time.Millisecond, base, 0))
	if out := e.Expire(nil); len(out) != 0 {
		t.Fatalf("released before wait_timeout")
	}
	clock.Advance(time.Second)
	out := e.Expire(nil)
	if len(out) != 1 {
		t.Fatalf("want 1 timeout release, got %d", len(out))
	}
	r := out[0]
	if r.Reason != ReleasedTimeout || r.MissingRanks != 2 || fmt.Sprint(r.Missing) != "[1 2]" {
		t.Errorf("reason %s missing %d %v, want timeout 2 [1 2]", r.Reason, r.MissingRanks, r.Missing)
	}
	if s := e.Stats(); s.ReleasedIncomplete != 1 || s.Pending != 0 || s.BufferedSpans != 0 {
		t.Errorf("stats %+v", s)
	}
	// A member arriving after the release is late, not the start of a new collective.
	outcome, _ := e.Add(arrival("default", 4, 7, 1, time.Millisecond, base, 0), nil)
	if outcome != RejectedLate {
		t.Errorf("late member: outcome %q, want late_arrival", outcome.Reason())
	}
}

func TestSubgroupMissingRanksFromEarlierCollectives(t *testing.T) {
	e, clock := newTestEngine(t, func(c *Config) { c.WaitTimeout = time.Second })
	// Group "tp1" holds global ranks 4..7 of an 8-rank job.
	for rank := 4; rank < 8; rank++ {
		a := arrival("tp1", 4, 0, rank, 5*time.Millisecond, base, 0)
		a.WorldSize = 8
		addAll(t, e, a)
	}
	for _, rank := range []int{4, 6} {
		a := arrival("tp1", 4, 1, rank, 5*time.Millisecond, base, 0)
		a.WorldSize = 8
		addAll(t, e, a)
	}
	// A group never seen complete can only give the count.
	addAll(t, e, arrival("tp9", 2, 0, 3, 5*time.Millisecond, base, 0))
	clock.Advance(time.Second)
	// Ranks 5 and 7 delivered spans a wait_timeout ago: alive, tp1 waits on for them.
	out := e.Expire(nil)
	if len(out) != 1 || out[0].PG != "tp9" || out[0].MissingRanks != 1 || len(out[0].Missing) != 0 {
		t.Fatalf("want tp9 released missing 1 unnamed rank, got %+v", out)
	}
	clock.Advance(time.Second + time.Millisecond)
	out = e.Expire(nil)
	if len(out) != 1 || out[0].MissingRanks != 2 || fmt.Sprint(out[0].Missing) != "[5 7]" {
		t.Fatalf("tp1: want missing 2 [5 7] once they fell silent, got %+v", out)
	}
}

func TestLateDeliveredBacklogIsNotMissing(t *testing.T) {
	e, clock := newTestEngine(t, func(c *Config) {
		c.WaitTimeout, c.MaxWait = time.Second, 10*time.Second
	})
	addAll(t, e, arrival("default", 2, 0, 0, time.Millisecond, base, 0))
	// Rank 1 is behind (a backlog after an outage) but keeps delivering earlier spans.
	for range 5 {
		clock.Advance(900 * time.Millisecond)
		e.AddPhase(Phase{Job: "job", Step: 0, Rank: 1, Kind: 1, StartUnixNano: base,
			EndUnixNano: base + 1})
		if out := e.Expire(nil); len(out) != 0 {
			t.Fatalf("released while rank 1 was still delivering: %+v", out[0])
		}
	}
	out := addAll(t, e, arrival("default", 2, 0, 1, time.Millisecond, base, 0))
	if len(out) != 1 || !out[0].Complete() {
		t.Fatalf("the backlog's member did not complete its collective: %+v", out)
	}
	if s := e.Stats(); s.ReleasedIncomplete != 0 || s.Extended == 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestAliveButAbsentMemberWaitsAtMostMaxWait(t *testing.T) {
	e, clock := newTestEngine(t, func(c *Config) {
		c.WaitTimeout, c.MaxWait = time.Second, 3*time.Second
	})
	addAll(t, e, arrival("default", 2, 0, 0, time.Millisecond, base, 0))
	var out []*Released[int]
	for i := 0; i < 10 && len(out) == 0; i++ {
		clock.Advance(500 * time.Millisecond)
		// Rank 1 stays alive (its phases keep coming) but never sends this collective.
		e.AddPhase(Phase{Job: "job", Step: 9, Rank: 1, Kind: 1, StartUnixNano: base,
			EndUnixNano: base + 1})
		out = e.Expire(out)
	}
	if len(out) != 1 || out[0].Reason != ReleasedTimeout || fmt.Sprint(out[0].Missing) != "[1]" {
		t.Fatalf("want a timeout release naming rank 1, got %+v", out)
	}
}

func TestJustAfterAStartAnIncompleteCollectiveIsPartial(t *testing.T) {
	e, clock := newTestEngine(t, func(c *Config) {
		c.WaitTimeout, c.MaxWait, c.StartupGrace = time.Second, 2*time.Second, 10*time.Second
	})
	addAll(t, e, arrival("default", 2, 0, 0, time.Millisecond, base, 0))
	clock.Advance(3 * time.Second)
	out := e.Expire(nil)
	if len(out) != 1 || out[0].Reason != ReleasedPartial || out[0].Reason.CountsAsMissing() {
		t.Fatalf("want a partial release that counts nobody missing, got %+v", out)
	}
	// After the grace, the same silence is a missing rank.
	clock.Advance(10 * time.Second)
	addAll(t, e, arrival("default", 2, 1, 0, time.Millisecond, base, 0))
	clock.Advance(3 * time.Second)
	out = e.Expire(nil)
	if len(out) != 1 || out[0].Reason != ReleasedTimeout || !out[0].Reason.CountsAsMissing() {
		t.Fatalf("want a timeout release after the grace, got %+v", out)
	}
}

func TestOverlappingProcessGroups(t *testing.T) {
	e, _ := newTestEngine(t, nil)
	// Rank 1 belongs to the world group and to "dp0" = {0, 1}; the same seq in two groups
	// are different collectives.
	out := addAll(t, e,
		arrival("default", 3, 5, 0, 9*time.Millisecond, base, 0),
		arrival("dp0", 2, 5, 1, 4*time.Millisecond, base, 0),
		arrival("default", 3, 5, 1, 3*time.Millisecond, base, 0),
		arrival("dp0", 2, 5, 0, 6*time.Millisecond, base, 0),
		arrival("default", 3, 5, 2, 8*time.Millisecond, base, 0),
	)
	if len(out) != 2 {
		t.Fatalf("want 2 releases, got %d", len(out))
	}
	if out[0].PG != "dp0" || !near(out[0].Skew, 0.002) || len(out[0].Members) != 2 {
		t.Errorf("first release %s skew %g members %d", out[0].PG, out[0].Skew, len(out[0].Members))
	}
	if out[1].PG != "default" || !near(out[1].Skew, 0.006) || len(out[1].Members) != 3 {
		t.Errorf("second release %s skew %g members %d", out[1].PG, out[1].Skew, len(out[1].Members))
	}
}

func TestRejections(t *testing.T) {
	e, _ := newTestEngine(t, nil)
	addAll(t, e, arrival("default", 4, 0, 0, time.Millisecond, base, 0))
	bad := func(mutate func(*Arrival[int])) Outcome {
		a := arrival("default", 4, 0, 1, time.Millisecond, base, 0)
		mutate(a)
		o, out := e.Add(a, nil)
		if len(out) != 0 {
			t.Fatalf("a rejected arrival released something")
		}
		return o
	}
	cases := []struct {
		name   string
		mutate func(*Arrival[int])
		want   Outcome
	}{
		{"duplicate", func(a *Arrival[int]) { a.Rank = 0 }, RejectedDuplicate},
		{"rank >= pg_size in default", func(a *Arrival[int]) { a.Rank = 4 }, RejectedRankOutOfGroup},
		{"negative rank", func(a *Arrival[int]) { a.Rank = -1 }, RejectedRankOutOfGroup},
		{"rank >= world size", func(a *Arrival[int]) { a.PG, a.Rank, a.WorldSize = "x", 9, 8 },
			RejectedRankOutOfGroup},
		{"pg_size disagreement", func(a *Arrival[int]) { a.PGSize = 5 }, RejectedPGSizeMismatch},
		{"pg_size zero", func(a *Arrival[int]) { a.PGSize = 0 }, RejectedPGSizeMismatch},
		{"pg_size > world", func(a *Arrival[int]) { a.WorldSize = 2 }, RejectedPGSizeMismatch},
		{"negative duration", func(a *Arrival[int]) { a.StartUnixNano = a.EndUnixNano + 1 },
			RejectedBadDuration},
	}
	for _, tc := range cases {
		if got := bad(tc.mutate); got != tc.want {
			t.Errorf("%s: outcome %q, want %q", tc.name, got.Reason(), tc.want.Reason())
		}
	}
	s := e.Stats()
	if s.Accepted != 1 || s.BufferedSpans != 1 || s.Rejected[RejectedRankOutOfGroup] != 3 ||
		s.Rejected[RejectedPGSizeMismatch] != 3 || s.Rejected[RejectedBadDuration] != 1 ||
		s.Rejected[RejectedDuplicate] != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestMaxPendingEvictsOldestFirst(t *testing.T) {
	e, _ := newTestEngine(t, func(c *Config) { c.MaxPending = 3 })
	for seq := range int64(3) {
		addAll(t, e, arrival("default", 2, seq, 0, time.Millisecond, base, 0))
	}
	_, out := e.Add(arrival("default", 2, 3, 0, time.Millisecond, base, 0), nil)
	if len(out) != 1 || out[0].Seq != 0 || out[0].Reason != ReleasedEvicted ||
		out[0].MissingRanks != 1 || fmt.Sprint(out[0].Missing) != "[1]" {
		t.Fatalf("want seq 0 evicted with rank 1 missing, got %+v", out)
	}
	if s := e.Stats(); s.Pending != 3 || s.Evicted != 1 || s.ReleasedIncomplete != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestMaxBufferedSpansEvictsOldestFirst(t *testing.T) {
	e, _ := newTestEngine(t, func(c *Config) { c.MaxBufferedSpans = 4 })
	addAll(t, e,
		arrival("default", 8, 0, 0, time.Millisecond, base, 0),
		arrival("default", 8, 0, 1, time.Millisecond, base, 0),
		arrival("default", 8, 1, 0, time.Millisecond, base, 0),
		arrival("default", 8, 1, 1, time.Millisecond, base, 0))
	o, out := e.Add(arrival("default", 8, 1, 2, time.Millisecond, base, 0), nil)
	if o != Accepted || len(out) != 1 || out[0].Seq != 0 || out[0].Reason != ReleasedEvicted {
		t.Fatalf("want seq 0 evicted and the arrival accepted, got %q %+v", o.Reason(), out)
	}
	if s := e.Stats(); s.BufferedSpans != 3 || s.Pending != 1 {
		t.Errorf("stats %+v", s)
	}
}

// straggle runs n collectives of 4 ranks where lateRank (or nobody, -1) arrives late by
// lateness, and returns the verdict of each rank in the last one.
func TestDrainReleasesEverything(t *testing.T) {
	e, _ := newTestEngine(t, nil)
	addAll(t, e, arrival("default", 2, 0, 0, time.Millisecond, base, 0),
		arrival("default", 2, 1, 1, time.Millisecond, base, 0))
	out := e.Drain(nil)
	if len(out) != 2 || out[0].Reason != ReleasedShutdown || out[1].Reason != ReleasedShutdown {
		t.Fatalf("drain: %+v", out)
	}
	if s := e.Stats(); s.Pending != 0 || s.BufferedSpans != 0 {
		t.Errorf("stats after drain %+v", s)
	}
}

func TestRestartedJobJoinsAgainUnderTheSameID(t *testing.T) {
	e, clock := newTestEngine(t, func(c *Config) {
		c.WaitTimeout, c.MaxWait = time.Second, 2*time.Second
	})
	addAll(t, e, arrival("default", 2, 0, 0, time.Millisecond, base, 0),
		arrival("default", 2, 0, 1, time.Millisecond, base, 0))
	// A duplicate of the same step soon after the release is a late arrival.
	if o, _ := e.Add(arrival("default", 2, 0, 1, time.Millisecond, base, 0), nil); o != RejectedLate {
		t.Fatalf("same step right after release: %q, want late_arrival", o.Reason())
	}
	// The job restarts under the same id: sequence numbers start over at another step.
	restarted := func(rank int) *Arrival[int] {
		a := arrival("default", 2, 0, rank, time.Millisecond, base, 0)
		a.Step = 500
		return a
	}
	if out := addAll(t, e, restarted(0), restarted(1)); len(out) != 1 || !out[0].Complete() {
		t.Fatalf("restarted job's collective not joined: %+v", out)
	}
	// Long after max_wait the same (step, seq) is a new collective too.
	clock.Advance(3 * time.Second)
	if out := addAll(t, e, restarted(0), restarted(1)); len(out) != 1 {
		t.Fatalf("same key long after release not joined: %+v", out)
	}
}

// TestHugeClaimedGroupExpiresQuickly: spans claiming a group of a million ranks must not make
// each expiry walk a million ranks (the processor's lock is held meanwhile).
func TestHugeClaimedGroupExpiresQuickly(t *testing.T) {
	e, clock := newTestEngine(t, func(c *Config) { c.WaitTimeout, c.MaxWait = time.Second, time.Second })
	for seq := range int64(4096) {
		a := arrival("default", MaxRanks-1, seq, 0, time.Millisecond, base, 0)
		addAll(t, e, a)
	}
	clock.Advance(2 * time.Second)
	start := time.Now()
	out := e.Expire(nil)
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("expiring 4096 collectives of a claimed million ranks took %s", elapsed)
	}
	if len(out) != 4096 {
		t.Errorf("released %d of 4096", len(out))
	}
}

// A pending member costs 48 bytes with a two-word handle (the processor's), not a Member's
// ~170: at 4096 ranks the engine holds about a step of every rank's collective members.
func TestHeldMemberIsCompact(t *testing.T) {
	type twoWords struct {
		p *int
		i int
	}
	if got := unsafe.Sizeof(heldMember[twoWords]{}); got > 48 {
		t.Fatalf("heldMember with a two-word Ref is %d bytes, want <= 48", got)
	}
}

// Members keep their topology through the interning, and a collective's member slice does
// not grow past pg_size.
func TestPendingMembersKeepTheirTopologyAndFitTheGroup(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
	e := New[int](DefaultConfig(), clock)
	const size = 100
	var out []*Released[int]
	for rank := range size {
		a := Arrival[int]{Key: Key{Job: "j", PG: "0", Seq: 1}, Op: "all_reduce", PGSize: size,
			Rank: rank, StartUnixNano: 1000, EndUnixNano: 2000 + int64(rank), Ref: rank}
		a.Host, a.Switch, a.NIC = fmt.Sprintf("node-%d", rank/8), "leaf-0", fmt.Sprintf("nic%d", rank%8)
		if rank < size-1 {
			if p, _ := e.pending.get(hashKey(&a.Key), &a.Key); p != nil && cap(p.members) > size {
				t.Fatalf("member capacity %d past pg_size %d", cap(p.members), size)
			}
		}
		_, out = e.Add(&a, out)
	}
	if len(out) != 1 || len(out[0].Members) != size {
		t.Fatalf("released %d collectives, want one of %d members", len(out), size)
	}
	for _, m := range out[0].Members {
		if m.Ref != m.Rank || m.Host != fmt.Sprintf("node-%d", m.Rank/8) || m.NIC != fmt.Sprintf("nic%d", m.Rank%8) ||
			m.Switch != "leaf-0" || m.EndUnixNano != 2000+int64(m.Rank) {
			t.Fatalf("member %+v lost what it arrived with", m)
		}
	}
}
