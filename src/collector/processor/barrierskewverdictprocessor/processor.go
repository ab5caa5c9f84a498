package barrierskewverdictprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewverdictprocessor"

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
	"github.com/skewtrace/skewtrace/src/collector/internal/ticker"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewverdictprocessor/internal/metadata"
)

type clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// verdictProcessor decides each job's flags from the step summaries of every instance that
// analyzed its steps:
//
//	train.step.summary, flag_decision: deferred ─▶ the job's flag state, in step order
//	    (waiting up to reorder_wait for earlier steps) ─▶ the summary again, with the job's
//	    flags, suspects, imbalances and slowdown, not deferred
//	any other span, or a summary decided where it was written ─▶ unchanged
type verdictProcessor struct {
	logger *zap.Logger
	cfg    *Config
	next   consumer.Traces
	clock  clock

	mu       sync.Mutex
	verdicts *diagnosis.Verdicts
	decided  []diagnosis.StepResult

	telemetry *metadata.TelemetryBuilder
	outcomes  map[string]metric.AddOption
	releases  ticker.Loop
}

func newProcessor(set processor.Settings, cfg *Config, next consumer.Traces, clk clock,
) (*verdictProcessor, error) {
	p := &verdictProcessor{
		logger:   set.Logger,
		cfg:      cfg,
		next:     next,
		clock:    clk,
		verdicts: diagnosis.NewVerdicts(cfg.diagnosisConfig(), cfg.ReorderWait),
		outcomes: make(map[string]metric.AddOption),
	}
	for _, o := range []string{outcomeDecided, outcomeLate, outcomeDuplicate, outcomeDropped,
		outcomeUnreadable, outcomeNotDeferred} {
		p.outcomes[o] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))
	}
	tb, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	if err := tb.RegisterProcessorBarrierskewverdictWaitingSummariesCallback(
		func(_ context.Context, o metric.Int64Observer) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			o.Observe(int64(p.verdicts.Pending()))
			return nil
		}); err != nil {
		tb.Shutdown()
		return nil, err
	}
	p.telemetry = tb
	return p, nil
}

const (
	outcomeDecided     = "decided"
	outcomeLate        = "late"
	outcomeDuplicate   = "duplicate"
	outcomeDropped     = "dropped"
	outcomeUnreadable  = "unreadable"
	outcomeNotDeferred = "not_deferred"
)

// Start launches the ticker that decides the summaries whose wait is over.
func (p *verdictProcessor) Start(context.Context, component.Host) error {
	p.releases.Start(p.cfg.ReleaseInterval, func() {
		ctx := context.Background()
		if err := p.release(ctx, false); err != nil {
			p.logger.Warn("forwarding decided step summaries failed", zap.Error(err))
		}
	})
	return nil
}

// Shutdown decides every waiting summary and forwards it.
func (p *verdictProcessor) Shutdown(ctx context.Context) error {
	p.releases.Stop()
	err := p.release(ctx, true)
	if p.telemetry != nil {
		p.telemetry.Shutdown()
	}
	return err
}

func (p *verdictProcessor) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

// ConsumeTraces takes the deferred summaries into their jobs' flag state and forwards what
// is decided now, with every other span unchanged.
func (p *verdictProcessor) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	unchanged := spanio.NewCopier(0)
	counts := make(map[string]int64)
	now := p.clock.Now()
	p.mu.Lock()
	before := p.verdicts.Stats()
	rss := td.ResourceSpans()
	for i := range rss.Len() {
		rs := rss.At(i)
		sss := rs.ScopeSpans()
		for k := range sss.Len() {
			ss := sss.At(k)
			spans := ss.Spans()
			for n := range spans.Len() {
				span := spans.At(n)
				if !spanio.IsSummary(span) {
					unchanged.Add(rs, i, ss, k, span)
					continue
				}
				res, ok := spanio.ReadSummary(span, rs.Resource(), p.cfg.MaxAttributeLength)
				switch {
				case !ok:
					counts[outcomeUnreadable]++
				case !res.Deferred:
					counts[outcomeNotDeferred]++
					unchanged.Add(rs, i, ss, k, span)
				default:
					p.decided = p.verdicts.Add(res, now, p.decided)
				}
			}
		}
	}
	decided := p.takeDecided(before, counts)
	p.mu.Unlock()
	out := unchanged.Traces()
	for i := range decided {
		spanio.AppendSummary(out, &decided[i])
	}
	p.count(ctx, counts)
	if out.ResourceSpans().Len() == 0 {
		return nil
	}
	return p.next.ConsumeTraces(ctx, out)
}

// release decides the summaries whose wait is over (all of them when draining) and
// forwards them.
func (p *verdictProcessor) release(ctx context.Context, drain bool) error {
	counts := make(map[string]int64)
	p.mu.Lock()
	before := p.verdicts.Stats()
	p.decided = p.verdicts.Ready(p.clock.Now(), drain, p.decided)
	decided := p.takeDecided(before, counts)
	p.mu.Unlock()
	p.count(ctx, counts)
	if len(decided) == 0 {
		return nil
	}
	out := ptrace.NewTraces()
	for i := range decided {
		spanio.AppendSummary(out, &decided[i])
	}
	return p.next.ConsumeTraces(ctx, out)
}

// takeDecided hands over the decided steps and counts the outcomes since before. Called
// with mu held.
func (p *verdictProcessor) takeDecided(before diagnosis.VerdictStats, counts map[string]int64,
) []diagnosis.StepResult {
	after := p.verdicts.Stats()
	late := after.Late - before.Late
	counts[outcomeDecided] += after.Decided - before.Decided - late
	counts[outcomeLate] += late
	counts[outcomeDuplicate] += after.Duplicates - before.Duplicates
	counts[outcomeDropped] += after.StepsDropped - before.StepsDropped
	decided := p.decided
	p.decided = nil
	return decided
}

func (p *verdictProcessor) count(ctx context.Context, counts map[string]int64) {
	for outcome, n := range counts {
		if n > 0 {
			p.telemetry.ProcessorBarrierskewverdictSummaries.Add(ctx, n, p.outcomes[outcome])
		}
	}
}
