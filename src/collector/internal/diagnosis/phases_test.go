package diagnosis

import "testing"

// The cache holds at most limit entries, in at most limit entries' memory, and forgets the
// oldest first.
func TestPhaseCacheIsBoundedInEntriesAndCapacity(t *testing.T) {
	const limit = 1000
	c := newPhaseCache(limit)
	for step := int64(0); step < 3; step++ {
		for rank := int32(0); rank < 700; rank++ {
			c.add("job", step, rank, PhaseForward, 10, 20, 0)
			c.add("job", step, rank, PhaseForward, 30, 35, 0)
		}
	}
	if c.len() != limit {
		t.Fatalf("len = %d, want %d", c.len(), limit)
	}
	if cap(c.entries) != limit {
		t.Fatalf("cap(entries) = %d, want %d (growth must stop at the limit)", cap(c.entries), limit)
	}
	if e := c.get("job", 0, 0); e != nil {
		t.Fatalf("step 0 rank 0 should have been evicted first, got %+v", e.key)
	}
	e := c.get("job", 2, 699)
	if e == nil {
		t.Fatal("the newest entry is missing")
	}
	iv, ok := e.get(PhaseForward)
	if !ok || iv.start != 10 || iv.end != 35 || iv.total != 15 {
		t.Fatalf("forward = %+v (seen %v), want start 10, end 35, total 15", iv, ok)
	}
}

// Entries of steps before a job's last analyzed step are reused before the cache grows: it
// holds the steps still open, not limit entries. Entries still read (the analyzed step, the
// open ones) stay.
func TestPhaseCacheReusesAnalyzedStepsBeforeGrowing(t *testing.T) {
	const limit, ranks = 100000, 1000
	c := newPhaseCache(limit)
	// The step before is analyzed once this one has arrived (it reads its predecessor).
	addSteps(&c, "job", 0, 20, ranks, 1)
	// Steps 18 and 19 are read; 17 and older are stale. The ring needed steps 17-19 at once,
	// and grows by doubling (without the reuse: 20 steps, a capacity of 32768).
	if got := cap(c.entries); got > 6*ranks {
		t.Fatalf("cap(entries) = %d for 3 steps of %d ranks (limit %d): analyzed steps were not reused", got, ranks, limit)
	}
	for _, step := range []int64{18, 19} {
		for _, rank := range []int32{0, ranks / 2, ranks - 1} {
			if c.get("job", step, rank) == nil {
				t.Fatalf("step %d rank %d is missing", step, rank)
			}
		}
	}
	checkPhaseIndex(t, &c)
}

// A ring that wrapped (stale entries reused) and then has to grow keeps its age order: the
// limit still forces out the oldest entries first, and the index stays true.
func TestPhaseCacheGrowsAfterWrappingInAgeOrder(t *testing.T) {
	const limit = 500
	c := newPhaseCache(limit)
	// Four steps of 50 in a ring of 150: step 3 took step 0's slots, and the ring's oldest is
	// now step 1 (stale), then step 2 (read).
	addSteps(&c, "a", 0, 4, 50, 1)
	if c.next == 0 {
		t.Fatal("the ring did not wrap; the test does not test growth after a wrap")
	}
	// Job b is never analyzed: its entries fill the cache to the limit and force out a's
	// entries, oldest first.
	for rank := int32(0); rank < limit-100+60; rank++ {
		c.add("b", 0, rank, PhaseStep, 1, 2, 0)
	}
	checkPhaseIndex(t, &c)
	if c.len() != limit {
		t.Fatalf("len = %d, want %d", c.len(), limit)
	}
	// Steps 2 and 3 of a are live (100 entries), so 60 of them were forced out, oldest first:
	// step 2's 50, then step 3's ranks 0-9.
	if c.get("a", 2, 49) != nil || c.get("a", 3, 9) != nil {
		t.Fatal("an older entry outlived a newer one")
	}
	if c.get("a", 3, 10) == nil || c.get("a", 3, 49) == nil || c.get("b", 0, 0) == nil {
		t.Fatal("a newer entry was forced out before an older one")
	}
	// 40 more of b force out the rest of a, and nothing of b.
	for rank := int32(limit - 100 + 60); rank < limit; rank++ {
		c.add("b", 0, rank, PhaseStep, 1, 2, 0)
	}
	checkPhaseIndex(t, &c)
	for rank := int32(0); rank < limit; rank++ {
		if c.get("b", 0, rank) == nil {
			t.Fatalf("b rank %d was forced out while older entries of a remained", rank)
		}
	}
}

// addSteps adds steps [from, to) of job, ranks entries each, and after each step marks the
// step lag steps before it analyzed (as the analysis does once a later step has arrived).
func addSteps(c *phaseCache, job string, from, to int64, ranks int32, lag int64) {
	for step := from; step < to; step++ {
		for rank := range ranks {
			c.add(job, step, rank, PhaseForward, 10, 20, 0)
		}
		c.setAnalyzed(job, step-lag)
	}
}

func checkPhaseIndex(t *testing.T, c *phaseCache) {
	t.Helper()
	for k, i := range c.index {
		if c.entries[i].key != k {
			t.Fatalf("index says %+v is at %d, which holds %+v", k, i, c.entries[i].key)
		}
	}
}

// A job that ended leaves its last analyzed step at the head of the ring; after a lap with no
// entry of that job it is stale, and the next job's analyzed steps are reused as before (it
// used to make the ring grow to its limit for good). A job the analysis forgot is stale at
// once, until the analysis knows a job of that name again.
func TestPhaseCacheEndedAndForgottenJobsDoNotStopTheReuse(t *testing.T) {
	const limit, ranks = 100000, 1000
	c := newPhaseCache(limit)
	addSteps(&c, "old", 0, 3, ranks, 0)
	addSteps(&c, "job", 0, 200, ranks, 1)
	if got := cap(c.entries); got > 8*ranks {
		t.Fatalf("cap(entries) = %d after a job ended (limit %d): its last step stopped the reuse", got, limit)
	}
	if c.get("job", 198, 0) == nil || c.get("job", 199, ranks-1) == nil {
		t.Fatal("the running job's read steps are missing")
	}
	checkPhaseIndex(t, &c)

	// A forgotten job's entries are stale at once; a job of that name known again is not.
	d := newPhaseCache(limit)
	d.add("gone", 0, 0, PhaseStep, 1, 2, 0)
	d.forget("gone")
	if !d.stale(&d.entries[0]) {
		t.Fatal("an entry of a forgotten job is not stale")
	}
	d.known("gone")
	if d.stale(&d.entries[0]) {
		t.Fatal("an entry of a job known again is stale")
	}
	// The last analyzed step of a running job stays while the job adds entries.
	e := newPhaseCache(limit)
	e.add("run", 5, 0, PhaseStep, 1, 2, 0)
	e.setAnalyzed("run", 5)
	for rank := int32(0); rank < 10; rank++ {
		e.add("run", 6, rank, PhaseStep, 1, 2, 0)
	}
	if e.stale(&e.entries[0]) {
		t.Fatal("the last analyzed step of a job still adding entries is stale")
	}
}
