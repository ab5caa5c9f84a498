package barrierskewprocessor

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/heldbatch"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor/internal/metadata"
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
	proc  *barrierSkewProcessor
	sink  *consumertest.TracesSink
	clock *fakeClock
	tel   *componenttest.Telemetry
}

func newHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	cfg := createDefaultConfig()
	// Steady state: not just after a (re)start (see startup_grace).
	cfg.StartupGrace = 0
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	tel := componenttest.NewTelemetry()
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	sink := new(consumertest.TracesSink)
	clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
	proc, err := newProcessor(set, cfg, sink, clock)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proc.Shutdown(context.Background())
		_ = tel.Shutdown(context.Background())
	})
	return &harness{proc: proc, sink: sink, clock: clock, tel: tel}
}

func (h *harness) consume(t *testing.T, b *fixture.Batch) {
	t.Helper()
	if err := h.proc.ConsumeTraces(context.Background(), b.Traces); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) spans() []fixture.SpanWithResource {
	var out []fixture.SpanWithResource
	for _, td := range h.sink.AllTraces() {
		out = append(out, fixture.Spans(td)...)
	}
	return out
}

func (h *harness) collectives() []fixture.SpanWithResource {
	var out []fixture.SpanWithResource
	for _, s := range h.spans() {
		if s.Span.Name() == "collective.all_reduce" {
			out = append(out, s)
		}
	}
	return out
}

func double(t *testing.T, s ptrace.Span, key string) float64 {
	t.Helper()
	v, ok := s.Attributes().Get(key)
	if !ok || v.Type() != pcommon.ValueTypeDouble {
		t.Fatalf("span %s: %s missing or not a double (%v)", s.Name(), key, s.Attributes().AsRaw())
	}
	return v.Double()
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

var trueEnd = fixture.Base.Add(time.Second)

// collective adds every rank's span of collective seq: each lasts 30 ms except the listed
// ranks, which arrive late by lateBy.
func collective(b *fixture.Batch, ranks []fixture.Rank, seq int64, late map[int]time.Duration) {
	for _, r := range ranks {
		d := 30 * time.Millisecond
		if lateBy, ok := late[r.Rank]; ok {
			d -= lateBy
		}
		b.AddCollective(r, fixture.Collective{PGSize: len(ranks), Seq: seq, Step: seq,
			TrueEnd: trueEnd.Add(time.Duration(seq) * time.Second), Duration: d})
	}
}

func TestCompleteCollectiveIsAnnotatedAndOtherSpansPassUnchanged(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(4)
	b := fixture.NewBatch()
	for _, r := range ranks {
		b.AddPhase(r, semconv.SpanForward, 0, fixture.Base, 10*time.Millisecond)
	}
	collective(b, ranks, 0, map[int]time.Duration{2: 20 * time.Millisecond})
	want := ptrace.NewTraces()
	b.Traces.CopyTo(want)
	h.consume(t, b)

	spans := h.spans()
	if len(spans) != 8 {
		t.Fatalf("want 8 spans out, got %d", len(spans))
	}
	forwards := 0
	for _, s := range spans {
		if s.Span.Name() == semconv.SpanForward {
			forwards++
			if s.Span.Attributes().Len() != 1 {
				t.Errorf("forward span modified: %v", s.Span.Attributes().AsRaw())
			}
		}
	}
	if forwards != 4 {
		t.Errorf("want 4 forward spans passed through, got %d", forwards)
	}
	for _, s := range h.collectives() {
		if !near(double(t, s.Span, semconv.AttrBarrierSkew), 0.020) {
			t.Errorf("skew %g", double(t, s.Span, semconv.AttrBarrierSkew))
		}
		if !near(double(t, s.Span, semconv.AttrBarrierTransfer), 0.010) {
			t.Errorf("transfer %g", double(t, s.Span, semconv.AttrBarrierTransfer))
		}
		lateness, wait := double(t, s.Span, semconv.AttrBarrierLateness),
			double(t, s.Span, semconv.AttrBarrierWait)
		wantLateness, wantWait := 0.0, 0.020
		if s.Rank() == 2 {
			wantLateness, wantWait = 0.020, 0
		}
		if !near(lateness, wantLateness) || !near(wait, wantWait) {
			t.Errorf("rank %d lateness %g wait %g", s.Rank(), lateness, wait)
		}
		if v, ok := s.Span.Attributes().Get(semconv.AttrStraggler); !ok || v.Bool() {
			t.Errorf("rank %d: training.straggler should be false after one late collective",
				s.Rank())
		}
		if host, _ := s.Resource.Attributes().Get(semconv.AttrHostName); host.Str() == "" {
			t.Errorf("resource lost on the annotated span")
		}
	}
	if h.proc.engine.Stats().Pending != 0 {
		t.Errorf("collective still pending")
	}
}

func TestCollectiveSplitAcrossBatchesOutOfOrder(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(8)
	// Every rank's span of two collectives in its own batch, shuffled, seq 1 before seq 0
	// for some ranks.
	var batches []*fixture.Batch
	for seq := int64(0); seq < 2; seq++ {
		for _, r := range ranks {
			b := fixture.NewBatch()
			b.AddCollective(r, fixture.Collective{PGSize: 8, Seq: seq, Step: seq,
				TrueEnd: trueEnd, Duration: time.Duration(10+r.Rank) * time.Millisecond})
			batches = append(batches, b)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(batches), func(i, j int) { batches[i], batches[j] = batches[j], batches[i] })
	for i, b := range batches {
		h.consume(t, b)
		if got := len(h.collectives()); i < 8 && got == 16 {
			t.Fatalf("all released after %d of 16 batches", i+1)
		}
	}
	spans := h.collectives()
	if len(spans) != 16 {
		t.Fatalf("want 16 annotated collective spans, got %d", len(spans))
	}
	for _, s := range spans {
		if !near(double(t, s.Span, semconv.AttrBarrierSkew), 0.007) {
			t.Errorf("skew %g, want 0.007", double(t, s.Span, semconv.AttrBarrierSkew))
		}
	}
}

// runSteps plays a fixture job through the processor: each step's batches, then the clock
// past analysis_delay and a tick, so that the step's summary is written.
func (h *harness) runSteps(t *testing.T, job *fixture.Job, steps int) {
	t.Helper()
	for step := range steps {
		for _, b := range job.Step(step) {
			h.consume(t, b)
		}
		h.clock.Advance(h.proc.cfg.AnalysisDelay + time.Millisecond)
		h.proc.releaseExpired(context.Background())
	}
}

// summaries returns the step summaries written so far, by step.
func (h *harness) summaries(t *testing.T) map[int64]fixture.SpanWithResource {
	t.Helper()
	out := map[int64]fixture.SpanWithResource{}
	for _, s := range h.spans() {
		if s.Span.Name() != semconv.SpanStepSummary {
			continue
		}
		step, ok := s.Span.Attributes().Get(semconv.AttrStep)
		if !ok {
			t.Fatalf("summary without %s", semconv.AttrStep)
		}
		out[step.Int()] = s
	}
	return out
}

// flaggedIn returns the ranks a summary flags, with their cause.
func flaggedIn(s fixture.SpanWithResource) map[int64]string {
	out := map[int64]string{}
	events := s.Span.Events()
	for i := range events.Len() {
		if ev := events.At(i); ev.Name() == semconv.EventStraggler {
			rank, _ := ev.Attributes().Get(semconv.AttrRank)
			cause, _ := ev.Attributes().Get(semconv.AttrStragglerCause)
			out[rank.Int()] = cause.Str()
		}
	}
	return out
}

func TestClockOffsetsDoNotChangeSkewOrVerdict(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.LeafSpine(4, 1, 4)
	ranks[0].ClockOffset = 2 * time.Second
	ranks[1].ClockOffset = -2 * time.Second
	job := fixture.NewJob(ranks, []fixture.Coll{fixture.World(4, 1<<20, 2*time.Millisecond)}, 1)
	job.Jitter = 0
	job.ExtraForward = func(_, rank int) time.Duration {
		if rank == 1 {
			return 15 * time.Millisecond
		}
		return 0
	}
	h.runSteps(t, job, 10)
	stragglerSpans := map[int]int{}
	for _, s := range h.collectives() {
		// Every rank but 1 waited 15 ms for it, whatever the clocks say.
		if skew := double(t, s.Span, semconv.AttrBarrierSkew); math.Abs(skew-0.015) > 1e-4 {
			t.Errorf("skew %g with shifted clocks, want 0.015", skew)
		}
		offset := double(t, s.Span, semconv.AttrClockOffset)
		// Median end of {+2, -2, 0, 0} s is 0.
		want := map[int]float64{0: 2, 1: -2, 2: 0, 3: 0}[s.Rank()]
		if math.Abs(offset-want) > 1e-3 {
			t.Errorf("rank %d clock offset %g, want %g", s.Rank(), offset, want)
		}
		if v, ok := s.Span.Attributes().Get(semconv.AttrStraggler); ok && v.Bool() {
			stragglerSpans[s.Rank()]++
		}
	}
	summaries := h.summaries(t)
	if len(summaries) != 10 {
		t.Fatalf("%d step summaries for 10 steps", len(summaries))
	}
	if got := flaggedIn(summaries[9]); len(got) != 1 || got[1] != semconv.CauseCompute {
		t.Errorf("step 9 flags %v, want rank 1 compute", got)
	}
	// Flagged after its 4th step as the root cause past the job's two warm-up steps (step
	// 5), its spans of steps 6-9 say so.
	if len(stragglerSpans) != 1 || stragglerSpans[1] != 4 {
		t.Errorf("training.straggler=true on %v, want rank 1's spans of steps 6-9", stragglerSpans)
	}
}

func TestStepSummaryIsInTheStepsTraceWithRootCauseAndCost(t *testing.T) {
	h := newHarness(t, nil)
	job := fixture.NewJob(fixture.LeafSpine(8, 2, 2), fixture.IntraCrossWorld(8, 4), 2)
	job.ExtraFetch = func(_, rank int) time.Duration {
		if rank == 5 {
			return 30 * time.Millisecond
		}
		return 0
	}
	h.runSteps(t, job, 6)
	summaries := h.summaries(t)
	last, ok := summaries[5]
	if !ok {
		t.Fatalf("no summary of step 5 (have %d)", len(summaries))
	}
	if last.Span.TraceID() != fixture.TraceID("job", 5) {
		t.Errorf("summary trace %s, want the step's", last.Span.TraceID())
	}
	if last.Span.ParentSpanID().IsEmpty() || last.Span.SpanID().IsEmpty() {
		t.Errorf("summary without its parent (the step root) or span ID")
	}
	if job, _ := last.Resource.Attributes().Get(semconv.AttrJobID); job.Str() != "job" {
		t.Errorf("summary resource %v", last.Resource.Attributes().AsRaw())
	}
	if got := flaggedIn(last); len(got) != 1 || got[5] != semconv.CauseData {
		t.Errorf("flags %v, want rank 5 data", got)
	}
	var roots []int64
	events := last.Span.Events()
	for i := range events.Len() {
		ev := events.At(i)
		if ev.Name() != semconv.EventRootCause {
			continue
		}
		rank, _ := ev.Attributes().Get(semconv.AttrRank)
		cost, _ := ev.Attributes().Get(semconv.AttrRankCost)
		roots = append(roots, rank.Int())
		if c := cost.Double(); c < 0.025 || c > 0.035 {
			t.Errorf("rank %d cost %g, want about the 30 ms its fetch adds", rank.Int(), c)
		}
	}
	if len(roots) != 1 || roots[0] != 5 {
		t.Errorf("root causes %v, want rank 5 only (its peers only waited)", roots)
	}
	if slowdown := double(t, last.Span, semconv.AttrJobSlowdown); slowdown <= 1.1 {
		t.Errorf("job slowdown %g, want well above 1", slowdown)
	}
}

func TestAsyncAndSyncCollectivesJoinAlike(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(2)
	b := fixture.NewBatch()
	for _, r := range ranks {
		for seq, async := range []bool{false, true} {
			b.AddCollective(r, fixture.Collective{PGSize: 2, Seq: int64(seq), Async: async,
				TrueEnd: trueEnd, Duration: time.Duration(5+5*r.Rank) * time.Millisecond})
		}
	}
	h.consume(t, b)
	spans := h.collectives()
	if len(spans) != 4 {
		t.Fatalf("want 4 collective spans, got %d", len(spans))
	}
	asyncSeen := 0
	for _, s := range spans {
		if v, _ := s.Span.Attributes().Get(semconv.AttrCollectiveAsync); v.Bool() {
			asyncSeen++
		}
		if !near(double(t, s.Span, semconv.AttrBarrierSkew), 0.005) {
			t.Errorf("skew %g, want 0.005", double(t, s.Span, semconv.AttrBarrierSkew))
		}
	}
	if asyncSeen != 2 {
		t.Errorf("training.collective.async kept on %d spans, want 2", asyncSeen)
	}
}

func TestTickerReleasesIncompleteAfterWaitTimeout(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.WaitTimeout = 2 * time.Second
		c.ReleaseInterval = 5 * time.Millisecond
	})
	ranks := fixture.Ranks(4)
	b := fixture.NewBatch()
	collective(b, ranks[:3], 0, nil)
	// The fixture's pg_size is len(ranks)=3 above; make it a 4-rank collective.
	for _, s := range fixture.Spans(b.Traces) {
		s.Span.Attributes().PutInt(semconv.AttrCollectivePGSize, 4)
	}
	h.consume(t, b)
	time.Sleep(30 * time.Millisecond)
	if n := len(h.collectives()); n != 0 {
		t.Fatalf("released %d spans before wait_timeout", n)
	}
	h.clock.Advance(2 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for len(h.collectives()) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	spans := h.collectives()
	if len(spans) != 3 {
		t.Fatalf("ticker released %d spans, want 3", len(spans))
	}
	for _, s := range spans {
		missing, _ := s.Span.Attributes().Get(semconv.AttrBarrierMissingRanks)
		names, _ := s.Span.Attributes().Get(semconv.AttrBarrierMissing)
		if missing.Int() != 1 || names.Str() != "3" {
			t.Errorf("missing_ranks %v missing %q, want 1 and \"3\"", missing.AsRaw(), names.Str())
		}
	}
	assertCounter(t, h, "otelcol_processor_barrierskew_collectives_released", "outcome",
		"incomplete", 1)
}

func TestShutdownReleasesPendingAsIncomplete(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(4)
	b := fixture.NewBatch()
	collective(b, ranks, 0, nil)
	for _, s := range fixture.Spans(b.Traces) {
		s.Span.Attributes().PutInt(semconv.AttrCollectivePGSize, 8)
		s.Resource.Attributes().PutInt(semconv.AttrWorldSize, 8)
	}
	h.consume(t, b)
	if n := len(h.spans()); n != 0 {
		t.Fatalf("%d spans forwarded before shutdown", n)
	}
	if err := h.proc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := h.collectives()
	if len(spans) != 4 {
		t.Fatalf("shutdown forwarded %d spans, want 4", len(spans))
	}
	for _, s := range spans {
		names, _ := s.Span.Attributes().Get(semconv.AttrBarrierMissing)
		if names.Str() != "4,5,6,7" {
			t.Errorf("missing %q, want 4,5,6,7", names.Str())
		}
	}
}

func TestMalformedCollectivesForwardedUnannotatedAndCounted(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(2)
	cases := []struct {
		reason string
		mutate func(fixture.SpanWithResource)
	}{
		{"missing:training.collective.seq", func(s fixture.SpanWithResource) {
			s.Span.Attributes().Remove(semconv.AttrCollectiveSeq)
		}},
		{"mistyped:training.collective.pg_size", func(s fixture.SpanWithResource) {
			s.Span.Attributes().PutStr(semconv.AttrCollectivePGSize, "two")
		}},
		{"missing:training.job.id", func(s fixture.SpanWithResource) {
			s.Resource.Attributes().Remove(semconv.AttrJobID)
		}},
		{"bad_duration", func(s fixture.SpanWithResource) {
			s.Span.SetStartTimestamp(s.Span.EndTimestamp() + 1)
		}},
		{"rank_outside_group", func(s fixture.SpanWithResource) {
			s.Resource.Attributes().PutInt(semconv.AttrRank, 7)
		}},
		{"pg_size_mismatch", func(s fixture.SpanWithResource) {
			s.Span.Attributes().PutInt(semconv.AttrCollectivePGSize, 3)
		}},
	}
	// Rank 0 opens collective seq=100 so that the pg_size disagreement has something to
	// disagree with; a duplicate of it comes last.
	open := fixture.NewBatch()
	open.AddCollective(ranks[0], fixture.Collective{PGSize: 2, Seq: 100, TrueEnd: trueEnd,
		Duration: time.Millisecond})
	h.consume(t, open)
	for _, tc := range cases {
		b := fixture.NewBatch()
		b.AddCollective(ranks[1], fixture.Collective{PGSize: 2, Seq: 100, TrueEnd: trueEnd,
			Duration: time.Millisecond})
		tc.mutate(fixture.Spans(b.Traces)[0])
		h.consume(t, b)
	}
	dup := fixture.NewBatch()
	dup.AddCollective(ranks[0], fixture.Collective{PGSize: 2, Seq: 100, TrueEnd: trueEnd,
		Duration: time.Millisecond})
	h.consume(t, dup)

	spans := h.collectives()
	if len(spans) != len(cases)+1 {
		t.Fatalf("want %d malformed spans forwarded, got %d", len(cases)+1, len(spans))
	}
	for _, s := range spans {
		if _, ok := s.Span.Attributes().Get(semconv.AttrBarrierSkew); ok {
			t.Errorf("malformed span annotated: %v", s.Span.Attributes().AsRaw())
		}
	}
	for _, tc := range cases {
		assertCounter(t, h, "otelcol_processor_barrierskew_spans_malformed", "reason", tc.reason, 1)
	}
	assertCounter(t, h, "otelcol_processor_barrierskew_spans_malformed", "reason", "duplicate", 1)
}

func TestOwnTelemetry(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(4)
	b := fixture.NewBatch()
	collective(b, ranks[:2], 0, nil)
	for _, s := range fixture.Spans(b.Traces) {
		s.Span.Attributes().PutInt(semconv.AttrCollectivePGSize, 4)
	}
	b.AddPhase(ranks[0], semconv.SpanForward, 0, fixture.Base, time.Millisecond)
	h.consume(t, b)
	assertGauge(t, h, "otelcol_processor_barrierskew_pending_collectives", 1)
	assertGauge(t, h, "otelcol_processor_barrierskew_buffered_spans", 2)
	assertCounter(t, h, "otelcol_processor_barrierskew_spans_passed_through", "", "", 1)
}

func assertGauge(t *testing.T, h *harness, name string, want int64) {
	t.Helper()
	m, err := h.tel.GetMetric(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	g, ok := m.Data.(metricdata.Gauge[int64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != want {
		t.Errorf("%s = %+v, want %d", name, m.Data, want)
	}
}

func assertCounter(t *testing.T, h *harness, name, key, value string, want int64) {
	t.Helper()
	m, err := h.tel.GetMetric(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is %T", name, m.Data)
	}
	for _, dp := range sum.DataPoints {
		if key == "" {
			if dp.Value != want {
				t.Errorf("%s = %d, want %d", name, dp.Value, want)
			}
			return
		}
		if v, ok := dp.Attributes.Value(attribute.Key(key)); ok && v.AsString() == value {
			if dp.Value != want {
				t.Errorf("%s{%s=%s} = %d, want %d", name, key, value, dp.Value, want)
			}
			return
		}
	}
	t.Errorf("%s{%s=%s} not reported: %+v", name, key, value, sum.DataPoints)
}

func TestReleasedSpansKeepTheirResourceAndShareIt(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(2)
	// Rank 0's resource changes between seq 0 and seq 1 (a restarted process, say).
	for seq, version := range []string{"a", "b"} {
		b := fixture.NewBatch()
		b.AddCollective(ranks[0], fixture.Collective{PGSize: 2, Seq: int64(seq), Step: 0,
			TrueEnd: trueEnd, Duration: 2 * time.Millisecond})
		fixture.Spans(b.Traces)[0].Resource.Attributes().PutStr("service.version", version)
		h.consume(t, b)
	}
	// Rank 1's two spans (one step) arrive in one batch and complete both collectives at once.
	b := fixture.NewBatch()
	for seq := range int64(2) {
		b.AddCollective(ranks[1], fixture.Collective{PGSize: 2, Seq: seq, Step: 0,
			TrueEnd: trueEnd, Duration: time.Millisecond})
	}
	h.consume(t, b)
	spans := h.collectives()
	if len(spans) != 4 {
		t.Fatalf("want 4 spans, got %d", len(spans))
	}
	for _, s := range spans {
		if s.Rank() != 0 {
			continue
		}
		seq, _ := s.Span.Attributes().Get(semconv.AttrCollectiveSeq)
		version, _ := s.Resource.Attributes().Get("service.version")
		if want := []string{"a", "b"}[seq.Int()]; version.Str() != want {
			t.Errorf("rank 0 seq %d carries resource version %q, want %q", seq.Int(),
				version.Str(), want)
		}
	}
	// Rank 1's two released spans (one batch, one step) share one ResourceSpans in the output.
	out := h.sink.AllTraces()
	last := out[len(out)-1]
	rank1Resources := 0
	for i := range last.ResourceSpans().Len() {
		v, _ := last.ResourceSpans().At(i).Resource().Attributes().Get(semconv.AttrRank)
		if v.Int() == 1 {
			rank1Resources++
		}
	}
	if rank1Resources != 1 {
		t.Errorf("rank 1's spans spread over %d resources, want 1", rank1Resources)
	}
}

// TestConcurrentRanksAndTicker sends each rank's spans from its own goroutine (as concurrent
// OTLP requests arrive) while the release ticker runs and the telemetry is read; run it with
// -race. Every span comes out exactly once and every collective completes.
func TestConcurrentRanksAndTicker(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ReleaseInterval = time.Millisecond })
	ranks := fixture.Ranks(4)
	const collectives = 50
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Add(1)
		go func(r fixture.Rank) {
			defer wg.Done()
			for seq := range int64(collectives) {
				b := fixture.NewBatch()
				b.AddCollective(r, fixture.Collective{PGSize: 4, Seq: seq, Step: seq,
					TrueEnd: trueEnd, Duration: time.Duration(1+r.Rank) * time.Millisecond})
				b.AddPhase(r, semconv.SpanForward, seq, fixture.Base, time.Millisecond)
				if err := h.proc.ConsumeTraces(context.Background(), b.Traces); err != nil {
					t.Error(err)
					return
				}
				h.proc.snapshot()
			}
		}(r)
	}
	wg.Wait()
	if err := h.proc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	summaries := 0
	for _, s := range h.spans() {
		if s.Span.Name() == semconv.SpanStepSummary {
			summaries++
		}
	}
	if got, want := h.sink.SpanCount()-summaries, 2*4*collectives; got != want {
		t.Fatalf("%d spans out besides %d step summaries, want %d", got, summaries, want)
	}
	for _, s := range h.collectives() {
		if _, ok := s.Span.Attributes().Get(semconv.AttrBarrierMissingRanks); ok {
			t.Fatalf("a collective was released incomplete: %v", s.Span.Attributes().AsRaw())
		}
		if _, ok := s.Span.Attributes().Get(semconv.AttrBarrierSkew); !ok {
			t.Fatalf("collective span not annotated")
		}
	}
}

func TestRejectedAndMalformedSpansAreMarkedUnjoined(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(2)
	b := fixture.NewBatch()
	collective(b, ranks, 0, nil)
	h.consume(t, b)
	// A duplicate of rank 0 after the release, and a span without its group.
	b = fixture.NewBatch()
	b.AddCollective(ranks[0], fixture.Collective{PGSize: 2, Seq: 0, Step: 0, TrueEnd: trueEnd,
		Duration: time.Millisecond})
	noPG := b.AddCollective(ranks[1], fixture.Collective{PGSize: 2, Seq: 5, Step: 0,
		TrueEnd: trueEnd, Duration: time.Millisecond})
	noPG.Attributes().Remove(semconv.AttrCollectivePG)
	h.consume(t, b)
	reasons := map[string]int{}
	for _, s := range h.collectives() {
		if v, ok := s.Span.Attributes().Get(semconv.AttrBarrierUnjoined); ok {
			reasons[v.Str()]++
		}
	}
	want := map[string]int{"late_arrival": 1, "missing:" + semconv.AttrCollectivePG: 1}
	if len(reasons) != len(want) || reasons["late_arrival"] != 1 ||
		reasons["missing:"+semconv.AttrCollectivePG] != 1 {
		t.Errorf("unjoined marks %v, want %v", reasons, want)
	}
}

func TestForgedSummariesAreDroppedAndClaimedFiguresIgnored(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(2)
	b := fixture.NewBatch()
	forged := b.AddPhase(ranks[0], semconv.SpanStepSummary, 0, fixture.Base, time.Millisecond)
	forged.Events().AppendEmpty().SetName(semconv.EventStraggler)
	// A collective span that claims figures on arrival: they are dropped and it is joined.
	for _, r := range ranks {
		span := b.AddCollective(r, fixture.Collective{PGSize: 2, Seq: 0, Step: 0,
			TrueEnd: trueEnd, Duration: time.Duration(1+r.Rank) * time.Millisecond})
		span.Attributes().PutDouble(semconv.AttrBarrierSkew, 9)
		span.Attributes().PutBool(semconv.AttrStraggler, true)
	}
	h.consume(t, b)
	for _, s := range h.spans() {
		if s.Span.Name() == semconv.SpanStepSummary {
			t.Fatal("a summary from outside was forwarded")
		}
	}
	for _, s := range h.collectives() {
		if skew := double(t, s.Span, semconv.AttrBarrierSkew); math.Abs(skew-0.001) > 1e-6 {
			t.Errorf("skew %g, want the measured 0.001, not the claimed 9", skew)
		}
		if v, _ := s.Span.Attributes().Get(semconv.AttrStraggler); v.Bool() {
			t.Errorf("claimed straggler flag kept")
		}
	}
	if n := h.proc.malformed[reasonForeignSummary]; n != 1 {
		t.Errorf("foreign summaries counted %d, want 1", n)
	}
}

// TestHeldSpansComeBackWhole: collective spans are held encoded between batches; what comes
// out is each span as it went in (IDs, times, name, status, events, links, attributes,
// resource and scope) plus the annotations. Of a batch holding a collective that completes
// in it and one that waits for wait_timeout, the first leaves at once, the second (decoded
// from its encoding) at the timeout.
func TestHeldSpansComeBackWhole(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.WaitTimeout = 5 * time.Second })
	ranks := fixture.Ranks(3)
	first := fixture.NewBatch()
	for seq := range int64(2) {
		for _, r := range ranks[:2] {
			s := first.AddCollective(r, fixture.Collective{PGSize: 2 + int(seq), Seq: seq, Step: 0,
				TrueEnd: trueEnd, Duration: time.Duration(5+r.Rank) * time.Millisecond})
			s.Status().SetMessage("kept")
			s.Events().AppendEmpty().SetName("an event")
			s.Links().AppendEmpty().SetSpanID(pcommon.SpanID{1, 2, 3})
		}
	}
	first.Traces.ResourceSpans().At(0).ScopeSpans().At(0).Scope().SetVersion("9.9")
	want := map[[2]int64]ptrace.Span{}
	for _, s := range fixture.Spans(first.Traces) {
		seq, _ := s.Span.Attributes().Get(semconv.AttrCollectiveSeq)
		c := ptrace.NewSpan()
		s.Span.CopyTo(c)
		want[[2]int64{int64(s.Rank()), seq.Int()}] = c
	}
	h.consume(t, first)
	// Seq 0 (a 2-member group: ranks 0 and 1) completed in the batch that took it and leaves
	// at once; seq 1 (3 members) waits for rank 2, which never comes, so the rest of the held
	// batch leaves at wait_timeout.
	for _, s := range h.collectives() {
		if seq, _ := s.Span.Attributes().Get(semconv.AttrCollectiveSeq); seq.Int() != 0 {
			t.Fatalf("rank %d seq %d forwarded before its collective was released", s.Rank(), seq.Int())
		}
	}
	if n := len(h.collectives()); n != 2 {
		t.Fatalf("%d spans of the collective the batch completed were forwarded, want 2", n)
	}
	h.clock.Advance(6 * time.Second)
	h.proc.releaseExpired(context.Background())
	got := h.collectives()
	if len(got) != 4 {
		t.Fatalf("want 4 collective spans after the timeout, got %d", len(got))
	}
	for _, s := range got {
		seq, _ := s.Span.Attributes().Get(semconv.AttrCollectiveSeq)
		w := want[[2]int64{int64(s.Rank()), seq.Int()}]
		if _, ok := s.Span.Attributes().Get(semconv.AttrBarrierSkew); !ok {
			t.Errorf("rank %d seq %d not annotated", s.Rank(), seq.Int())
		}
		missing, ok := s.Span.Attributes().Get(semconv.AttrBarrierMissingRanks)
		if (seq.Int() == 1) != (ok && missing.Int() == 1) {
			t.Errorf("rank %d seq %d: missing ranks %v", s.Rank(), seq.Int(), missing.AsRaw())
		}
		c := ptrace.NewSpan()
		s.Span.CopyTo(c)
		spanio.StripAnnotations(c)
		if c.Name() != w.Name() || c.SpanID() != w.SpanID() || c.TraceID() != w.TraceID() ||
			c.StartTimestamp() != w.StartTimestamp() || c.EndTimestamp() != w.EndTimestamp() ||
			c.Status().Message() != "kept" || c.Events().Len() != 1 || c.Links().Len() != 1 ||
			!c.Attributes().Equal(w.Attributes()) {
			t.Errorf("rank %d seq %d came back changed: %v", s.Rank(), seq.Int(), c.Attributes().AsRaw())
		}
		if host, _ := s.Resource.Attributes().Get(semconv.AttrHostName); host.Str() == "" {
			t.Errorf("resource lost on a held span")
		}
	}
	var scopeVersion string
	for _, td := range h.sink.AllTraces() {
		for i := range td.ResourceSpans().Len() {
			if v := td.ResourceSpans().At(i).ScopeSpans().At(0).Scope().Version(); v != "" {
				scopeVersion = v
			}
		}
	}
	if scopeVersion != "9.9" {
		t.Errorf("scope version %q came back, want 9.9", scopeVersion)
	}
}

// TestManyReleasedBatchesAreForwardedInChunks: a step whose collectives all complete with
// its last batch is forwarded in calls of at most forwardChunk spans, none lost.
func TestManyReleasedBatchesAreForwardedInChunks(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBufferedSpans = 1 << 20 })
	const world, perBatch, collectives = 512, 8, 8
	ranks := fixture.Ranks(world)
	for from := 0; from < world; from += perBatch {
		b := fixture.NewBatch()
		for _, r := range ranks[from : from+perBatch] {
			for seq := range int64(collectives) {
				b.AddCollective(r, fixture.Collective{PGSize: world, Seq: seq, Step: 0,
					TrueEnd: trueEnd, Duration: time.Duration(5+r.Rank%9) * time.Millisecond})
			}
		}
		h.consume(t, b)
	}
	if got := len(h.collectives()); got != world*collectives {
		t.Fatalf("%d of %d collective spans forwarded", got, world*collectives)
	}
	if calls := len(h.sink.AllTraces()); calls < world*collectives/forwardChunk {
		t.Errorf("%d spans forwarded in %d calls", world*collectives, calls)
	}
	for _, td := range h.sink.AllTraces() {
		if td.SpanCount() > forwardChunk {
			t.Errorf("one call forwarded %d spans (chunk %d)", td.SpanCount(), forwardChunk)
		}
	}
}

// TestSummariesWaitOnlyForEarlierForwards: the ticker waits for the batches that began
// forwarding before it analyzed, not for those that began after (waiting behind every
// batch would stall the receiver while a large step is forwarded).
func TestSummariesWaitOnlyForEarlierForwards(t *testing.T) {
	var f heldbatch.InFlight
	early := f.Begin()
	mark := f.Mark()
	late := f.Begin()
	done := make(chan struct{})
	go func() {
		f.WaitBefore(mark)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("waitBefore returned while an earlier forward was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	f.End(early)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("waitBefore kept waiting for a forward that began after the mark")
	}
	f.End(late)
}

// TestABatchSpanningTwoStepsReleasesEachStepOnItsOwn: a rank's batch often ends one step and
// begins the next. Its span of the step that completes first leaves when that step's
// collective does, not when the next step's does.
func TestABatchSpanningTwoStepsReleasesEachStepOnItsOwn(t *testing.T) {
	h := newHarness(t, nil)
	ranks := fixture.Ranks(2)
	b := fixture.NewBatch()
	for step := range int64(2) {
		b.AddCollective(ranks[0], fixture.Collective{PGSize: 2, Seq: step, Step: step,
			TrueEnd: trueEnd, Duration: 2 * time.Millisecond})
	}
	h.consume(t, b)
	// Rank 1 completes step 0 only.
	b = fixture.NewBatch()
	b.AddCollective(ranks[1], fixture.Collective{PGSize: 2, Seq: 0, Step: 0, TrueEnd: trueEnd,
		Duration: time.Millisecond})
	h.consume(t, b)
	got := map[[2]int64]bool{}
	for _, s := range h.collectives() {
		step, _ := s.Span.Attributes().Get(semconv.AttrStep)
		got[[2]int64{int64(s.Rank()), step.Int()}] = true
	}
	want := map[[2]int64]bool{{0, 0}: true, {1, 0}: true}
	if len(got) != len(want) || !got[[2]int64{0, 0}] || !got[[2]int64{1, 0}] {
		t.Fatalf("forwarded (rank, step) %v, want %v", got, want)
	}
}
