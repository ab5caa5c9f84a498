package barrierskewprocessor

import (
	"context"
	"fmt"
	"math"
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
	// afterMore: after twice as many again (four times in all past the bounds).
	baseline, afterBound, afterTwice, afterMore uint64
	pending, buffered                           int
	evicted                                     int64
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
			// What the release ticker does every release_interval (not started here): the
			// step analysis keeps at most max_open_steps steps of a job open.
			p.releaseExpired(context.Background())
		}
	}
	feed(0, maxPending)
	res.afterBound = liveHeap()
	feed(maxPending, 3*maxPending)
	res.afterTwice = liveHeap()
	feed(3*maxPending, 5*maxPending)
	res.afterMore = liveHeap()
	s := p.engine.Stats()
	res.pending, res.buffered, res.evicted = s.Pending, s.BufferedSpans, s.Evicted
	return res
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// TestMemoryIsBoundedByConfig checks, at a scale plain `go test` can afford, that the heap
// stops growing once max_pending is full: feeding twice as many collectives again does not
// raise it by more than 25% plus the engine's free lists (a fixed 3 MB at most, which
// evictions fill), and twice as many more do not move it.
func TestMemoryIsBoundedByConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 50 MB")
	}
	res := fill(t, 256, 32)
	if res.pending != 32 || res.buffered != 32*255 || res.evicted != 128 {
		t.Fatalf("pending %d buffered %d evicted %d, want 32, %d, 128", res.pending,
			res.buffered, res.evicted, 32*255)
	}
	held, again := res.afterBound-res.baseline, int64(res.afterTwice)-int64(res.baseline)
	const freeListAllowance = 4 << 20
	if float64(again) > 1.25*float64(held)+freeListAllowance {
		t.Errorf("heap grew from %.1f MiB to %.1f MiB after the bounds were reached", mib(held),
			float64(again)/(1<<20))
	}
	// And then it stays: twice as many more move it by at most a tenth of what is held.
	if more := int64(res.afterMore) - int64(res.afterTwice); math.Abs(float64(more)) > 0.1*float64(held)+(1<<20) {
		t.Errorf("heap moved by %+.1f MiB over twice as many more collectives (held %.1f MiB)",
			float64(more)/(1<<20), mib(held))
	}
}

// BenchmarkMemory4096Ranks measures the heap held with max_pending full at 4096 ranks
// (max_pending 64, max_buffered_spans 64*4096 = the default 262144) and shows the bound:
// past the bounds the heap grows by a fixed amount (each collective here is a step of its
// own, and the step analysis keeps up to max_open_steps of them, plus the engine's free
// lists), and then no more. Run with -benchtime 1x.
func BenchmarkMemory4096Ranks(b *testing.B) {
	const ranks, maxPending = 4096, 64
	for range b.N {
		res := fill(b, ranks, maxPending)
		held := res.afterBound - res.baseline
		perSpan := float64(held) / float64(res.buffered)
		fixed := float64(int64(res.afterTwice)-int64(res.afterBound)) / (1 << 20)
		more := float64(int64(res.afterMore)-int64(res.afterTwice)) / (1 << 20)
		b.ReportMetric(mib(held), "MiB_held")
		b.ReportMetric(perSpan, "B/buffered_span")
		b.ReportMetric(more, "MiB_after_4x_more")
		b.Log(fmt.Sprintf("4096 ranks, max_pending=%d full (%d spans buffered, %d evicted): "+
			"live heap %.1f MiB over a same-run baseline of %.1f MiB = %.0f B per buffered span; "+
			"after twice as many collectives again %+.1f MiB (analysis state and free lists), "+
			"after twice as many more %+.1f MiB (target: bounded, |growth| <= 10%% of held: %s); "+
			"bound = max_buffered_spans x %.0f B = %.1f MiB", maxPending, res.buffered,
			res.evicted, mib(held), mib(res.baseline), perSpan, fixed, more,
			map[bool]string{true: "met", false: "MISSED"}[math.Abs(more) <= 0.1*mib(held)],
			perSpan, perSpan*float64(maxPending*ranks)/(1<<20)))
	}
}
