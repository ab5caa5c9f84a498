package barrierskewprocessor

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor/internal/metadata"
)

// liveHeap is the heap in use by reachable objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// fillResult is the live heap after feeding never-completing collectives.
type fillResult struct {
	baseline, afterBound, afterTwice uint64
	pending, buffered                int
	evicted                          int64
}

// fill feeds `rounds` collectives of `ranks` members of which one never arrives, so nothing
// completes and the processor must rely on max_pending / max_buffered_spans. It measures the
// live heap once the bounds are reached and again after twice as many collectives.
func fill(t testing.TB, ranks, maxPending int) fillResult {
	cfg := createDefaultConfig()
	// Steady state: not just after a (re)start (see startup_grace).
	cfg.StartupGrace = 0
	cfg.MaxPending = maxPending
	cfg.MaxBufferedSpans = maxPending * ranks
	cfg.WaitTimeout = time.Hour
	p, err := newProcessor(processortest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop(),
		&fakeClock{now: time.Unix(1_800_000_000, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Shutdown(context.Background()) }()
	members := fixture.Ranks(ranks)
	var res fillResult
	res.baseline = liveHeap()
	feed := func(from, to int) {
		for seq := from; seq < to; seq++ {
			b := fixture.NewBatch()
			for _, r := range members[1:] {
				b.AddCollective(r, fixture.Collective{PGSize: ranks, Seq: int64(seq),
					Step: int64(seq), TrueEnd: fixture.Base.Add(time.Duration(seq) * time.Second),
					Duration: time.Duration(1+r.Rank%7) * time.Millisecond})
			}
			if err := p.ConsumeTraces(context.Background(), b.Traces); err != nil {
				t.Fatal(err)
			}
		}
	}
	feed(0, maxPending)
	res.afterBound = liveHeap()
	feed(maxPending, 3*maxPending)
	res.afterTwice = liveHeap()
	s := p.engine.Stats()
	res.pending, res.buffered, res.evicted = s.Pending, s.BufferedSpans, s.Evicted
	return res
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// TestMemoryIsBoundedByConfig checks, at a scale plain `go test` can afford, that the heap
// stops growing once max_pending is full: feeding twice as many collectives again does not
// raise it by more than 25% plus the engine's free lists (a fixed 3 MB at most, which
// evictions fill).
func TestMemoryIsBoundedByConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 50 MB")
	}
	res := fill(t, 256, 32)
	if res.pending != 32 || res.buffered != 32*255 || res.evicted != 64 {
		t.Fatalf("pending %d buffered %d evicted %d, want 32, %d, 64", res.pending,
			res.buffered, res.evicted, 32*255)
	}
	held, again := res.afterBound-res.baseline, int64(res.afterTwice)-int64(res.baseline)
	const freeListAllowance = 4 << 20
	if float64(again) > 1.25*float64(held)+freeListAllowance {
		t.Errorf("heap grew from %.1f MiB to %.1f MiB after the bounds were reached", mib(held),
			float64(again)/(1<<20))
	}
}

// BenchmarkMemory4096Ranks measures the heap held with max_pending full at 4096 ranks
// (max_pending 64, max_buffered_spans 64*4096 = the default 262144) and shows the bound:
// twice as many collectives again leave the heap where it was. Run with -benchtime 1x.
func BenchmarkMemory4096Ranks(b *testing.B) {
	const ranks, maxPending = 4096, 64
	for range b.N {
		res := fill(b, ranks, maxPending)
		held := res.afterBound - res.baseline
		perSpan := float64(held) / float64(res.buffered)
		growth := (float64(res.afterTwice) - float64(res.baseline)) / float64(held)
		b.ReportMetric(mib(held), "MiB_held")
		b.ReportMetric(perSpan, "B/buffered_span")
		b.ReportMetric(growth, "x_after_2x_more")
		b.Log(fmt.Sprintf("4096 ranks, max_pending=%d full (%d spans buffered, %d evicted): "+
			"live heap %.1f MiB over a same-run baseline of %.1f MiB = %.0f B per buffered span; "+
			"after twice as many collectives again %.2fx (target: bounded, <= 1.25x); "+
			"bound = max_buffered_spans x %.0f B = %.1f MiB", maxPending, res.buffered,
			res.evicted, mib(held), mib(res.baseline), perSpan, growth, perSpan,
			perSpan*float64(maxPending*ranks)/(1<<20)))
	}
}
