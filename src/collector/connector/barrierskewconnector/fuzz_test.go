package barrierskewconnector

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/collector/connector/connectortest"
	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector/internal/metadata"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
)

// FuzzConnectorNeverPanics feeds malformed, well-formed and falsely "annotated" spans and
// checks that the connector never panics, emits well-formed metrics, and holds nothing after
// shutdown.
func FuzzConnectorNeverPanics(f *testing.F) {
	for _, seed := range fixture.FuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		batches, _ := fixture.FuzzBatches(data)
		cfg := createDefaultConfig()
		// Steady state: not just after a (re)start (see startup_grace).
		cfg.StartupGrace = 0
		cfg.MaxPending = 3
		cfg.MaxBufferedSpans = 8
		cfg.MaxSeries = 16
		cfg.DedupWindow = 4
		cfg.FlagK, cfg.FlagWindow, cfg.ClearSteps = 1, 2, 1
		sink := new(consumertest.MetricsSink)
		clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
		c, err := newConnector(connectortest.NewNopSettings(metadata.Type), cfg, sink, clock)
		if err != nil {
			t.Fatal(err)
		}
		for _, td := range batches {
			if err := c.ConsumeTraces(context.Background(), td); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Second)
			if err := c.flush(context.Background(), false); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, md := range sink.AllMetrics() {
			rms := md.ResourceMetrics()
			for i := range rms.Len() {
				ms := rms.At(i).ScopeMetrics().At(0).Metrics()
				for j := range ms.Len() {
					if ms.At(j).Name() == "" {
						t.Fatal("metric without a name")
					}
				}
			}
		}
		if s := c.engine.Stats(); s.Pending != 0 || s.BufferedSpans != 0 {
			t.Fatalf("engine holds %d collectives after shutdown", s.Pending)
		}
	})
}
