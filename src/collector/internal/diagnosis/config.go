package diagnosis

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes the step analysis. The join engine's Config embeds it (squashed), so these
// YAML keys are the barrierskew components' keys and Check's errors name them.
type Config struct {
	// AnalysisDelay is how long a step waits after its last span arrived before it is
	// analyzed, so that an asynchronous span a rank exports after its train.step is in. A
	// step is never analyzed while one of its collectives is still pending, nor before
	// every rank of the job's world (training.world_size) has ended it (its train.step span,
	// or its spans of a later step), unless step_timeout passes first. Default 1s.
	AnalysisDelay time.Duration `mapstructure:"analysis_delay"`
	// StepTimeout is how long a step waits for ranks of the world that have not ended it:
	// the longer of this and twice the job's step time (at most 5 minutes). It must cover
	// the exporters' delay: the OpenTelemetry SDK's batch span processor exports every 5 s
	// by default, and a gateway tier adds its own batching. A step analyzed after it names
	// the ranks that never reported (training.step.missing_ranks). Default 15s.
	StepTimeout time.Duration `mapstructure:"step_timeout"`
	// MaxOpenSteps bounds the steps per job waiting for analysis; past it the oldest is
	// analyzed at once. It must hold the steps a job runs while its ranks' exporters wait
	// (5 s at 10 steps/s is 50). Default 64.
	MaxOpenSteps int `mapstructure:"max_open_steps"`
	// MaxStepOps bounds the collective spans held for analysis across all jobs' open steps
	// (a 4096-rank step with 30 collectives is about 123k); past it the oldest steps are
	// analyzed at once. Default 1048576.
	MaxStepOps int `mapstructure:"max_step_ops"`
	// MaxPhaseEntries bounds the per-(job, step, rank) phase cache used for causes; the
	// oldest entries are forgotten first. Default 65536.
	MaxPhaseEntries int `mapstructure:"max_phase_entries"`
	// MinCost is the least a rank's own work (or a slow link) must have added to a step's
	// duration for it to be that step's root cause. Default 5ms.
	MinCost time.Duration `mapstructure:"min_cost"`
	// MinCostFraction is the same bound as a fraction of the step's duration; the larger
	// of the two applies: a root cause (a rank, a stage, the data, a link) is named only
	// where fixing it saves this share of the step. Default 0.03.
	MinCostFraction float64 `mapstructure:"min_cost_fraction"`
	// FlagWindow is W: flags look at the root causes of the job's last W analyzed steps.
	// Default 8.
	FlagWindow int `mapstructure:"flag_window"`
	// FlagK is K: a rank (or a link) that was a root cause in at least K of the last W
	// steps, the latest among them, is flagged. Default 4.
	FlagK int `mapstructure:"flag_k"`
	// ClearSteps is the hysteresis: a flag clears after this many consecutive steps in
	// which it was not a root cause. Default 3.
	ClearSteps int `mapstructure:"clear_steps"`
	// CauseMinFraction is the part of a root-cause rank's excess own work that one kind of
	// phase (data loading, or compute) must explain to be named the cause. Default 0.5.
	CauseMinFraction float64 `mapstructure:"cause_min_fraction"`
	// NetworkFactor: a collective's transfer (the part after the last arrival) above
	// NetworkFactor times its reference (its group's history, and same-shaped collectives
	// of the job's other groups) is slow. Default 2.
	NetworkFactor float64 `mapstructure:"network_factor"`
	// MinTransferExcess is the least a slow transfer must exceed its reference by to count
	// as slow (tiny collectives slowed by scheduling noise do not point at a link).
	// Default 1ms.
	MinTransferExcess time.Duration `mapstructure:"min_transfer_excess"`
	// FlagDecision is where a job's flags are decided: "local" (here, from the steps this
	// instance analyzed) or "deferred" (the step summaries carry the step's root causes,
	// marked training.verdict.deferred, and a barrierskewverdict processor that receives
	// every step summary of the job decides its flags: a tier-2 instance of the gateway,
	// which sees only some of a job's steps). Default local.
	FlagDecision string `mapstructure:"flag_decision"`
	// MaxJobs bounds the jobs with analysis state (and, in the connector, the jobs with metric
	// series); past it the job with the least activity is forgotten, so a training job keeps
	// its state however many one-off job ids arrive. Default 64.
	MaxJobs int `mapstructure:"max_jobs"`
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		AnalysisDelay:     time.Second,
		StepTimeout:       15 * time.Second,
		MaxOpenSteps:      64,
		MaxStepOps:        1 << 20,
		MaxPhaseEntries:   65536,
		MinCost:           5 * time.Millisecond,
		MinCostFraction:   0.03,
		FlagWindow:        8,
		FlagK:             4,
		ClearSteps:        3,
		CauseMinFraction:  0.5,
		NetworkFactor:     2,
		MinTransferExcess: time.Millisecond,
		FlagDecision:      FlagDecisionLocal,
		MaxJobs:           64,
	}
}

// The values of flag_decision.
const (
	FlagDecisionLocal    = "local"
	FlagDecisionDeferred = "deferred"
)

// maxFlagWindow: the per-rank step history is one 64-bit word.
const maxFlagWindow = 64

// Check validates every field; each error names the YAML key.
func (c *Config) Check() error {
	var errs []error
	if c.AnalysisDelay < 0 {
		errs = append(errs, fmt.Errorf("analysis_delay must be >= 0, got %s", c.AnalysisDelay))
	}
	if c.StepTimeout <= 0 {
		errs = append(errs, fmt.Errorf("step_timeout must be > 0, got %s", c.StepTimeout))
	}
	if c.MaxOpenSteps < 1 {
		errs = append(errs, fmt.Errorf("max_open_steps must be >= 1, got %d", c.MaxOpenSteps))
	}
	if c.MaxStepOps < 1 {
		errs = append(errs, fmt.Errorf("max_step_ops must be >= 1, got %d", c.MaxStepOps))
	}
	if c.MaxPhaseEntries <= 0 {
		errs = append(errs, fmt.Errorf("max_phase_entries must be > 0, got %d", c.MaxPhaseEntries))
	}
	if c.MinCost < 0 {
		errs = append(errs, fmt.Errorf("min_cost must be >= 0, got %s", c.MinCost))
	}
	if c.MinCostFraction < 0 || c.MinCostFraction >= 1 {
		errs = append(errs, fmt.Errorf("min_cost_fraction must be in [0, 1), got %g",
			c.MinCostFraction))
	}
	if c.FlagWindow <= 0 || c.FlagWindow > maxFlagWindow {
		errs = append(errs, fmt.Errorf("flag_window must be in [1, %d], got %d",
			maxFlagWindow, c.FlagWindow))
	}
	if c.FlagK <= 0 || c.FlagK > c.FlagWindow {
		errs = append(errs, fmt.Errorf("flag_k must be in [1, flag_window=%d], got %d",
			c.FlagWindow, c.FlagK))
	}
	if c.ClearSteps < 1 || c.ClearSteps > c.FlagWindow {
		errs = append(errs, fmt.Errorf("clear_steps must be in [1, flag_window=%d], got %d",
			c.FlagWindow, c.ClearSteps))
	}
	if c.CauseMinFraction <= 0 || c.CauseMinFraction > 1 {
		errs = append(errs, fmt.Errorf("cause_min_fraction must be in (0, 1], got %g",
			c.CauseMinFraction))
	}
	if c.NetworkFactor <= 1 {
		errs = append(errs, fmt.Errorf("network_factor must be > 1, got %g", c.NetworkFactor))
	}
	if c.MinTransferExcess < 0 {
		errs = append(errs, fmt.Errorf("min_transfer_excess must be >= 0, got %s",
			c.MinTransferExcess))
	}
	if c.FlagDecision != FlagDecisionLocal && c.FlagDecision != FlagDecisionDeferred {
		errs = append(errs, fmt.Errorf("flag_decision must be %q or %q, got %q",
			FlagDecisionLocal, FlagDecisionDeferred, c.FlagDecision))
	}
	if c.MaxJobs <= 0 {
		errs = append(errs, fmt.Errorf("max_jobs must be > 0, got %d", c.MaxJobs))
	}
	return errors.Join(errs...)
}
