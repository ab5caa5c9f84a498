package barrierskewprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.uber.org/zap"

	"github.com/skewtrace/skewtrace/src/collector/internal/heldbatch"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/internal/ticker"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor/internal/metadata"
)

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// reasonForeignSummary counts train.step.summary spans that arrived from outside (dropped).
const reasonForeignSummary = "foreign_summary"

// reasonHoldLost counts held collective spans whose encoded batch could not be decoded
// (it cannot happen with an encoding this processor wrote; counted, never silent).
const reasonHoldLost = "hold_decode_failed"

// forwardChunk is the most released spans forwarded in one call: a 4096-rank step completes
// at once, and forwarding it whole would decode all of it at once. What is decoded at a time
// is about five chunks (the one being built, the batch processor's queue of two, its batch and
// its export): at 8192 spans a chunk that was ~45 MB of a 4096-rank job's heap.
const forwardChunk = 2048

// barrierSkewProcessor joins collective spans across ranks and annotates them.
//
//	ConsumeTraces(batch)
//	  ├─ pass 1: phase spans ──────────────▶ engine phase cache (read, left in the batch)
//	  ├─ pass 2: collective spans ─▶ moved out of the batch into a held batch ─▶ engine.Add
//	  │            malformed / rejected ─▶ left in the batch unannotated, counted
//	  ├─ held batch ─▶ encoded (unless all its collectives were released by now)
//	  └─ batch (everything else), then every held batch whose last collective was released
//	     (decoded, annotated), in chunks ─▶ next
//	ticker (release_interval): collectives past wait_timeout ─▶ released, incomplete
//	                           steps due for analysis ─▶ train.step.summary spans ─▶ next
//	Shutdown: every pending collective ─▶ released, incomplete; every open step ─▶ next
type barrierSkewProcessor struct {
	logger *zap.Logger
	cfg    *Config
	next   consumer.Traces
	clock  join.Clock

	mu sync.Mutex
	// forwards orders what leaves the processor: a step's summary never overtakes the spans
	// released before it (see heldbatch.InFlight).
	forwards  heldbatch.InFlight
	engine    *join.Engine[heldbatch.Member]
	scratch   []*join.Released[heldbatch.Member]
	resources []spanio.Resource
	// held: the collective spans taken out of incoming batches until their collectives are
	// released.
	held          heldbatch.Store
	malformed     map[string]int64
	passedThrough int64

	telemetry *metadata.TelemetryBuilder
	releases  ticker.Loop
}

func newProcessor(
	set processor.Settings, cfg *Config, next consumer.Traces, clock join.Clock,
) (*barrierSkewProcessor, error) {
	p := &barrierSkewProcessor{
		logger:    set.Logger,
		cfg:       cfg,
		next:      next,
		clock:     clock,
		engine:    join.New[heldbatch.Member](cfg.Config, clock),
		malformed: make(map[string]int64),
	}
	tb, err := newTelemetry(set.TelemetrySettings, p.snapshot)
	if err != nil {
		return nil, err
	}
	p.telemetry = tb
	return p, nil
}

// Start launches the ticker that releases collectives past wait_timeout.
func (p *barrierSkewProcessor) Start(context.Context, component.Host) error {
	p.releases.Start(p.cfg.ReleaseInterval, func() { p.releaseExpired(context.Background()) })
	return nil
}

// releaseExpired forwards the collectives whose wait_timeout has passed, and the summaries
// of the steps whose analysis is due.
func (p *barrierSkewProcessor) releaseExpired(ctx context.Context) {
	p.mu.Lock()
	out := ptrace.NewTraces()
	p.scratch = p.engine.Expire(p.scratch[:0])
	p.noteReleased()
	p.appendSummaries(out, false)
	ready := p.held.TakeReady()
	before := p.forwards.Mark()
	p.mu.Unlock()
	p.forwards.WaitBefore(before)
	if err := p.forwardHeld(ctx, out, ready); err != nil {
		p.logger.Warn("forwarding released collective spans failed", zap.Error(err))
	}
}

// appendSummaries analyzes the steps that are due (all of them when draining) and writes
// each one's train.step.summary span into td.
func (p *barrierSkewProcessor) appendSummaries(td ptrace.Traces, drain bool) {
	results := p.engine.Analyze(drain)
	for i := range results {
		spanio.AppendSummary(td, &results[i])
	}
}

// forwardHeld forwards the ready held batches, decoded and annotated, then td (when not
// empty), in calls of at most forwardChunk spans (a held batch larger than that goes whole).
// Released collectives go first: a late rank's batch completes its collectives and carries
// its train.step, and what is behind (traceshape) keeps that step for the late member it
// learns of from the collectives.
func (p *barrierSkewProcessor) forwardHeld(ctx context.Context, td ptrace.Traces, ready []*heldbatch.Batch) error {
	var errs []error
	out, n := ptrace.NewTraces(), 0
	send := func() {
		if out.ResourceSpans().Len() > 0 {
			if err := p.next.ConsumeTraces(ctx, out); err != nil {
				errs = append(errs, err)
			}
		}
		out, n = ptrace.NewTraces(), 0
	}
	for i, hb := range ready {
		ready[i] = nil
		spans, ok := hb.Decode()
		if !ok {
			p.mu.Lock()
			p.malformed[reasonHoldLost] += int64(hb.Spans())
			p.mu.Unlock()
			p.logger.Error("a held batch of collective spans could not be decoded",
				zap.Int("spans", hb.Spans()))
			continue
		}
		if n > 0 && n+hb.Spans() > forwardChunk {
			send()
		}
		spans.ResourceSpans().MoveAndAppendTo(out.ResourceSpans())
		n += hb.Spans()
	}
	if rest := td.SpanCount(); rest > 0 {
		if n > 0 && n+rest > forwardChunk {
			send()
		}
		td.ResourceSpans().MoveAndAppendTo(out.ResourceSpans())
	}
	send()
	return errors.Join(errs...)
}

// Shutdown forwards every pending collective (incomplete) and stops the ticker.
func (p *barrierSkewProcessor) Shutdown(ctx context.Context) error {
	p.releases.Stop()
	p.mu.Lock()
	out := ptrace.NewTraces()
	p.scratch = p.engine.Drain(p.scratch[:0])
	p.noteReleased()
	p.appendSummaries(out, true)
	ready := p.held.TakeReady()
	before := p.forwards.Mark()
	p.mu.Unlock()
	p.forwards.WaitBefore(before)
	err := p.forwardHeld(ctx, out, ready)
	if p.telemetry != nil {
		p.telemetry.Shutdown()
		p.telemetry = nil
	}
	return err
}

// Capabilities: the processor moves collective spans out of the batch (and forwards them,
// annotated, later).
func (p *barrierSkewProcessor) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: true}
}

// ConsumeTraces passes non-collective spans through at once and buffers collective spans
// until their collective is released.
func (p *barrierSkewProcessor) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	p.mu.Lock()
	rss := td.ResourceSpans()
	p.resources = p.resources[:0]
	for i := range rss.Len() {
		p.resources = append(p.resources, spanio.ParseResource(rss.At(i).Resource(), p.cfg.MaxAttributeLength))
	}
	// Phases first, so that a step's phases in this batch are known when its collectives
	// in the same batch complete.
	for i := range rss.Len() {
		res := &p.resources[i]
		sss := rss.At(i).ScopeSpans()
		for j := range sss.Len() {
			spans := sss.At(j).Spans()
			for k := range spans.Len() {
				span := spans.At(k)
				if kind, phase := spanio.Classify(span.Name()); kind == spanio.KindPhase {
					if ph, ok := spanio.ParsePhase(span, res, phase); ok {
						p.engine.AddPhase(ph)
					}
				} else if spanio.IsLayers(span) {
					if lp, ok := spanio.ParseLayers(span, res); ok {
						p.engine.AddLayers(res.Job, res.Rank, lp)
					}
				}
			}
		}
	}
	p.scratch = p.scratch[:0]
	moved := false
	for i := range rss.Len() {
		rs := rss.At(i)
		res := &p.resources[i]
		sss := rs.ScopeSpans()
		for j := range sss.Len() {
			ss := sss.At(j)
			ss.Spans().RemoveIf(func(span ptrace.Span) bool {
				taken := p.take(rs, ss, [2]int{i, j}, span, res)
				moved = moved || taken
				return taken
			})
		}
	}
	if moved {
		rss.RemoveIf(func(rs ptrace.ResourceSpans) bool {
			rs.ScopeSpans().RemoveIf(func(ss ptrace.ScopeSpans) bool { return ss.Spans().Len() == 0 })
			return rs.ScopeSpans().Len() == 0
		})
	}
	p.noteReleased()
	for _, err := range p.held.Seal() {
		// Held decoded instead: more memory, nothing lost.
		p.logger.Warn("encoding held collective spans failed", zap.Error(err))
	}
	ready := p.held.TakeReady()
	id := p.forwards.Begin()
	p.mu.Unlock()
	defer p.forwards.End(id)
	return p.forwardHeld(ctx, td, ready)
}

// take moves a joinable collective span out of the batch into the engine and reports whether
// it did; everything else stays in the batch.
func (p *barrierSkewProcessor) take(rs ptrace.ResourceSpans, ss ptrace.ScopeSpans, at [2]int,
	span ptrace.Span, res *spanio.Resource,
) bool {
	kind, _ := spanio.Classify(span.Name())
	if kind != spanio.KindCollective {
		if spanio.IsSummary(span) {
			// Only this processor writes step summaries: one arriving from outside is
			// forged (it would set flags and costs in the connector's metrics).
			p.malformed[reasonForeignSummary]++
			return true
		}
		p.passedThrough++
		return false
	}
	// Annotations are this processor's to write: whatever a span claims on arrival is
	// dropped, and the span is joined like any other.
	spanio.StripAnnotations(span)
	var a join.Arrival[heldbatch.Member]
	if reason := spanio.ParseCollective(span, res, &a); reason != "" {
		p.malformed[reason]++
		spanio.MarkUnjoined(span, reason)
		return false
	}
	a.Ref = p.held.Next(a.Job, a.Step)
	var outcome join.Outcome
	outcome, p.scratch = p.engine.Add(&a, p.scratch)
	if outcome != join.Accepted {
		// Counted by the engine's rejection stats; the span stays where it is.
		spanio.MarkUnjoined(span, outcome.Reason())
		return false
	}
	a.Ref.Take(rs, ss, at, span)
	if len(p.scratch) > 0 {
		// Annotate and recycle what this member released now, not at the end of the batch:
		// the last rank's batch of a 4096-rank step releases all its collectives, and their
		// members (~20 MB at once) would otherwise all be alive together.
		p.noteReleased()
	}
	return true
}

// noteReleased writes the engine's figures for the members of the collectives in p.scratch
// into their held batches' notes (queuing every sealed batch that has no pending member
// left), and recycles the collectives.
func (p *barrierSkewProcessor) noteReleased() {
	for _, r := range p.scratch {
		p.held.Release(r)
		p.engine.Recycle(r)
	}
	p.scratch = p.scratch[:0]
}
