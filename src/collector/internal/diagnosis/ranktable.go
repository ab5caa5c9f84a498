package diagnosis

// maxDenseRank bounds the ranks a rankTable holds in its slice (indexed by rank); larger
// ones (a span may claim a rank up to a million) go to its map.
const maxDenseRank = 1 << 16

// rankTable maps ranks to values as a map[int32]V would, in a slice indexed by rank below
// maxDenseRank (grown to the largest rank set): each member span of a step reads its rank's
// topology and latest step, and a map lookup was most of the cost of recording it.
type rankTable[V any] struct {
	dense  []V
	has    []bool
	sparse map[int32]V
	n      int
}

// get returns rank r's value (the zero value and false when it has none).
func (t *rankTable[V]) get(r int32) (V, bool) {
	if r >= 0 && int(r) < len(t.dense) {
		return t.dense[r], t.has[r]
	}
	v, ok := t.sparse[r]
	return v, ok
}

// at returns rank r's value, the zero value when it has none.
func (t *rankTable[V]) at(r int32) V {
	if r >= 0 && int(r) < len(t.dense) {
		return t.dense[r]
	}
	return t.sparse[r]
}

// set sets rank r's value.
func (t *rankTable[V]) set(r int32, v V) {
	if r >= 0 && r < maxDenseRank {
		if int(r) >= len(t.dense) {
			n := max(int(r)+1, min(maxDenseRank, 2*len(t.dense)))
			dense, has := make([]V, n), make([]bool, n)
			copy(dense, t.dense)
			copy(has, t.has)
			t.dense, t.has = dense, has
		}
		if !t.has[r] {
			t.has[r] = true
			t.n++
		}
		t.dense[r] = v
		return
	}
	if t.sparse == nil {
		t.sparse = make(map[int32]V)
	}
	if _, ok := t.sparse[r]; !ok {
		t.n++
	}
	t.sparse[r] = v
}

// len is how many ranks have a value.
func (t *rankTable[V]) len() int { return t.n }
