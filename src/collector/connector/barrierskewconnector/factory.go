package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

//go:generate bash ../../generate.sh .

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/consumer"

	"github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector/internal/metadata"
)

// NewFactory returns the barrierskew connector factory: traces to metrics (the barrierskew
// metrics), and traces to traces (only the step summaries, for the gateway's verdict stage).
// Its type and stability come from metadata.yaml (generated into internal/metadata).
func NewFactory() connector.Factory {
	return connector.NewFactory(
		metadata.Type,
		func() component.Config { return createDefaultConfig() },
		connector.WithTracesToMetrics(createTracesToMetrics, metadata.TracesToMetricsStability),
		connector.WithTracesToTraces(createTracesToTraces, metadata.TracesToTracesStability),
	)
}

func createTracesToMetrics(
	_ context.Context,
	set connector.Settings,
	cfg component.Config,
	next consumer.Metrics,
) (connector.Traces, error) {
	return newConnector(set, cfg.(*Config), next, realClock{})
}

func createTracesToTraces(
	_ context.Context,
	_ connector.Settings,
	_ component.Config,
	next consumer.Traces,
) (connector.Traces, error) {
	return &summaryForwarder{next: next}, nil
}
