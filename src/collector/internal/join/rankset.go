package join

// rankSet is the set of ranks a pending collective has seen: open addressing over a slice
// sized to the members that arrived (twice their count, a power of two), so its memory
// follows the spans actually buffered, never the rank numbers a span claims. Small sets
// (up to linearMax) are scanned.
type rankSet struct {
	linear []int32
	slots  []int32 // rank+1; 0 is empty
	n      int
}

const linearMax = 32

func (s *rankSet) has(rank int) bool {
	if s.slots == nil {
		for _, r := range s.linear {
			if int(r) == rank {
				return true
			}
		}
		return false
	}
	mask := len(s.slots) - 1
	for i := hashRank(rank) & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case 0:
			return false
		case int32(rank + 1):
			return true
		}
	}
}

func (s *rankSet) add(rank int) {
	if s.slots == nil {
		if len(s.linear) < linearMax {
			s.linear = append(s.linear, int32(rank))
			s.n++
			return
		}
		s.rehash(4 * linearMax)
	}
	if 2*(s.n+1) > len(s.slots) {
		s.rehash(2 * len(s.slots))
	}
	s.insert(rank)
	s.n++
}

func (s *rankSet) insert(rank int) {
	mask := len(s.slots) - 1
	i := hashRank(rank) & mask
	for s.slots[i] != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = int32(rank + 1)
}

func (s *rankSet) rehash(size int) {
	old := s.slots
	s.slots = make([]int32, size)
	for _, v := range old {
		if v != 0 {
			s.insert(int(v - 1))
		}
	}
	for _, r := range s.linear {
		s.insert(int(r))
	}
	s.linear = s.linear[:0]
}

// reset empties the set, keeping the linear part's capacity; a hashed part is dropped (a
// large group's set is not worth keeping for the next, maybe small, collective).
func (s *rankSet) reset() {
	s.linear = s.linear[:0]
	s.slots = nil
	s.n = 0
}

func hashRank(rank int) int {
	x := uint32(rank) * 0x9e3779b1
	return int(x ^ x>>15)
}
