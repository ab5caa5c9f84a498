package traceshapeprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/traceshapeprocessor"

import (
	"errors"
	"fmt"
)

// Config is the traceshape processor's configuration.
type Config struct {
	// MaxTraceSpans is the most spans one stored trace holds. A job whose step would exceed
	// it (world size x the spans one rank sends per step) is stored one trace per (step,
	// rank) from then on; past it in any one trace, spans are dropped and counted
	// (trace_full). Default 6000: about 3.5 MB at the ~600 bytes of an annotated collective
	// span, under Grafana Tempo's default max_bytes_per_trace of 5 MB.
	MaxTraceSpans int `mapstructure:"max_trace_spans"`
	// SampleRanks is how many ranks of a job stored per (step, rank) keep every span of every
	// step although healthy: every ceil(world_size / sample_ranks)-th rank, the same ranks
	// in every step. Flagged ranks and the late member of each collective are kept besides.
	// Default 32; 0 keeps only those.
	SampleRanks int `mapstructure:"sample_ranks"`
	// MaxLinks bounds the span links a step summary gets to the train.step spans of the
	// ranks it names (root causes and flagged ranks). Default 64.
	MaxLinks int `mapstructure:"max_links"`
	// MaxJobs bounds the jobs whose shape (flags, split) is remembered; past it the state
	// starts over. Default 1024.
	MaxJobs int `mapstructure:"max_jobs"`
	// MaxRequestSpans bounds the spans of one request the processor forwards (the copies it
	// keeps of one incoming batch are split into requests of at most this many): many
	// OTLP/gRPC receivers refuse messages over 4 MiB, and an annotated span with its
	// resource is about 550 bytes. Default 4096; 0 does not split.
	MaxRequestSpans int `mapstructure:"max_request_spans"`
}

func createDefaultConfig() *Config {
	return &Config{MaxTraceSpans: 6000, SampleRanks: 32, MaxLinks: 64, MaxJobs: 1024, MaxRequestSpans: 4096}
}

// Validate checks the configuration; each error names the YAML key.
func (c *Config) Validate() error {
	var errs []error
	if c.MaxTraceSpans < 1 {
		errs = append(errs, fmt.Errorf("max_trace_spans must be >= 1, got %d", c.MaxTraceSpans))
	}
	if c.SampleRanks < 0 {
		errs = append(errs, fmt.Errorf("sample_ranks must be >= 0, got %d", c.SampleRanks))
	}
	if c.MaxLinks < 0 {
		errs = append(errs, fmt.Errorf("max_links must be >= 0, got %d", c.MaxLinks))
	}
	if c.MaxJobs < 1 {
		errs = append(errs, fmt.Errorf("max_jobs must be >= 1, got %d", c.MaxJobs))
	}
	if c.MaxRequestSpans < 0 {
		errs = append(errs, fmt.Errorf("max_request_spans must be >= 0, got %d", c.MaxRequestSpans))
	}
	return errors.Join(errs...)
}
