package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

import (
	"context"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

type barrierSkewConnector struct {
	next consumer.Metrics
	cfg  *Config
}

func newConnector(
	_ connector.Settings, cfg *Config, next consumer.Metrics, _ realClock,
) (*barrierSkewConnector, error) {
	return &barrierSkewConnector{next: next, cfg: cfg}, nil
}

func (c *barrierSkewConnector) Start(context.Context, component.Host) error { return nil }

func (c *barrierSkewConnector) Shutdown(context.Context) error { return nil }

func (c *barrierSkewConnector) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

func (c *barrierSkewConnector) ConsumeTraces(context.Context, ptrace.Traces) error { return nil }
