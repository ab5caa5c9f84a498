package barrierskewprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.uber.org/zap"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/internal/ticker"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor/internal/metadata"
)

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// origin is one copy of a rank's resource and instrumentation scope, shared by every span of
// that rank the processor holds: resources are copied once per rank (and again only when
// they change), not once per span.
type origin struct {
	resource       pcommon.Resource
	resourceSchema string
	scope          pcommon.InstrumentationScope
	scopeSchema    string
}

type originKey struct {
	job   string
	rank  int
	scope string
}

// reasonForeignSummary counts train.step.summary spans that arrived from outside (dropped).
const reasonForeignSummary = "foreign_summary"

// maxOrigins bounds the origin cache; past it the cache starts over (held spans keep their
// origin alive through their own pointer).
const maxOrigins = 1 << 16

// member is how a buffered collective span is held: the span moved out of its batch, and
// where it came from.
type member struct {
	span   ptrace.Span
	origin *origin
}

// barrierSkewProcessor joins collective spans across ranks and annotates them.
//
//	ConsumeTraces(batch)
//	  ├─ pass 1: phase spans ──────────────▶ engine phase cache (read, left in the batch)
//	  ├─ pass 2: collective spans ─▶ moved out of the batch ─▶ engine.Add
//	  │            malformed / rejected ─▶ left in the batch unannotated, counted
//	  └─ batch (everything else) + collectives released by this batch (annotated) ─▶ next
//	ticker (release_interval): collectives past wait_timeout ─▶ annotated, incomplete ─▶ next
//	                           steps due for analysis ─▶ train.step.summary spans ─▶ next
//	Shutdown: every pending collective ─▶ annotated, incomplete; every open step ─▶ next
type barrierSkewProcessor struct {
	logger *zap.Logger
	cfg    *Config
	next   consumer.Traces
	clock  join.Clock

	mu        sync.Mutex
	engine    *join.Engine[member]
	scratch   []*join.Released[member]
	resources []spanio.Resource
	origins   map[originKey]*origin
	// batchOrigins caches this batch's origin per (resource, scope) index pair.
	batchOrigins  map[[2]int]*origin
	malformed     map[string]int64
	passedThrough int64

	telemetry *metadata.TelemetryBuilder
	releases  ticker.Loop
}

func newProcessor(
	set processor.Settings, cfg *Config, next consumer.Traces, clock join.Clock,
) (*barrierSkewProcessor, error) {
	p := &barrierSkewProcessor{
		logger:       set.Logger,
		cfg:          cfg,
		next:         next,
		clock:        clock,
		engine:       join.New[member](cfg.Config, clock),
		malformed:    make(map[string]int64),
		origins:      make(map[originKey]*origin),
		batchOrigins: make(map[[2]int]*origin),
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
	p.appendReleased(out)
	p.appendSummaries(out, false)
	p.mu.Unlock()
	p.forward(ctx, out)
}

// appendSummaries analyzes the steps that are due (all of them when draining) and writes
// each one's train.step.summary span into td.
func (p *barrierSkewProcessor) appendSummaries(td ptrace.Traces, drain bool) {
	results := p.engine.Analyze(drain)
	for i := range results {
		spanio.AppendSummary(td, &results[i])
	}
}

func (p *barrierSkewProcessor) forward(ctx context.Context, td ptrace.Traces) {
	if td.ResourceSpans().Len() == 0 {
		return
	}
	if err := p.next.ConsumeTraces(ctx, td); err != nil {
		p.logger.Warn("forwarding released collective spans failed", zap.Error(err),
			zap.Int("spans", td.SpanCount()))
	}
}

// Shutdown forwards every pending collective (incomplete) and stops the ticker.
func (p *barrierSkewProcessor) Shutdown(ctx context.Context) error {
	p.releases.Stop()
	p.mu.Lock()
	out := ptrace.NewTraces()
	p.scratch = p.engine.Drain(p.scratch[:0])
	p.appendReleased(out)
	p.appendSummaries(out, true)
	p.mu.Unlock()
	var err error
	if out.ResourceSpans().Len() > 0 {
		err = p.next.ConsumeTraces(ctx, out)
	}
	if p.telemetry != nil {
		p.telemetry.Shutdown()
		p.telemetry = nil
	}
	return err
}

// Capabilities: the processor moves collective spans out of the batch and annotates them.
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
				}
			}
		}
	}
	p.scratch = p.scratch[:0]
	clear(p.batchOrigins)
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
	p.appendReleased(td)
	p.mu.Unlock()
	if rss.Len() == 0 {
		return nil
	}
	return p.next.ConsumeTraces(ctx, td)
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
	var a join.Arrival[member]
	if reason := spanio.ParseCollective(span, res, &a); reason != "" {
		p.malformed[reason]++
		spanio.MarkUnjoined(span, reason)
		return false
	}
	held := ptrace.NewSpan()
	span.MoveTo(held)
	a.Ref = member{span: held, origin: p.originOf(rs, ss, at, res)}
	var outcome join.Outcome
	outcome, p.scratch = p.engine.Add(&a, p.scratch)
	if outcome != join.Accepted {
		// Counted by the engine's rejection stats; the span goes back where it was.
		held.MoveTo(span)
		spanio.MarkUnjoined(span, outcome.Reason())
		return false
	}
	return true
}

// originOf returns the shared copy of a span's resource and scope, copying them only when
// this rank's cached copy is missing or differs.
func (p *barrierSkewProcessor) originOf(rs ptrace.ResourceSpans, ss ptrace.ScopeSpans,
	at [2]int, res *spanio.Resource,
) *origin {
	if o, ok := p.batchOrigins[at]; ok {
		return o
	}
	key := originKey{job: res.Job, rank: res.Rank, scope: ss.Scope().Name()}
	o, ok := p.origins[key]
	if !ok || o.resourceSchema != rs.SchemaUrl() || o.scopeSchema != ss.SchemaUrl() ||
		o.scope.Version() != ss.Scope().Version() ||
		!o.resource.Attributes().Equal(rs.Resource().Attributes()) ||
		!o.scope.Attributes().Equal(ss.Scope().Attributes()) {
		o = &origin{
			resource:       pcommon.NewResource(),
			resourceSchema: rs.SchemaUrl(),
			scope:          pcommon.NewInstrumentationScope(),
			scopeSchema:    ss.SchemaUrl(),
		}
		rs.Resource().CopyTo(o.resource)
		ss.Scope().CopyTo(o.scope)
		if len(p.origins) >= maxOrigins {
			clear(p.origins)
		}
		p.origins[key] = o
	}
	p.batchOrigins[at] = o
	return o
}

// appendReleased annotates the spans of the collectives in p.scratch and moves them into td,
// one ResourceSpans per origin.
func (p *barrierSkewProcessor) appendReleased(td ptrace.Traces) {
	if len(p.scratch) == 0 {
		return
	}
	out := td.ResourceSpans()
	byOrigin := make(map[*origin]ptrace.SpanSlice)
	for _, r := range p.scratch {
		for i := range r.Members {
			m := &r.Members[i]
			spanio.Annotate(m.Ref.span, r, m)
			spans, ok := byOrigin[m.Ref.origin]
			if !ok {
				rs := out.AppendEmpty()
				m.Ref.origin.resource.CopyTo(rs.Resource())
				rs.SetSchemaUrl(m.Ref.origin.resourceSchema)
				ss := rs.ScopeSpans().AppendEmpty()
				m.Ref.origin.scope.CopyTo(ss.Scope())
				ss.SetSchemaUrl(m.Ref.origin.scopeSchema)
				spans = ss.Spans()
				byOrigin[m.Ref.origin] = spans
			}
			m.Ref.span.MoveTo(spans.AppendEmpty())
		}
		p.engine.Recycle(r)
	}
	p.scratch = p.scratch[:0]
}
