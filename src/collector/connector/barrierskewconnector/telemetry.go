package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

import (
	"go.opentelemetry.io/collector/component"

	"github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector/internal/metadata"
	"github.com/skewtrace/skewtrace/src/collector/internal/selftel"
)

// newTelemetry creates the connector's own instruments (declared in metadata.yaml, listed in
// documentation.md) and observes them from read.
func newTelemetry(
	set component.TelemetrySettings, read func() selftel.Snapshot,
) (*metadata.TelemetryBuilder, error) {
	tb, err := metadata.NewTelemetryBuilder(set)
	if err != nil {
		return nil, err
	}
	err = selftel.Observe(selftel.Callbacks{
		PendingCollectives:  tb.RegisterConnectorBarrierskewPendingCollectivesCallback,
		BufferedSpans:       tb.RegisterConnectorBarrierskewBufferedSpansCallback,
		PhaseEntries:        tb.RegisterConnectorBarrierskewPhaseEntriesCallback,
		CollectivesReleased: tb.RegisterConnectorBarrierskewCollectivesReleasedCallback,
		CollectivesEvicted:  tb.RegisterConnectorBarrierskewCollectivesEvictedCallback,
		SpansMalformed:      tb.RegisterConnectorBarrierskewSpansMalformedCallback,
		SpansPassedThrough:  tb.RegisterConnectorBarrierskewSpansPassedThroughCallback,
		OpenSteps:           tb.RegisterConnectorBarrierskewOpenStepsCallback,
		StepSpansHeld:       tb.RegisterConnectorBarrierskewStepSpansHeldCallback,
		StepsAnalyzed:       tb.RegisterConnectorBarrierskewStepsAnalyzedCallback,
		StepsForced:         tb.RegisterConnectorBarrierskewStepsForcedCallback,
		SpansLate:           tb.RegisterConnectorBarrierskewSpansLateForAnalysisCallback,
		StepModelBreaks:     tb.RegisterConnectorBarrierskewStepModelBreaksCallback,
		CollectivesExtended: tb.RegisterConnectorBarrierskewCollectivesExtendedCallback,
		JobsForgotten:       tb.RegisterConnectorBarrierskewJobsForgottenCallback,
		SeriesDropped:       tb.RegisterConnectorBarrierskewSeriesDroppedCallback,
	}, read)
	if err != nil {
		tb.Shutdown()
		return nil, err
	}
	return tb, nil
}

// snapshot is what one collection of the connector's own metrics reports.
func (c *barrierSkewConnector) snapshot() selftel.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	stats := c.engine.Stats()
	return selftel.Snapshot{
		Engine:        stats,
		Malformed:     selftel.CountRejected(stats, c.malformed),
		PassedThrough: c.passedThrough,
		SeriesDropped: c.agg.seriesDropped,
		JobsForgotten: c.agg.jobsForgotten,
	}
}
