// Package selftel registers the barrierskew components' own metrics on the collector's
// MeterProvider. The values are read from a snapshot callback at collection time, so the
// span path pays nothing for them.
package selftel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
)

// Snapshot is the component state one collection reports.
type Snapshot struct {
	Engine join.Stats
	// Malformed counts collective spans forwarded unjoined, by reason.
	Malformed map[string]int64
	// PassedThrough counts spans that are not collectives (processor) or that were already
	// annotated (connector).
	PassedThrough int64
	// SeriesDropped counts data points not recorded because max_series was reached
	// (connector only).
	SeriesDropped int64
}

// Names of the instruments, after the prefix (otelcol_processor_barrierskew_ or
// otelcol_connector_barrierskew_).
const (
	PendingCollectives  = "pending_collectives"
	BufferedSpans       = "buffered_spans"
	PhaseEntries        = "phase_entries"
	CollectivesReleased = "collectives_released"
	CollectivesEvicted  = "collectives_evicted"
	SpansMalformed      = "spans_malformed"
	SpansPassedThrough  = "spans_passed_through"
	SeriesDropped       = "series_dropped"
)

// Register creates the instruments and the callback that reads a snapshot.
func Register(mp metric.MeterProvider, scope, prefix string, withSeries bool,
	read func() Snapshot,
) (metric.Registration, error) {
	meter := mp.Meter(scope)
	var errs []error
	gauge := func(name, desc, unit string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(prefix+name, metric.WithDescription(desc),
			metric.WithUnit(unit))
		errs = append(errs, err)
		return g
	}
	counter := func(name, desc, unit string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(prefix+name, metric.WithDescription(desc),
			metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	pending := gauge(PendingCollectives, "Collectives waiting for members.", "{collectives}")
	buffered := gauge(BufferedSpans, "Collective spans held in pending collectives.", "{spans}")
	phases := gauge(PhaseEntries, "Per-(job, step, rank) phase entries cached for causes.",
		"{entries}")
	released := counter(CollectivesReleased,
		"Collectives released, by outcome (complete, incomplete).", "{collectives}")
	evicted := counter(CollectivesEvicted,
		"Collectives released early because max_pending or max_buffered_spans was reached.",
		"{collectives}")
	malformed := counter(SpansMalformed,
		"Collective spans forwarded without a join, by reason.", "{spans}")
	passed := counter(SpansPassedThrough,
		"Spans forwarded or read without a join (not collectives, or already annotated).",
		"{spans}")
	instruments := []metric.Observable{pending, buffered, phases, released, evicted, malformed,
		passed}
	var series metric.Int64ObservableCounter
	if withSeries {
		series = counter(SeriesDropped, "Data points not recorded because max_series was reached.",
			"{points}")
		instruments = append(instruments, series)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	complete := metric.WithAttributes(attribute.String("outcome", "complete"))
	incomplete := metric.WithAttributes(attribute.String("outcome", "incomplete"))
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := read()
		o.ObserveInt64(pending, int64(s.Engine.Pending))
		o.ObserveInt64(buffered, int64(s.Engine.BufferedSpans))
		o.ObserveInt64(phases, int64(s.Engine.PhaseEntries))
		o.ObserveInt64(released, s.Engine.ReleasedComplete, complete)
		o.ObserveInt64(released, s.Engine.ReleasedIncomplete, incomplete)
		o.ObserveInt64(evicted, s.Engine.Evicted)
		for reason, n := range s.Malformed {
			o.ObserveInt64(malformed, n, metric.WithAttributes(attribute.String("reason", reason)))
		}
		o.ObserveInt64(passed, s.PassedThrough)
		if withSeries {
			o.ObserveInt64(series, s.SeriesDropped)
		}
		return nil
	}, instruments...)
}

// CountRejected adds the engine's rejections to a malformed-by-reason map.
func CountRejected(stats join.Stats, malformed map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(malformed)+len(stats.Rejected))
	for reason, n := range malformed {
		out[reason] = n
	}
	for outcome, n := range stats.Rejected {
		if n > 0 {
			out[join.Outcome(outcome).Reason()] += n
		}
	}
	return out
}
