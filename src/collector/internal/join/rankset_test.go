package join

import (
	"math/rand/v2"
	"testing"
)

func TestRankSetAgreesWithAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 31, 32, 33, 200, 5000} {
		var s rankSet
		want := map[int]bool{}
		for len(want) < n {
			r := rng.IntN(1 << 20)
			if want[r] != s.has(r) {
				t.Fatalf("n=%d: has(%d) = %v before adding", n, r, s.has(r))
			}
			if !want[r] {
				s.add(r)
				want[r] = true
			}
		}
		for r := range want {
			if !s.has(r) {
				t.Fatalf("n=%d: lost rank %d", n, r)
			}
		}
		for range 1000 {
			if r := rng.IntN(1 << 20); s.has(r) != want[r] {
				t.Fatalf("n=%d: has(%d) = %v", n, r, s.has(r))
			}
		}
		s.reset()
		for r := range want {
			if s.has(r) {
				t.Fatalf("n=%d: rank %d after reset", n, r)
			}
		}
	}
}

// TestMemoryFollowsMembersNotRankNumbers: a span claiming a huge rank in a small group
// costs what any member costs (a bitset indexed by rank cost 128 KiB for rank 1048575).
func TestMemoryFollowsMembersNotRankNumbers(t *testing.T) {
	var s rankSet
	s.add(1<<20 - 1)
	s.add(7)
	if !s.has(1<<20-1) || !s.has(7) || s.has(8) {
		t.Fatal("membership wrong")
	}
	if size := cap(s.linear)*4 + cap(s.slots)*4; size > 64 {
		t.Errorf("two members take %d bytes", size)
	}
}
