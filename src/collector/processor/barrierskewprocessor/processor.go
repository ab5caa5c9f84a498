package barrierskewprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
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

// heldBatch is the collective spans one incoming batch handed to the engine, moved out of it
// under copies of their resources and scopes. From the end of that batch until the last of
// its collectives is released it is held encoded (OTLP protobuf, S2-compressed): bytes take
// a fraction of the memory of decoded pdata and the GC does not scan them, and at thousands
// of ranks the processor holds about one step of every rank's collective spans. The spans of
// one batch repeat their attribute keys and most values, so S2 takes the protobuf to about a
// tenth of its size (28 MB -> 2.5 MB for a 4096-rank step; docs/performance.md).
type heldBatch struct {
	// traces: the spans while the batch is being taken, or when it needs no encoding (every
	// collective released by the batch that took them).
	traces ptrace.Traces
	data   []byte
	// at: where the spans of the incoming batch's (resource, scope) went in traces.
	at      map[[2]int]ptrace.SpanSlice
	spans   int
	pending int
	// notes: each span's annotations by its index (the order in which the batch took them),
	// written as its collective is released.
	notes []spanio.Note
	// order: the index of each span in data when some of the batch's spans left before it
	// was encoded (nil: data holds every span, in index order).
	order []int32
	// written: the spans in traces are annotated already.
	written bool
	// sealed: the incoming batch is done; the held batch is forwarded once pending is 0.
	sealed bool
}

// stepKey is a (job, step): the unit a held batch holds.
type stepKey struct {
	job  string
	step int64
}

// inFlight tracks the batches forwarding what they released, so that the release ticker
// can wait for those that began before it analyzed a step, and only for those: waiting
// behind a lock would stop every batch that arrives meanwhile (a 4096-rank step takes
// seconds to forward), and with them the receiver. begin and mark are called under the
// processor's lock, so an id orders a batch's release against the ticker's analysis.
type inFlight struct {
	mu       sync.Mutex
	cond     sync.Cond
	next     uint64
	inFlight map[uint64]struct{}
}

func (f *inFlight) init() {
	f.inFlight = make(map[uint64]struct{})
	f.cond.L = &f.mu
}

func (f *inFlight) begin() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.next
	f.next++
	f.inFlight[id] = struct{}{}
	return id
}

func (f *inFlight) end(id uint64) {
	f.mu.Lock()
	delete(f.inFlight, id)
	f.mu.Unlock()
	f.cond.Broadcast()
}

// mark returns the id the next batch will get: waitBefore(mark()) waits for every batch
// that began before.
func (f *inFlight) mark() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

func (f *inFlight) waitBefore(mark uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		earlier := false
		for id := range f.inFlight {
			if id < mark {
				earlier = true
				break
			}
		}
		if !earlier {
			return
		}
		f.cond.Wait()
	}
}

// member is how a held collective span is found: its batch and its index in it.
type member struct {
	batch *heldBatch
	index int
}

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
	// released before it (see inFlight).
	forwards  inFlight
	engine    *join.Engine[member]
	scratch   []*join.Released[member]
	resources []spanio.Resource
	// taking: the held batches of the incoming batch being taken, one per (job, step): a
	// rank's batch often ends one step and begins the next, and the spans of the step that
	// completes first must not wait for the next one's.
	taking map[stepKey]*heldBatch
	// ready: held batches whose every collective was released, to forward.
	ready []*heldBatch
	// encoded is seal's compression buffer.
	encoded       []byte
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
		engine:    join.New[member](cfg.Config, clock),
		malformed: make(map[string]int64),
		taking:    make(map[stepKey]*heldBatch),
	}
	p.forwards.init()
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
	ready := p.takeReady()
	before := p.forwards.mark()
	p.mu.Unlock()
	p.forwards.waitBefore(before)
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

// takeReady hands over the held batches that are ready to forward.
func (p *barrierSkewProcessor) takeReady() []*heldBatch {
	ready := p.ready
	p.ready = nil
	return ready
}

// forwardHeld forwards the ready held batches, decoded and annotated, then td (when not
// empty), in calls of at most forwardChunk spans (a held batch larger than that goes whole).
// Released collectives go first: a late rank's batch completes its collectives and carries
// its train.step, and what is behind (traceshape) keeps that step for the late member it
// learns of from the collectives.
func (p *barrierSkewProcessor) forwardHeld(ctx context.Context, td ptrace.Traces, ready []*heldBatch) error {
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
		spans, ok := hb.decode()
		if !ok {
			p.mu.Lock()
			p.malformed[reasonHoldLost] += int64(hb.spans)
			p.mu.Unlock()
			p.logger.Error("a held batch of collective spans could not be decoded",
				zap.Int("spans", hb.spans))
			continue
		}
		if n > 0 && n+hb.spans > forwardChunk {
			send()
		}
		spans.ResourceSpans().MoveAndAppendTo(out.ResourceSpans())
		n += hb.spans
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
	ready := p.takeReady()
	before := p.forwards.mark()
	p.mu.Unlock()
	p.forwards.waitBefore(before)
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
				}
			}
		}
	}
	p.scratch = p.scratch[:0]
	clear(p.taking)
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
	for _, hb := range p.taking {
		p.seal(hb)
	}
	clear(p.taking)
	ready := p.takeReady()
	id := p.forwards.begin()
	p.mu.Unlock()
	defer p.forwards.end(id)
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
	var a join.Arrival[member]
	if reason := spanio.ParseCollective(span, res, &a); reason != "" {
		p.malformed[reason]++
		spanio.MarkUnjoined(span, reason)
		return false
	}
	hb := p.takingFor(a.Job, a.Step)
	a.Ref = member{batch: hb, index: hb.spans}
	var outcome join.Outcome
	outcome, p.scratch = p.engine.Add(&a, p.scratch)
	if outcome != join.Accepted {
		// Counted by the engine's rejection stats; the span stays where it is.
		spanio.MarkUnjoined(span, outcome.Reason())
		return false
	}
	span.MoveTo(hb.slice(rs, ss, at).AppendEmpty())
	hb.spans++
	hb.pending++
	if len(p.scratch) > 0 {
		// Annotate and recycle what this member released now, not at the end of the batch:
		// the last rank's batch of a 4096-rank step releases all its collectives, and their
		// members (~20 MB at once) would otherwise all be alive together.
		p.noteReleased()
	}
	return true
}

// takingFor returns the held batch of the incoming batch for (job, step).
func (p *barrierSkewProcessor) takingFor(job string, step int64) *heldBatch {
	k := stepKey{job: job, step: step}
	hb, ok := p.taking[k]
	if !ok {
		hb = &heldBatch{}
		p.taking[k] = hb
	}
	return hb
}

// slice returns where the held batch keeps the spans of the incoming batch's (resource,
// scope) at, copying the resource and scope the first time. The spans are taken in the
// incoming batch's order, so each (resource, scope)'s are contiguous and the order of the
// held batch's traces is the order of the spans' indexes.
func (hb *heldBatch) slice(rs ptrace.ResourceSpans, ss ptrace.ScopeSpans, at [2]int) ptrace.SpanSlice {
	if spans, ok := hb.at[at]; ok {
		return spans
	}
	if hb.at == nil {
		hb.traces = ptrace.NewTraces()
		hb.at = make(map[[2]int]ptrace.SpanSlice)
	}
	out := hb.traces.ResourceSpans().AppendEmpty()
	rs.Resource().CopyTo(out.Resource())
	out.SetSchemaUrl(rs.SchemaUrl())
	outSS := out.ScopeSpans().AppendEmpty()
	ss.Scope().CopyTo(outSS.Scope())
	outSS.SetSchemaUrl(ss.SchemaUrl())
	hb.at[at] = outSS.Spans()
	return outSS.Spans()
}

// seal ends the taking of a held batch. The spans whose collectives this very batch released
// (a tensor-parallel group whose ranks share the batch, say) are ready at once; the others
// are encoded until their collectives are released.
func (p *barrierSkewProcessor) seal(hb *heldBatch) {
	hb.at = nil
	hb.sealed = true
	switch {
	case hb.spans == 0:
		return
	case hb.pending == 0:
		p.ready = append(p.ready, hb)
		return
	case hb.pending < hb.spans:
		p.ready = append(p.ready, hb.splitReleased())
	}
	data, err := (&ptrace.ProtoMarshaler{}).MarshalTraces(hb.traces)
	if err != nil {
		// Held decoded instead: more memory, nothing lost.
		p.logger.Warn("encoding held collective spans failed", zap.Error(err))
		return
	}
	// s2.Encode's output keeps the capacity of its worst case (more than the input): the held
	// copy is exactly as long as the compressed bytes.
	p.encoded = s2.Encode(p.encoded[:cap(p.encoded)], data)
	hb.data, hb.traces = bytes.Clone(p.encoded), ptrace.Traces{}
	if cap(p.encoded) > maxEncodeScratch {
		p.encoded = nil
	}
}

// maxEncodeScratch is the largest compression buffer the processor keeps between batches.
const maxEncodeScratch = 4 << 20

// splitReleased moves the spans whose notes are written out of the held batch into a batch
// of their own, annotated, and records the original index of each span that stays.
func (hb *heldBatch) splitReleased() *heldBatch {
	done := &heldBatch{traces: ptrace.NewTraces(), written: true}
	hb.order = make([]int32, 0, hb.pending)
	i := 0
	rss := hb.traces.ResourceSpans()
	for r := range rss.Len() {
		rs := rss.At(r)
		sss := rs.ScopeSpans()
		for s := range sss.Len() {
			ss := sss.At(s)
			var to ptrace.SpanSlice
			moved := false
			ss.Spans().RemoveIf(func(span ptrace.Span) bool {
				index := i
				i++
				if index >= len(hb.notes) || hb.notes[index].CollectiveNote == nil {
					hb.order = append(hb.order, int32(index))
					return false
				}
				if !moved {
					out := done.traces.ResourceSpans().AppendEmpty()
					rs.Resource().CopyTo(out.Resource())
					out.SetSchemaUrl(rs.SchemaUrl())
					outSS := out.ScopeSpans().AppendEmpty()
					ss.Scope().CopyTo(outSS.Scope())
					outSS.SetSchemaUrl(ss.SchemaUrl())
					to, moved = outSS.Spans(), true
				}
				hb.notes[index].Write(span)
				hb.notes[index] = spanio.Note{}
				span.MoveTo(to.AppendEmpty())
				done.spans++
				return true
			})
		}
	}
	return done
}

// decode returns the held batch's spans with their annotations written.
func (hb *heldBatch) decode() (ptrace.Traces, bool) {
	if hb.written {
		return hb.traces, true
	}
	td := hb.traces
	if hb.data != nil {
		data, err := s2.Decode(nil, hb.data)
		if err != nil {
			return ptrace.Traces{}, false
		}
		td, err = (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(data)
		if err != nil {
			return ptrace.Traces{}, false
		}
		hb.data = nil
	}
	want := hb.spans
	if hb.order != nil {
		want = len(hb.order)
	}
	if td.SpanCount() != want {
		return ptrace.Traces{}, false
	}
	i := 0
	rss := td.ResourceSpans()
	for r := range rss.Len() {
		sss := rss.At(r).ScopeSpans()
		for s := range sss.Len() {
			spans := sss.At(s).Spans()
			for k := range spans.Len() {
				index := i
				if hb.order != nil {
					index = int(hb.order[i])
				}
				hb.notes[index].Write(spans.At(k))
				i++
			}
		}
	}
	hb.notes, hb.order = nil, nil
	return td, true
}

// noteReleased writes the engine's figures for the members of the collectives in p.scratch
// into their held batches' notes, and queues every sealed batch that has no pending member
// left.
func (p *barrierSkewProcessor) noteReleased() {
	for _, r := range p.scratch {
		c := spanio.NewCollectiveNote(r)
		for i := range r.Members {
			m := &r.Members[i]
			hb := m.Ref.batch
			if m.Ref.index >= len(hb.notes) {
				hb.notes = append(hb.notes, make([]spanio.Note, max(m.Ref.index+1, hb.spans)-len(hb.notes))...)
			}
			hb.notes[m.Ref.index] = spanio.NewNote(c, m)
			hb.pending--
			if hb.pending == 0 && hb.sealed {
				p.ready = append(p.ready, hb)
			}
		}
		p.engine.Recycle(r)
	}
	p.scratch = p.scratch[:0]
}
