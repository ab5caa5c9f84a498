package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

const traceExportMethod = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

// rawCodec sends bytes that are already an encoded ExportTraceServiceRequest, so that a
// pregenerated run spends no CPU on marshaling while the collector is measured. It keeps
// the reply's bytes for decoding the partial-success answer.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: want *[]byte, got %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: want *[]byte, got %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

// request is one encoded OTLP export request, its span count and the job step it belongs to.
type request struct {
	body  []byte
	spans int
	step  int
}

// encodeRequests marshals each batch; TracesData and ExportTraceServiceRequest share their
// wire format (field 1: repeated ResourceSpans).
func encodeRequests(batches []ptrace.Traces, step int) ([]request, error) {
	marshaler := &ptrace.ProtoMarshaler{}
	out := make([]request, 0, len(batches))
	for _, td := range batches {
		body, err := marshaler.MarshalTraces(td)
		if err != nil {
			return nil, err
		}
		out = append(out, request{body: body, spans: td.SpanCount(), step: step})
	}
	return out, nil
}

// SendStats is what a send run did, printed as JSON at the end.
type SendStats struct {
	Mode            string `json:"mode"`
	Endpoint        string `json:"endpoint"`
	Ranks           int    `json:"ranks"`
	Steps           int    `json:"steps"`
	Requests        int64  `json:"requests"`
	FailedRequests  int64  `json:"failed_requests"`
	Spans           int64  `json:"spans"`
	RejectedSpans   int64  `json:"rejected_spans"`
	StartedUnixNano int64  `json:"started_unix_nano"` // when the first request went out
	// StepSentUnixNano[i]: when the first request of the i-th step sent went out (0: none
	// was), so that a fault's onset is a wall-clock time even when sending fell behind.
	StepSentUnixNano []int64 `json:"step_sent_unix_nano"`
	Seconds          float64 `json:"seconds"`
	SpansPerSecond   float64 `json:"spans_per_second"`
	TargetRate       float64 `json:"target_spans_per_second"`
	FirstError       string  `json:"first_error,omitempty"`
}

// sender sends requests over one gRPC connection from several workers, at most at a
// target rate (0: as fast as the receiver answers).
type sender struct {
	conn        *grpc.ClientConn
	workers     int
	rate        float64
	timeout     time.Duration
	requests    atomic.Int64
	failed      atomic.Int64
	spans       atomic.Int64
	rejected    atomic.Int64
	firstErrMu  sync.Mutex
	firstErr    error
	paceMu      sync.Mutex
	nextSendsAt time.Time
	stepMu      sync.Mutex
	stepSentAt  []int64 // unix nanos of each step's first request, by step index
}

func newSender(endpoint string, workers int, rate float64, timeout time.Duration) (*sender, error) {
	conn, err := grpc.NewClient(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
	)
	if err != nil {
		return nil, fmt.Errorf("-endpoint %q: %w", endpoint, err)
	}
	return &sender{conn: conn, workers: workers, rate: rate, timeout: timeout}, nil
}

func (s *sender) Close() error { return s.conn.Close() }

// pace blocks until this request's share of the target rate is due.
func (s *sender) pace(ctx context.Context, spans int) {
	if s.rate <= 0 {
		return
	}
	s.paceMu.Lock()
	now := time.Now()
	if s.nextSendsAt.Before(now) {
		s.nextSendsAt = now
	}
	due := s.nextSendsAt
	s.nextSendsAt = s.nextSendsAt.Add(time.Duration(float64(spans) / s.rate * float64(time.Second)))
	s.paceMu.Unlock()
	if wait := time.Until(due); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
}

func (s *sender) noteError(err error) {
	s.failed.Add(1)
	s.firstErrMu.Lock()
	if s.firstErr == nil {
		s.firstErr = err
	}
	s.firstErrMu.Unlock()
}

func (s *sender) sendOne(ctx context.Context, req request) {
	s.pace(ctx, req.spans)
	if ctx.Err() != nil {
		return
	}
	s.noteStepSent(req.step)
	callCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var reply []byte
	body := req.body
	err := s.conn.Invoke(callCtx, traceExportMethod, &body, &reply)
	s.requests.Add(1)
	if err != nil {
		if ctx.Err() == nil {
			s.noteError(err)
		}
		return
	}
	s.spans.Add(int64(req.spans))
	resp := ptraceotlp.NewExportResponse()
	if err := resp.UnmarshalProto(reply); err == nil {
		if n := resp.PartialSuccess().RejectedSpans(); n > 0 {
			s.rejected.Add(n)
		}
	}
}

// noteStepSent records when the first request of a step went out.
func (s *sender) noteStepSent(step int) {
	if step < 0 {
		return
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	for len(s.stepSentAt) <= step {
		s.stepSentAt = append(s.stepSentAt, 0)
	}
	if s.stepSentAt[step] == 0 {
		s.stepSentAt[step] = time.Now().UnixNano()
	}
}

// run sends everything that arrives on queue until it closes or ctx ends.
func (s *sender) run(ctx context.Context, queue <-chan request) {
	var wg sync.WaitGroup
	for range s.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for req := range queue {
				if ctx.Err() != nil {
					continue // drain so the producer never blocks
				}
				s.sendOne(ctx, req)
			}
		}()
	}
	wg.Wait()
}

// progress prints spans/s every interval until stop closes.
func (s *sender) progress(w io.Writer, interval time.Duration, stop <-chan struct{}) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	last, lastAt := int64(0), time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-ticker.C:
			sent := s.spans.Load()
			rate := float64(sent-last) / now.Sub(lastAt).Seconds()
			fmt.Fprintf(w, "loadgen: %d spans sent, %.0f spans/s, %d failed requests\n",
				sent, rate, s.failed.Load())
			last, lastAt = sent, now
		}
	}
}

func (s *sender) stats() SendStats {
	st := SendStats{
		Requests:       s.requests.Load(),
		FailedRequests: s.failed.Load(),
		Spans:          s.spans.Load(),
		RejectedSpans:  s.rejected.Load(),
		TargetRate:     s.rate,
	}
	s.stepMu.Lock()
	st.StepSentUnixNano = append([]int64{}, s.stepSentAt...)
	s.stepMu.Unlock()
	s.firstErrMu.Lock()
	if s.firstErr != nil {
		st.FirstError = s.firstErr.Error()
	}
	s.firstErrMu.Unlock()
	return st
}

// waitReady fails fast with a clear message when nothing listens at the endpoint.
func (s *sender) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	empty, err := encodeRequests([]ptrace.Traces{ptrace.NewTraces()}, -1)
	if err != nil {
		return err
	}
	for {
		var reply []byte
		body := empty[0].body
		err := s.conn.Invoke(ctx, traceExportMethod, &body, &reply, grpc.WaitForReady(true))
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(errors.New("no OTLP/gRPC receiver answered"), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
