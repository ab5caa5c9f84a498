package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	// The collector's OTLP exporters compress with gzip by default.
	_ "google.golang.org/grpc/encoding/gzip"
)

// sink is an OTLP/gRPC traces and metrics receiver that only counts: the end of the
// pipeline in the end-to-end benchmark, and a backend stand-in that can say whether the
// spans it got were annotated by barrierskew.
type sink struct {
	ptraceotlp.UnimplementedGRPCServer
	start            time.Time
	traceRequests    atomic.Int64
	spans            atomic.Int64
	annotatedSpans   atomic.Int64
	stepSummaries    atomic.Int64
	metricRequests   atomic.Int64
	metricDataPoints atomic.Int64
	firstSpanAt      atomic.Int64 // unix nanos
	lastSpanAt       atomic.Int64

	mu         sync.Mutex
	stragglers map[string]int64 // "rank:cause" -> spans flagged
	// summaryFlags: "rank:cause" -> step summaries that name the rank flagged, and when the
	// first of them arrived (a flag as soon as the collector's analysis has it, read without
	// loading the collector as scraping its /metrics page does).
	summaryFlags      map[string]int64
	summaryFlagsFirst map[string]int64
}

// SinkStats is printed as one JSON line per report and once at exit.
type SinkStats struct {
	Mode              string           `json:"mode"`
	Listen            string           `json:"listen"`
	Seconds           float64          `json:"seconds"`
	TraceRequests     int64            `json:"trace_requests"`
	Spans             int64            `json:"spans"`
	AnnotatedSpans    int64            `json:"annotated_spans"`
	StepSummaries     int64            `json:"step_summaries"`
	MetricRequests    int64            `json:"metric_requests"`
	MetricDataPoints  int64            `json:"metric_data_points"`
	FirstSpanUnixNano int64            `json:"first_span_unix_nano"`
	LastSpanUnixNano  int64            `json:"last_span_unix_nano"`
	ActiveSeconds     float64          `json:"active_seconds"`
	SpansPerSecond    float64          `json:"spans_per_second_active"`
	Stragglers        map[string]int64 `json:"stragglers"`
	// SummaryStragglers: step summaries naming "rank:cause" flagged; the first one's arrival
	// (unix nanos) in SummaryStragglersFirst.
	SummaryStragglers      map[string]int64 `json:"summary_stragglers"`
	SummaryStragglersFirst map[string]int64 `json:"summary_stragglers_first_unix_nano"`
}

func newSink() *sink {
	return &sink{start: time.Now(), stragglers: map[string]int64{},
		summaryFlags: map[string]int64{}, summaryFlagsFirst: map[string]int64{}}
}

func (s *sink) Export(_ context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	s.traceRequests.Add(1)
	td := req.Traces()
	// The collector's own step summaries are counted apart: the spans (and the times of the
	// first and last) are the job's.
	summaries := s.countAnnotations(td)
	n := int64(td.SpanCount()) - summaries
	if n > 0 {
		now := time.Now().UnixNano()
		s.firstSpanAt.CompareAndSwap(0, now)
		s.lastSpanAt.Store(now)
	}
	s.spans.Add(n)
	s.stepSummaries.Add(summaries)
	return ptraceotlp.NewExportResponse(), nil
}

// countAnnotations counts annotated spans and flags, and returns how many spans of td are
// step summaries.
func (s *sink) countAnnotations(td ptrace.Traces) int64 {
	var annotated, summaries int64
	var flagged map[string]int64
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		rs := td.ResourceSpans().At(i)
		rank := "?"
		if v, ok := rs.Resource().Attributes().Get(attrRank); ok {
			rank = v.AsString()
		}
		for j := 0; j < rs.ScopeSpans().Len(); j++ {
			spans := rs.ScopeSpans().At(j).Spans()
			for k := 0; k < spans.Len(); k++ {
				if spans.At(k).Name() == spanStepSummary {
					summaries++
					s.countSummaryFlags(spans.At(k))
					continue
				}
				attrs := spans.At(k).Attributes()
				if _, ok := attrs.Get(attrBarrierSkew); ok {
					annotated++
				}
				if v, ok := attrs.Get(attrStraggler); ok && v.Type() == pcommon.ValueTypeBool && v.Bool() {
					cause := "?"
					if c, ok := attrs.Get(attrStragCause); ok {
						cause = c.AsString()
					}
					if flagged == nil {
						flagged = map[string]int64{}
					}
					flagged[rank+":"+cause]++
				}
			}
		}
	}
	s.annotatedSpans.Add(annotated)
	if flagged != nil {
		s.mu.Lock()
		for key, n := range flagged {
			s.stragglers[key] += n
		}
		s.mu.Unlock()
	}
	return summaries
}

// countSummaryFlags records the ranks a step summary names flagged (its training.straggler
// events).
func (s *sink) countSummaryFlags(span ptrace.Span) {
	events := span.Events()
	for i := 0; i < events.Len(); i++ {
		ev := events.At(i)
		if ev.Name() != eventStraggler {
			continue
		}
		rank, cause := "?", "?"
		if v, ok := ev.Attributes().Get(attrRank); ok {
			rank = v.AsString()
		}
		if v, ok := ev.Attributes().Get(attrStragCause); ok {
			cause = v.AsString()
		}
		key := rank + ":" + cause
		s.mu.Lock()
		if s.summaryFlags[key] == 0 {
			s.summaryFlagsFirst[key] = time.Now().UnixNano()
		}
		s.summaryFlags[key]++
		s.mu.Unlock()
	}
}

type metricsSink struct {
	pmetricotlp.UnimplementedGRPCServer
	parent *sink
}

func (m *metricsSink) Export(_ context.Context, req pmetricotlp.ExportRequest) (pmetricotlp.ExportResponse, error) {
	m.parent.metricRequests.Add(1)
	m.parent.metricDataPoints.Add(int64(req.Metrics().DataPointCount()))
	return pmetricotlp.NewExportResponse(), nil
}

func (s *sink) stats(listen string) SinkStats {
	st := SinkStats{
		Mode:             "sink",
		Listen:           listen,
		Seconds:          time.Since(s.start).Seconds(),
		TraceRequests:    s.traceRequests.Load(),
		Spans:            s.spans.Load(),
		AnnotatedSpans:   s.annotatedSpans.Load(),
		StepSummaries:    s.stepSummaries.Load(),
		MetricRequests:   s.metricRequests.Load(),
		MetricDataPoints: s.metricDataPoints.Load(),
		Stragglers:       map[string]int64{},
	}
	first, last := s.firstSpanAt.Load(), s.lastSpanAt.Load()
	st.FirstSpanUnixNano, st.LastSpanUnixNano = first, last
	if first > 0 && last > first {
		st.ActiveSeconds = time.Duration(last - first).Seconds()
		st.SpansPerSecond = float64(st.Spans) / st.ActiveSeconds
	}
	s.mu.Lock()
	keys := make([]string, 0, len(s.stragglers))
	for key := range s.stragglers {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		st.Stragglers[key] = s.stragglers[key]
	}
	st.SummaryStragglers = make(map[string]int64, len(s.summaryFlags))
	st.SummaryStragglersFirst = make(map[string]int64, len(s.summaryFlags))
	for key, n := range s.summaryFlags {
		st.SummaryStragglers[key] = n
		st.SummaryStragglersFirst[key] = s.summaryFlagsFirst[key]
	}
	s.mu.Unlock()
	return st
}

// runSink serves until ctx ends, printing a JSON stats line to out every interval (and a
// first one, with the bound address, as soon as it listens).
func runSink(ctx context.Context, listen string, interval time.Duration, out io.Writer) error {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("-listen %q: %w", listen, err)
	}
	server := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	s := newSink()
	ptraceotlp.RegisterGRPCServer(server, s)
	pmetricotlp.RegisterGRPCServer(server, &metricsSink{parent: s})
	serveErr := make(chan error, 1)
	go func() { serveErr <- server.Serve(lis) }()

	addr := lis.Addr().String()
	enc := json.NewEncoder(out)
	report := func() { _ = enc.Encode(s.stats(addr)) }
	report()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			server.GracefulStop()
			report()
			return nil
		case err := <-serveErr:
			return err
		case <-ticker.C:
			report()
		}
	}
}
