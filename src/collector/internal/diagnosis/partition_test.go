package diagnosis_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// exhaustive is the reference: every composition of len(costs) into stages parts, the least
// (slowest stage, sum of squares within a relative 1e-9, counts in lexicographic order).
func exhaustive(costs []float64, stages int) []int {
	var best []int
	var bestMax, bestSq float64
	var walk func(at int, counts []int)
	walk = func(at int, counts []int) {
		left := stages - len(counts)
		if left == 0 {
			if at != len(costs) {
				return
			}
			sc := diagnosis.StageCosts(costs, counts)
			mx, sq := 0.0, 0.0
			for _, c := range sc {
				mx, sq = max(mx, c), sq+c*c
			}
			better := best == nil || mx < bestMax*(1-1e-9) ||
				(mx <= bestMax*(1+1e-9) && (sq < bestSq*(1-1e-9) ||
					(sq <= bestSq*(1+1e-9) && slices.Compare(counts, best) < 0)))
			if better {
				best, bestMax, bestSq = slices.Clone(counts), mx, sq
			}
			return
		}
		for n := 1; at+n <= len(costs)-(left-1); n++ {
			walk(at+n, append(counts, n))
		}
	}
	walk(0, nil)
	return best
}

func TestBestPartitionEqualsExhaustiveSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, shape := range [][2]int{{4, 2}, {6, 3}, {8, 4}, {10, 4}, {12, 3}, {13, 5}, {17, 4}} {
		for trial := range 25 {
			costs := make([]float64, shape[0])
			for i := range costs {
				switch trial % 3 {
				case 0: // small integers: many ties
					costs[i] = float64(1 + rng.IntN(4))
				case 1:
					costs[i] = rng.Float64()
				default: // equal layers and a heavy head
					costs[i] = 1
					if i == len(costs)-1 {
						costs[i] = 1 + 2*rng.Float64()
					}
				}
			}
			got := diagnosis.BestPartition(costs, shape[1])
			want := exhaustive(costs, shape[1])
			if !slices.Equal(got, want) {
				t.Errorf("%v into %d: got %v (%v), exhaustive %v (%v)", costs, shape[1], got,
					diagnosis.StageCosts(costs, got), want, diagnosis.StageCosts(costs, want))
			}
		}
	}
	if diagnosis.BestPartition([]float64{1, 2}, 3) != nil || diagnosis.BestPartition(nil, 1) != nil {
		t.Error("fewer layers than stages must give no partition")
	}
}

// TestBestPartitionSharedCases reads the cases Python's best_partition is tested on too
// (tests/data/partition/cases.json).
func TestBestPartitionSharedCases(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "tests", "data", "partition",
		"cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Cases []struct {
			Name   string
			Stages int
			Costs  []float64
			Layers []int
		}
	}
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range table.Cases {
		if got := diagnosis.BestPartition(c.Costs, c.Stages); !slices.Equal(got, c.Layers) {
			t.Errorf("%s: got %v, want %v", c.Name, got, c.Layers)
		}
	}
}

// layered is a pipeline job whose ranks send a pipeline.layers profile every `every` steps:
// stage s holds perStage[s] layers, each costing its stage's forward and backward per
// microbatch spread evenly over its layers.
type layered struct {
	*fixture.Pipeline
	perStage []int
	every    int
	// spike, when set, multiplies one layer's time in one profile (a descheduled layer).
	spike func(step, stage, replica, layer int) float64
}

func (l *layered) Step(step int) []*fixture.Batch {
	batches := l.Pipeline.Step(step)
	if l.every <= 0 || step%l.every != 0 {
		return batches
	}
	for stage, n := range l.perStage {
		f := l.Forward[stage].Seconds() * float64(l.Microbatches) / float64(n)
		b := l.Backward[stage].Seconds() * float64(l.Microbatches) / float64(n)
		for d := range l.Replicas {
			r := l.RankOf(stage, d)
			span := batches[r].AddPhase(l.Ranks[r], semconv.SpanPipelineLayers, int64(step),
				fixture.Base, time.Millisecond)
			a := span.Attributes()
			names := a.PutEmptySlice(semconv.AttrPipelineLayers)
			fw := a.PutEmptySlice(semconv.AttrPipelineLayerForward)
			bw := a.PutEmptySlice(semconv.AttrPipelineLayerBackward)
			for i := range n {
				k := 1.0
				if l.spike != nil {
					k = l.spike(step, stage, d, i)
				}
				names.AppendEmpty().SetStr(fmt.Sprintf("stage%d.layer%d", stage, i))
				fw.AppendEmpty().SetDouble(f * k)
				bw.AppendEmpty().SetDouble(b * k)
			}
			a.PutInt(semconv.AttrPipelineMicrobatches, int64(l.Microbatches))
		}
	}
	return batches
}

// TestHeavyStageGetsThePartitionItsLayersAdvise: 4 stages of 4 layers of equal cost, the
// last stage's layers 1.4x as long (a loss head); with profiles, the stage_imbalance names
// the advised partition of the 16 layers (the least slowest stage, as exhaustive search
// finds it, then the shortest 1F1B replay), its split points and a
// replayed saving close to what the stages' new times give; without profiles the fix is as
// before.
func TestHeavyStageGetsThePartitionItsLayersAdvise(t *testing.T) {
	for _, c := range []struct {
		name  string
		every int
		spike bool
	}{{"no-profiles", 0, false}, {"every-5", 5, false}, {"every-5-one-spike", 5, true}} {
		every := c.every
		t.Run(c.name, func(t *testing.T) {
			p := fixture.NewPipeline(4, 2, 8, 1, 11)
			p.Forward[3] = p.Forward[3] * 14 / 10
			p.Backward[3] = p.Backward[3] * 14 / 10
			job := &layered{Pipeline: p, perStage: []int{4, 4, 4, 4}, every: every}
			if c.spike {
				// The latest profile of the advising rank of stage 0 holds one layer 10x
				// as long: the median of its last three profiles leaves it out.
				job.spike = func(step, stage, replica, layer int) float64 {
					if step == 20 && stage == 0 && replica == 0 && layer == 1 {
						return 10
					}
					return 1
				}
			}
			results := run(t, job, join.DefaultConfig(), 24)
			last := results[len(results)-1]
			if len(last.Imbalances) != 1 || last.Imbalances[0].Stage != 3 {
				t.Fatalf("imbalances %+v, roots %+v", last.Imbalances, last.RootCauses)
			}
			im := last.Imbalances[0]
			if every == 0 {
				if im.Partition != nil || strings.Contains(im.Fix, "split points") {
					t.Fatalf("no profiles, yet a partition: %+v %q", im.Partition, im.Fix)
				}
				return
			}
			if im.Partition == nil {
				t.Fatalf("no partition: fix %q", im.Fix)
			}
			var costs, fwd, bwd []float64
			for s, n := range job.perStage {
				for range n {
					f := p.Forward[s].Seconds() * float64(p.Microbatches) / float64(n)
					b := p.Backward[s].Seconds() * float64(p.Microbatches) / float64(n)
					fwd, bwd, costs = append(fwd, f), append(bwd, b), append(costs, f+b)
				}
			}
			// The advice has the least slowest stage (exhaustive search agrees) and, of the
			// partitions that have it, the shortest 1F1B replay.
			least := slices.Max(diagnosis.StageCosts(costs, exhaustive(costs, 4)))
			want := diagnosis.AdvisePartition(fwd, bwd, 4, p.Microbatches, 0)
			adv := im.Partition
			if !slices.Equal(adv.Layers, want) || !slices.Equal(adv.Current, []int{4, 4, 4, 4}) {
				t.Fatalf("partition %v (now %v), advised from the layers' times %v", adv.Layers,
					adv.Current, want)
			}
			if mx := slices.Max(diagnosis.StageCosts(costs, adv.Layers)); mx > least*(1+1e-9) {
				t.Fatalf("partition %v's slowest stage %v, exhaustive search's %v", adv.Layers,
					mx, least)
			}
			if got := adv.SplitPoints(); len(got) != 3 {
				t.Fatalf("split points %v", got)
			}
			points := joinInts(adv.SplitPoints())
			if !strings.Contains(im.Fix, "split points "+points) ||
				!strings.Contains(im.Fix, "instead of 4/4/4/4") {
				t.Errorf("fix %q does not give split points %s", im.Fix, points)
			}
			// The slowest stage's layer time falls from 1.4 to the advice's max; the 1F1B
			// step with 8 microbatches saves most of that difference per microbatch.
			slowBefore, slowAfter := slices.Max(adv.Before), slices.Max(adv.After)
			if slowAfter >= slowBefore {
				t.Fatalf("slowest stage %v -> %v", adv.Before, adv.After)
			}
			ideal := slowBefore - slowAfter
			if adv.Saving < 0.5*ideal || adv.Saving > 1.5*ideal {
				t.Errorf("replayed saving %.4f s, the slowest stage's time falls by %.4f s",
					adv.Saving, ideal)
			}
			t.Logf("fix: %s; before %v after %v saving %.4f of %.4f", im.Fix, adv.Before,
				adv.After, adv.Saving, last.Duration)
		})
	}
}

func joinInts(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}

// BenchmarkBestPartition: the partition of a deep pipeline's layers (computed once per
// profile update, not per step).
func BenchmarkBestPartition(b *testing.B) {
	for _, shape := range [][2]int{{64, 8}, {256, 16}, {1024, 32}} {
		b.Run(fmt.Sprintf("%dx%d", shape[0], shape[1]), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			costs := make([]float64, shape[0])
			for i := range costs {
				costs[i] = 1 + rng.Float64()
			}
			for b.Loop() {
				diagnosis.BestPartition(costs, shape[1])
			}
		})
	}
}

// A partition's fix text fits the summaries' 256-character strings however many stages: past
// that the counts are left to training.imbalance.partition.
func TestPartitionFixTextStaysReadable(t *testing.T) {
	share := func(s float64) float64 { return 100 * s }
	head := "stage 3 does 40% more work than the mean stage, and the step would be 12% shorter " +
		"with it as fast as the others"
	for _, stages := range []int{4, 8, 64} {
		p := &diagnosis.Partition{Saving: 0.09}
		for s := range stages {
			p.Layers = append(p.Layers, 10+s%3)
			p.Current = append(p.Current, 11)
		}
		text := diagnosis.PartitionText(head, p, share, " once each global batch is split by work")
		if len(text) > 256 {
			t.Errorf("%d stages: %d characters: %q", stages, len(text), text)
		}
		if !strings.Contains(text, "save about 9% of the step") &&
			!strings.Contains(text, "saves about 9% of the step") {
			t.Errorf("%d stages: no saving in %q", stages, text)
		}
		if stages == 4 && !strings.Contains(text, "split points 10,21,33") {
			t.Errorf("4 stages: %q", text)
		}
	}
}

// TestAdvisePartitionSharedCases: the advice and its replayed step on the cases Python's
// advise_partition and replay_1f1b are tested on too (tests/data/partition/cases.json).
func TestAdvisePartitionSharedCases(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "tests", "data", "partition",
		"cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Advice []struct {
			Name              string
			Stages            int
			Microbatches      int
			Forward, Backward []float64
			Layers            []int
			Replay            float64
		}
	}
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Advice) == 0 {
		t.Fatal("no advice cases")
	}
	for _, c := range table.Advice {
		got := diagnosis.AdvisePartition(c.Forward, c.Backward, c.Stages, c.Microbatches, 0)
		if !slices.Equal(got, c.Layers) {
			t.Errorf("%s: got %v, want %v", c.Name, got, c.Layers)
			continue
		}
		f, b := diagnosis.StageCosts(c.Forward, got), diagnosis.StageCosts(c.Backward, got)
		for i := range f {
			f[i] /= float64(c.Microbatches)
			b[i] /= float64(c.Microbatches)
		}
		if r := diagnosis.Replay1F1B(f, b, c.Microbatches, 0); math.Abs(r-c.Replay) > 1e-9 {
			t.Errorf("%s: replay %v, want %v", c.Name, r, c.Replay)
		}
	}
}

// TestAdvisePartitionIsTheShortestReplayOfTheTies: against every composition, the advice has
// the least slowest stage and, among those, the shortest 1F1B replay; equal stages replay in
// (M + P - 1)(f + b).
func TestAdvisePartitionIsTheShortestReplayOfTheTies(t *testing.T) {
	rng := rand.New(rand.NewPCG(46, 1))
	for _, shape := range [][2]int{{6, 3}, {8, 4}, {10, 4}, {12, 3}, {17, 4}} {
		for trial := range 12 {
			n, stages := shape[0], shape[1]
			fwd, bwd := make([]float64, n), make([]float64, n)
			for i := range n {
				fwd[i] = float64(1 + rng.IntN(3))
				if trial%2 == 1 {
					fwd[i] = rng.Float64()
				}
				bwd[i] = 2 * fwd[i]
			}
			mb := 2 + rng.IntN(8)
			costs := make([]float64, n)
			for i := range n {
				costs[i] = fwd[i] + bwd[i]
			}
			replay := func(layers []int) float64 {
				f, b := diagnosis.StageCosts(fwd, layers), diagnosis.StageCosts(bwd, layers)
				for i := range f {
					f[i] /= float64(mb)
					b[i] /= float64(mb)
				}
				return diagnosis.Replay1F1B(f, b, mb, 0)
			}
			got := diagnosis.AdvisePartition(fwd, bwd, stages, mb, 0)
			least := slices.Max(diagnosis.StageCosts(costs, diagnosis.BestPartition(costs, stages)))
			if mx := slices.Max(diagnosis.StageCosts(costs, got)); mx > least*(1+1e-9) {
				t.Fatalf("%v: advice %v's slowest stage %v above the least %v", costs, got, mx, least)
			}
			var walk func(at int, counts []int)
			walk = func(at int, counts []int) {
				left := stages - len(counts)
				if left == 0 {
					if at == n && slices.Max(diagnosis.StageCosts(costs, counts)) <= least*(1+1e-9) &&
						replay(counts) < replay(got)*(1-1e-9) {
						t.Errorf("%v (mb %d): %v replays %v, shorter than the advice %v's %v",
							costs, mb, counts, replay(counts), got, replay(got))
					}
					return
				}
				for k := 1; at+k <= n-(left-1); k++ {
					walk(at+k, append(counts, k))
				}
			}
			walk(0, nil)
		}
	}
	if r := diagnosis.Replay1F1B([]float64{1, 1, 1, 1}, []float64{2, 2, 2, 2}, 8, 0); r != 33 {
		t.Errorf("equal stages: %v, want (8 + 4 - 1) x 3 = 33", r)
	}
}
