package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/consumer"
)

// Type is the component type used in collector configs.
var Type = component.MustNewType("barrierskew")

// Stability of the traces-to-metrics connector.
const Stability = component.StabilityLevelAlpha

// NewFactory returns the barrierskew traces-to-metrics connector factory.
func NewFactory() connector.Factory {
	return connector.NewFactory(
		Type,
		func() component.Config { return createDefaultConfig() },
		connector.WithTracesToMetrics(createTracesToMetrics, Stability),
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
