package diagnosis

import "testing"

// rankTable means what a map[int32]V means: values by rank, zero and false where unset, a
// count of the ranks set; ranks from maxDenseRank on and negative ones go to its map.
func TestRankTableIsAMapByRank(t *testing.T) {
	var tab rankTable[int64]
	want := map[int32]int64{}
	for i, r := range []int32{3, 0, 3, 70, -1, maxDenseRank - 1, maxDenseRank, 1 << 20, 70, 2} {
		tab.set(r, int64(i))
		want[r] = int64(i)
	}
	if tab.len() != len(want) {
		t.Fatalf("len %d, want %d", tab.len(), len(want))
	}
	for _, r := range []int32{-2, -1, 0, 1, 2, 3, 4, 69, 70, 71, maxDenseRank - 1, maxDenseRank,
		1<<20 - 1, 1 << 20} {
		v, ok := tab.get(r)
		w, wok := want[r]
		if v != w || ok != wok || tab.at(r) != w {
			t.Errorf("rank %d: %d %v (at %d), want %d %v", r, v, ok, tab.at(r), w, wok)
		}
	}
}
