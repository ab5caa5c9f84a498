package join

import (
	"math/rand/v2"
	"testing"
)

// A liveTable holds what a map[int32]int64 would: each rank's last time, whether a set added
// a rank, the count, and every rank once in each; with the dense budget spent or not.
func TestLiveTableIsAMapByRank(t *testing.T) {
	for _, budget := range []int{0, 100, 5000, maxDenseLive} {
		rng := rand.New(rand.NewPCG(7, uint64(budget)))
		var tab liveTable
		want := map[int32]int64{}
		left := budget
		for i := range 20000 {
			var r int32
			switch rng.IntN(4) {
			case 0:
				r = int32(rng.IntN(70000))
			case 1:
				r = int32(rng.IntN(1 << 20))
			default:
				r = int32(rng.IntN(300))
			}
			_, had := want[r]
			want[r] = int64(i)
			if added := tab.set(r, int64(i), &left); added == had {
				t.Fatalf("budget %d: set(%d) added %v, had %v", budget, r, added, had)
			}
			if left < 0 {
				t.Fatalf("budget %d overspent: %d", budget, left)
			}
		}
		if tab.len() != len(want) {
			t.Fatalf("budget %d: len %d, want %d", budget, tab.len(), len(want))
		}
		seen := map[int32]bool{}
		tab.each(func(r int32, v int64) bool {
			if seen[r] || want[r] != v {
				t.Fatalf("budget %d: each gave rank %d (%d) twice or wrong, want %d", budget, r, v,
					want[r])
			}
			seen[r] = true
			return true
		})
		if len(seen) != len(want) {
			t.Fatalf("budget %d: each gave %d ranks, want %d", budget, len(seen), len(want))
		}
		for r := int32(-1); r < 1000; r++ {
			v, ok := tab.get(r)
			w, wok := want[r]
			if v != w || ok != wok {
				t.Fatalf("budget %d: get(%d) = %d %v, want %d %v", budget, r, v, ok, w, wok)
			}
		}
	}
}
