package barrierskewverdictprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewverdictprocessor"

//go:generate bash ../../generate.sh .

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/processor"

	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewverdictprocessor/internal/metadata"
)

// NewFactory returns the barrierskewverdict traces processor factory. Its type and stability
// come from metadata.yaml (generated into internal/metadata).
func NewFactory() processor.Factory {
	return processor.NewFactory(
		metadata.Type,
		func() component.Config { return createDefaultConfig() },
		processor.WithTraces(createTraces, metadata.TracesStability),
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
