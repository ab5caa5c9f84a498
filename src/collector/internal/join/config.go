package join

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes the join engine. Both barrierskew components embed it (squashed), so the
// YAML keys below are the components' keys and Validate's errors name them.
type Config struct {
	// WaitTimeout is how long a collective waits for its missing members after its first
	// member arrived before it is released incomplete. Default 5s.
	WaitTimeout time.Duration `mapstructure:"wait_timeout"`
	// MaxPending bounds the collectives waiting for members; when full the oldest is released
	// (incomplete) and counted as evicted. Default 4096.
	MaxPending int `mapstructure:"max_pending"`
	// MaxBufferedSpans bounds the collective spans held across all pending collectives; when
	// full the oldest collectives are released and counted as evicted. Default 262144.
	MaxBufferedSpans int `mapstructure:"max_buffered_spans"`
	// MaxPhaseEntries bounds the per-(job, step, rank) phase-duration cache used for causes;
	// the oldest entries are forgotten first. Default 65536.
	MaxPhaseEntries int `mapstructure:"max_phase_entries"`
	// MinLateness is the absolute lateness the last arrival must exceed to count as late.
	// Default 5ms.
	MinLateness time.Duration `mapstructure:"min_lateness"`
	// MinLatenessFraction is the fraction of the late rank's recent step duration its
	// lateness must also exceed (0 disables; an unknown step duration counts as 0). Default 0.05.
	MinLatenessFraction float64 `mapstructure:"min_lateness_fraction"`
	// FlagWindow is W: verdicts look at the last W released collectives of the job. Default 10.
	FlagWindow int `mapstructure:"flag_window"`
	// FlagK is K: a rank late in at least K of the last W collectives is flagged. Default 3.
	FlagK int `mapstructure:"flag_k"`
	// ClearK is the hysteresis: a flagged rank clears when late in at most ClearK of the last
	// W collectives. Must be below flag_k. Default 1.
	ClearK int `mapstructure:"clear_k"`
	// CauseMinFraction is the part of the lateness a phase's excess over the peers' median
	// must explain to be named the cause (data or compute). Default 0.5.
	CauseMinFraction float64 `mapstructure:"cause_min_fraction"`
	// NetworkFactor: when no phase explains the lateness, a transfer time above NetworkFactor
	// times its rolling baseline for (job, pg, op, bytes) names the cause network. Default 2.
	NetworkFactor float64 `mapstructure:"network_factor"`
	// MaxJobs bounds the jobs with verdict state; the least recently seen is forgotten.
	// Default 64.
	MaxJobs int `mapstructure:"max_jobs"`
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		WaitTimeout:         5 * time.Second,
		MaxPending:          4096,
		MaxBufferedSpans:    262144,
		MaxPhaseEntries:     65536,
		MinLateness:         5 * time.Millisecond,
		MinLatenessFraction: 0.05,
		FlagWindow:          10,
		FlagK:               3,
		ClearK:              1,
		CauseMinFraction:    0.5,
		NetworkFactor:       2,
		MaxJobs:             64,
	}
}

// maxFlagWindow keeps the per-job verdict ring small; larger windows add nothing a
// dashboard cannot do with the metrics.
const maxFlagWindow = 1024

// Check validates every field; each error names the YAML key. It is not called Validate so
// that the collector's recursive config validation does not report its errors twice for
// the components that embed it (their Validate calls Check).
func (c *Config) Check() error {
	var errs []error
	if c.WaitTimeout <= 0 {
		errs = append(errs, fmt.Errorf("wait_timeout must be > 0, got %s", c.WaitTimeout))
	}
	if c.MaxPending <= 0 {
		errs = append(errs, fmt.Errorf("max_pending must be > 0, got %d", c.MaxPending))
	}
	if c.MaxBufferedSpans <= 0 {
		errs = append(errs, fmt.Errorf("max_buffered_spans must be > 0, got %d", c.MaxBufferedSpans))
	}
	if c.MaxPhaseEntries <= 0 {
		errs = append(errs, fmt.Errorf("max_phase_entries must be > 0, got %d", c.MaxPhaseEntries))
	}
	if c.MinLateness < 0 {
		errs = append(errs, fmt.Errorf("min_lateness must be >= 0, got %s", c.MinLateness))
	}
	if c.MinLatenessFraction < 0 || c.MinLatenessFraction >= 1 {
		errs = append(errs, fmt.Errorf("min_lateness_fraction must be in [0, 1), got %g",
			c.MinLatenessFraction))
	}
	if c.FlagWindow <= 0 || c.FlagWindow > maxFlagWindow {
		errs = append(errs, fmt.Errorf("flag_window must be in [1, %d], got %d",
			maxFlagWindow, c.FlagWindow))
	}
	if c.FlagK <= 0 || c.FlagK > c.FlagWindow {
		errs = append(errs, fmt.Errorf("flag_k must be in [1, flag_window=%d], got %d",
			c.FlagWindow, c.FlagK))
	}
	if c.ClearK < 0 || c.ClearK >= c.FlagK {
		errs = append(errs, fmt.Errorf("clear_k must be in [0, flag_k=%d), got %d", c.FlagK, c.ClearK))
	}
	if c.CauseMinFraction <= 0 || c.CauseMinFraction > 1 {
		errs = append(errs, fmt.Errorf("cause_min_fraction must be in (0, 1], got %g",
			c.CauseMinFraction))
	}
	if c.NetworkFactor <= 1 {
		errs = append(errs, fmt.Errorf("network_factor must be > 1, got %g", c.NetworkFactor))
	}
	if c.MaxJobs <= 0 {
		errs = append(errs, fmt.Errorf("max_jobs must be > 0, got %d", c.MaxJobs))
	}
	return errors.Join(errs...)
}
