package barrierskewprocessor

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor/internal/metadata"
)

// FuzzProcessorForwardsEverySpanOnce feeds malformed and well-formed spans in arbitrary
// batches and checks that the processor never panics, never drops or duplicates a span
// (every span comes out exactly once by shutdown), and holds nothing afterwards.
func FuzzProcessorForwardsEverySpanOnce(f *testing.F) {
	for _, seed := range fixture.FuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		batches, spansIn := fixture.FuzzBatches(data)
		cfg := createDefaultConfig()
		// Steady state: not just after a (re)start (see startup_grace).
		cfg.StartupGrace = 0
		cfg.MaxPending = 3
		cfg.MaxBufferedSpans = 8
		cfg.WaitTimeout = time.Second
		cfg.FlagK, cfg.FlagWindow, cfg.ClearSteps = 1, 2, 1
		sink := new(consumertest.TracesSink)
		clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
		p, err := newProcessor(processortest.NewNopSettings(metadata.Type), cfg, sink, clock)
		if err != nil {
			t.Fatal(err)
		}
		for i, td := range batches {
			if err := p.ConsumeTraces(context.Background(), td); err != nil {
				t.Fatal(err)
			}
			if i%2 == 1 {
				clock.Advance(time.Second)
				p.releaseExpired(context.Background())
			}
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Every span comes out once, plus the summaries of the steps analyzed.
		summaries := 0
		for _, td := range sink.AllTraces() {
			for _, s := range fixture.Spans(td) {
				if s.Span.Name() == semconv.SpanStepSummary {
					summaries++
				}
			}
		}
		if out := sink.SpanCount() - summaries; out != spansIn {
			t.Fatalf("%d spans in, %d out", spansIn, out)
		}
		if s := p.engine.Stats(); s.Pending != 0 || s.BufferedSpans != 0 {
			t.Fatalf("engine holds %d collectives, %d spans after shutdown", s.Pending,
				s.BufferedSpans)
		}
	})
}
