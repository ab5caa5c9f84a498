package diagnosis

import "testing"

// The cache holds at most limit entries, in at most limit entries' memory, and forgets the
// oldest first.
func TestPhaseCacheIsBoundedInEntriesAndCapacity(t *testing.T) {
	const limit = 1000
	c := newPhaseCache(limit)
	for step := int64(0); step < 3; step++ {
		for rank := int32(0); rank < 700; rank++ {
			c.add("job", step, rank, PhaseForward, 10, 20)
			c.add("job", step, rank, PhaseForward, 30, 35)
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
