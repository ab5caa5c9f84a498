package barrierskewverdictprocessor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewverdictprocessor/internal/metadata"
)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

type harness struct {
	proc  *verdictProcessor
	sink  *consumertest.TracesSink
	tel   *componenttest.Telemetry
	clock *fakeClock
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	cfg := createDefaultConfig()
	require.NoError(t, cfg.Validate())
	tel := componenttest.NewTelemetry()
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	sink := new(consumertest.TracesSink)
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	proc, err := newProcessor(set, cfg, sink, clk)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return &harness{proc: proc, sink: sink, tel: tel, clock: clk}
}

func (h *harness) outcome(t *testing.T, outcome string) int64 {
	t.Helper()
	m, err := h.tel.GetMetric("otelcol_processor_barrierskewverdict_summaries")
	if err != nil {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value("outcome"); ok && v.AsString() == outcome {
			n += dp.Value
		}
	}
	return n
}

// deferred is a tier-2 instance's summary of one step of job "j" in which rank 5's compute
// cost 0.2 s.
func deferred(step int64) ptrace.Traces {
	td := ptrace.NewTraces()
	spanio.AppendSummary(td, &diagnosis.StepResult{Job: "j", Step: step, Duration: 1,
		WhatIf: 0.8, Ranks: 8, Deferred: true, EndUnixNano: 1e18 + step*1e9,
		RootCauses: []diagnosis.RootCause{{Rank: 5, Cause: semconv.CauseCompute, Cost: 0.2,
			Stage: -1, Topology: diagnosis.Topology{Host: "n2", Switch: "s1", NIC: "eth0"}}}})
	return td
}

// decidedSteps reads what the processor forwarded: each summary's step and flagged ranks.
func decidedSteps(t *testing.T, sink *consumertest.TracesSink) (steps []int64, flags []int) {
	t.Helper()
	for _, td := range sink.AllTraces() {
		rss := td.ResourceSpans()
		for i := range rss.Len() {
			spans := rss.At(i).ScopeSpans().At(0).Spans()
			for k := range spans.Len() {
				if !spanio.IsSummary(spans.At(k)) {
					continue
				}
				res, ok := spanio.ReadSummary(spans.At(k), rss.At(i).Resource(), 256)
				require.True(t, ok)
				require.False(t, res.Deferred, "forwarded summary still deferred")
				steps = append(steps, res.Step)
				flags = append(flags, len(res.Flagged))
			}
		}
	}
	return steps, flags
}

// Summaries from two instances, out of order, are decided in step order with the job's
// flags; one waits for an earlier step only reorder_wait; a retried summary and an
// unreadable span are counted and dropped; every other span passes unchanged.
func TestDecidesInStepOrderAndCountsEveryOutcome(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for _, step := range []int64{0, 2, 1, 3, 5, 4, 6, 8} {
		require.NoError(t, h.proc.ConsumeTraces(ctx, deferred(step)))
		h.clock.now = h.clock.now.Add(100 * time.Millisecond)
	}
	require.NoError(t, h.proc.ConsumeTraces(ctx, deferred(3)))
	bad := deferred(9)
	bad.ResourceSpans().At(0).Resource().Attributes().Remove(semconv.AttrJobID)
	require.NoError(t, h.proc.ConsumeTraces(ctx, bad))
	other := ptrace.NewTraces()
	other.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty().
		SetName(semconv.SpanStep)
	require.NoError(t, h.proc.ConsumeTraces(ctx, other))

	steps, flags := decidedSteps(t, h.sink)
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6}, steps[:7], "decided out of order")
	// Two warm-up steps, then K=4 of W=8: flagged from the fourth root cause after them.
	require.Equal(t, []int{0, 0, 0, 0, 0, 1, 1}, flags[:7])
	require.Equal(t, 1, h.proc.verdicts.Pending(), "step 8 waits for step 7")
	require.NoError(t, h.proc.release(ctx, false))
	require.Equal(t, 1, h.proc.verdicts.Pending(), "step 8 decided within reorder_wait")
	h.clock.now = h.clock.now.Add(h.proc.cfg.ReorderWait)
	require.NoError(t, h.proc.release(ctx, false))
	require.Equal(t, 0, h.proc.verdicts.Pending())
	steps, _ = decidedSteps(t, h.sink)
	require.Equal(t, int64(8), steps[len(steps)-1])

	require.Equal(t, int64(8), h.outcome(t, outcomeDecided))
	require.Equal(t, int64(1), h.outcome(t, outcomeDuplicate))
	require.Equal(t, int64(1), h.outcome(t, outcomeUnreadable))
	var passed int
	for _, td := range h.sink.AllTraces() {
		rss := td.ResourceSpans()
		for i := range rss.Len() {
			if rss.At(i).ScopeSpans().At(0).Spans().At(0).Name() == semconv.SpanStep {
				passed++
			}
		}
	}
	require.Equal(t, 1, passed, "a span that is not a summary passes unchanged")
}

// At shutdown every waiting summary is decided and forwarded.
func TestShutdownDecidesWhatWaits(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	require.NoError(t, h.proc.Start(ctx, componenttest.NewNopHost()))
	require.NoError(t, h.proc.ConsumeTraces(ctx, deferred(0)))
	require.NoError(t, h.proc.ConsumeTraces(ctx, deferred(2)))
	require.NoError(t, h.proc.Shutdown(ctx))
	steps, _ := decidedSteps(t, h.sink)
	require.Equal(t, []int64{0, 2}, steps)
}
