package barrierskewconnector

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/connector/connectortest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector/internal/metadata"
	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type harness struct {
	conn  *barrierSkewConnector
	sink  *consumertest.MetricsSink
	clock *fakeClock
}

func newHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	cfg := createDefaultConfig()
	// Steady state: not just after a (re)start (see startup_grace).
	cfg.StartupGrace = 0
	// Flushes are driven by the test unless it asks for the ticker.
	cfg.MetricsFlushInterval = time.Hour
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sink := new(consumertest.MetricsSink)
	clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
	conn, err := newConnector(connectortest.NewNopSettings(metadata.Type), cfg, sink, clock)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Shutdown(context.Background()) })
	return &harness{conn: conn, sink: sink, clock: clock}
}

func (h *harness) consume(t *testing.T, td ptrace.Traces) {
	t.Helper()
	if err := h.conn.ConsumeTraces(context.Background(), td); err != nil {
		t.Fatal(err)
	}
}

// flush moves the clock past analysis_delay (so the steps consumed so far are analyzed),
// emits the metrics and returns the latest emission.
func (h *harness) flush(t *testing.T) pmetric.Metrics {
	t.Helper()
	h.clock.Advance(h.conn.cfg.AnalysisDelay + time.Millisecond)
	if err := h.conn.flush(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	all := h.sink.AllMetrics()
	if len(all) == 0 {
		t.Fatal("nothing emitted")
	}
	return all[len(all)-1]
}

// lookupMetric returns the first metric called name, and whether there was one.
func lookupMetric(md pmetric.Metrics, name string) (pmetric.Metric, bool) {
	rms := md.ResourceMetrics()
	for i := range rms.Len() {
		sms := rms.At(i).ScopeMetrics()
		for j := range sms.Len() {
			ms := sms.At(j).Metrics()
			for k := range ms.Len() {
				if ms.At(k).Name() == name {
					return ms.At(k), true
				}
			}
		}
	}
	return pmetric.NewMetric(), false
}

func findMetric(t *testing.T, md pmetric.Metrics, name string) pmetric.Metric {
	t.Helper()
	m, ok := lookupMetric(md, name)
	if !ok {
		t.Fatalf("metric %s not emitted", name)
	}
	conformsToRegistry(t, m)
	return m
}

// conformsToRegistry fails unless the metric is the registry's: its name listed, its unit,
// description and instrument kind as there (a unit changed on one side would rename its
// Prometheus series and break every query).
func conformsToRegistry(t *testing.T, m pmetric.Metric) {
	t.Helper()
	spec, ok := semconv.Metrics[m.Name()]
	if !ok {
		t.Fatalf("metric %s is not in the registry", m.Name())
	}
	kind := map[pmetric.MetricType]string{
		pmetric.MetricTypeGauge: "gauge", pmetric.MetricTypeHistogram: "histogram",
	}[m.Type()]
	if m.Type() == pmetric.MetricTypeSum {
		kind = "updowncounter"
		if m.Sum().IsMonotonic() {
			kind = "counter"
		}
	}
	if m.Unit() != spec.Unit || m.Description() != spec.Description || kind != spec.Instrument {
		t.Errorf("metric %s: %s %q %q, the registry says %s %q %q", m.Name(), kind, m.Unit(),
			m.Description(), spec.Instrument, spec.Unit, spec.Description)
	}
}

func attrs(m pcommon.Map) map[string]any { return m.AsRaw() }

var trueEnd = fixture.Base.Add(time.Second)

// stepBatch is one training step of every rank: train.step, dataloader.fetch, forward, and
// one all_reduce; slowRank spends extra in the phase named slowPhase and arrives late by
// as much.
func stepBatch(ranks []fixture.Rank, step int64, slowRank int, slowPhase string,
	extra time.Duration,
) ptrace.Traces {
	b := fixture.NewBatch()
	start := fixture.Base.Add(time.Duration(step) * 100 * time.Millisecond)
	for _, r := range ranks {
		fetch, forward := 5*time.Millisecond, 20*time.Millisecond
		if r.Rank == slowRank {
			switch slowPhase {
			case semconv.SpanDataloaderFetch:
				fetch += extra
			case semconv.SpanForward:
				forward += extra
			}
		}
		b.AddPhase(r, semconv.SpanDataloaderFetch, step, start, fetch)
		b.AddPhase(r, semconv.SpanForward, step, start.Add(fetch), forward)
		collectiveStart := start.Add(fetch + forward)
		end := start.Add(5*time.Millisecond + 20*time.Millisecond + extra + 3*time.Millisecond)
		b.AddCollective(r, fixture.Collective{PGSize: len(ranks), Seq: step, Step: step,
			TrueEnd: end, Duration: end.Sub(collectiveStart)})
		b.AddPhase(r, semconv.SpanStep, step, start, end.Sub(start)+2*time.Millisecond)
	}
	return b.Traces
}

func TestMetricsFromOwnJoin(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(4)
	// Seven steps: the job's first two (its warm-up) vote for no flag, then K = 4.
	for step := range int64(7) {
		h.consume(t, stepBatch(ranks, step, 2, semconv.SpanForward, 30*time.Millisecond))
	}
	md := h.flush(t)

	skew := findMetric(t, md, semconv.MetricBarrierSkew)
	if skew.Unit() != "s" || skew.Type() != pmetric.MetricTypeHistogram ||
		skew.Histogram().AggregationTemporality() != pmetric.AggregationTemporalityCumulative {
		t.Fatalf("skew metric shape: unit %q type %s", skew.Unit(), skew.Type())
	}
	dp := skew.Histogram().DataPoints().At(0)
	if dp.Count() != 7 || math.Abs(dp.Sum()-0.210) > 1e-6 {
		t.Errorf("skew count %d sum %g, want 7 and 0.210", dp.Count(), dp.Sum())
	}
	want := map[string]any{semconv.AttrJobID: "job", semconv.AttrCollectivePG: "default",
		semconv.AttrCollectiveOp: "all_reduce"}
	if got := attrs(dp.Attributes()); len(got) != 3 || got[semconv.AttrCollectivePG] != "default" ||
		got[semconv.AttrJobID] != "job" || got[semconv.AttrCollectiveOp] != "all_reduce" {
		t.Errorf("skew attributes %v, want %v", got, want)
	}
	if dp.Exemplars().Len() == 0 || dp.Exemplars().At(0).TraceID().IsEmpty() {
		t.Errorf("skew histogram without exemplars")
	}
	// Every member's collective lasts 3 ms after the slow rank's arrival: the transfer.
	transfer := findMetric(t, md, semconv.MetricCollectiveTransfer)
	if transfer.Unit() != "s" || transfer.Histogram().DataPoints().Len() != 1 {
		t.Fatalf("transfer metric: unit %q, %d series", transfer.Unit(),
			transfer.Histogram().DataPoints().Len())
	}
	if tp := transfer.Histogram().DataPoints().At(0); tp.Count() != 7 ||
		math.Abs(tp.Sum()-0.021) > 1e-6 || attrs(tp.Attributes())[semconv.AttrCollectivePG] != "default" {
		t.Errorf("transfer count %d sum %g attrs %v, want 7, 0.021, pg default", tp.Count(),
			tp.Sum(), attrs(tp.Attributes()))
	}

	lateness := findMetric(t, md, semconv.MetricRankLateness).Histogram().DataPoints()
	if lateness.Len() != 4 {
		t.Fatalf("lateness series %d, want 4", lateness.Len())
	}
	for i := range lateness.Len() {
		p := lateness.At(i)
		a := attrs(p.Attributes())
		for _, k := range []string{semconv.AttrJobID, semconv.AttrRank, semconv.AttrHostName,
			semconv.AttrSwitch, semconv.AttrNIC} {
			if _, ok := a[k]; !ok {
				t.Errorf("lateness point lacks %s: %v", k, a)
			}
		}
		wantSum := 0.0
		if a[semconv.AttrRank] == int64(2) {
			wantSum = 0.210
		}
		if math.Abs(p.Sum()-wantSum) > 1e-6 {
			t.Errorf("rank %v lateness sum %g, want %g", a[semconv.AttrRank], p.Sum(), wantSum)
		}
	}

	stragglers := findMetric(t, md, semconv.MetricStraggler).Gauge().DataPoints()
	flagged := 0
	for i := range stragglers.Len() {
		p := stragglers.At(i)
		a := attrs(p.Attributes())
		if p.IntValue() == 1 {
			flagged++
			if a[semconv.AttrRank] != int64(2) || a[semconv.AttrStragglerCause] != semconv.CauseCompute {
				t.Errorf("flagged %v, want rank 2 compute", a)
			}
		}
	}
	if flagged != 1 {
		t.Errorf("%d flagged ranks, want 1", flagged)
	}
	costs := findMetric(t, md, semconv.MetricRankCost).Gauge().DataPoints()
	if costs.Len() != 1 || attrs(costs.At(0).Attributes())[semconv.AttrRank] != int64(2) ||
		costs.At(0).DoubleValue() < 0.010 {
		t.Errorf("rank cost points %d, want rank 2 costing about 30 ms per step", costs.Len())
	}
	slowdown := findMetric(t, md, semconv.MetricJobSlowdown).Gauge().DataPoints()
	if slowdown.Len() != 1 || slowdown.At(0).DoubleValue() <= 1 {
		t.Errorf("job slowdown points %d, want one above 1", slowdown.Len())
	}

	steps := findMetric(t, md, semconv.MetricStepDuration).Histogram().DataPoints()
	if steps.Len() != 4 || steps.At(0).Count() != 7 {
		t.Errorf("step duration series %d count %d, want 4 series of 7", steps.Len(),
			steps.At(0).Count())
	}
	ex := steps.At(0).Exemplars()
	if ex.Len() == 0 {
		t.Fatal("step duration without exemplars")
	}
	found := false
	for step := range int64(7) {
		if ex.At(ex.Len()-1).TraceID() == fixture.TraceID("job", step) {
			found = true
		}
	}
	if !found {
		t.Errorf("exemplar trace ID %s is not a step's trace", ex.At(ex.Len()-1).TraceID())
	}
}

func TestStragglerClearsToZero(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.FlagK, c.FlagWindow, c.ClearSteps = 2, 4, 1 })
	ranks := fixture.Ranks(4)
	// Two warm-up steps that vote for no flag, then K = 2.
	for step := range int64(4) {
		h.consume(t, stepBatch(ranks, step, 1, semconv.SpanDataloaderFetch, 30*time.Millisecond))
	}
	if v := stragglerValue(t, h.flush(t), 1, semconv.CauseData); v != 1 {
		t.Fatalf("rank 1 data straggler gauge %d, want 1", v)
	}
	for step := int64(4); step < 9; step++ {
		h.consume(t, stepBatch(ranks, step, -1, "", 0))
	}
	if v := stragglerValue(t, h.flush(t), 1, semconv.CauseData); v != 0 {
		t.Fatalf("rank 1 gauge %d after it cleared, want 0", v)
	}
}

func stragglerValue(t *testing.T, md pmetric.Metrics, rank int64, cause string) int64 {
	t.Helper()
	points := findMetric(t, md, semconv.MetricStraggler).Gauge().DataPoints()
	for i := range points.Len() {
		a := attrs(points.At(i).Attributes())
		if a[semconv.AttrRank] == rank && a[semconv.AttrStragglerCause] == cause {
			return points.At(i).IntValue()
		}
	}
	t.Fatalf("no straggler point for rank %d cause %s", rank, cause)
	return -1
}

func TestFabricSuspectGaugeForRanksSharingASwitch(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.FlagK, c.FlagWindow = 2, 8 })
	ranks := fixture.Ranks(6)
	for i := range ranks {
		ranks[i].Switch = "leaf0"
		if i == 3 || i == 4 {
			ranks[i].Switch = "leaf9"
		}
	}
	job := fixture.NewJob(ranks, []fixture.Coll{fixture.World(6, 1<<20, 2*time.Millisecond)}, 3)
	// Ranks 3 and 4 (hosts node1 and node2) are slow: they share leaf9.
	job.ExtraForward = func(_, rank int) time.Duration {
		if rank == 3 || rank == 4 {
			return 30 * time.Millisecond
		}
		return 0
	}
	for step := range 6 {
		h.consume(t, fixture.Merge(job.Step(step)))
	}
	md := h.flush(t)
	points := findMetric(t, md, semconv.MetricFabricSuspect).Gauge().DataPoints()
	found := false
	for i := range points.Len() {
		a := attrs(points.At(i).Attributes())
		if a[semconv.AttrSuspectKind] == "switch" && a[semconv.AttrSuspectName] == "leaf9" &&
			points.At(i).IntValue() == 1 {
			found = true
			continue
		}
		t.Errorf("unexpected suspect %v = %d", a, points.At(i).IntValue())
	}
	if !found {
		t.Errorf("switch leaf9 not suspected")
	}
	if costs := findMetric(t, md, semconv.MetricFabricCost).Gauge().DataPoints(); costs.Len() != 1 ||
		costs.At(0).DoubleValue() <= 0 {
		t.Errorf("fabric cost points %d, want leaf9 with a cost", costs.Len())
	}
}

func TestClockOffsetAndIncomplete(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.WaitTimeout = time.Second
		c.ClockOffsetSmoothing = 1
	})
	ranks := fixture.Ranks(4)
	ranks[0].ClockOffset = 2 * time.Second
	ranks[1].ClockOffset = 2 * time.Second
	ranks[2].ClockOffset = -2 * time.Second
	ranks[3].ClockOffset = -2 * time.Second
	h.consume(t, stepBatch(ranks, 0, -1, "", 0))
	// Collective 1 misses rank 3.
	b := fixture.NewBatch()
	for _, r := range ranks[:3] {
		b.AddCollective(r, fixture.Collective{PGSize: 4, Seq: 1, Step: 1, TrueEnd: trueEnd,
			Duration: time.Millisecond})
	}
	h.consume(t, b.Traces)
	h.clock.Advance(time.Second)
	md := h.flush(t)
	offsets := findMetric(t, md, semconv.MetricClockOffset).Gauge().DataPoints()
	if offsets.Len() != 2 {
		t.Fatalf("clock offset series %d, want 2 hosts", offsets.Len())
	}
	for i := range offsets.Len() {
		a := attrs(offsets.At(i).Attributes())
		// The last sample (collective 1: +2, +2, -2) has median +2: node0 reads 0, node1 -4.
		want := map[any]float64{"node0": 0, "node1": -4}[a[semconv.AttrHostName]]
		if math.Abs(offsets.At(i).DoubleValue()-want) > 1e-3 {
			t.Errorf("%v offset %g, want %g", a, offsets.At(i).DoubleValue(), want)
		}
	}
	inc := findMetric(t, md, semconv.MetricCollectiveIncomplete).Sum()
	if !inc.IsMonotonic() || inc.DataPoints().Len() != 1 || inc.DataPoints().At(0).IntValue() != 1 {
		t.Errorf("incomplete counter %v", inc.DataPoints().At(0).IntValue())
	}
	assertMissing(t, md, map[int64]int64{3: 1})
}

func assertMissing(t *testing.T, md pmetric.Metrics, want map[int64]int64) {
	t.Helper()
	points := findMetric(t, md, semconv.MetricRankMissing).Sum().DataPoints()
	got := map[int64]int64{}
	for i := range points.Len() {
		rank, _ := points.At(i).Attributes().Get(semconv.AttrRank)
		got[rank.Int()] = points.At(i).IntValue()
	}
	if len(got) != len(want) {
		t.Fatalf("training.rank.missing %v, want %v", got, want)
	}
	for rank, n := range want {
		if got[rank] != n {
			t.Errorf("training.rank.missing %v, want %v", got, want)
		}
	}
}

// TestMissingRanksFromAnnotations: the processor releases a collective without ranks 1 and
// 3 at shutdown; the connector behind it counts them by rank from the annotations.
func TestMissingRanksFromAnnotations(t *testing.T) {
	h := newHarness(t, nil)
	procSink := new(consumertest.TracesSink)
	procFactory := barrierskewprocessor.NewFactory()
	procCfg := procFactory.CreateDefaultConfig().(*barrierskewprocessor.Config)
	procCfg.WaitTimeout, procCfg.MaxWait, procCfg.StartupGrace = 50*time.Millisecond,
		50*time.Millisecond, 0
	procCfg.ReleaseInterval = 10 * time.Millisecond
	proc, err := procFactory.CreateTraces(context.Background(),
		processortest.NewNopSettings(procFactory.Type()), procCfg, procSink)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	ranks := fixture.Ranks(4)
	add := func(seq int64) {
		b := fixture.NewBatch()
		for _, r := range []fixture.Rank{ranks[0], ranks[2]} {
			b.AddCollective(r, fixture.Collective{PGSize: 4, Seq: seq, Step: 2,
				TrueEnd: trueEnd, Duration: time.Millisecond})
		}
		if err := proc.ConsumeTraces(context.Background(), b.Traces); err != nil {
			t.Fatal(err)
		}
	}
	// Collective 9 times out with ranks 1 and 3 never heard from: they are missing.
	add(9)
	deadline := time.Now().Add(5 * time.Second)
	for procSink.SpanCount() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Collective 10 is still pending when the processor stops: a shutdown says nothing
	// about who was missing.
	add(10)
	if err := proc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, td := range procSink.AllTraces() {
		h.consume(t, td)
	}
	md := h.flush(t)
	assertMissing(t, md, map[int64]int64{1: 1, 3: 1})
	inc := findMetric(t, md, semconv.MetricCollectiveIncomplete).Sum().DataPoints()
	if inc.Len() != 1 || inc.At(0).IntValue() != 1 {
		t.Errorf("incomplete counted %d times for one collective", inc.At(0).IntValue())
	}
}

func TestMaxSeriesIsEnforcedAndCounted(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxSeries = 2 })
	h.consume(t, stepBatch(fixture.Ranks(4), 0, -1, "", 0))
	md := h.flush(t)
	if n := findMetric(t, md, semconv.MetricRankLateness).Histogram().DataPoints().Len(); n != 2 {
		t.Errorf("lateness series %d, want 2 (max_series)", n)
	}
	if h.conn.snapshot().SeriesDropped == 0 {
		t.Errorf("dropped series not counted")
	}
}

func TestFlushTickerEmits(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MetricsFlushInterval = 10 * time.Millisecond })
	h.consume(t, stepBatch(fixture.Ranks(2), 0, -1, "", 0))
	deadline := time.Now().Add(5 * time.Second)
	for len(h.sink.AllMetrics()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if len(h.sink.AllMetrics()) == 0 {
		t.Fatal("flush ticker emitted nothing")
	}
}

// startProcessor starts the real barrierskew processor with its default config, forwarding
// to sink; the caller shuts it down (which releases what it still holds).
func startProcessor(t *testing.T, sink *consumertest.TracesSink) processor.Traces {
	t.Helper()
	factory := barrierskewprocessor.NewFactory()
	proc, err := factory.CreateTraces(context.Background(),
		processor.Settings(processortest.NewNopSettings(factory.Type())),
		factory.CreateDefaultConfig(), sink)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	return proc
}

// TestProcessorThenConnectorJoinsOnce runs the real processor in front of the connector, as
// in the pipeline traces -> barrierskew processor -> barrierskew connector, and checks that
// the connector reads the annotations (its own engine joins nothing) and reports the same
// figures as a connector that joined by itself.
func TestProcessorThenConnectorJoinsOnce(t *testing.T) {
	alone := newHarness(t, nil)
	chained := newHarness(t, nil)
	procSink := new(consumertest.TracesSink)
	proc := startProcessor(t, procSink)
	defer func() { _ = proc.Shutdown(context.Background()) }()

	ranks := fixture.Ranks(4)
	for step := range int64(6) {
		td := stepBatch(ranks, step, 3, semconv.SpanForward, 25*time.Millisecond)
		copyForAlone := ptrace.NewTraces()
		td.CopyTo(copyForAlone)
		alone.consume(t, copyForAlone)
		if err := proc.ConsumeTraces(context.Background(), td); err != nil {
			t.Fatal(err)
		}
	}
	// Shutting the processor down analyzes every open step: their summaries are in the sink.
	if err := proc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, td := range procSink.AllTraces() {
		chained.consume(t, td)
	}
	if s := chained.conn.engine.Stats(); s.Accepted != 0 {
		t.Errorf("connector joined %d spans again behind the processor", s.Accepted)
	}
	if chained.conn.passedThrough != 24 {
		t.Errorf("connector read %d annotated spans, want 24", chained.conn.passedThrough)
	}
	a, c := alone.flush(t), chained.flush(t)
	for _, name := range []string{semconv.MetricBarrierSkew, semconv.MetricCollectiveTransfer,
		semconv.MetricRankLateness, semconv.MetricRankWait, semconv.MetricStepDuration} {
		sa, sc := histogramTotals(findMetric(t, a, name)), histogramTotals(findMetric(t, c, name))
		if sa.count != sc.count || math.Abs(sa.sum-sc.sum) > 1e-9 {
			t.Errorf("%s: alone count %d sum %g, chained count %d sum %g", name, sa.count, sa.sum,
				sc.count, sc.sum)
		}
	}
	if stragglerValue(t, a, 3, semconv.CauseCompute) != 1 ||
		stragglerValue(t, c, 3, semconv.CauseCompute) != 1 {
		t.Errorf("rank 3 not flagged compute in both")
	}
	// The phases of a job the processor joins are not kept (the connector never analyzes its
	// steps): at most those that came before its first annotated collective.
	if n := chained.conn.snapshot().Engine.Analysis.PhaseEntries; n > len(ranks) {
		t.Errorf("connector behind the processor keeps %d phase entries, want <= %d", n, len(ranks))
	}
	if n := alone.conn.snapshot().Engine.Analysis.PhaseEntries; n < len(ranks) {
		t.Errorf("connector alone keeps %d phase entries, want >= %d", n, len(ranks))
	}
	// A collective of the job that arrives unannotated puts the job back in the connector's
	// own join, phases included (from its next batch on).
	for step := int64(10); step < 12; step++ {
		chained.consume(t, stepBatch(ranks, step, -1, "", 0))
	}
	if n := chained.conn.snapshot().Engine.Analysis.PhaseEntries; n < 2*len(ranks) {
		t.Errorf("after unannotated steps the connector keeps %d phase entries, want >= %d", n, 2*len(ranks))
	}
}

type totals struct {
	count uint64
	sum   float64
}

func histogramTotals(m pmetric.Metric) totals {
	var out totals
	points := m.Histogram().DataPoints()
	for i := range points.Len() {
		out.count += points.At(i).Count()
		out.sum += points.At(i).Sum()
	}
	return out
}

// TestConcurrentConsumersAndFlushTicker feeds steps from several goroutines while the flush
// ticker emits and the telemetry is read; run it with -race.
func TestConcurrentConsumersAndFlushTicker(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.MetricsFlushInterval = time.Millisecond
		// The last flush below must carry every series, not only those the ticker's
		// flushes have not emitted yet.
		c.MetricsResendInterval = 0
	})
	ranks := fixture.Ranks(4)
	var wg sync.WaitGroup
	for worker := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range int64(20) {
				step := int64(worker)*100 + i
				if err := h.conn.ConsumeTraces(context.Background(),
					stepBatch(ranks, step, 1, semconv.SpanForward, 20*time.Millisecond)); err != nil {
					t.Error(err)
					return
				}
				h.conn.snapshot()
			}
		}()
	}
	wg.Wait()
	md := h.flush(t)
	skew := findMetric(t, md, semconv.MetricBarrierSkew).Histogram().DataPoints().At(0)
	if skew.Count() != 80 {
		t.Errorf("skew count %d, want 80 collectives", skew.Count())
	}
}

// TestSpansTheProcessorDidNotJoinAreNotJoinedAgain: a member that arrived after its
// collective was released (or a duplicate) comes out of the processor marked unjoined; the
// connector must not open a collective for it that never completes and then counts the
// members that did arrive as missing.
func TestSpansTheProcessorDidNotJoinAreNotJoinedAgain(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.WaitTimeout, c.MaxWait = time.Second, time.Second })
	b := fixture.NewBatch()
	late := b.AddCollective(fixture.Ranks(4)[3], fixture.Collective{PGSize: 4, Seq: 9, Step: 2,
		TrueEnd: trueEnd, Duration: time.Millisecond})
	late.Attributes().PutStr(semconv.AttrBarrierUnjoined, "late_arrival")
	h.consume(t, b.Traces)
	h.clock.Advance(5 * time.Second)
	if err := h.conn.flush(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if s := h.conn.engine.Stats(); s.Accepted != 0 || s.ReleasedIncomplete != 0 {
		t.Errorf("the unjoined span was joined again: %+v", s)
	}
	for _, md := range h.sink.AllMetrics() {
		rms := md.ResourceMetrics()
		for i := range rms.Len() {
			ms := rms.At(i).ScopeMetrics().At(0).Metrics()
			for j := range ms.Len() {
				if n := ms.At(j).Name(); n == semconv.MetricRankMissing ||
					n == semconv.MetricCollectiveIncomplete {
					t.Errorf("%s emitted for a span that was only late", n)
				}
			}
		}
	}
}

func TestSeriesOfAtMostMaxJobsJobs(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxJobs = 2 })
	for j, job := range []string{"a", "b", "c"} {
		ranks := fixture.Ranks(2)
		for i := range ranks {
			ranks[i].Job = job
		}
		h.clock.Advance(time.Second)
		h.consume(t, stepBatch(ranks, int64(j), -1, "", 0))
	}
	md := h.flush(t)
	jobs := map[string]bool{}
	points := findMetric(t, md, semconv.MetricRankLateness).Histogram().DataPoints()
	for i := range points.Len() {
		jobs[attrs(points.At(i).Attributes())[semconv.AttrJobID].(string)] = true
	}
	if len(jobs) != 2 || jobs["a"] {
		t.Errorf("series of jobs %v, want b and c (a reported least recently)", jobs)
	}
	if h.conn.agg.jobsForgotten != 1 {
		t.Errorf("jobs forgotten %d, want 1", h.conn.agg.jobsForgotten)
	}
}

func TestSummaryEventsWithOversizedOrUnknownValuesAreIgnored(t *testing.T) {
	h := newHarness(t, nil)
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr(semconv.AttrJobID, "victim")
	span := rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	span.SetName(semconv.SpanStepSummary)
	span.Attributes().PutInt(semconv.AttrStep, 1)
	for i, ev := range []struct{ host, cause string }{
		{strings.Repeat("h", 1<<20), semconv.CauseCompute}, {"node1", "made-up"},
	} {
		e := span.Events().AppendEmpty()
		e.SetName(semconv.EventStraggler)
		e.Attributes().PutInt(semconv.AttrRank, int64(i))
		e.Attributes().PutStr(semconv.AttrHostName, ev.host)
		e.Attributes().PutStr(semconv.AttrStragglerCause, ev.cause)
	}
	h.consume(t, td)
	if n := len(h.conn.agg.stragglers); n != 0 {
		t.Errorf("%d straggler series from events that should have been ignored", n)
	}
}

// TestUnchangedHistogramsWaitForTheResend: a flush emits the histograms observed since the
// previous one (cumulative, so a left-out point repeats the last), the gauges every time, and
// every series again once metrics_resend_interval has passed.
func TestUnchangedHistogramsWaitForTheResend(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MetricsResendInterval = time.Minute })
	ranks := fixture.Ranks(4)
	for step := range int64(3) {
		h.consume(t, stepBatch(ranks, step, 1, semconv.SpanForward, 20*time.Millisecond))
	}
	first := h.flush(t)
	if n := findMetric(t, first, semconv.MetricRankLateness).Histogram().DataPoints().Len(); n != 4 {
		t.Fatalf("first flush: %d lateness points, want 4", n)
	}

	emitted := len(h.sink.AllMetrics())
	quiet := h.flush(t)
	if len(h.sink.AllMetrics()) != emitted+1 {
		t.Fatal("a flush with nothing new emitted nothing; the gauges should still go out")
	}
	for _, name := range []string{semconv.MetricBarrierSkew, semconv.MetricRankLateness,
		semconv.MetricRankWait, semconv.MetricStepDuration} {
		if _, ok := lookupMetric(quiet, name); ok {
			t.Errorf("%s emitted again with no new observation", name)
		}
	}
	if _, ok := lookupMetric(quiet, semconv.MetricJobSlowdown); !ok {
		t.Errorf("the job's gauge must go out at every flush")
	}

	h.consume(t, stepBatch(ranks, 3, 1, semconv.SpanForward, 20*time.Millisecond))
	changed := h.flush(t)
	points := findMetric(t, changed, semconv.MetricRankLateness).Histogram().DataPoints()
	if points.Len() != 4 {
		t.Fatalf("after a new step: %d lateness points, want 4", points.Len())
	}
	steps := findMetric(t, changed, semconv.MetricStepDuration).Histogram().DataPoints()
	for i := range steps.Len() {
		if steps.At(i).Count() != 4 {
			t.Errorf("step duration count %d, want 4 (cumulative)", steps.At(i).Count())
		}
	}

	h.clock.Advance(time.Minute)
	resent := h.flush(t)
	if n := findMetric(t, resent, semconv.MetricRankLateness).Histogram().DataPoints().Len(); n != 4 {
		t.Fatalf("after metrics_resend_interval: %d lateness points, want all 4", n)
	}
}

func TestImbalanceAndReplayErrorGauges(t *testing.T) {
	h := newHarness(t, nil)
	p := fixture.NewPipeline(4, 2, 8, 1, 3)
	p.Forward[3], p.Backward[3] = p.Forward[3]*2, p.Backward[3]*3/2
	for step := range 10 {
		for _, b := range p.Step(step) {
			h.consume(t, b.Traces)
		}
		h.clock.Advance(time.Second)
	}
	md := h.flush(t)
	ms := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
	for i := range ms.Len() {
		conformsToRegistry(t, ms.At(i))
	}
	points := findMetric(t, md, semconv.MetricImbalance).Gauge().DataPoints()
	costs := findMetric(t, md, semconv.MetricImbalanceCost).Gauge().DataPoints()
	if points.Len() != 1 || costs.Len() != 1 {
		t.Fatalf("%d imbalance points, %d costs; want the last stage's", points.Len(), costs.Len())
	}
	a := attrs(points.At(0).Attributes())
	if a[semconv.AttrStragglerCause] != semconv.CauseStageImbalance ||
		a[semconv.AttrPipelineStage] != int64(3) || points.At(0).IntValue() != 1 {
		t.Errorf("imbalance point %v = %d, want stage 3 flagged", a, points.At(0).IntValue())
	}
	if c := costs.At(0).DoubleValue(); c <= 0.01 {
		t.Errorf("imbalance cost %g s, want tens of ms per step", c)
	}
	// The attribution: fixing compute (the long stage's work, balanced) saves about what the
	// imbalance costs; more than any op's transfers.
	saves := map[any]float64{}
	att := findMetric(t, md, semconv.MetricAttribution).Gauge().DataPoints()
	for i := range att.Len() {
		saves[attrs(att.At(i).Attributes())[semconv.AttrAttributionKind]] = att.At(i).DoubleValue()
	}
	for kind, v := range saves {
		if kind != semconv.AttributionCompute && v >= saves[semconv.AttributionCompute] {
			t.Errorf("attribution %v: %v saves more than compute", saves, kind)
		}
	}
	if c := costs.At(0).DoubleValue(); saves[semconv.AttributionCompute] < 0.5*c {
		t.Errorf("attribution %v: compute saves less than half of the imbalance's cost %g", saves, c)
	}
	errs := findMetric(t, md, semconv.MetricReplayError).Gauge().DataPoints()
	if errs.Len() != 1 || errs.At(0).DoubleValue() > 0.02 {
		t.Errorf("replay error points %d, value %g; want one below 0.02", errs.Len(),
			errs.At(0).DoubleValue())
	}
}

// TestGroupPhaseGauges: each data-parallel group's communication phase, with the switches
// its members sit behind, as the two training.group.phase gauges (what a controller reads to
// see groups whose phases collide on a shared link).
func TestGroupPhaseGauges(t *testing.T) {
	for _, behind := range []bool{false, true} {
		t.Run(map[bool]string{false: "own join", true: "behind the processor"}[behind],
			func(t *testing.T) { checkGroupPhaseGauges(t, behind) })
	}
}

// checkGroupPhaseGauges feeds the connector a 2-stage job, by itself or through the real
// processor (whose step summaries then carry the phases), and checks the gauges.
func checkGroupPhaseGauges(t *testing.T, behind bool) {
	h := newHarness(t, nil)
	p := fixture.NewPipeline(2, 2, 4, 1, 3)
	p.Ranks = fixture.LeafSpine(len(p.Ranks), 1, 2)
	procSink := new(consumertest.TracesSink)
	proc := startProcessor(t, procSink)
	for step := range 8 {
		for _, b := range p.Step(step) {
			if !behind {
				h.consume(t, b.Traces)
			} else if err := proc.ConsumeTraces(context.Background(), b.Traces); err != nil {
				t.Fatal(err)
			}
		}
		h.clock.Advance(time.Second)
	}
	if err := proc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, td := range procSink.AllTraces() {
		h.consume(t, td)
	}
	md := h.flush(t)
	ms := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
	for i := range ms.Len() {
		conformsToRegistry(t, ms.At(i))
	}
	starts := findMetric(t, md, semconv.MetricGroupPhaseStart).Gauge().DataPoints()
	durations := findMetric(t, md, semconv.MetricGroupPhaseDuration).Gauge().DataPoints()
	if starts.Len() != 4 || durations.Len() != 4 {
		t.Fatalf("%d start and %d duration points, want dp0's and dp1's all-gather and"+
			" reduce-scatter", starts.Len(), durations.Len())
	}
	for i := range 4 {
		a := attrs(durations.At(i).Attributes())
		stage := i / 2
		want := map[string]any{
			semconv.AttrJobID:         "job",
			semconv.AttrCollectivePG:  fmt.Sprintf("dp%d", stage),
			semconv.AttrCollectiveOp:  []string{semconv.OpAllGather, semconv.OpReduceScatter}[i%2],
			semconv.AttrGroupSwitches: fmt.Sprintf("leaf%d", stage),
			semconv.AttrGroupHosts:    fmt.Sprintf("node%d,node%d", 2*stage, 2*stage+1),
		}
		if !reflect.DeepEqual(a, want) {
			t.Errorf("point %d: %v, want %v", i, a, want)
		}
		if d := durations.At(i).DoubleValue(); math.Abs(d-0.004) > 0.0005 {
			t.Errorf("%v: phase lasts %g s, want 0.004", a, d)
		}
		if s := starts.At(i).DoubleValue(); s < 0.12 {
			t.Errorf("%v: phase starts %g s into the step, before its compute ends", a, s)
		}
	}
}

// joinModeInput is what a connector behind the processor may see at once: 6 steps of a job
// the processor joined (annotated spans and its step summaries), 2 steps of a job nobody
// joined ("raw"), a span the processor marked unjoined, and a summary of a job
// ("summarized") the connector has no span of.
func joinModeInput(t *testing.T) []ptrace.Traces {
	t.Helper()
	procSink := new(consumertest.TracesSink)
	proc := startProcessor(t, procSink)
	ranks := fixture.Ranks(4)
	for step := range int64(6) {
		if err := proc.ConsumeTraces(context.Background(),
			stepBatch(ranks, step, 3, semconv.SpanForward, 25*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	if err := proc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := procSink.AllTraces()
	raw := make([]fixture.Rank, 4)
	for i, r := range ranks {
		r.Job = "raw"
		raw[i] = r
	}
	for step := int64(0); step < 2; step++ {
		out = append(out, stepBatch(raw, step, -1, "", 0))
	}
	b := fixture.NewBatch()
	late := b.AddCollective(raw[3], fixture.Collective{PGSize: 4, Seq: 9, Step: 2,
		TrueEnd: trueEnd, Duration: time.Millisecond})
	late.Attributes().PutStr(semconv.AttrBarrierUnjoined, "late_arrival")
	out = append(out, b.Traces)
	summary := ptrace.NewTraces()
	spanio.AppendSummary(summary, &diagnosis.StepResult{Job: "summarized", Step: 1, Slowdown: 1.5,
		Flagged: []diagnosis.RankFlag{{Rank: 2, Cause: semconv.CauseCompute, Cost: 0.1}}})
	return append(out, summary)
}

// The join key chooses the path of every collective span: auto reads annotated spans and
// joins the others, annotated only reads (the others skipped, counted not_annotated), own
// joins every span and ignores what the processor wrote (annotations, unjoined marks,
// summaries).
func TestJoinModes(t *testing.T) {
	for _, tc := range []struct {
		mode JoinMode
		// accepted: spans the own engine joined; read: annotated spans read (plus the unjoined
		// one, counted as passed through); skipped: spans counted not_annotated.
		accepted, read, skipped int64
		// collectives: skew observations (annotated once per collective, joined once).
		collectives uint64
		// summaries: whether the processor's summary of "summarized" was read.
		summaries bool
		// phases: whether the own engine keeps the raw job's phases.
		phases bool
	}{
		{mode: JoinAuto, accepted: 8, read: 25, collectives: 8, summaries: true, phases: true},
		{mode: JoinAnnotated, read: 25, skipped: 8, collectives: 6, summaries: true},
		{mode: JoinOwn, accepted: 33, collectives: 8, phases: true},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.Join = tc.mode })
			for _, td := range joinModeInput(t) {
				h.consume(t, td)
			}
			snap := h.conn.snapshot()
			if got := snap.Engine.Accepted; got != tc.accepted {
				t.Errorf("own engine joined %d spans, want %d", got, tc.accepted)
			}
			if got := snap.PassedThrough; got != tc.read {
				t.Errorf("%d spans passed through, want %d", got, tc.read)
			}
			if got := snap.Malformed[reasonNotAnnotated]; got != tc.skipped {
				t.Errorf("%d spans skipped as not annotated, want %d", got, tc.skipped)
			}
			phases := snap.Engine.Analysis.PhaseEntries > 0
			if phases != tc.phases {
				t.Errorf("own engine keeps phases: %v, want %v", phases, tc.phases)
			}
			_, summarized := h.conn.agg.jobs[jobName("summarized")]
			if summarized != tc.summaries {
				t.Errorf("the processor's summary read: %v, want %v", summarized, tc.summaries)
			}
			md := h.flush(t)
			if got := histogramTotals(findMetric(t, md, semconv.MetricBarrierSkew)).count; got != tc.collectives {
				t.Errorf("%d collectives observed, want %d", got, tc.collectives)
			}
		})
	}
}
