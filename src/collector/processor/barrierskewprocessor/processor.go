package barrierskewprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"

import (
	"context"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
)

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

type barrierSkewProcessor struct {
	next consumer.Traces
	cfg  *Config
}

func newProcessor(
	_ processor.Settings, cfg *Config, next consumer.Traces, _ realClock,
) (*barrierSkewProcessor, error) {
	return &barrierSkewProcessor{next: next, cfg: cfg}, nil
}

func (p *barrierSkewProcessor) Start(context.Context, component.Host) error { return nil }

func (p *barrierSkewProcessor) Shutdown(context.Context) error { return nil }

func (p *barrierSkewProcessor) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: true}
}

func (p *barrierSkewProcessor) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	return p.next.ConsumeTraces(ctx, td)
}
