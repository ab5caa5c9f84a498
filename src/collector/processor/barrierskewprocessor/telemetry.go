package barrierskewprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"

import (
	"go.opentelemetry.io/collector/component"

	"github.com/skewtrace/skewtrace/src/collector/internal/selftel"
	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor/internal/metadata"
)

// newTelemetry creates the processor's own instruments (declared in metadata.yaml, listed in
// documentation.md) and observes them from read.
func newTelemetry(
	set component.TelemetrySettings, read func() selftel.Snapshot,
) (*metadata.TelemetryBuilder, error) {
	tb, err := metadata.NewTelemetryBuilder(set)
	if err != nil {
		return nil, err
	}
	err = selftel.Observe(selftel.Callbacks{
		PendingCollectives:  tb.RegisterProcessorBarrierskewPendingCollectivesCallback,
		BufferedSpans:       tb.RegisterProcessorBarrierskewBufferedSpansCallback,
		PhaseEntries:        tb.RegisterProcessorBarrierskewPhaseEntriesCallback,
		CollectivesReleased: tb.RegisterProcessorBarrierskewCollectivesReleasedCallback,
		CollectivesEvicted:  tb.RegisterProcessorBarrierskewCollectivesEvictedCallback,
		SpansMalformed:      tb.RegisterProcessorBarrierskewSpansMalformedCallback,
		SpansPassedThrough:  tb.RegisterProcessorBarrierskewSpansPassedThroughCallback,
		OpenSteps:           tb.RegisterProcessorBarrierskewOpenStepsCallback,
		StepSpansHeld:       tb.RegisterProcessorBarrierskewStepSpansHeldCallback,
		StepsAnalyzed:       tb.RegisterProcessorBarrierskewStepsAnalyzedCallback,
		StepsForced:         tb.RegisterProcessorBarrierskewStepsForcedCallback,
		SpansLate:           tb.RegisterProcessorBarrierskewSpansLateForAnalysisCallback,
		StepModelBreaks:     tb.RegisterProcessorBarrierskewStepModelBreaksCallback,
		CollectivesExtended: tb.RegisterProcessorBarrierskewCollectivesExtendedCallback,
	}, read)
	if err != nil {
		tb.Shutdown()
		return nil, err
	}
	return tb, nil
}

// snapshot is what one collection of the processor's own metrics reports.
func (p *barrierSkewProcessor) snapshot() selftel.Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	stats := p.engine.Stats()
	return selftel.Snapshot{
		Engine:        stats,
		Malformed:     selftel.CountRejected(stats, p.malformed),
		PassedThrough: p.passedThrough,
	}
}
