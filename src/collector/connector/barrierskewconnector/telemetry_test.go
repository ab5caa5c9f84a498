package barrierskewconnector

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector/internal/metadatatest"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// TestOwnTelemetry reads every instrument metadata.yaml declares through the generated
// assertions, so a metric renamed or retyped there fails here.
func TestOwnTelemetry(t *testing.T) {
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	cfg := createDefaultConfig()
	// Steady state: not just after a (re)start (see startup_grace).
	cfg.StartupGrace = 0
	cfg.MetricsFlushInterval = time.Hour
	cfg.WaitTimeout = time.Second
	cfg.MaxSeries = 2
	clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
	conn, err := newConnector(metadatatest.NewSettings(tel), cfg, new(consumertest.MetricsSink),
		clock)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Shutdown(context.Background()) })

	ranks := fixture.Ranks(4)
	// Step 0 completes (more series than max_series); collective 1 waits for rank 3; one
	// span lacks its sequence number; one was annotated upstream.
	if err := conn.ConsumeTraces(context.Background(),
		stepBatch(ranks, 0, -1, "", 0)); err != nil {
		t.Fatal(err)
	}
	b := fixture.NewBatch()
	for _, r := range ranks[:3] {
		b.AddCollective(r, fixture.Collective{PGSize: 4, Seq: 1, Step: 1, TrueEnd: trueEnd,
			Duration: time.Millisecond})
	}
	noSeq := b.AddCollective(ranks[0], fixture.Collective{PGSize: 4, Seq: 2, Step: 1,
		TrueEnd: trueEnd, Duration: time.Millisecond})
	noSeq.Attributes().Remove(semconv.AttrCollectiveSeq)
	annotated := b.AddCollective(ranks[0], fixture.Collective{PGSize: 4, Seq: 3, Step: 1,
		TrueEnd: trueEnd, Duration: time.Millisecond})
	annotated.Attributes().PutDouble(semconv.AttrBarrierSkew, 0)
	if err := conn.ConsumeTraces(context.Background(), b.Traces); err != nil {
		t.Fatal(err)
	}

	one := func(v int64, kv ...attribute.KeyValue) []metricdata.DataPoint[int64] {
		return []metricdata.DataPoint[int64]{{Value: v, Attributes: attribute.NewSet(kv...)}}
	}
	released := func(complete, incomplete int64) []metricdata.DataPoint[int64] {
		return append(one(complete, attribute.String("outcome", "complete")),
			one(incomplete, attribute.String("outcome", "incomplete"))...)
	}
	ignore := metricdatatest.IgnoreTimestamp()
	metadatatest.AssertEqualConnectorBarrierskewPendingCollectives(t, tel, one(1), ignore)
	metadatatest.AssertEqualConnectorBarrierskewBufferedSpans(t, tel, one(3), ignore)
	metadatatest.AssertEqualConnectorBarrierskewPhaseEntries(t, tel,
		one(int64(conn.snapshot().Engine.Analysis.PhaseEntries)), ignore)
	metadatatest.AssertEqualConnectorBarrierskewCollectivesReleased(t, tel, released(1, 0),
		ignore)
	metadatatest.AssertEqualConnectorBarrierskewCollectivesEvicted(t, tel, one(0), ignore)
	metadatatest.AssertEqualConnectorBarrierskewSpansMalformed(t, tel,
		one(1, attribute.String("reason", "missing:"+semconv.AttrCollectiveSeq)), ignore)
	metadatatest.AssertEqualConnectorBarrierskewSpansPassedThrough(t, tel, one(1), ignore)
	dropped := conn.snapshot().SeriesDropped
	if dropped == 0 {
		t.Fatal("max_series dropped nothing")
	}
	metadatatest.AssertEqualConnectorBarrierskewSeriesDropped(t, tel, one(dropped), ignore)

	// Rank 3 delivered spans a moment ago (step 0): alive, collective 1 waits on for it; once
	// it has been silent past wait_timeout the flush releases collective 1 incomplete.
	clock.Advance(time.Second)
	if err := conn.flush(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	metadatatest.AssertEqualConnectorBarrierskewPendingCollectives(t, tel, one(1), ignore)
	clock.Advance(time.Second + time.Millisecond)
	if err := conn.flush(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	metadatatest.AssertEqualConnectorBarrierskewPendingCollectives(t, tel, one(0), ignore)
	metadatatest.AssertEqualConnectorBarrierskewCollectivesReleased(t, tel, released(1, 1),
		ignore)
}
