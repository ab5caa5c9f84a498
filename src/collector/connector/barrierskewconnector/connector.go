package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.uber.org/zap"

	"github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector/internal/metadata"
	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/internal/ticker"
)

// reasonNotAnnotated counts, under join: annotated, the collective spans skipped because
// the processor did not annotate them.
const reasonNotAnnotated = "not_annotated"

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// spanRef is what the connector keeps of a buffered span: enough for an exemplar.
type spanRef struct {
	traceID pcommon.TraceID
	spanID  pcommon.SpanID
}

// barrierSkewConnector turns spans into the barrierskew metrics.
//
//	collective span annotated by the processor ──read──▶ aggregator   (one join per collective)
//	collective span not annotated ──▶ own join engine ──released──▶ aggregator
//	train.step ──▶ step duration histogram; phase spans ──▶ own engine (causes)
//	train.step.summary (the processor's step analysis) ──▶ flags, costs, suspects
//	ticker (metrics_flush_interval): expire and analyze own engine, emit metrics ──▶ next
//
// The config's join key chooses the path: auto (above, span by span), annotated (only the
// read path: unannotated collective spans are skipped, counted not_annotated, and no phase
// is kept) or own (only the own engine: annotations, unjoined marks and summaries ignored).
type barrierSkewConnector struct {
	logger *zap.Logger
	cfg    *Config
	next   consumer.Metrics
	clock  join.Clock

	mu            sync.Mutex
	engine        *join.Engine[spanRef]
	scratch       []*join.Released[spanRef]
	resources     []spanio.Resource
	agg           *aggregator
	malformed     map[string]int64
	passedThrough int64
	// seen remembers recent annotated collectives so that their skew (carried by every
	// member's span) is counted once. The step is part of the key: a job restarted under
	// the same id starts its sequence numbers over.
	seen     map[seenKey]struct{}
	seenRing []seenKey
	seenPos  int
	// joinedJobs are the jobs whose collectives arrive joined by the processor. Their phase
	// spans are not kept: the own engine never analyzes their steps, and at 4096 ranks its
	// phase cache was ~14 MB that nothing read. A collective of the job that arrives
	// unannotated puts the job back, and its phases are kept from then on.
	joinedJobs map[string]struct{}

	telemetry *metadata.TelemetryBuilder
	flushes   ticker.Loop
}

func newConnector(
	set connector.Settings, cfg *Config, next consumer.Metrics, clock join.Clock,
) (*barrierSkewConnector, error) {
	c := &barrierSkewConnector{
		logger:    set.Logger,
		cfg:       cfg,
		next:      next,
		clock:     clock,
		engine:    join.New[spanRef](cfg.Config, clock),
		agg:       newAggregator(cfg),
		malformed: make(map[string]int64),
		seen:      make(map[seenKey]struct{}, cfg.DedupWindow),
		seenRing:  make([]seenKey, cfg.DedupWindow),

		joinedJobs: make(map[string]struct{}),
	}
	tb, err := newTelemetry(set.TelemetrySettings, c.snapshot)
	if err != nil {
		return nil, err
	}
	c.telemetry = tb
	return c, nil
}

// Start launches the flush ticker.
func (c *barrierSkewConnector) Start(context.Context, component.Host) error {
	c.flushes.Start(c.cfg.MetricsFlushInterval, func() {
		if err := c.flush(context.Background(), false); err != nil {
			c.logger.Warn("emitting barrierskew metrics failed", zap.Error(err))
		}
	})
	return nil
}

// flush releases the own engine's expired collectives (all of them at shutdown) and emits
// the metrics.
func (c *barrierSkewConnector) flush(ctx context.Context, drain bool) error {
	c.mu.Lock()
	now := c.clock.Now()
	if drain {
		c.scratch = c.engine.Drain(c.scratch[:0])
	} else {
		c.scratch = c.engine.Expire(c.scratch[:0])
	}
	c.observeReleased(now)
	results := c.engine.Analyze(drain)
	for i := range results {
		c.agg.observeStepResult(now, &results[i])
	}
	md := c.agg.build(now)
	c.mu.Unlock()
	if md.DataPointCount() == 0 {
		return nil
	}
	return c.next.ConsumeMetrics(ctx, md)
}

// Shutdown stops the ticker and emits a last flush including every pending collective.
func (c *barrierSkewConnector) Shutdown(ctx context.Context) error {
	c.flushes.Stop()
	err := c.flush(ctx, true)
	if c.telemetry != nil {
		c.telemetry.Shutdown()
		c.telemetry = nil
	}
	return err
}

// Capabilities: the connector only reads spans.
func (c *barrierSkewConnector) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

// ConsumeTraces records the spans; metrics leave on the flush ticker.
func (c *barrierSkewConnector) ConsumeTraces(_ context.Context, td ptrace.Traces) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	rss := td.ResourceSpans()
	c.resources = c.resources[:0]
	for i := range rss.Len() {
		c.resources = append(c.resources, spanio.ParseResource(rss.At(i).Resource(), c.cfg.MaxAttributeLength))
	}
	forEachSpan(rss, func(i int, span ptrace.Span) {
		kind, phase := spanio.Classify(span.Name())
		if kind == spanio.KindOther && spanio.IsSummary(span) {
			if c.cfg.Join == JoinOwn {
				// The own engine analyzes every step: the processor's analysis of the
				// same steps would count twice.
				return
			}
			// The processor analyzed this step: its verdicts become the flag metrics.
			// A deferred summary's flags are decided by the job's verdict stage, whose
			// summary comes back here (or to another instance) decided.
			if res, ok := spanio.ReadSummary(span, rss.At(i).Resource(),
				c.cfg.MaxAttributeLength); ok && !res.Deferred {
				c.agg.observeStepResult(now, &res)
			}
			return
		}
		if kind != spanio.KindPhase {
			if spanio.IsLayers(span) && c.cfg.Join != JoinAnnotated {
				res := &c.resources[i]
				if _, joined := c.joinedJobs[res.Job]; !joined {
					if lp, ok := spanio.ParseLayers(span, res); ok {
						c.engine.AddLayers(res.Job, res.Rank, lp)
					}
				}
			}
			return
		}
		res := &c.resources[i]
		ph, ok := spanio.ParsePhase(span, res, phase)
		if !ok {
			return
		}
		if _, joined := c.joinedJobs[ph.Job]; !joined && c.cfg.Join != JoinAnnotated {
			c.engine.AddPhase(ph)
		}
		if phase == diagnosis.PhaseStep {
			c.agg.observeStep(now, rankOf(res), float64(ph.EndUnixNano-ph.StartUnixNano)/1e9,
				spanRef{traceID: span.TraceID(), spanID: span.SpanID()})
		}
	})
	c.scratch = c.scratch[:0]
	forEachSpan(rss, func(i int, span ptrace.Span) {
		if kind, _ := spanio.Classify(span.Name()); kind != spanio.KindCollective {
			return
		}
		if c.cfg.Join != JoinOwn && spanio.Unjoined(span) {
			// The processor forwarded it without a join (malformed, duplicate, late): joining
			// it here would open a collective that never completes.
			c.passedThrough++
			return
		}
		res := &c.resources[i]
		var a join.Arrival[spanRef]
		if reason := spanio.ParseCollective(span, res, &a); reason != "" {
			c.malformed[reason]++
			return
		}
		ref := spanRef{traceID: span.TraceID(), spanID: span.SpanID()}
		if c.cfg.Join != JoinOwn && spanio.IsAnnotated(span) {
			c.passedThrough++
			c.observeAnnotated(now, &a, spanio.ReadAnnotations(span), ref)
			return
		}
		if c.cfg.Join == JoinAnnotated {
			c.malformed[reasonNotAnnotated]++
			return
		}
		c.noteJoined(a.Job, false)
		a.Ref = ref
		_, c.scratch = c.engine.Add(&a, c.scratch)
	})
	c.observeReleased(now)
	return nil
}

func forEachSpan(rss ptrace.ResourceSpansSlice, f func(resourceIndex int, span ptrace.Span)) {
	for i := range rss.Len() {
		sss := rss.At(i).ScopeSpans()
		for j := range sss.Len() {
			spans := sss.At(j).Spans()
			for k := range spans.Len() {
				f(i, spans.At(k))
			}
		}
	}
}

func rankOf(res *spanio.Resource) rankKey {
	return rankKey{job: res.Job, rank: res.Rank, Topology: res.Topology}
}

// observeAnnotated records a span the processor already joined.
func (c *barrierSkewConnector) observeAnnotated(
	now time.Time, a *join.Arrival[spanRef], ann spanio.Annotations, ref spanRef,
) {
	if c.firstSighting(seenKey{Key: a.Key, step: a.Step}) {
		// Once a collective, not once a member: the job's phases stop being kept.
		c.noteJoined(a.Job, true)
		c.agg.observeCollective(now, collective{
			key:          collectiveKey{job: a.Job, pg: a.PG, op: a.Op},
			skew:         ann.Skew,
			transfer:     ann.Transfer,
			missingRanks: ann.MissingRanks,
			missing:      ann.Missing,
			released:     ann.Released,
			skewRef:      ref,
		})
	}
	c.agg.observeMember(now, memberObservation{
		rank:        rankKey{job: a.Job, rank: a.Rank, Topology: a.Topology},
		lateness:    ann.Lateness,
		wait:        ann.Wait,
		clockOffset: ann.ClockOffset,
		ref:         ref,
	})
}

// maxJoinedJobs bounds joinedJobs; past it the set starts over (phases are kept again until
// each job's next annotated collective).
const maxJoinedJobs = 1024

// noteJoined records whether a collective of job arrived joined by the processor.
func (c *barrierSkewConnector) noteJoined(job string, joined bool) {
	_, was := c.joinedJobs[job]
	switch {
	case joined == was:
	case joined:
		if len(c.joinedJobs) >= maxJoinedJobs {
			clear(c.joinedJobs)
		}
		c.joinedJobs[strings.Clone(job)] = struct{}{}
	default:
		delete(c.joinedJobs, job)
	}
}

type seenKey struct {
	join.Key
	step int64
}

func (c *barrierSkewConnector) firstSighting(k seenKey) bool {
	if _, ok := c.seen[k]; ok {
		return false
	}
	// Keys are unique in the ring (a seen key is never added again while it is there).
	old := c.seenRing[c.seenPos]
	if old.Job != "" || old.PG != "" {
		delete(c.seen, old)
	}
	c.seenRing[c.seenPos] = k
	c.seen[k] = struct{}{}
	c.seenPos = (c.seenPos + 1) % len(c.seenRing)
	return true
}

// observeReleased records the collectives in c.scratch that the own engine released.
func (c *barrierSkewConnector) observeReleased(now time.Time) {
	for _, r := range c.scratch {
		col := collective{
			key:          collectiveKey{job: r.Job, pg: r.PG, op: r.Op},
			skew:         r.Skew,
			transfer:     r.Transfer,
			missingRanks: r.MissingRanks,
			missing:      r.Missing,
		}
		if r.MissingRanks > 0 {
			col.released = r.Reason.String()
		}
		lastArrival := -1
		for i := range r.Members {
			if lastArrival < 0 || r.Members[i].Lateness > r.Members[lastArrival].Lateness {
				lastArrival = i
			}
		}
		if lastArrival >= 0 {
			col.skewRef = r.Members[lastArrival].Ref
		}
		c.agg.observeCollective(now, col)
		for i := range r.Members {
			m := &r.Members[i]
			c.agg.observeMember(now, memberObservation{
				rank:        rankKey{job: r.Job, rank: m.Rank, Topology: m.Topology},
				lateness:    m.Lateness,
				wait:        m.Wait,
				clockOffset: m.ClockOffset,
				ref:         m.Ref,
			})
		}
		c.engine.Recycle(r)
	}
	c.scratch = c.scratch[:0]
}
