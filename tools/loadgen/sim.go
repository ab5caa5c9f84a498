package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// `loadgen simulate` plays the model of fabric.go in real time: each step is computed when
// it starts (with the pacing delays each rank's poller holds at that moment), its spans are
// sent to the collector when the step's last rank has finished in wall-clock time, and the
// real pacer's decisions, polled by every rank in the background as the Python rank client
// does, feed the next steps (the closed loop). A step's figures come from the model, so a
// busy machine delays when they are sent, not what they say.

// pacerPoller is one rank's background poller of GET /v1/pacing?job=ID. It fails open: an
// error, a malformed answer or one older than three poll intervals means no delay.
type pacerPoller struct {
	rank     int
	maxDelay float64
	latest   atomic.Pointer[pacerAnswer]
	ok       atomic.Int64
	failed   atomic.Int64
}

type pacerAnswer struct {
	delay   float64
	version int64
	active  bool
	at      time.Time
}

// pacerDecision is the part of the pacer's JSON a rank reads; the rest is ignored.
type pacerDecision struct {
	Version *int64             `json:"version"`
	Active  *bool              `json:"active"`
	Delays  map[string]float64 `json:"delays"`
}

// parseDecision is this rank's (delay, version, active), or an error when malformed.
func parseDecision(body []byte, rank int, maxDelay float64) (pacerAnswer, error) {
	var d pacerDecision
	if err := json.Unmarshal(body, &d); err != nil {
		return pacerAnswer{}, err
	}
	if d.Version == nil || d.Active == nil || d.Delays == nil {
		return pacerAnswer{}, errors.New("pacer answer lacks version, active or delays")
	}
	answer := pacerAnswer{version: *d.Version, active: *d.Active}
	if answer.active {
		delay := d.Delays[strconv.Itoa(rank)]
		if math.IsNaN(delay) || math.IsInf(delay, 0) {
			return pacerAnswer{}, errors.New("pacer delay is not finite")
		}
		answer.delay = math.Min(math.Max(delay, 0), maxDelay)
	}
	return answer, nil
}

// current is the delay to apply now (0 when stale or failing) and its version.
func (p *pacerPoller) current(now time.Time, staleAfter time.Duration) (float64, int64) {
	a := p.latest.Load()
	if a == nil {
		return 0, 0
	}
	if now.Sub(a.at) > staleAfter {
		return 0, a.version
	}
	return a.delay, a.version
}

func (p *pacerPoller) run(ctx context.Context, client *http.Client, target string,
	interval time.Duration, phase time.Duration,
) {
	timer := time.NewTimer(phase)
	defer timer.Stop()
	backoff := interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		answer, err := pollOnce(ctx, client, target, p.rank, p.maxDelay)
		wait := interval
		if err != nil {
			p.failed.Add(1)
			// Fail open at once, keeping the last version for the spans.
			if prev := p.latest.Load(); prev != nil {
				p.latest.Store(&pacerAnswer{version: prev.version, at: prev.at})
			}
			wait, backoff = backoff, min(2*backoff, 30*time.Second)
		} else {
			p.ok.Add(1)
			answer.at = time.Now()
			p.latest.Store(&answer)
			backoff = interval
		}
		timer.Reset(wait)
	}
}

func pollOnce(ctx context.Context, client *http.Client, target string, rank int,
	maxDelay float64,
) (pacerAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return pacerAnswer{}, err
	}
	req.Header.Set("Accept", "application/json")
	if token := os.Getenv("SKEWTRACE_PACER_TOKEN"); token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return pacerAnswer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return pacerAnswer{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return pacerAnswer{}, fmt.Errorf("pacer answered %s", resp.Status)
	}
	return parseDecision(body, rank, maxDelay)
}

// SimSummary is the JSON the simulate command prints at the end.
type SimSummary struct {
	Mode         string  `json:"mode"`
	JobID        string  `json:"job"`
	Nodes        int     `json:"nodes"`
	Ranks        int     `json:"ranks"`
	Leaves       int     `json:"leaves"`
	Steps        int     `json:"steps"`
	MeasuredFrom int     `json:"measured_from_step"`
	Pacing       bool    `json:"pacing"`
	IterMeanS    float64 `json:"iteration_mean_s"`
	IterCV       float64 `json:"iteration_cv"`
	IterP99S     float64 `json:"iteration_p99_s"`
	// Samples per second of model time over the measured steps.
	Throughput float64 `json:"throughput_samples_per_s"`
	// The collision cost: the measured steps' transfers' mean duration over their duration
	// alone (1: no transfer shared an uplink beyond its capacity).
	TransferStretch float64 `json:"transfer_stretch"`
	Groups          int     `json:"dp_groups"`
	// Each data-parallel group's communication phases (its gather, its buckets from the first
	// start to the last end), as the link sees them: from the transfer's start, seconds after
	// the members' step start, and its duration, means over the measured steps.
	GroupPhases []GroupPhase `json:"group_phases,omitempty"`
	// Pacing as applied: how many (rank, step) pairs got a delay, their total, and the
	// share of measured steps in which any rank was delayed.
	DelaysApplied    int64   `json:"delays_applied"`
	DelayTotalS      float64 `json:"delay_total_s"`
	PacedStepShare   float64 `json:"paced_step_share"`
	PollsOK          int64   `json:"polls_ok"`
	PollsFailed      int64   `json:"polls_failed"`
	PacerActiveShare float64 `json:"pacer_active_share"` // of polled answers (rank 0's poller)
	// Delay applied per node over the measured steps, mean per step, in seconds; and each
	// node's drawn speed factor, so a reader can see who was paced and why.
	NodeDelayMeanS []float64 `json:"node_delay_mean_s,omitempty"`
	NodeSpeed      []float64 `json:"node_speed,omitempty"`
	Spans          int64     `json:"spans"`
	DelaySpans     int64     `json:"delay_spans"`
	FailedRequests int64     `json:"failed_requests"`
	FirstError     string    `json:"first_error,omitempty"`
	WallS          float64   `json:"wall_s"`
	MaxLagS        float64   `json:"max_lag_s"` // how far sending fell behind the model's clock
	IterationsS    []float64 `json:"iterations_s,omitempty"`
}

// GroupPhase is one data-parallel group's communication phases in the summary.
type GroupPhase struct {
	PG       string       `json:"pg"`
	Hosts    []string     `json:"hosts"`
	Switches []string     `json:"switches"`
	Phases   [][2]float64 `json:"phases"` // (start, duration) in seconds
}

// phaseSums adds up each group's phases over the measured steps.
type phaseSums struct {
	sums  [][][2]float64 // per group, per phase
	steps int
}

func (p *phaseSums) add(m *Model, st SimStep) {
	cfg := &m.cfg
	if p.sums == nil {
		p.sums = make([][][2]float64, cfg.Groups())
	}
	for g, members := range m.members {
		var phases [][2]float64
		var stepStart float64
		for _, r := range members {
			stepStart += st.Ranks[r].Start / float64(len(members))
		}
		rs := st.Ranks[members[0]]
		if cfg.Gather > 0 {
			phases = append(phases, [2]float64{rs.GatherStart - stepStart, rs.GatherEnd - rs.GatherStart})
		}
		last := cfg.Buckets - 1
		phases = append(phases, [2]float64{rs.BucketStart[0] - stepStart, rs.BucketEnd[last] - rs.BucketStart[0]})
		if p.sums[g] == nil {
			p.sums[g] = make([][2]float64, len(phases))
		}
		for i, ph := range phases {
			p.sums[g][i][0] += ph[0]
			p.sums[g][i][1] += ph[1]
		}
	}
	p.steps++
}

func (p *phaseSums) summary(m *Model) []GroupPhase {
	if p.steps == 0 {
		return nil
	}
	cfg := &m.cfg
	var out []GroupPhase
	for g, members := range m.members {
		gp := GroupPhase{PG: dpGroupName(cfg, g)}
		for _, r := range members {
			node := r / cfg.GPUsPerNode
			gp.Hosts = append(gp.Hosts, fmt.Sprintf("node-%04d", node))
			if sw := fmt.Sprintf("leaf-%02d", node/cfg.NodesPerLeaf); !slices.Contains(gp.Switches, sw) {
				gp.Switches = append(gp.Switches, sw)
			}
		}
		for _, sum := range p.sums[g] {
			gp.Phases = append(gp.Phases, [2]float64{sum[0] / float64(p.steps), sum[1] / float64(p.steps)})
		}
		out = append(out, gp)
	}
	return out
}

// simRun is everything one simulate run holds.
type simRun struct {
	cfg        SimConfig
	model      *Model
	job        *Job // reused for resources and span IDs
	epoch      time.Time
	pollers    []*pacerPoller
	staleAfter time.Duration
}

func runSimulateCommand(ctx context.Context, args []string) error {
	cfg := DefaultSimConfig()
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "127.0.0.1:4317", "OTLP/gRPC endpoint of the collector (plaintext)")
	pacerURL := fs.String("pacer-url", "", "the pacer's base URL (http://127.0.0.1:4320); empty: no pacing")
	pollInterval := fs.Duration("poll-interval", time.Second, "how often each rank polls the pacer")
	maxDelay := fs.Duration("max-delay", 50*time.Millisecond, "each rank's own cap on one delay")
	steps := fs.Int("steps", 100, "steps to simulate")
	measureFrom := fs.Int("measure-from", 20, "first step counted in the summary's figures")
	ranksPerRequest := fs.Int("ranks-per-request", 16, "ranks whose spans share one OTLP request")
	workers := fs.Int("workers", 4, "concurrent export calls")
	keepIterations := fs.Bool("iterations", false, "print every measured iteration time in the summary")
	offline := fs.Bool("offline", false, "play the model as fast as it computes, send nothing, poll no pacer (what-if figures)")
	fs.StringVar(&cfg.JobID, "job", cfg.JobID, "training.job.id")
	fs.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "nodes")
	fs.IntVar(&cfg.GPUsPerNode, "gpus-per-node", cfg.GPUsPerNode, "ranks per node (the tensor-parallel group)")
	fs.IntVar(&cfg.NodesPerLeaf, "nodes-per-leaf", cfg.NodesPerLeaf, "nodes behind one leaf switch")
	fs.IntVar(&cfg.Buckets, "buckets", cfg.Buckets, "gradient all-reduces per step in each data-parallel group")
	fs.IntVar(&cfg.BatchPerRank, "batch-per-rank", cfg.BatchPerRank, "samples per rank per step")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of every draw")
	fs.DurationVar(&cfg.Fetch, "fetch", cfg.Fetch, "mean dataloader fetch")
	fs.DurationVar(&cfg.Forward, "forward", cfg.Forward, "mean forward")
	fs.DurationVar(&cfg.Backward, "backward", cfg.Backward, "mean backward compute")
	fs.DurationVar(&cfg.Optimizer, "optimizer", cfg.Optimizer, "mean optimizer step")
	fs.DurationVar(&cfg.Transfer, "transfer", cfg.Transfer, "one bucket's all-reduce at full rate")
	fs.DurationVar(&cfg.TPTransfer, "tp-transfer", cfg.TPTransfer, "the tensor-parallel all_gather")
	fs.Float64Var(&cfg.Jitter, "jitter", cfg.Jitter, "relative stddev of every per-rank phase")
	fs.Float64Var(&cfg.NodeSpeedSpread, "node-speed-spread", cfg.NodeSpeedSpread, "stddev of node compute-time factors")
	fs.Float64Var(&cfg.StallProb, "stall-prob", cfg.StallProb, "chance of a data-loader stall per rank and step")
	fs.DurationVar(&cfg.StallMean, "stall-mean", cfg.StallMean, "mean stall (exponential)")
	fs.Float64Var(&cfg.SpineCapacity, "spine-capacity", cfg.SpineCapacity, "full-rate transfers a spine uplink carries at once (more share it equally)")
	fs.Float64Var(&cfg.ParkedPenalty, "parked-penalty", cfg.ParkedPenalty, "spine capacity lost to early ranks' parked traffic (0: none)")
	fs.IntVar(&cfg.DPSets, "dp-sets", cfg.DPSets, "sets of nodes (node n in set n mod S) with data-parallel groups of their own, synced by a world all-reduce before the optimizer")
	fs.DurationVar(&cfg.Gather, "gather", cfg.Gather, "each data-parallel group's blocking all_gather before forward, at full rate (0: none)")
	slowNodes := fs.String("slow-node", "", "NODE:FACTOR[,...] compute-time factors (1.2: 20% slower)")
	slowNICs := fs.String("slow-nic", "", "RANK:FACTOR[,...] NIC rates (0.5: half speed)")
	slowUplinks := fs.String("slow-uplink", "", "LEAF:FACTOR[,...] leaf uplink rates")
	groupOffsets := fs.String("group-offset", "", "PG:SECONDS[,...] a fixed delay before forward on every member of a data-parallel group (dp<set>.<local rank> with -dp-sets > 1), every step, as a rank applies the interleave policy's offsets")
	setDelays := fs.String("set-delay", "", "SET:SECONDS[,...] a fixed delay before forward on every rank of a -dp-sets set, every step (an offset without a pacer)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.SlowNodes, err = ParseSlowdowns("slow-node", *slowNodes); err != nil {
		return err
	}
	for i := range cfg.SlowNodes {
		cfg.SlowNodes[i].Factor = math.Max(cfg.SlowNodes[i].Factor, 1e-3)
	}
	if cfg.SlowNICs, err = ParseSlowdowns("slow-nic", *slowNICs); err != nil {
		return err
	}
	if cfg.SlowUplinks, err = ParseSlowdowns("slow-uplink", *slowUplinks); err != nil {
		return err
	}
	fixed, err := ParseSlowdowns("set-delay", *setDelays)
	if err != nil {
		return err
	}
	for _, d := range fixed {
		if d.Index >= cfg.DPSets {
			return fmt.Errorf("-set-delay set %d is outside -dp-sets=%d", d.Index, cfg.DPSets)
		}
	}
	offsets, err := parseGroupOffsets(&cfg, *groupOffsets)
	if err != nil {
		return err
	}
	for g, offset := range offsets {
		fixed = append(fixed, Slowdown{Index: -1 - g, Factor: offset})
	}
	switch {
	case *steps < 1:
		return fmt.Errorf("-steps must be >= 1, got %d", *steps)
	case *measureFrom < 0 || *measureFrom >= *steps:
		return fmt.Errorf("-measure-from must be in [0, -steps), got %d", *measureFrom)
	case *pollInterval <= 0:
		return fmt.Errorf("-poll-interval must be > 0, got %s", *pollInterval)
	case *maxDelay < 0:
		return fmt.Errorf("-max-delay must be >= 0, got %s", *maxDelay)
	case *ranksPerRequest < 1 || *workers < 1:
		return errors.New("-ranks-per-request and -workers must be >= 1")
	}
	var pacer *url.URL
	if *pacerURL != "" {
		if pacer, err = url.Parse(*pacerURL); err != nil || (pacer.Scheme != "http" && pacer.Scheme != "https") {
			return fmt.Errorf("-pacer-url %q: want http(s)://host:port", *pacerURL)
		}
	}
	model, err := NewModel(cfg)
	if err != nil {
		return err
	}
	var snd *sender
	if *offline {
		if pacer != nil {
			return errors.New("-offline polls no pacer: leave out -pacer-url")
		}
	} else {
		if snd, err = newSender(*endpoint, *workers, 0, 10*time.Second); err != nil {
			return err
		}
		defer snd.Close()
		if err := snd.waitReady(ctx, 15*time.Second); err != nil {
			return fmt.Errorf("-endpoint %s: %w", *endpoint, err)
		}
	}
	summary, err := simulate(ctx, model, snd, simOptions{
		pacer: pacer, pollInterval: *pollInterval, maxDelay: maxDelay.Seconds(),
		steps: *steps, measureFrom: *measureFrom, ranksPerRequest: *ranksPerRequest,
		keepIterations: *keepIterations, setDelays: fixed,
	})
	if err != nil {
		return err
	}
	if err := json.NewEncoder(os.Stdout).Encode(summary); err != nil {
		return err
	}
	if summary.FailedRequests > 0 {
		return fmt.Errorf("%d requests failed, first: %s", summary.FailedRequests, summary.FirstError)
	}
	return nil
}

type simOptions struct {
	pacer           *url.URL
	pollInterval    time.Duration
	maxDelay        float64
	steps           int
	measureFrom     int
	ranksPerRequest int
	keepIterations  bool
	setDelays       []Slowdown // Index: a -dp-sets set; Factor: its delay in seconds
}

// simulate plays opts.steps steps in real time and sends their spans through snd; with no
// sender it only computes them, as fast as it can.
func simulate(ctx context.Context, model *Model, snd *sender, opts simOptions) (SimSummary, error) {
	cfg := model.cfg
	ranks := cfg.Ranks()
	started := time.Now()
	job, err := NewJob(JobConfig{
		JobID: cfg.JobID, Ranks: ranks, GPUsPerNode: cfg.GPUsPerNode,
		NodesPerSwitch: cfg.NodesPerLeaf, Collectives: cfg.Buckets, MissingRank: -1, Seed: cfg.Seed,
	}, started)
	if err != nil {
		return SimSummary{}, err
	}
	run := &simRun{cfg: cfg, model: model, job: job, epoch: started, staleAfter: 3 * opts.pollInterval}

	pollCtx, stopPolling := context.WithCancel(ctx)
	var pollers sync.WaitGroup
	defer func() { stopPolling(); pollers.Wait() }()
	if opts.pacer != nil {
		target := opts.pacer.JoinPath("/v1/pacing").String() + "?job=" + url.QueryEscape(cfg.JobID)
		// Every rank polls, as each Python rank does; the connections are pooled (at most 16
		// open), as a node's ranks would not hold more than one each to the pacer.
		client := &http.Client{
			Timeout: min(2*time.Second, max(200*time.Millisecond, opts.pollInterval)),
			Transport: &http.Transport{
				MaxConnsPerHost: 16, MaxIdleConnsPerHost: 16, IdleConnTimeout: 5 * time.Second,
			},
		}
		phases := rand.New(rand.NewPCG(cfg.Seed, 0x9011))
		for r := range ranks {
			p := &pacerPoller{rank: r, maxDelay: opts.maxDelay}
			run.pollers = append(run.pollers, p)
			phase := time.Duration(phases.Float64() * float64(opts.pollInterval))
			pollers.Add(1)
			go func() { defer pollers.Done(); p.run(pollCtx, client, target, opts.pollInterval, phase) }()
		}
	}

	queue := make(chan request, 64)
	sent := make(chan struct{})
	if snd != nil {
		go func() { defer close(sent); snd.run(ctx, queue) }()
	} else {
		go func() {
			defer close(sent)
			for range queue {
			}
		}()
	}

	summary := SimSummary{
		Mode: "simulate", JobID: cfg.JobID, Nodes: cfg.Nodes, Ranks: ranks, Leaves: cfg.Leaves(),
		MeasuredFrom: opts.measureFrom, Pacing: opts.pacer != nil, Groups: cfg.Groups(),
	}
	var iterations []float64
	var stretchSum float64
	var transfers int
	var phases phaseSums
	var delaySpans int64
	pacedSteps, activeAnswers, answers := 0, 0, 0
	nodeDelay := make([]float64, cfg.Nodes)
	delays := make([]float64, ranks)
	versions := make([]int64, ranks)
	prevEnd := 0.0
	for step := range opts.steps {
		if ctx.Err() != nil {
			break
		}
		now := time.Now()
		anyDelay := false
		for r, p := range run.pollers {
			delays[r], versions[r] = p.current(now, run.staleAfter)
		}
		for _, d := range opts.setDelays {
			for r := range delays {
				// Index >= 0: a set; -1 - g: data-parallel group g.
				if r/cfg.GPUsPerNode%cfg.DPSets == d.Index || cfg.GroupOf(r) == -1-d.Index {
					delays[r] = math.Max(delays[r], d.Factor)
				}
			}
		}
		for _, d := range delays {
			anyDelay = anyDelay || d > 0
		}
		if len(run.pollers) > 0 {
			if a := run.pollers[0].latest.Load(); a != nil {
				answers++
				if a.active {
					activeAnswers++
				}
			}
		}
		st := model.Next(delays)
		if snd != nil {
			// The step happens in real time: its spans leave once its last rank finished.
			due := run.epoch.Add(time.Duration(st.End * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
			} else {
				summary.MaxLagS = math.Max(summary.MaxLagS, -wait.Seconds())
			}
			td, nDelay := run.spans(st, versions)
			delaySpans += int64(nDelay)
			reqs, err := encodeRequests(SplitByRanks(Step{Index: st.Index, Traces: td},
				opts.ranksPerRequest), int(st.Index))
			if err != nil {
				close(queue)
				<-sent
				return summary, err
			}
			for _, req := range reqs {
				queue <- req
			}
		}
		if step >= opts.measureFrom {
			iterations = append(iterations, st.End-prevEnd)
			stretchSum += st.StretchSum
			transfers += st.Transfers
			phases.add(model, st)
			if anyDelay {
				pacedSteps++
			}
			for r := range st.Ranks {
				if d := st.Ranks[r].Delay; d > 0 {
					summary.DelaysApplied++
					summary.DelayTotalS += d
					nodeDelay[r/cfg.GPUsPerNode] += d / float64(cfg.GPUsPerNode)
				}
			}
		}
		prevEnd = st.End
		summary.Steps = step + 1
	}
	close(queue)
	<-sent
	stopPolling()
	pollers.Wait()

	if n := len(iterations); n > 0 {
		mean, sd := meanStd(iterations)
		summary.IterMeanS, summary.IterCV = mean, sd/mean
		sorted := append([]float64(nil), iterations...)
		sort.Float64s(sorted)
		summary.IterP99S = sorted[min(n-1, int(math.Ceil(0.99*float64(n)))-1)]
		summary.Throughput = float64(ranks*cfg.BatchPerRank) / mean
		summary.PacedStepShare = float64(pacedSteps) / float64(n)
		if transfers > 0 {
			summary.TransferStretch = stretchSum / float64(transfers)
		}
		summary.GroupPhases = phases.summary(model)
		for i := range nodeDelay {
			nodeDelay[i] /= float64(n)
		}
		summary.NodeDelayMeanS = nodeDelay
	}
	if opts.keepIterations {
		summary.IterationsS = iterations
	}
	for n := range cfg.Nodes {
		summary.NodeSpeed = append(summary.NodeSpeed, model.NodeSpeed(n))
	}
	for _, p := range run.pollers {
		summary.PollsOK += p.ok.Load()
		summary.PollsFailed += p.failed.Load()
	}
	if answers > 0 {
		summary.PacerActiveShare = float64(activeAnswers) / float64(answers)
	}
	summary.DelaySpans = delaySpans
	if snd != nil {
		st := snd.stats()
		summary.Spans = st.Spans
		summary.FailedRequests, summary.FirstError = st.FailedRequests, st.FirstError
	}
	summary.WallS = time.Since(started).Seconds()
	return summary, nil
}

func meanStd(xs []float64) (float64, float64) {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	var sq float64
	for _, x := range xs {
		sq += (x - mean) * (x - mean)
	}
	if len(xs) < 2 {
		return mean, 0
	}
	return mean, math.Sqrt(sq / float64(len(xs)-1))
}

// spans builds the step's spans, the instrumentation's names and attributes (as job.go
// does), plus a pacing.delay span on every rank that applied a delay. It returns them and
// how many pacing.delay spans there are.
func (s *simRun) spans(st SimStep, versions []int64) (ptrace.Traces, int) {
	cfg := &s.cfg
	j := s.job
	ranks := cfg.Ranks()
	traceID := TraceIDForStep(cfg.JobID, st.Index)
	rootID := RootSpanIDForStep(cfg.JobID, st.Index)
	at := func(seconds float64) pcommon.Timestamp {
		return pcommon.NewTimestampFromTime(s.epoch.Add(time.Duration(seconds * float64(time.Second))))
	}
	td := ptrace.NewTraces()
	td.ResourceSpans().EnsureCapacity(ranks)
	delaySpans := 0
	for r := range st.Ranks {
		rs := &st.Ranks[r]
		out := td.ResourceSpans().AppendEmpty()
		j.resource[r].CopyTo(out.Resource().Attributes())
		ss := out.ScopeSpans().AppendEmpty()
		ss.Scope().SetName(loadgenScopeName)
		spans := ss.Spans()
		stepID := RankStepSpanID(cfg.JobID, int(st.Index), r)
		add := func(name string, id, parent pcommon.SpanID, start, end float64) ptrace.Span {
			return appendStepSpan(spans, name, traceID, id, parent, at(start), at(end), st.Index)
		}
		if r == 0 {
			add(spanStepRoot, rootID, pcommon.NewSpanIDEmpty(), rs.Start, rs.StepEnd)
		}
		add(spanStep, stepID, rootID, rs.Start, rs.StepEnd)
		add(spanDataloaderFetch, j.newSpanID(), stepID, rs.Start, rs.FetchEnd)
		if rs.Delay > 0 {
			d := add(spanPacingDelay, j.newSpanID(), stepID, rs.FetchEnd, rs.ForwardStart)
			d.Attributes().PutDouble(attrPacingDelay, rs.Delay)
			d.Attributes().PutInt(attrPacingVersion, versions[r])
			delaySpans++
		}
		node, group := r/cfg.GPUsPerNode, cfg.GroupOf(r)
		dp, dpSize := dpGroupName(cfg, group), len(s.model.Members(group))
		// A group's collectives are numbered in order: its gather, then its buckets.
		perStep := cfg.Buckets
		if cfg.Gather > 0 {
			perStep++
			c := add(spanCollectivePrefix+opAllGather, j.newSpanID(), stepID, rs.GatherArrival,
				rs.GatherEnd)
			putCollective(c.Attributes(), opAllGather, dp, dpSize, int64(st.Index*perStep),
				25<<20, sourceAPI)
		}
		fwd := add(spanForward, j.newSpanID(), stepID, rs.ForwardStart, rs.ForwardEnd)
		fwd.Attributes().PutStr(attrTiming, timingHost)
		if cfg.GPUsPerNode > 1 {
			c := add(spanCollectivePrefix+opAllGather, j.newSpanID(), stepID, rs.TPArrival, rs.TPEnd)
			putCollective(c.Attributes(), opAllGather, tpGroupName(node), cfg.GPUsPerNode,
				int64(st.Index), 4<<20, sourceAPI)
		}
		bwd := add(spanBackward, j.newSpanID(), stepID, rs.ForwardEnd, rs.BackwardEnd)
		bwd.Attributes().PutStr(attrTiming, timingHost)
		for k := range cfg.Buckets {
			c := add(spanCollectivePrefix+opAllReduce, j.newSpanID(), stepID, rs.BucketArrival[k],
				rs.BucketEnd[k])
			putCollective(c.Attributes(), opAllReduce, dp, dpSize,
				int64(st.Index*perStep+perStep-cfg.Buckets+k), 25<<20, sourceDDP)
		}
		optimizerStart := rs.BackwardEnd
		if cfg.DPSets > 1 {
			c := add(spanCollectivePrefix+opAllReduce, j.newSpanID(), stepID, rs.BackwardEnd,
				rs.WorldEnd)
			putCollective(c.Attributes(), opAllReduce, worldGroupName, ranks, int64(st.Index), 8,
				sourceAPI)
			optimizerStart = rs.WorldEnd
		}
		add(spanOptimizerStep, j.newSpanID(), stepID, optimizerStart, rs.StepEnd)
	}
	return td, delaySpans
}

// dpGroupName is data-parallel group g's name: dp<local rank>, or dp<set>.<local rank> with
// several sets.
func dpGroupName(cfg *SimConfig, g int) string {
	if cfg.DPSets == 1 {
		return "dp" + strconv.Itoa(g)
	}
	return "dp" + strconv.Itoa(g/cfg.GPUsPerNode) + "." + strconv.Itoa(g%cfg.GPUsPerNode)
}

// parseGroupOffsets reads -group-offset: PG:SECONDS by data-parallel group index.
func parseGroupOffsets(cfg *SimConfig, text string) (map[int]float64, error) {
	out := map[int]float64{}
	if text == "" {
		return out, nil
	}
	byName := map[string]int{}
	for g := range cfg.Groups() {
		byName[dpGroupName(cfg, g)] = g
	}
	for _, part := range strings.Split(text, ",") {
		name, value, ok := strings.Cut(part, ":")
		g, known := byName[name]
		seconds, err := strconv.ParseFloat(value, 64)
		if !ok || !known || err != nil || seconds < 0 || math.IsInf(seconds, 0) {
			return nil, fmt.Errorf("-group-offset %q: want PG:SECONDS with a data-parallel group of this job", part)
		}
		out[g] = seconds
	}
	return out, nil
}

// worldGroupName is the group of every rank (the world all-reduce that syncs -dp-sets).
const worldGroupName = "world"
