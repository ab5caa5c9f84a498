package traceshapeprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/traceshapeprocessor"

import (
	"context"
	"errors"
	"math/bits"
	"slices"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/processor/traceshapeprocessor/internal/metadata"
)

// maxTracked bounds the per-trace span counts of one generation: past it the counts of the
// generation before are forgotten (a trace still receiving spans two generations later may
// then hold up to twice max_trace_spans).
const maxTracked = 1 << 16

// maxLateSteps bounds the (job, step, rank) entries remembered as some collective's late
// member; past it they start over.
const maxLateSteps = 1 << 16

// maxLatePerStep bounds the late members whose steps are kept in one step of a job, and
// maxLateStepsTracked the steps per job that count them.
const (
	maxLatePerStep      = 64
	maxLateStepsTracked = 64
)

// skewWindow is how many recent skews of a job's collectives of one size class make the
// usual skew (their median); minSkewSamples are needed before a skew can stand out.
const (
	skewWindow     = 31
	minSkewSamples = 5
	// anomalyFactor x the usual skew, and at least minAnomalousSkew seconds, makes a
	// collective anomalous.
	anomalyFactor    = 3
	minAnomalousSkew = 1e-3
)

// skewHistory is a ring of a job's recent collective skews (one size class of group).
type skewHistory struct {
	vals [skewWindow]float64
	n    int
	next int
}

// anomalous reports whether skew stands out from the recent ones, then remembers it.
func (h *skewHistory) anomalous(skew float64) bool {
	out := true
	if h.n >= minSkewSamples {
		sorted := h.vals // a copy of the array
		slices.Sort(sorted[:h.n])
		out = skew >= minAnomalousSkew && skew > anomalyFactor*sorted[h.n/2]
	}
	h.vals[h.next] = skew
	h.next = (h.next + 1) % skewWindow
	h.n = min(h.n+1, skewWindow)
	return out
}

// maxLabelLength bounds the job ids read from resources and summaries (as the barrierskew
// components do): each one keys state.
const maxLabelLength = 256

// jobShape is what the processor remembers of one job.
type jobShape struct {
	// split: the job is stored one trace per (step, rank); never undone within a job.
	split bool
	world int
	// The spans one rank sends per step, counted on the first rank seen (probe).
	probeRank  int
	probeStep  int64
	probeCount int
	perRank    int
	// The ranks flagged after the latest analyzed step (from its summary).
	flagged     map[int]struct{}
	flaggedStep int64
	// Recent skews by group size class (bit length of pg_size), and the late members kept
	// per step.
	skews     map[int]*skewHistory
	lateSteps map[int64]int
}

func (j *jobShape) observe(rank int, step int64, world int, maxTraceSpans int) bool {
	j.world = max(j.world, world, rank+1)
	if j.probeRank < 0 {
		j.probeRank, j.probeStep = rank, step
	}
	if rank == j.probeRank {
		if step != j.probeStep {
			j.probeStep, j.probeCount = step, 0
		}
		j.probeCount++
		j.perRank = max(j.perRank, j.probeCount)
	}
	if !j.split && j.world*j.perRank > maxTraceSpans {
		j.split = true
		return true
	}
	return false
}

// sampled reports whether a healthy rank keeps its spans: every stride-th rank.
func (j *jobShape) sampled(rank, sample int) bool {
	if sample <= 0 {
		return false
	}
	stride := (j.world + sample - 1) / sample
	return stride <= 1 || rank%stride == 0
}

type rankStep struct {
	job  string
	step int64
	rank int
}

// traceShapeProcessor decides what reaches the trace backend and in which traces.
//
//	ConsumeTraces(batch)
//	  ├─ train.step.summary spans: the job's flagged ranks; links to the ranks they name
//	  ├─ spans of a job whose step fits in one trace: unchanged (dropped past max_trace_spans)
//	  └─ spans of a larger job: the steps of flagged and sampled ranks, and of a collective's
//	     late member from that span on, moved to the trace of their (step, rank), train.step
//	     linked to the step summary; the rest dropped, counted
type traceShapeProcessor struct {
	cfg  *Config
	next consumer.Traces

	mu     sync.Mutex
	jobs   map[string]*jobShape
	counts [2]map[pcommon.TraceID]int32
	traces map[rankStep]pcommon.TraceID
	// resources: this batch's ResourceSpans, read once.
	resources []rankRes
	// late: the (job, step, rank)s that were the late member of a collective; in a split
	// job, the rest of that rank's step (its train.step, which the summary links to, ends
	// after its collectives) is kept too.
	late map[rankStep]struct{}

	telemetry   *metadata.TelemetryBuilder
	healthyRank metric.AddOption
	deferred    metric.AddOption
	traceFull   metric.AddOption
}

func newProcessor(set processor.Settings, cfg *Config, next consumer.Traces) (*traceShapeProcessor, error) {
	tb, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	return &traceShapeProcessor{
		cfg:         cfg,
		next:        next,
		jobs:        make(map[string]*jobShape),
		counts:      [2]map[pcommon.TraceID]int32{make(map[pcommon.TraceID]int32), nil},
		traces:      make(map[rankStep]pcommon.TraceID),
		late:        make(map[rankStep]struct{}),
		telemetry:   tb,
		healthyRank: metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "healthy_rank"))),
		traceFull:   metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "trace_full"))),
		deferred: metric.WithAttributeSet(attribute.NewSet(attribute.String("reason",
			"deferred_summary"))),
	}, nil
}

func (p *traceShapeProcessor) Start(context.Context, component.Host) error { return nil }

func (p *traceShapeProcessor) Shutdown(context.Context) error {
	if p.telemetry != nil {
		p.telemetry.Shutdown()
		p.telemetry = nil
	}
	return nil
}

// Capabilities: the processor forwards copies of what it keeps (trace IDs, parents and links
// rewritten on the copies) and never changes its input.
func (p *traceShapeProcessor) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

func (p *traceShapeProcessor) job(name string) *jobShape {
	j, ok := p.jobs[name]
	if !ok {
		if len(p.jobs) >= p.cfg.MaxJobs {
			clear(p.jobs)
		}
		j = &jobShape{probeRank: -1, flaggedStep: -1, skews: make(map[int]*skewHistory),
			lateSteps: make(map[int64]int)}
		p.jobs[name] = j
	}
	return j
}

// count returns how many spans the processor forwarded into a trace, and whether one more
// may go (counting it).
func (p *traceShapeProcessor) admit(id pcommon.TraceID) bool {
	n := p.counts[0][id]
	if p.counts[1] != nil {
		n += p.counts[1][id]
	}
	if int(n) >= p.cfg.MaxTraceSpans {
		return false
	}
	if len(p.counts[0]) >= maxTracked {
		p.counts[1] = p.counts[0]
		p.counts[0] = make(map[pcommon.TraceID]int32)
	}
	p.counts[0][id]++
	return true
}

func (p *traceShapeProcessor) rankTrace(job string, step int64, rank int) pcommon.TraceID {
	key := rankStep{job: job, step: step, rank: rank}
	id, ok := p.traces[key]
	if !ok {
		id = spanio.RankStepTraceID(job, step, rank)
		p.traces[key] = id
	}
	return id
}

// summaryCopy is the forwarded copy of a step summary, linked at the end of its batch.
type summaryCopy struct {
	span     ptrace.Span
	resource pcommon.Resource
}

// ConsumeTraces shapes the batch and forwards copies of what is kept.
func (p *traceShapeProcessor) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	p.mu.Lock()
	clear(p.traces)
	rss := td.ResourceSpans()
	for i := range rss.Len() {
		p.readSummaries(rss.At(i))
	}
	p.resources = p.resources[:0]
	for i := range rss.Len() {
		p.resources = append(p.resources, rankOf(rss.At(i).Resource()))
		p.markLate(rss.At(i), p.resources[i])
	}
	// What the processor forwards: copies of the kept spans under copies of their resource
	// and scope, in requests of at most max_request_spans spans. The input is never changed
	// (the processor is read-only, so the pipeline does not clone every batch for it beside
	// the barrierskew connector).
	out := spanio.NewCopier(p.cfg.MaxRequestSpans)
	var summaries []summaryCopy
	var kept, healthy, full, deferred int64
	splits := 0
	for i := range rss.Len() {
		rs := rss.At(i)
		res := p.resources[i]
		job, rank, world := res.job, res.rank, res.world
		sss := rs.ScopeSpans()
		var js *jobShape
		if res.ok {
			js = p.job(job)
		}
		for j := range sss.Len() {
			ss := sss.At(j)
			spans := ss.Spans()
			for k := range spans.Len() {
				span := spans.At(k)
				if spanio.IsSummary(span) {
					if deferredSummary(span) {
						deferred++
						continue
					}
					summaries = append(summaries, summaryCopy{out.Add(rs, i, ss, j, span), rs.Resource()})
					kept++
					continue
				}
				step, hasStep := stepOf(span)
				if js == nil || !hasStep || span.Name() == semconv.SpanStepRoot {
					out.Add(rs, i, ss, j, span)
					kept++
					continue
				}
				if js.observe(rank, step, world, p.cfg.MaxTraceSpans) {
					splits++
				}
				if !js.split {
					if !p.admit(span.TraceID()) {
						full++
						continue
					}
					out.Add(rs, i, ss, j, span)
					kept++
					continue
				}
				_, flagged := js.flagged[rank]
				_, late := p.late[rankStep{job: job, step: step, rank: rank}]
				if !flagged && !late && !js.sampled(rank, p.cfg.SampleRanks) {
					healthy++
					continue
				}
				id := p.rankTrace(job, step, rank)
				if !p.admit(id) {
					full++
					continue
				}
				c := out.Add(rs, i, ss, j, span)
				c.SetTraceID(id)
				// The rank's step is the root of the (step, rank) trace, one link away from
				// its step's summary.
				if c.Name() == semconv.SpanStep {
					c.SetParentSpanID(pcommon.NewSpanIDEmpty())
					link := c.Links().AppendEmpty()
					link.SetTraceID(spanio.StepTraceID(job, step))
					link.SetSpanID(spanio.StepSummarySpanID(job, step))
				}
				kept++
			}
		}
	}
	// Linked once the batch's spans are counted: a summary may arrive with the first spans
	// that split its job.
	for _, s := range summaries {
		p.linkSummary(s.span, s.resource)
	}
	p.mu.Unlock()

	if t := p.telemetry; t != nil {
		t.ProcessorTraceshapeSpansKept.Add(ctx, kept)
		if healthy > 0 {
			t.ProcessorTraceshapeSpansDropped.Add(ctx, healthy, p.healthyRank)
		}
		if deferred > 0 {
			t.ProcessorTraceshapeSpansDropped.Add(ctx, deferred, p.deferred)
		}
		if full > 0 {
			t.ProcessorTraceshapeSpansDropped.Add(ctx, full, p.traceFull)
		}
		if splits > 0 {
			t.ProcessorTraceshapeJobsSplit.Add(ctx, int64(splits))
		}
	}
	var errs []error
	for _, req := range out.Batches() {
		if err := p.next.ConsumeTraces(ctx, req); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// markLate remembers the (job, step, rank) of the late member of each anomalous collective:
// one whose skew stands out from the job's recent collectives of its size, or that carries a
// straggler verdict (before the job may split in this very batch). At most maxLatePerStep
// per step.
func (p *traceShapeProcessor) markLate(rs ptrace.ResourceSpans, res rankRes) {
	if !res.ok {
		return
	}
	job, rank := res.job, res.rank
	var js *jobShape
	sss := rs.ScopeSpans()
	for j := range sss.Len() {
		spans := sss.At(j).Spans()
		for k := range spans.Len() {
			span := spans.At(k)
			if kind, _ := spanio.Classify(span.Name()); kind != spanio.KindCollective {
				continue
			}
			step, ok := stepOf(span)
			if !ok {
				continue
			}
			skew, size, late, verdict := lateMember(span)
			if !late {
				continue
			}
			if js == nil {
				js = p.job(job)
			}
			h := js.skews[bits.Len(uint(size))]
			if h == nil {
				h = &skewHistory{}
				js.skews[bits.Len(uint(size))] = h
			}
			if !h.anomalous(skew) && !verdict {
				continue
			}
			key := rankStep{job: job, step: step, rank: rank}
			if _, ok := p.late[key]; ok || js.lateSteps[step] >= maxLatePerStep {
				continue
			}
			if len(p.late) >= maxLateSteps {
				clear(p.late)
			}
			if len(js.lateSteps) >= maxLateStepsTracked {
				clear(js.lateSteps)
			}
			js.lateSteps[step]++
			p.late[key] = struct{}{}
		}
	}
}

// deferredSummary reports whether a step summary was written with flag_decision: deferred:
// the job's verdict stage writes the summary the backend stores, with the job's flags.
func deferredSummary(span ptrace.Span) bool {
	v, ok := span.Attributes().Get(semconv.AttrVerdictDeferred)
	return ok && v.Type() == pcommon.ValueTypeBool && v.Bool()
}

// readSummaries takes the flagged ranks from the step summaries of a resource.
func (p *traceShapeProcessor) readSummaries(rs ptrace.ResourceSpans) {
	sss := rs.ScopeSpans()
	for j := range sss.Len() {
		spans := sss.At(j).Spans()
		for k := range spans.Len() {
			span := spans.At(k)
			if !spanio.IsSummary(span) {
				continue
			}
			res, ok := spanio.ReadSummary(span, rs.Resource(), maxLabelLength)
			if !ok || res.Deferred {
				continue
			}
			js := p.job(res.Job)
			if res.Step >= js.flaggedStep {
				js.flaggedStep = res.Step
				js.flagged = make(map[int]struct{}, len(res.Flagged))
				for _, f := range res.Flagged {
					js.flagged[f.Rank] = struct{}{}
				}
			}
		}
	}
}

// linkSummary links the forwarded copy of a step summary to the train.step spans of the ranks
// it names (root causes first, then flagged ranks), at most max_links.
func (p *traceShapeProcessor) linkSummary(span ptrace.Span, resource pcommon.Resource) {
	res, ok := spanio.ReadSummary(span, resource, maxLabelLength)
	if !ok {
		return
	}
	js := p.job(res.Job)
	linked := make(map[int]bool)
	link := func(rank int) {
		if linked[rank] || len(linked) >= p.cfg.MaxLinks {
			return
		}
		linked[rank] = true
		l := span.Links().AppendEmpty()
		if js.split {
			l.SetTraceID(p.rankTrace(res.Job, res.Step, rank))
		} else {
			l.SetTraceID(span.TraceID())
		}
		l.SetSpanID(spanio.RankStepSpanID(res.Job, res.Step, rank))
		l.Attributes().PutInt(semconv.AttrRank, int64(rank))
	}
	for _, rc := range res.RootCauses {
		if rc.Rank >= 0 {
			link(rc.Rank)
		}
	}
	for _, f := range res.Flagged {
		link(f.Rank)
	}
}

// rankRes is what the processor reads of a rank's resource.
type rankRes struct {
	job   string
	rank  int
	world int
	ok    bool
}

// rankOf reads the job, rank and world size of a rank's resource, integers as the barrierskew
// components read them (spanio.ResourceInt). ok is false for a resource without a job id
// (or one longer than maxLabelLength) or rank: the Collector's own summaries, foreign spans.
func rankOf(res pcommon.Resource) rankRes {
	attrs := res.Attributes()
	job, ok := attrs.Get(semconv.AttrJobID)
	if !ok || job.Type() != pcommon.ValueTypeStr || job.Str() == "" ||
		len(job.Str()) > maxLabelLength {
		return rankRes{}
	}
	rank, ok := spanio.ResourceInt(attrs, semconv.AttrRank)
	if !ok || rank < 0 || rank >= 1<<20 {
		return rankRes{}
	}
	world, ok := spanio.ResourceInt(attrs, semconv.AttrWorldSize)
	if !ok || world <= 0 || world > 1<<20 {
		world = 0
	}
	return rankRes{job: job.Str(), rank: int(rank), world: int(world), ok: true}
}

func stepOf(span ptrace.Span) (int64, bool) {
	v, ok := span.Attributes().Get(semconv.AttrStep)
	if !ok || v.Type() != pcommon.ValueTypeInt || v.Int() < 0 {
		return 0, false
	}
	return v.Int(), true
}

// lateMember reads a collective span's annotations: its skew and group size, whether it was
// the late member (the one the others waited for: lateness equal to the skew), and whether it
// carries a straggler verdict.
func lateMember(span ptrace.Span) (skew float64, size int64, late, verdict bool) {
	attrs := span.Attributes()
	if v, ok := attrs.Get(semconv.AttrStraggler); ok && v.Type() == pcommon.ValueTypeBool && v.Bool() {
		verdict = true
	}
	if v, ok := attrs.Get(semconv.AttrCollectivePGSize); ok && v.Type() == pcommon.ValueTypeInt {
		size = max(0, v.Int())
	}
	s, ok := attrs.Get(semconv.AttrBarrierSkew)
	if !ok || s.Type() != pcommon.ValueTypeDouble || s.Double() <= 0 {
		return 0, size, verdict, verdict
	}
	l, ok := attrs.Get(semconv.AttrBarrierLateness)
	late = verdict || (ok && l.Type() == pcommon.ValueTypeDouble && l.Double() >= s.Double())
	return s.Double(), size, late, verdict
}
