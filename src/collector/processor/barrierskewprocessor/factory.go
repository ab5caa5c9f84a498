package barrierskewprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/processor"
)

// Type is the component type used in collector configs.
var Type = component.MustNewType("barrierskew")

// Stability of the traces processor.
const Stability = component.StabilityLevelAlpha

// NewFactory returns the barrierskew traces processor factory.
func NewFactory() processor.Factory {
	return processor.NewFactory(
		Type,
		func() component.Config { return createDefaultConfig() },
		processor.WithTraces(createTraces, Stability),
	)
}

func createTraces(
	_ context.Context,
	set processor.Settings,
	cfg component.Config,
	next consumer.Traces,
) (processor.Traces, error) {
	return newProcessor(set, cfg.(*Config), next, realClock{})
}
