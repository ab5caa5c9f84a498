package traceshapeprocessor

import (
	"context"
	"testing"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/processor/traceshapeprocessor/internal/metadata"
)

// FuzzShapeAccountsForEverySpan feeds malformed and well-formed spans in arbitrary batches,
// with a tiny max_trace_spans so that jobs split and traces fill, and checks that the
// processor never panics and that every span is either forwarded or counted as dropped.
func FuzzShapeAccountsForEverySpan(f *testing.F) {
	for _, seed := range fixture.FuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		batches, spansIn := fixture.FuzzBatches(data)
		cfg := createDefaultConfig()
		cfg.MaxTraceSpans, cfg.SampleRanks, cfg.MaxJobs = 3, 1, 2
		tel := componenttest.NewTelemetry()
		defer func() { _ = tel.Shutdown(context.Background()) }()
		set := processortest.NewNopSettings(metadata.Type)
		set.TelemetrySettings = tel.NewTelemetrySettings()
		sink := new(consumertest.TracesSink)
		p, err := newProcessor(set, cfg, sink)
		if err != nil {
			t.Fatal(err)
		}
		for _, td := range batches {
			if err := p.ConsumeTraces(context.Background(), td); err != nil {
				t.Fatal(err)
			}
		}
		kept := counter(t, tel, "otelcol_processor_traceshape_spans_kept", "")
		dropped := counter(t, tel, "otelcol_processor_traceshape_spans_dropped", "")
		if int64(sink.SpanCount()) != kept || kept+dropped != int64(spansIn) {
			t.Fatalf("%d spans in, %d out, counted %d kept + %d dropped", spansIn,
				sink.SpanCount(), kept, dropped)
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
