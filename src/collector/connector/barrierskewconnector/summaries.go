package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
)

// summaryForwarder is the connector as traces to traces: it forwards the train.step.summary
// spans of what it reads and nothing else. A gateway's tier-2 instance routes them, by job,
// through the load-balancing exporter to the instance whose barrierskewverdict processor
// decides the job's flags (collector-config/gateway-tier2.yaml); the other spans stay where
// their step was joined.
type summaryForwarder struct {
	component.StartFunc
	component.ShutdownFunc
	next consumer.Traces
}

func (f *summaryForwarder) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

func (f *summaryForwarder) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	out := summariesOf(td)
	if out.SpanCount() == 0 {
		return nil
	}
	return f.next.ConsumeTraces(ctx, out)
}

// summariesOf copies the step summaries of td, each with its resource and scope.
func summariesOf(td ptrace.Traces) ptrace.Traces {
	out := spanio.NewCopier(0)
	rss := td.ResourceSpans()
	for i := range rss.Len() {
		rs := rss.At(i)
		sss := rs.ScopeSpans()
		for k := range sss.Len() {
			ss := sss.At(k)
			spans := ss.Spans()
			for n := range spans.Len() {
				if spanio.IsSummary(spans.At(n)) {
					out.Add(rs, i, ss, k, spans.At(n))
				}
			}
		}
	}
	return out.Traces()
}
