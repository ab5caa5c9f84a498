package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
)

func TestTraceIDsMatchSemanticConventions(t *testing.T) {
	// Vectors from Python: hashlib.sha256(b"skewtrace/trace/job-a/7").digest()[:16] and
	// hashlib.sha256(b"skewtrace/root/job-a/7").digest()[:8], so both languages agree.
	traceID := TraceIDForStep("job-a", 7)
	rootID := RootSpanIDForStep("job-a", 7)
	if got, want := hex.EncodeToString(traceID[:]), wantTraceIDHex; got != want {
		t.Errorf("trace id = %s, want %s", got, want)
	}
	if got, want := hex.EncodeToString(rootID[:]), wantRootIDHex; got != want {
		t.Errorf("root span id = %s, want %s", got, want)
	}
}

// collectiveSpans indexes one step's collective spans by rank, in emission order.
func collectiveSpans(t *testing.T, td ptrace.Traces) map[int64][]ptrace.Span {
	t.Helper()
	out := map[int64][]ptrace.Span{}
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		rs := td.ResourceSpans().At(i)
		rankValue, ok := rs.Resource().Attributes().Get(attrRank)
		if !ok {
			t.Fatalf("resource %d has no %s", i, attrRank)
		}
		spans := rs.ScopeSpans().At(0).Spans()
		for k := 0; k < spans.Len(); k++ {
			if _, ok := spans.At(k).Attributes().Get(attrCollSeq); ok {
				out[rankValue.Int()] = append(out[rankValue.Int()], spans.At(k))
			}
		}
	}
	return out
}

func duration(span ptrace.Span) time.Duration {
	return span.EndTimestamp().AsTime().Sub(span.StartTimestamp().AsTime())
}

func TestComputeStragglerHasTheShortestCollectives(t *testing.T) {
	cfg := DefaultJobConfig()
	cfg.Ranks, cfg.Collectives, cfg.Jitter = 4, 3, 0
	cfg.Straggler = &Straggler{Rank: 2, Cause: "compute", Amount: 30 * time.Millisecond}
	job, err := NewJob(cfg, time.Unix(1_700_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	step := job.NextStep()
	if step.Spans != cfg.SpansPerStep() || step.Traces.SpanCount() != step.Spans {
		t.Fatalf("spans = %d (counted %d), want %d", step.Spans, step.Traces.SpanCount(),
			cfg.SpansPerStep())
	}
	byRank := collectiveSpans(t, step.Traces)
	for k := 0; k < cfg.Collectives; k++ {
		late := duration(byRank[2][k])
		for _, rank := range []int64{0, 1, 3} {
			// Lateness is max(duration) - duration: the peers waited the straggler's extra time.
			// Bucket k waits for (k+1)/K of the extra backward time plus all of the forward's.
			peer := duration(byRank[rank][k])
			lateness := peer - late
			if lateness < 10*time.Millisecond || lateness > 31*time.Millisecond {
				t.Errorf("bucket %d rank %d: lateness of rank 2 = %s, want 10ms..30ms", k, rank, lateness)
			}
			if !byRank[rank][k].EndTimestamp().AsTime().Equal(byRank[2][k].EndTimestamp().AsTime()) {
				t.Errorf("bucket %d: a blocking collective must end together on every member", k)
			}
		}
	}
}

func TestClockSkewShiftsTimestampsNotDurations(t *testing.T) {
	base := DefaultJobConfig()
	base.Ranks, base.GPUsPerNode, base.Collectives = 16, 2, 2
	base.Straggler = &Straggler{Rank: 5, Cause: "data", Amount: 20 * time.Millisecond}
	skewed := base
	skewed.ClockSkew = 2 * time.Second
	start := time.Unix(1_700_000_000, 0)
	a, _ := NewJob(base, start)
	b, _ := NewJob(skewed, start)
	plain, shifted := collectiveSpans(t, a.NextStep().Traces), collectiveSpans(t, b.NextStep().Traces)
	endsDiffer := false
	for rank, spans := range plain {
		for k := range spans {
			if duration(spans[k]) != duration(shifted[rank][k]) {
				t.Fatalf("rank %d bucket %d: clock skew changed a duration", rank, k)
			}
			if spans[k].EndTimestamp() != shifted[rank][k].EndTimestamp() {
				endsDiffer = true
			}
		}
	}
	if !endsDiffer {
		t.Fatal("-clock-skew 2s moved no timestamp")
	}
}

func TestSequenceNumbersAgreeAcrossRanksAndAdvance(t *testing.T) {
	cfg := DefaultJobConfig()
	cfg.Ranks, cfg.Collectives, cfg.TPSize = 8, 2, 4
	job, _ := NewJob(cfg, time.Now())
	seen := map[string]map[int64]int{} // "step/pg" -> seq -> members
	for s := 0; s < 2; s++ {
		step := job.NextStep()
		for _, spans := range collectiveSpans(t, step.Traces) {
			for _, span := range spans {
				pg, _ := span.Attributes().Get(attrCollPG)
				seq, _ := span.Attributes().Get(attrCollSeq)
				key := pg.Str()
				if seen[key] == nil {
					seen[key] = map[int64]int{}
				}
				seen[key][seq.Int()]++
			}
		}
	}
	if got := len(seen[defaultPGName]); got != 4 {
		t.Errorf("default group: %d distinct seqs over 2 steps x 2 buckets, want 4", got)
	}
	for seq, members := range seen[defaultPGName] {
		if members != cfg.Ranks {
			t.Errorf("default seq %d has %d members, want %d", seq, members, cfg.Ranks)
		}
	}
	for _, group := range []string{"tp0", "tp1"} {
		for seq, members := range seen[group] {
			if members != cfg.TPSize {
				t.Errorf("%s seq %d has %d members, want %d", group, seq, members, cfg.TPSize)
			}
		}
	}
}

func TestParseStragglerRejectsBadInput(t *testing.T) {
	for _, text := range []string{"2", "x:data:1s", "2:disk:1s", "2:data:-1s", "2:data:soon"} {
		if _, err := ParseStraggler(text); err == nil {
			t.Errorf("ParseStraggler(%q) accepted bad input", text)
		}
	}
	s, err := ParseStraggler("3:network:0.04")
	if err != nil || s.Rank != 3 || s.Cause != "network" || s.Amount != 40*time.Millisecond {
		t.Fatalf("ParseStraggler(3:network:0.04) = %+v, %v", s, err)
	}
}

func TestSendToSinkOverGRPC(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reader, writer := io.Pipe()
	sinkDone := make(chan error, 1)
	go func() { sinkDone <- runSink(ctx, "127.0.0.1:0", 50*time.Millisecond, writer) }()
	lines := bufio.NewScanner(reader)
	nextStats := func() SinkStats {
		t.Helper()
		if !lines.Scan() {
			t.Fatal("sink printed nothing")
		}
		var st SinkStats
		if err := json.Unmarshal(lines.Bytes(), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	listen := nextStats().Listen

	cfg := DefaultJobConfig()
	cfg.Ranks, cfg.Collectives = 32, 2
	job, _ := NewJob(cfg, time.Now())
	snd, err := newSender(listen, 2, 0, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	if err := snd.waitReady(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	queue := make(chan request, 64)
	want := 0
	for range 3 {
		step := job.NextStep()
		want += step.Spans
		reqs, err := encodeRequests(SplitByRanks(step, 5), 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			queue <- r
		}
	}
	close(queue)
	snd.run(ctx, queue)
	if st := snd.stats(); st.Spans != int64(want) || st.FailedRequests != 0 {
		t.Fatalf("sender: %+v, want %d spans", st, want)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := nextStats()
		if st.Spans == int64(want) {
			if st.AnnotatedSpans != 0 {
				t.Errorf("annotated spans = %d; loadgen output carries no annotations", st.AnnotatedSpans)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sink counted %d spans, want %d", st.Spans, want)
		}
	}
	cancel()
	go func() { _, _ = io.Copy(io.Discard, reader) }()
	if err := <-sinkDone; err != nil {
		t.Fatal(err)
	}
}

const (
	wantTraceIDHex = "4f1e93a063a9531a7ad7287975f71d19"
	wantRootIDHex  = "92e8985478e8dbe1"
)

func TestStragglerStartsAtItsFirstStep(t *testing.T) {
	cfg := DefaultJobConfig()
	cfg.Ranks, cfg.Collectives, cfg.Jitter = 4, 1, 0
	cfg.Straggler = &Straggler{Rank: 1, Cause: "data", Amount: 20 * time.Millisecond, FromStep: 1}
	job, _ := NewJob(cfg, time.Unix(1_700_000_000, 0))
	for step, wantLate := range []bool{false, true} {
		byRank := collectiveSpans(t, job.NextStep().Traces)
		lateness := duration(byRank[0][0]) - duration(byRank[1][0])
		if late := lateness >= 19*time.Millisecond; late != wantLate {
			t.Errorf("step %d: rank 1 lateness %s, want late=%v", step, lateness, wantLate)
		}
	}
}

func TestMissingRankSendsNothing(t *testing.T) {
	cfg := DefaultJobConfig()
	cfg.Ranks, cfg.Collectives, cfg.MissingRank = 4, 2, 3
	job, _ := NewJob(cfg, time.Now())
	step := job.NextStep()
	byRank := collectiveSpans(t, step.Traces)
	if _, ok := byRank[3]; ok || len(byRank) != 3 {
		t.Fatalf("ranks with collectives: %d (rank 3 present: %v), want 3 without rank 3", len(byRank), ok)
	}
	if step.Spans != cfg.SpansPerStep() {
		t.Fatalf("spans = %d, SpansPerStep = %d", step.Spans, cfg.SpansPerStep())
	}
}

// A step summary's training.straggler events are counted by rank and cause, with the time
// the first one arrived; summary spans do not count as the job's spans.
func TestSinkCountsTheFlagsOfStepSummaries(t *testing.T) {
	s := newSink()
	td := ptrace.NewTraces()
	spans := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	for range 2 {
		summary := spans.AppendEmpty()
		summary.SetName(spanStepSummary)
		ev := summary.Events().AppendEmpty()
		ev.SetName(eventStraggler)
		ev.Attributes().PutInt(attrRank, 17)
		ev.Attributes().PutStr(attrStragCause, "compute")
		other := summary.Events().AppendEmpty()
		other.SetName("training.suspect")
		other.Attributes().PutInt(attrRank, 3)
	}
	spans.AppendEmpty().SetName("collective.all_reduce")
	if got := s.countAnnotations(td); got != 2 {
		t.Fatalf("summaries = %d, want 2", got)
	}
	st := s.stats("x")
	if len(st.SummaryStragglers) != 1 || st.SummaryStragglers["17:compute"] != 2 {
		t.Fatalf("summary stragglers = %v, want 17:compute twice", st.SummaryStragglers)
	}
	if st.SummaryStragglersFirst["17:compute"] <= 0 {
		t.Fatalf("first flag time = %v", st.SummaryStragglersFirst)
	}
}
