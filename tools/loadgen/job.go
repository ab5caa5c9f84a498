package main

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// loadgenScopeName is the instrumentation scope of the spans the load generator makes. The
// names skewtrace defines (attributes, spans, values) are in semconv_gen.go, generated from
// src/semconv/registry.yaml.
const loadgenScopeName = "skewtrace.loadgen"

// Straggler makes one rank late by Amount per step, for one reason, from step FromStep on
// (a slowdown that starts mid-run, as a failing NIC or a noisy neighbour does).
type Straggler struct {
	Rank     int
	Cause    string // data | compute | network
	Amount   time.Duration
	FromStep int
}

// ParseStraggler reads RANK:CAUSE:AMOUNT, the same form examples/train_ddp.py takes
// (AMOUNT is a Go duration such as 40ms, or plain seconds such as 0.04).
func ParseStraggler(text string) (*Straggler, error) {
	if text == "" {
		return nil, nil
	}
	parts := strings.Split(text, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("-straggler %q: want RANK:CAUSE:AMOUNT", text)
	}
	rank, err := strconv.Atoi(parts[0])
	if err != nil || rank < 0 {
		return nil, fmt.Errorf("-straggler %q: rank must be a non-negative integer", text)
	}
	switch parts[1] {
	case causeData, causeCompute, causeNetwork:
	default:
		return nil, fmt.Errorf("-straggler %q: cause must be data, compute or network", text)
	}
	amount, err := time.ParseDuration(parts[2])
	if err != nil {
		seconds, ferr := strconv.ParseFloat(parts[2], 64)
		if ferr != nil {
			return nil, fmt.Errorf("-straggler %q: amount must be a duration (40ms) or seconds", text)
		}
		amount = time.Duration(seconds * float64(time.Second))
	}
	if amount <= 0 {
		return nil, fmt.Errorf("-straggler %q: amount must be > 0", text)
	}
	return &Straggler{Rank: rank, Cause: parts[1], Amount: amount}, nil
}

// JobConfig describes the synthetic training job.
type JobConfig struct {
	JobID          string
	Ranks          int
	GPUsPerNode    int // ranks per host.name
	NodesPerSwitch int // hosts per training.switch
	Collectives    int // DDP gradient all-reduces per step on the default group
	TPSize         int // >0 adds one all_gather per step in tensor-parallel groups of this size
	Jitter         float64
	ClockSkew      time.Duration // each host's clock is off by up to +-ClockSkew
	Straggler      *Straggler
	MissingRank    int // >=0: this rank sends nothing (a dead rank); its collectives stay incomplete
	Seed           uint64

	// Phase means; each rank draws around them with Jitter as the relative stddev.
	Fetch     time.Duration
	Forward   time.Duration
	Backward  time.Duration
	Optimizer time.Duration
	Transfer  time.Duration // per all-reduce, after the last member arrived
}

// DefaultJobConfig is a 1024-rank data-parallel job with 8 gradient buckets per step.
func DefaultJobConfig() JobConfig {
	return JobConfig{
		JobID:          "loadgen",
		Ranks:          1024,
		GPUsPerNode:    8,
		NodesPerSwitch: 16,
		Collectives:    8,
		MissingRank:    -1,
		Jitter:         0.02,
		Seed:           1,
		Fetch:          4 * time.Millisecond,
		Forward:        30 * time.Millisecond,
		Backward:       60 * time.Millisecond,
		Optimizer:      8 * time.Millisecond,
		Transfer:       3 * time.Millisecond,
	}
}

// Validate names the flag of each bad field.
func (c *JobConfig) Validate() error {
	var errs []error
	if c.JobID == "" {
		errs = append(errs, errors.New("-job must not be empty"))
	}
	if c.Ranks < 1 {
		errs = append(errs, fmt.Errorf("-ranks must be >= 1, got %d", c.Ranks))
	}
	if c.GPUsPerNode < 1 {
		errs = append(errs, fmt.Errorf("-gpus-per-node must be >= 1, got %d", c.GPUsPerNode))
	}
	if c.NodesPerSwitch < 1 {
		errs = append(errs, fmt.Errorf("-nodes-per-switch must be >= 1, got %d", c.NodesPerSwitch))
	}
	if c.Collectives < 1 {
		errs = append(errs, fmt.Errorf("-collectives must be >= 1, got %d", c.Collectives))
	}
	if c.TPSize < 0 || (c.TPSize > 0 && c.Ranks%c.TPSize != 0) {
		errs = append(errs, fmt.Errorf("-tp must be 0 or divide -ranks=%d, got %d", c.Ranks, c.TPSize))
	}
	if c.Jitter < 0 || c.Jitter > 0.5 {
		errs = append(errs, fmt.Errorf("-jitter must be in [0, 0.5], got %g", c.Jitter))
	}
	if c.ClockSkew < 0 {
		errs = append(errs, fmt.Errorf("-clock-skew must be >= 0, got %s", c.ClockSkew))
	}
	if c.MissingRank >= c.Ranks {
		errs = append(errs, fmt.Errorf("-missing-rank %d is outside -ranks=%d", c.MissingRank, c.Ranks))
	}
	if c.Straggler != nil && c.Straggler.Rank >= c.Ranks {
		errs = append(errs, fmt.Errorf("-straggler rank %d is outside -ranks=%d",
			c.Straggler.Rank, c.Ranks))
	}
	return errors.Join(errs...)
}

// SpansPerStep is how many spans one step of the whole job produces.
func (c *JobConfig) SpansPerStep() int {
	perRank := 5 + c.Collectives // train.step, fetch, forward, backward, optimizer + buckets
	if c.TPSize > 0 {
		perRank++
	}
	ranks := c.Ranks
	if c.MissingRank >= 0 {
		ranks--
	}
	spans := ranks * perRank
	if c.MissingRank != 0 {
		spans++ // rank 0's train.step.root
	}
	return spans
}

// TraceIDForStep is the trace every rank derives for (job, step): the first 16 bytes of
// sha256("skewtrace/trace/<job>/<step>").
func TraceIDForStep(job string, step int) pcommon.TraceID {
	sum := sha256.Sum256([]byte(fmt.Sprintf("skewtrace/trace/%s/%d", job, step)))
	var id pcommon.TraceID
	copy(id[:], sum[:16])
	return id
}

// appendStepSpan appends one internal span of a step, as the instrumentation writes it:
// in the step's trace, with training.step.
func appendStepSpan(spans ptrace.SpanSlice, name string, trace pcommon.TraceID,
	id, parent pcommon.SpanID, start, end pcommon.Timestamp, step int,
) ptrace.Span {
	span := spans.AppendEmpty()
	span.SetName(name)
	span.SetTraceID(trace)
	span.SetSpanID(id)
	span.SetParentSpanID(parent)
	span.SetKind(ptrace.SpanKindInternal)
	span.SetStartTimestamp(start)
	span.SetEndTimestamp(end)
	span.Attributes().PutInt(attrStep, int64(step))
	return span
}

// RankStepSpanID is one rank's train.step span ID: the first 8 bytes of
// sha256("skewtrace/rankstep/<job>/<step>/<rank>"), as the instrumentation derives it, so a
// step summary's links reach it.
func RankStepSpanID(job string, step, rank int) pcommon.SpanID {
	sum := sha256.Sum256([]byte(fmt.Sprintf("skewtrace/rankstep/%s/%d/%d", job, step, rank)))
	var id pcommon.SpanID
	copy(id[:], sum[:8])
	if id.IsEmpty() {
		id[7] = 1
	}
	return id
}

// RootSpanIDForStep is the step root span's ID: the first 8 bytes of
// sha256("skewtrace/root/<job>/<step>"), with an all-zero result replaced by ...01.
func RootSpanIDForStep(job string, step int) pcommon.SpanID {
	sum := sha256.Sum256([]byte(fmt.Sprintf("skewtrace/root/%s/%d", job, step)))
	var id pcommon.SpanID
	copy(id[:], sum[:8])
	if id.IsEmpty() {
		id[7] = 1
	}
	return id
}

// rankState is what a rank carries from one step to the next.
type rankState struct {
	cursor      time.Time     // true time at which the rank's next step starts
	clockOffset time.Duration // this rank's host clock minus true time
}

// Job generates the spans of a synthetic synchronous data-parallel training job. It
// models what skewtrace measures: every blocking collective ends at the same true time on
// all members (last arrival plus transfer), so a late rank shows as a short collective
// span and its peers as long ones, while each host stamps spans with its own clock.
type Job struct {
	cfg      JobConfig
	rng      *rand.Rand
	ranks    []rankState
	step     int
	seqByPG  map[string]int64
	spanIDs  *rand.Rand
	resource []pcommon.Map // per rank, built once
}

// NewJob starts the job at true time start.
func NewJob(cfg JobConfig, start time.Time) (*Job, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	job := &Job{
		cfg:     cfg,
		rng:     rng,
		ranks:   make([]rankState, cfg.Ranks),
		seqByPG: map[string]int64{},
		// Span IDs only need to be unique, not secret; a separate stream keeps the timing
		// draws independent of how many spans were made.
		spanIDs: rand.New(rand.NewPCG(cfg.Seed^0x9e3779b97f4a7c15, uint64(time.Now().UnixNano()))),
	}
	// Clock offsets draw from their own stream so that -clock-skew leaves durations alone.
	clockRNG := rand.New(rand.NewPCG(cfg.Seed, 0xc10c))
	hostOffsets := map[int]time.Duration{}
	for rank := range job.ranks {
		host := rank / cfg.GPUsPerNode
		offset, ok := hostOffsets[host]
		if !ok {
			if cfg.ClockSkew > 0 {
				offset = time.Duration((clockRNG.Float64()*2 - 1) * float64(cfg.ClockSkew))
			}
			hostOffsets[host] = offset
		}
		job.ranks[rank] = rankState{cursor: start, clockOffset: offset}
		job.resource = append(job.resource, job.rankResource(rank))
	}
	return job, nil
}

func (j *Job) rankResource(rank int) pcommon.Map {
	cfg := &j.cfg
	host := rank / cfg.GPUsPerNode
	attrs := pcommon.NewMap()
	attrs.PutStr(attrServiceName, "skewtrace-loadgen")
	attrs.PutStr(attrServiceInstanceID, fmt.Sprintf("%s/%d", cfg.JobID, rank))
	attrs.PutStr(attrJobID, cfg.JobID)
	attrs.PutInt(attrRank, int64(rank))
	attrs.PutInt(attrLocalRank, int64(rank%cfg.GPUsPerNode))
	attrs.PutInt(attrWorldSize, int64(cfg.Ranks))
	attrs.PutStr(attrHostName, fmt.Sprintf("node-%04d", host))
	attrs.PutStr(attrSwitch, fmt.Sprintf("leaf-%02d", host/cfg.NodesPerSwitch))
	attrs.PutStr(attrNIC, fmt.Sprintf("mlx5_%d", rank%cfg.GPUsPerNode))
	return attrs
}

// Step is one training step of the whole job, one ResourceSpans per rank.
type Step struct {
	Index  int
	Traces ptrace.Traces
	Spans  int
}

func (j *Job) draw(mean time.Duration) time.Duration {
	d := float64(mean) * (1 + j.cfg.Jitter*j.rng.NormFloat64())
	return time.Duration(math.Max(d, float64(mean)/10))
}

func (j *Job) newSpanID() pcommon.SpanID {
	var id pcommon.SpanID
	for id.IsEmpty() {
		binary.LittleEndian.PutUint64(id[:], j.spanIDs.Uint64())
	}
	return id
}

// rankTimeline is one rank's phases of one step, in true time.
type rankTimeline struct {
	start, fetchEnd, forwardEnd, computeEnd time.Time
	bucketArrival                           []time.Time
	tpArrival                               time.Time
}

// NextStep produces the spans of the next step of every rank.
func (j *Job) NextStep() Step {
	cfg := &j.cfg
	step := j.step
	j.step++
	straggler := cfg.Straggler
	if straggler != nil && step < straggler.FromStep {
		straggler = nil
	}

	timelines := make([]rankTimeline, cfg.Ranks)
	for rank := range timelines {
		extra := func(cause string, share float64) time.Duration {
			if straggler == nil || straggler.Rank != rank || straggler.Cause != cause {
				return 0
			}
			return time.Duration(share * float64(straggler.Amount))
		}
		tl := &timelines[rank]
		tl.start = j.ranks[rank].cursor
		tl.fetchEnd = tl.start.Add(j.draw(cfg.Fetch) + extra(causeData, 1))
		forward := j.draw(cfg.Forward) + extra(causeCompute, 1.0/3)
		tl.forwardEnd = tl.fetchEnd.Add(forward)
		tl.tpArrival = tl.fetchEnd.Add(forward / 2)
		backward := j.draw(cfg.Backward) + extra(causeCompute, 2.0/3)
		tl.computeEnd = tl.forwardEnd.Add(backward)
		// DDP launches bucket k once its gradients are ready, spread over backward.
		tl.bucketArrival = make([]time.Time, cfg.Collectives)
		for k := range tl.bucketArrival {
			ready := time.Duration(float64(backward) * float64(k+1) / float64(cfg.Collectives))
			tl.bucketArrival[k] = tl.forwardEnd.Add(ready)
		}
	}

	transfer := cfg.Transfer
	if straggler != nil && straggler.Cause == causeNetwork {
		// The straggler's NIC is slow: it slows the whole ring of every inter-host group it
		// is in (here the world group's buckets), so every member sees a longer transfer.
		// Nobody arrives late for it; its tensor-parallel group inside the host is not slowed.
		transfer *= 3
	}

	// True end time of each collective: the last member's arrival plus the transfer.
	bucketEnd := make([]time.Time, cfg.Collectives)
	for k := range bucketEnd {
		latest := timelines[0].bucketArrival[k]
		for rank := 1; rank < cfg.Ranks; rank++ {
			if a := timelines[rank].bucketArrival[k]; a.After(latest) {
				latest = a
			}
		}
		bucketEnd[k] = latest.Add(j.draw(transfer))
	}
	bucketSeq := j.seqByPG[defaultPGName]
	j.seqByPG[defaultPGName] += int64(cfg.Collectives)

	var tpEnd []time.Time
	tpSeq := map[int]int64{}
	if cfg.TPSize > 0 {
		groups := cfg.Ranks / cfg.TPSize
		tpEnd = make([]time.Time, groups)
		for g := range groups {
			latest := timelines[g*cfg.TPSize].tpArrival
			for rank := g * cfg.TPSize; rank < (g+1)*cfg.TPSize; rank++ {
				if a := timelines[rank].tpArrival; a.After(latest) {
					latest = a
				}
			}
			tpEnd[g] = latest.Add(j.draw(cfg.Transfer / 4))
			name := tpGroupName(g)
			tpSeq[g] = j.seqByPG[name]
			j.seqByPG[name]++
		}
	}

	traceID := TraceIDForStep(cfg.JobID, step)
	rootID := RootSpanIDForStep(cfg.JobID, step)
	td := ptrace.NewTraces()
	td.ResourceSpans().EnsureCapacity(cfg.Ranks)
	spans := 0
	for rank := range timelines {
		if rank == cfg.MissingRank {
			continue
		}
		tl := &timelines[rank]
		offset := j.ranks[rank].clockOffset
		ts := func(t time.Time) pcommon.Timestamp { return pcommon.NewTimestampFromTime(t.Add(offset)) }

		rs := td.ResourceSpans().AppendEmpty()
		j.resource[rank].CopyTo(rs.Resource().Attributes())
		ss := rs.ScopeSpans().AppendEmpty()
		ss.Scope().SetName(loadgenScopeName)
		out := ss.Spans()

		backwardEnd := tl.computeEnd
		if last := bucketEnd[cfg.Collectives-1]; last.After(backwardEnd) {
			backwardEnd = last
		}
		optimizerEnd := backwardEnd.Add(j.draw(cfg.Optimizer))

		stepID := RankStepSpanID(cfg.JobID, step, rank)
		addSpan := func(name string, id, parent pcommon.SpanID, start, end time.Time) ptrace.Span {
			spans++
			return appendStepSpan(out, name, traceID, id, parent, ts(start), ts(end), step)
		}
		if rank == 0 {
			addSpan(spanStepRoot, rootID, pcommon.NewSpanIDEmpty(), tl.start, optimizerEnd)
		}
		addSpan(spanStep, stepID, rootID, tl.start, optimizerEnd)
		addSpan(spanDataloaderFetch, j.newSpanID(), stepID, tl.start, tl.fetchEnd)
		fwd := addSpan(spanForward, j.newSpanID(), stepID, tl.fetchEnd, tl.forwardEnd)
		fwd.Attributes().PutStr(attrTiming, timingHost)
		bwd := addSpan(spanBackward, j.newSpanID(), stepID, tl.forwardEnd, backwardEnd)
		bwd.Attributes().PutStr(attrTiming, timingHost)
		for k := range cfg.Collectives {
			c := addSpan(spanCollectivePrefix+opAllReduce, j.newSpanID(), stepID,
				tl.bucketArrival[k], bucketEnd[k])
			putCollective(c.Attributes(), opAllReduce, defaultPGName, cfg.Ranks,
				bucketSeq+int64(k), 25<<20, sourceDDP)
		}
		if cfg.TPSize > 0 {
			g := rank / cfg.TPSize
			c := addSpan(spanCollectivePrefix+opAllGather, j.newSpanID(), stepID,
				tl.tpArrival, tpEnd[g])
			putCollective(c.Attributes(), opAllGather, tpGroupName(g), cfg.TPSize, tpSeq[g],
				4<<20, sourceAPI)
		}
		addSpan(spanOptimizerStep, j.newSpanID(), stepID, backwardEnd, optimizerEnd)
		j.ranks[rank].cursor = optimizerEnd
	}
	return Step{Index: step, Traces: td, Spans: spans}
}

func tpGroupName(group int) string { return "tp" + strconv.Itoa(group) }

func putCollective(attrs pcommon.Map, op, pg string, pgSize int, seq int64, bytes int64,
	source string,
) {
	// DDP launches bucket all-reduces from autograd hooks and they overlap the rest of
	// backward, as skewtrace's comm hook reports them (async, source ddp).
	async := source == sourceDDP

	attrs.PutStr(attrCollectiveOp, op)
	attrs.PutStr(attrCollPG, pg)
	attrs.PutInt(attrCollectivePGSize, int64(pgSize))
	attrs.PutInt(attrCollSeq, seq)
	attrs.PutInt(attrCollectiveBytes, bytes)
	attrs.PutBool(attrCollectiveAsync, async)
	attrs.PutStr(attrCollectiveSource, source)
	attrs.PutStr(attrTiming, timingHost)
}

// SplitByRanks cuts a step into requests of at most ranksPerRequest ranks each, the way
// ranks' own exporters batch (one resource per rank process).
func SplitByRanks(step Step, ranksPerRequest int) []ptrace.Traces {
	all := step.Traces.ResourceSpans()
	var out []ptrace.Traces
	for first := 0; first < all.Len(); first += ranksPerRequest {
		td := ptrace.NewTraces()
		last := min(first+ranksPerRequest, all.Len())
		td.ResourceSpans().EnsureCapacity(last - first)
		for i := first; i < last; i++ {
			all.At(i).CopyTo(td.ResourceSpans().AppendEmpty())
		}
		out = append(out, td)
	}
	return out
}
