package join

// maxDenseLiveRank bounds the ranks a liveTable keeps in its slice (indexed by rank); and
// maxDenseLive the slice entries of all jobs' tables together (2.4 MB): past it, a job's
// new ranks go to its map.
const (
	maxDenseLiveRank = 1 << 16
	maxDenseLive     = 1 << 18
)

// liveTable is when each rank of a job last delivered a span, as a map[int32]int64 would
// hold it: in a slice indexed by rank below maxDenseLiveRank while the engine's budget
// lasts (every arrival writes its rank's time: a map assignment was most of touch), in a
// map otherwise.
type liveTable struct {
	dense  []int64
	has    []bool
	sparse map[int32]int64
	n      int
}

// get returns when rank r last delivered, ok false when it has not.
func (t *liveTable) get(r int32) (int64, bool) {
	if r >= 0 && int(r) < len(t.dense) {
		return t.dense[r], t.has[r]
	}
	v, ok := t.sparse[r]
	return v, ok
}

// set records rank r's delivery at now and reports whether r is new; budget is the
// engine's slice entries left for the tables (grown from here).
func (t *liveTable) set(r int32, now int64, budget *int) bool {
	if r >= 0 && int(r) >= len(t.dense) && r < maxDenseLiveRank {
		if _, ok := t.sparse[r]; !ok {
			t.grow(int(r)+1, budget)
		}
	}
	if r >= 0 && int(r) < len(t.dense) {
		t.dense[r] = now
		if t.has[r] {
			return false
		}
		t.has[r] = true
		t.n++
		return true
	}
	if t.sparse == nil {
		t.sparse = make(map[int32]int64)
	}
	_, ok := t.sparse[r]
	t.sparse[r] = now
	if !ok {
		t.n++
	}
	return !ok
}

// grow makes the slice hold at least n ranks (twice its length, up to maxDenseLiveRank) if
// the budget allows, moving the map's ranks below the new length into it.
func (t *liveTable) grow(n int, budget *int) {
	size := min(maxDenseLiveRank, max(n, 2*len(t.dense), 64))
	if size-len(t.dense) > *budget {
		return
	}
	*budget -= size - len(t.dense)
	dense, has := make([]int64, size), make([]bool, size)
	copy(dense, t.dense)
	copy(has, t.has)
	t.dense, t.has = dense, has
	for r, v := range t.sparse {
		if r >= 0 && int(r) < size {
			t.dense[r], t.has[r] = v, true
			delete(t.sparse, r)
		}
	}
}

// len is how many ranks delivered.
func (t *liveTable) len() int { return t.n }

// each calls f with every rank and its last delivery until f returns false.
func (t *liveTable) each(f func(rank int32, seen int64) bool) {
	for r, ok := range t.has {
		if ok && !f(int32(r), t.dense[r]) {
			return
		}
	}
	for r, v := range t.sparse {
		if !f(r, v) {
			return
		}
	}
}
