package traceshapeprocessor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"
	"github.com/skewtrace/skewtrace/src/collector/processor/traceshapeprocessor/internal/metadata"
)

// tempoMaxBytesPerTrace is Grafana Tempo's default max_bytes_per_trace.
const tempoMaxBytesPerTrace = 5_000_000

type harness struct {
	proc *traceShapeProcessor
	sink *consumertest.TracesSink
	tel  *componenttest.Telemetry
}

func newHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	cfg := createDefaultConfig()
	if mutate != nil {
		mutate(cfg)
	}
	require.NoError(t, cfg.Validate())
	tel := componenttest.NewTelemetry()
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	sink := new(consumertest.TracesSink)
	proc, err := newProcessor(set, cfg, sink)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = proc.Shutdown(context.Background())
		_ = tel.Shutdown(context.Background())
	})
	return &harness{proc: proc, sink: sink, tel: tel}
}

// counter returns a counter's value (with the given reason, when not empty).
func counter(t *testing.T, tel *componenttest.Telemetry, name, reason string) int64 {
	t.Helper()
	m, err := tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value("reason"); reason == "" || (ok && v.AsString() == reason) {
			total += dp.Value
		}
	}
	return total
}

// deriveStepIDs makes each train.step span's ID the one the instrumentation derives, and its
// parent the step root, as on the wire.
func deriveStepIDs(td ptrace.Traces) {
	for _, s := range fixture.Spans(td) {
		if s.Span.Name() != semconv.SpanStep {
			continue
		}
		job, _ := s.Resource.Attributes().Get(semconv.AttrJobID)
		step, _ := s.Span.Attributes().Get(semconv.AttrStep)
		s.Span.SetSpanID(spanio.RankStepSpanID(job.Str(), step.Int(), s.Rank()))
		s.Span.SetParentSpanID(spanio.StepRootSpanID(job.Str(), step.Int()))
	}
}

// summary is the barrierskew processor's summary of a step flagging the given ranks.
func summary(job string, step int64, flagged ...int) ptrace.Traces {
	td := ptrace.NewTraces()
	res := diagnosis.StepResult{Job: job, Step: step, Duration: 0.1, EndUnixNano: 1}
	for _, r := range flagged {
		res.Flagged = append(res.Flagged, diagnosis.RankFlag{Rank: r, Cause: semconv.CauseCompute})
		res.RootCauses = append(res.RootCauses, diagnosis.RootCause{Rank: r, Cause: semconv.CauseCompute})
	}
	spanio.AppendSummary(td, &res)
	return td
}

// annotatedStep is one step of n ranks as the barrierskew processor forwards it: phases and
// k world all-reduces, each annotated with rank late as its late member.
func annotatedStep(job string, n, k int, step int64, late int) ptrace.Traces {
	ranks := fixture.LeafSpine(n, 8, 16)
	b := fixture.NewBatch()
	t0 := fixture.Base.Add(time.Duration(step) * time.Second)
	for _, r := range ranks {
		r.Job = job
		for _, name := range []string{semconv.SpanDataloaderFetch, semconv.SpanForward,
			semconv.SpanBackward, semconv.SpanOptimizerStep, semconv.SpanStep} {
			b.AddPhase(r, name, step, t0, 10*time.Millisecond)
		}
		for c := range k {
			span := b.AddCollective(r, fixture.Collective{PGSize: n, Seq: step*int64(k) + int64(c),
				Step: step, TrueEnd: t0.Add(50 * time.Millisecond), Duration: 5 * time.Millisecond})
			lateness := 0.004
			if r.Rank == late {
				lateness = 0.005
			}
			span.Attributes().PutDouble(semconv.AttrBarrierSkew, 0.005)
			span.Attributes().PutDouble(semconv.AttrBarrierLateness, lateness)
		}
	}
	deriveStepIDs(b.Traces)
	return b.Traces
}

func TestSmallJobKeepsOneTracePerStepAndLinksTheSummary(t *testing.T) {
	h := newHarness(t, nil)
	in := annotatedStep("small", 8, 4, 3, 5)
	n := in.SpanCount()
	require.NoError(t, h.proc.ConsumeTraces(context.Background(), in))
	require.NoError(t, h.proc.ConsumeTraces(context.Background(), summary("small", 3, 5)))

	var spans []fixture.SpanWithResource
	for _, td := range h.sink.AllTraces() {
		spans = append(spans, fixture.Spans(td)...)
	}
	require.Len(t, spans, n+1)
	step := spanio.StepTraceID("small", 3)
	var sum ptrace.Span
	for _, s := range spans {
		require.Equal(t, step, s.Span.TraceID(), s.Span.Name())
		if spanio.IsSummary(s.Span) {
			sum = s.Span
		}
	}
	require.Equal(t, 1, sum.Links().Len())
	link := sum.Links().At(0)
	require.Equal(t, step, link.TraceID())
	require.Equal(t, spanio.RankStepSpanID("small", 3, 5), link.SpanID())
	require.True(t, hasSpan(spans, link.TraceID(), link.SpanID()), "the link leads nowhere")
	require.Equal(t, int64(n+1), counter(t, h.tel, "otelcol_processor_traceshape_spans_kept", ""))
	require.Zero(t, counter(t, h.tel, "otelcol_processor_traceshape_spans_dropped", ""))

	// The default max_trace_spans of such spans fits Tempo's limit with room to spare.
	size := 0
	for _, td := range h.sink.AllTraces() {
		size += (&ptrace.ProtoMarshaler{}).TracesSize(td)
	}
	perSpan := float64(size) / float64(n+1)
	t.Logf("%.0f bytes per annotated span; %d spans: %.2f MB", perSpan,
		createDefaultConfig().MaxTraceSpans, perSpan*float64(createDefaultConfig().MaxTraceSpans)/1e6)
	require.Less(t, perSpan*float64(createDefaultConfig().MaxTraceSpans), 0.8*tempoMaxBytesPerTrace)
}

func hasSpan(spans []fixture.SpanWithResource, trace pcommon.TraceID, span pcommon.SpanID) bool {
	for _, s := range spans {
		if s.Span.TraceID() == trace && s.Span.SpanID() == span {
			return true
		}
	}
	return false
}

func TestTraceFullDropsAndCounts(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxTraceSpans = 50 })
	// 2 ranks x (5 phases + 30 collectives) = 70 spans in one step: the job splits (2 x 35 >
	// 50) once the probe rank has sent 26 spans; before that they went to the step trace.
	in := annotatedStep("full", 2, 30, 0, 1)
	n := in.SpanCount()
	require.NoError(t, h.proc.ConsumeTraces(context.Background(), in))
	out := 0
	perTrace := map[pcommon.TraceID]int{}
	for _, td := range h.sink.AllTraces() {
		out += td.SpanCount()
		for _, s := range fixture.Spans(td) {
			perTrace[s.Span.TraceID()]++
		}
	}
	for id, c := range perTrace {
		require.LessOrEqual(t, c, 50, id)
	}
	dropped := counter(t, h.tel, "otelcol_processor_traceshape_spans_dropped", "")
	require.Equal(t, int64(n), int64(out)+dropped)
	require.Equal(t, int64(out), counter(t, h.tel, "otelcol_processor_traceshape_spans_kept", ""))
	require.Equal(t, int64(1), counter(t, h.tel, "otelcol_processor_traceshape_jobs_split", ""))
}

// TestRankAsStringIsReadLikeTheJoinReadsIt: OTEL_RESOURCE_ATTRIBUTES carries only strings,
// so a rank may come as "1"; the processor reads it as the barrierskew components do
// (spanio.ResourceInt), and the job is shaped like any other (here: split, as 2 ranks x 35
// spans exceed max_trace_spans 50).
func TestRankAsStringIsReadLikeTheJoinReadsIt(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxTraceSpans = 50 })
	in := annotatedStep("strings", 2, 30, 0, 1)
	n := in.SpanCount()
	for i := range in.ResourceSpans().Len() {
		attrs := in.ResourceSpans().At(i).Resource().Attributes()
		rank, _ := attrs.Get(semconv.AttrRank)
		attrs.PutStr(semconv.AttrRank, rank.AsString())
		attrs.PutStr(semconv.AttrWorldSize, "2")
	}
	require.NoError(t, h.proc.ConsumeTraces(context.Background(), in))
	require.Equal(t, int64(1), counter(t, h.tel, "otelcol_processor_traceshape_jobs_split", ""))
	kept := counter(t, h.tel, "otelcol_processor_traceshape_spans_kept", "")
	dropped := counter(t, h.tel, "otelcol_processor_traceshape_spans_dropped", "")
	require.Equal(t, int64(n), kept+dropped)
}

// shape is what reached the backend, by trace.
type shape struct {
	traces map[pcommon.TraceID]ptrace.Traces
	spans  []fixture.SpanWithResource
}

func collect(tds []ptrace.Traces) shape {
	s := shape{traces: map[pcommon.TraceID]ptrace.Traces{}}
	for _, td := range tds {
		rss := td.ResourceSpans()
		for i := range rss.Len() {
			rs := rss.At(i)
			sss := rs.ScopeSpans()
			for j := range sss.Len() {
				spans := sss.At(j).Spans()
				for k := range spans.Len() {
					span := spans.At(k)
					s.spans = append(s.spans, fixture.SpanWithResource{Span: span, Resource: rs.Resource()})
					out, ok := s.traces[span.TraceID()]
					if !ok {
						out = ptrace.NewTraces()
						s.traces[span.TraceID()] = out
					}
					ors := out.ResourceSpans().AppendEmpty()
					rs.Resource().CopyTo(ors.Resource())
					span.CopyTo(ors.ScopeSpans().AppendEmpty().Spans().AppendEmpty())
				}
			}
		}
	}
	return s
}

// TestLargeJobShapeAt4096Ranks: a 4096-rank job with 30 collectives per step through the
// real barrierskew processor, then traceshape. Every stored trace stays under Tempo's 5 MB,
// every link of a step summary leads to the named rank's stored train.step (before the rank
// is flagged too: it was its collectives' late member), the flagged rank's steps are whole,
// and every span that did not reach the backend is counted.
func TestLargeJobShapeAt4096Ranks(t *testing.T) {
	if testing.Short() {
		t.Skip("4096 ranks x 6 steps")
	}
	const n, steps, straggler = 4096, 6, 1234
	h := newHarness(t, nil)

	bf := barrierskewprocessor.NewFactory()
	bcfg := bf.CreateDefaultConfig().(*barrierskewprocessor.Config)
	bcfg.StartupGrace = 0
	bcfg.AnalysisDelay = time.Millisecond
	bcfg.ReleaseInterval = 5 * time.Millisecond
	bset := processortest.NewNopSettings(bf.Type())
	barrier, err := bf.CreateTraces(context.Background(), bset, bcfg, h.proc)
	require.NoError(t, err)
	require.NoError(t, barrier.Start(context.Background(), componenttest.NewNopHost()))

	seq := make([]fixture.Coll, 30)
	for i := range seq {
		seq[i] = fixture.World(n, 1<<20, 2*time.Millisecond)
	}
	job := fixture.NewJob(fixture.LeafSpine(n, 8, 16), seq, 7)
	job.ExtraForward = func(_, rank int) time.Duration {
		if rank == straggler {
			return 40 * time.Millisecond
		}
		return 0
	}
	sent, sentBytes := 0, 0
	marshaler := &ptrace.ProtoMarshaler{}
	summaries := func() int {
		c := 0
		for _, td := range h.sink.AllTraces() {
			for _, s := range fixture.Spans(td) {
				if spanio.IsSummary(s.Span) {
					c++
				}
			}
		}
		return c
	}
	for step := range steps {
		td := fixture.Merge(job.Step(step))
		deriveStepIDs(td)
		sent += td.SpanCount()
		sentBytes += marshaler.TracesSize(td)
		require.NoError(t, barrier.ConsumeTraces(context.Background(), td))
		// The step's summary (and with it the flags) before the next step, as at one step
		// per second against analysis_delay.
		deadline := time.Now().Add(20 * time.Second)
		for summaries() < step+1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		require.Equal(t, step+1, summaries(), "no summary of step %d", step)
	}
	require.NoError(t, barrier.Shutdown(context.Background()))

	got := collect(h.sink.AllTraces())
	kept := counter(t, h.tel, "otelcol_processor_traceshape_spans_kept", "")
	dropped := counter(t, h.tel, "otelcol_processor_traceshape_spans_dropped", "")
	require.Equal(t, int64(len(got.spans)), kept)
	require.Equal(t, int64(sent+steps), kept+dropped, "spans in (with summaries) != kept + dropped")
	require.Zero(t, counter(t, h.tel, "otelcol_processor_traceshape_spans_dropped", "trace_full"))
	require.Equal(t, int64(1), counter(t, h.tel, "otelcol_processor_traceshape_jobs_split", ""))

	largest, storedBytes := 0, 0
	for id, td := range got.traces {
		size := marshaler.TracesSize(td)
		storedBytes += size
		largest = max(largest, size)
		require.Less(t, size, tempoMaxBytesPerTrace, "trace %s", id)
	}
	t.Logf("4096 ranks, %d steps: %d spans in, %d stored in %d traces (largest %d bytes), "+
		"%d dropped; stored %.2f MB per step, against %.1f MB per step as the ranks sent "+
		"them (before annotation)", steps, sent, len(got.spans), len(got.traces), largest,
		dropped, float64(storedBytes)/steps/1e6, float64(sentBytes)/steps/1e6)

	// Every step: one summary, in the step trace; the flagged rank's step is one link away
	// once it is flagged, and that rank's spans are all stored.
	flaggedSteps, linked := 0, 0
	for _, s := range got.spans {
		if !spanio.IsSummary(s.Span) {
			continue
		}
		step, _ := s.Span.Attributes().Get(semconv.AttrStep)
		require.Equal(t, spanio.StepTraceID("job", step.Int()), s.Span.TraceID())
		links := s.Span.Links()
		for i := range links.Len() {
			l := links.At(i)
			rank, _ := l.Attributes().Get(semconv.AttrRank)
			require.Equal(t, spanio.RankStepTraceID("job", step.Int(), int(rank.Int())), l.TraceID())
			require.Equal(t, spanio.RankStepSpanID("job", step.Int(), int(rank.Int())), l.SpanID())
			require.True(t, hasSpan(got.spans, l.TraceID(), l.SpanID()),
				"step %d: the link to rank %d leads nowhere", step.Int(), rank.Int())
			linked++
		}
		res, ok := spanio.ReadSummary(s.Span, s.Resource, 256)
		require.True(t, ok)
		for _, f := range res.Flagged {
			require.Equal(t, straggler, f.Rank, "a healthy rank flagged at step %d", res.Step)
			flaggedSteps++
		}
	}
	require.Positive(t, flaggedSteps, "the straggler was never flagged")
	require.Positive(t, linked)

	// After its first flag, the straggler's steps are whole in their own trace, rooted at its
	// train.step, which links back to the step summary.
	var stragglerSteps int
	for _, s := range got.spans {
		if s.Rank() != straggler || s.Span.Name() != semconv.SpanStep {
			continue
		}
		step, _ := s.Span.Attributes().Get(semconv.AttrStep)
		stragglerSteps++
		require.Equal(t, spanio.RankStepTraceID("job", step.Int(), straggler), s.Span.TraceID())
		require.True(t, s.Span.ParentSpanID().IsEmpty())
		require.Equal(t, 1, s.Span.Links().Len())
		require.Equal(t, spanio.StepSummarySpanID("job", step.Int()), s.Span.Links().At(0).SpanID())
		td := got.traces[s.Span.TraceID()]
		require.Equal(t, 5+len(seq), td.SpanCount(), "step %d of the straggler is not whole", step.Int())
	}
	require.Positive(t, stragglerSteps)

	// Sampled ranks: every 128th rank keeps its steps.
	for _, rank := range []int{0, 128, 4096 - 128} {
		id := spanio.RankStepTraceID("job", steps-1, rank)
		require.Contains(t, got.traces, id, fmt.Sprintf("sampled rank %d", rank))
	}
	// The straggler's step is stored in every step, flagged or not yet: it was the late
	// member of an anomalous collective (far above the job's usual skew).
	for step := range steps {
		require.Contains(t, got.traces, spanio.RankStepTraceID("job", int64(step), straggler),
			"step %d", step)
	}
	// A healthy, unsampled rank is not.
	require.NotContains(t, got.traces, spanio.RankStepTraceID("job", steps-1, 4000))
}

// TestInputIsReadOnly: the processor is declared read-only (so the pipeline does not clone
// every batch for it beside the barrierskew connector); it must then shape a read-only batch
// (pdata panics on a write) and leave it as it was, the kept spans being copies.
func TestInputIsReadOnly(t *testing.T) {
	require.False(t, newHarness(t, nil).proc.Capabilities().MutatesData)
	for _, tc := range []struct {
		name  string
		ranks int
	}{{"one trace per step", 8}, {"split per rank", 256}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.MaxTraceSpans = 1000; c.SampleRanks = 4 })
			sum := summary("ro", 2, 7)
			in := annotatedStep("ro", tc.ranks, 4, 3, 7)
			want := ptrace.NewTraces()
			in.CopyTo(want)
			sum.MarkReadOnly()
			in.MarkReadOnly()
			want.MarkReadOnly()
			require.NotPanics(t, func() {
				require.NoError(t, h.proc.ConsumeTraces(context.Background(), sum))
				require.NoError(t, h.proc.ConsumeTraces(context.Background(), in))
			})
			require.Equal(t, want, in, "the input batch was changed")
			require.Positive(t, h.sink.SpanCount())
			// The summary's copy got its link; the input summary did not.
			require.Equal(t, 1, h.sink.AllTraces()[0].ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Links().Len())
			require.Equal(t, 0, sum.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Links().Len())
		})
	}
}

// TestRequestsAreSplitAtMaxRequestSpans: what one batch keeps leaves in requests of at most
// max_request_spans spans, each span under its own resource, none lost.
func TestRequestsAreSplitAtMaxRequestSpans(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxRequestSpans = 50 })
	in := annotatedStep("req", 16, 4, 3, 5) // 16 x 9 = 144 spans, one trace
	require.NoError(t, h.proc.ConsumeTraces(context.Background(), in))
	require.Equal(t, in.SpanCount(), h.sink.SpanCount())
	require.Len(t, h.sink.AllTraces(), 3)
	ranksIn := map[int]int{}
	for _, s := range fixture.Spans(in) {
		ranksIn[s.Rank()]++
	}
	ranksOut := map[int]int{}
	for _, td := range h.sink.AllTraces() {
		require.LessOrEqual(t, td.SpanCount(), 50)
		for _, s := range fixture.Spans(td) {
			ranksOut[s.Rank()]++
		}
	}
	require.Equal(t, ranksIn, ranksOut)
}
