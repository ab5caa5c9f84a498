package diagnosis

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// selectKth finds what sort.Float64s puts at k, duplicates and NaNs included, at every k of
// arrays short and long.
func TestSelectKthIsTheSortedValue(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + rng.IntN(200)
		if trial%10 == 0 {
			n = 1000 + rng.IntN(3000)
		}
		vals := make([]float64, n)
		for i := range vals {
			switch rng.IntN(10) {
			case 0:
				vals[i] = math.NaN()
			case 1, 2:
				vals[i] = float64(rng.IntN(4))
			default:
				vals[i] = rng.NormFloat64()
			}
		}
		sorted := slices.Clone(vals)
		sort.Float64s(sorted)
		for _, k := range []int{0, (n - 1) / 4, n / 2, n - 1, rng.IntN(n)} {
			got := selectKth(slices.Clone(vals), k)
			if want := sorted[k]; got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
				t.Fatalf("n=%d k=%d: %v, want %v", n, k, got, want)
			}
		}
		if got, want := lowerQuartile(slices.Clone(vals)), sorted[(n-1)/4]; got != want &&
			!(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("lowerQuartile n=%d: %v, want %v", n, got, want)
		}
	}
}
