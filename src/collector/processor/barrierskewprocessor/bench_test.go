package barrierskewprocessor

import (
	"context"
	"runtime"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor/internal/metadata"
)

// benchBatches builds n batches, each one complete collective of `ranks` members (one span
// per rank, each rank its own resource, as OTLP from the ranks arrives). When passThrough is
// set the spans are named "forward", which the processor forwards untouched: the baseline.
func benchBatches(ranks, n int, passThrough bool) []ptrace.Traces {
	members := fixture.Ranks(ranks)
	out := make([]ptrace.Traces, n)
	for i := range out {
		b := fixture.NewBatch()
		for _, r := range members {
			s := b.AddCollective(r, fixture.Collective{PGSize: ranks, Seq: int64(i),
				Step: int64(i / 4), TrueEnd: fixture.Base.Add(time.Duration(i) * time.Millisecond),
				Duration: time.Duration(1+r.Rank%5) * time.Millisecond})
			if passThrough {
				s.SetName(semconv.SpanForward)
			}
		}
		out[i] = b.Traces
	}
	return out
}

// spansPerSecond returns the rate and the heap allocations per span of ConsumeTraces alone
// (the fixture is built outside the measured region).
func spansPerSecond(b *testing.B, ranks int, passThrough bool) (rate, allocsPerSpan float64) {
	const batches = 64
	p, err := newProcessor(processortest.NewNopSettings(metadata.Type), createDefaultConfig(),
		consumertest.NewNop(), realClock{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = p.Shutdown(context.Background()) }()
	spans := 0
	var elapsed time.Duration
	var mallocs uint64
	var before, after runtime.MemStats
	for done := 0; done < b.N; done += batches {
		// ConsumeTraces takes ownership of a batch, so each lap uses fresh copies, built
		// outside the timed region.
		input := benchBatches(ranks, batches, passThrough)
		for i := range input {
			for _, s := range fixture.Spans(input[i]) {
				s.Span.Attributes().PutInt(semconv.AttrCollectiveSeq, int64(done+i))
			}
		}
		counts := make([]int, len(input))
		for i, td := range input {
			counts[i] = td.SpanCount()
		}
		runtime.ReadMemStats(&before)
		start := time.Now()
		for i, td := range input {
			spans += counts[i]
			if err := p.ConsumeTraces(context.Background(), td); err != nil {
				b.Fatal(err)
			}
		}
		elapsed += time.Since(start)
		runtime.ReadMemStats(&after)
		mallocs += after.Mallocs - before.Mallocs
	}
	return float64(spans) / elapsed.Seconds(), float64(mallocs) / float64(spans)
}

// BenchmarkProcessor measures collective spans per second through ConsumeTraces (pdata in,
// annotated pdata out), against the processor forwarding the same number of non-collective
// spans in the same run. b.N counts batches of one 64-rank collective.
func BenchmarkProcessor(b *testing.B) {
	// B/op and allocs/op include building the fixture; allocs/span is ConsumeTraces alone.
	b.ReportAllocs()
	baseline, _ := spansPerSecond(b, 64, true)
	joined, allocs := spansPerSecond(b, 64, false)
	b.ReportMetric(joined, "spans/s")
	b.ReportMetric(joined/baseline, "x_passthrough")
	b.ReportMetric(allocs, "allocs/span")
	b.Logf("processor, 64 ranks: %.0f collective spans/s joined and annotated (%.1f allocs "+
		"per span; one resource copy per rank and output batch); pass-through of the same "+
		"spans in the same run %.0f spans/s (%.2fx). No target of its own: the 1e6/s per core "+
		"target is the join engine's (BenchmarkJoin), without pdata", joined, allocs, baseline,
		joined/baseline)
}
