// Command loadgen is a synthetic synchronous training job that speaks OTLP/gRPC, and the
// counting OTLP sink the end-to-end benchmark ends in.
//
//	loadgen send -endpoint 127.0.0.1:4317 -ranks 1024 -steps 20 -straggler 17:compute:40ms
//	loadgen sink -listen 127.0.0.1:4319
//	loadgen simulate -endpoint 127.0.0.1:4317 -pacer-url http://127.0.0.1:4320 -nodes 64
//
// simulate: a job of nodes x gpus-per-node ranks on a leaf/spine fabric (fabric.go), played
// in real time, sending the same spans and applying the real pacer's delays (sim.go).
//
// send: every step, every rank emits its resource (rank, host, switch, NIC), `train.step`,
// the phases (`dataloader.fetch`, `forward`, `backward`, `optimizer.step`) and K gradient
// all-reduces whose per-rank durations follow from the arrival model in job.go (skew from
// jitter, one optional straggler with a cause, optional per-host clock offsets). It sends at
// full speed or at -rate spans/s, for -steps steps or -duration, prints spans/s to stderr
// each second and a JSON summary on stdout. -pregenerate encodes every request before the
// clock starts, so the generator costs nothing while the receiver is measured.
//
// sink: accepts OTLP/gRPC traces and metrics, counts spans, spans annotated by barrierskew
// (`training.barrier.skew`), straggler flags by rank and cause, and metric data points, and
// prints them as one JSON line per -report-interval and at exit (SIGINT/SIGTERM).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	if len(args) == 0 || (args[0] != "send" && args[0] != "sink" && args[0] != "simulate") {
		return errors.New("usage: loadgen send|sink|simulate [flags] (-h for the flags of each)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "sink":
		return runSinkCommand(ctx, args[1:])
	case "simulate":
		return runSimulateCommand(ctx, args[1:])
	}
	return runSendCommand(ctx, args[1:])
}

func runSinkCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:4319", "address for OTLP/gRPC (port 0 picks one; the first JSON line says which)")
	interval := fs.Duration("report-interval", time.Second, "how often to print the counts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *interval <= 0 {
		return fmt.Errorf("-report-interval must be > 0, got %s", *interval)
	}
	return runSink(ctx, *listen, *interval, os.Stdout)
}

func runSendCommand(ctx context.Context, args []string) error {
	cfg := DefaultJobConfig()
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "127.0.0.1:4317", "OTLP/gRPC endpoint (host:port, plaintext)")
	fs.StringVar(&cfg.JobID, "job", cfg.JobID, "training.job.id")
	fs.IntVar(&cfg.Ranks, "ranks", cfg.Ranks, "world size")
	fs.IntVar(&cfg.GPUsPerNode, "gpus-per-node", cfg.GPUsPerNode, "ranks per host.name")
	fs.IntVar(&cfg.NodesPerSwitch, "nodes-per-switch", cfg.NodesPerSwitch, "hosts per training.switch")
	fs.IntVar(&cfg.Collectives, "collectives", cfg.Collectives, "gradient all-reduces per step (K)")
	fs.IntVar(&cfg.TPSize, "tp", cfg.TPSize, "tensor-parallel group size; >0 adds an all_gather per step in each group")
	fs.Float64Var(&cfg.Jitter, "jitter", cfg.Jitter, "relative stddev of every phase (the natural skew)")
	fs.DurationVar(&cfg.ClockSkew, "clock-skew", cfg.ClockSkew, "each host's clock is off by up to +- this")
	fs.IntVar(&cfg.MissingRank, "missing-rank", cfg.MissingRank, "this rank sends nothing (-1: none)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the timing draws")
	fs.DurationVar(&cfg.Forward, "forward", cfg.Forward, "mean forward time")
	fs.DurationVar(&cfg.Backward, "backward", cfg.Backward, "mean backward compute time")
	straggler := fs.String("straggler", "", "RANK:CAUSE:AMOUNT, CAUSE data|compute|network, AMOUNT per step (40ms)")
	stragglerFrom := fs.Int("straggler-from", 0, "first step the straggler is slow in")
	steps := fs.Int("steps", 0, "steps to send (0: until -duration)")
	duration := fs.Duration("duration", 0, "stop after this long (0: after -steps)")
	rate := fs.Float64("rate", 0, "target spans per second (0: as fast as the receiver takes them)")
	ranksPerRequest := fs.Int("ranks-per-request", 16, "ranks whose spans share one OTLP request")
	workers := fs.Int("workers", 4, "concurrent export calls")
	pregenerate := fs.Bool("pregenerate", false, "encode all -steps before sending (needs -steps)")
	timeout := fs.Duration("timeout", 10*time.Second, "per-request timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.Straggler, err = ParseStraggler(*straggler); err != nil {
		return err
	}
	if *stragglerFrom < 0 {
		return fmt.Errorf("-straggler-from must be >= 0, got %d", *stragglerFrom)
	}
	if cfg.Straggler != nil {
		cfg.Straggler.FromStep = *stragglerFrom
	}
	switch {
	case *steps < 0:
		return fmt.Errorf("-steps must be >= 0, got %d", *steps)
	case *duration < 0:
		return fmt.Errorf("-duration must be >= 0, got %s", *duration)
	case *steps == 0 && *duration == 0:
		return errors.New("give -steps or -duration (or both)")
	case *pregenerate && *steps == 0:
		return errors.New("-pregenerate needs -steps")
	case *rate < 0:
		return fmt.Errorf("-rate must be >= 0, got %g", *rate)
	case *ranksPerRequest < 1:
		return fmt.Errorf("-ranks-per-request must be >= 1, got %d", *ranksPerRequest)
	case *workers < 1:
		return fmt.Errorf("-workers must be >= 1, got %d", *workers)
	}
	job, err := NewJob(cfg, time.Now())
	if err != nil {
		return err
	}

	snd, err := newSender(*endpoint, *workers, *rate, *timeout)
	if err != nil {
		return err
	}
	defer snd.Close()
	if err := snd.waitReady(ctx, 15*time.Second); err != nil {
		return fmt.Errorf("-endpoint %s: %w", *endpoint, err)
	}

	var pregenerated []request
	if *pregenerate {
		for step := range *steps {
			reqs, err := encodeRequests(SplitByRanks(job.NextStep(), *ranksPerRequest), step)
			if err != nil {
				return err
			}
			pregenerated = append(pregenerated, reqs...)
		}
	}

	runCtx := ctx
	if *duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	queue := make(chan request, 4**workers)
	stopProgress := make(chan struct{})
	go snd.progress(os.Stderr, time.Second, stopProgress)
	started := time.Now()
	stepsDone := 0
	producerErr := make(chan error, 1)
	go func() {
		defer close(queue)
		if pregenerated != nil {
			stepsDone = *steps
			for _, req := range pregenerated {
				select {
				case queue <- req:
				case <-runCtx.Done():
					producerErr <- nil
					return
				}
			}
			producerErr <- nil
			return
		}
		for *steps == 0 || stepsDone < *steps {
			reqs, err := encodeRequests(SplitByRanks(job.NextStep(), *ranksPerRequest), stepsDone)
			if err != nil {
				producerErr <- err
				return
			}
			for _, req := range reqs {
				select {
				case queue <- req:
				case <-runCtx.Done():
					producerErr <- nil
					return
				}
			}
			stepsDone++
		}
		producerErr <- nil
	}()
	snd.run(runCtx, queue)
	elapsed := time.Since(started)
	close(stopProgress)
	if err := <-producerErr; err != nil {
		return err
	}

	st := snd.stats()
	st.Mode, st.Endpoint, st.Ranks, st.Steps = "send", *endpoint, cfg.Ranks, stepsDone
	st.Seconds = elapsed.Seconds()
	st.StartedUnixNano = started.UnixNano()
	if st.Seconds > 0 {
		st.SpansPerSecond = float64(st.Spans) / st.Seconds
	}
	if err := json.NewEncoder(os.Stdout).Encode(st); err != nil {
		return err
	}
	if st.FailedRequests > 0 {
		return fmt.Errorf("%d of %d requests failed, first: %s", st.FailedRequests, st.Requests,
			st.FirstError)
	}
	return nil
}
