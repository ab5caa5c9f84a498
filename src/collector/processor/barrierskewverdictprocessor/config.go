package barrierskewverdictprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewverdictprocessor"

import (
	"errors"
	"fmt"
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
)

// Config is the barrierskewverdict processor's configuration. The flag rule's keys mean what
// they mean on the barrierskew processor, and must be set the same as there for the verdict
// to be the one a single instance gives.
type Config struct {
	// FlagWindow, FlagK and ClearSteps: a rank, link or imbalance that was a root cause in
	// at least flag_k of the job's last flag_window steps, the latest among them, is
	// flagged; the flag clears after clear_steps steps without. Defaults 8, 4, 3.
	FlagWindow int `mapstructure:"flag_window"`
	FlagK      int `mapstructure:"flag_k"`
	ClearSteps int `mapstructure:"clear_steps"`
	// ReorderWait is how long a step's summary waits for the summaries of the job's earlier
	// steps (analyzed by other instances) before it is decided without them. Default 5s.
	ReorderWait time.Duration `mapstructure:"reorder_wait"`
	// MaxOpenSteps bounds the waiting summaries per job; past it the oldest is decided at
	// once. Default 16.
	MaxOpenSteps int `mapstructure:"max_open_steps"`
	// MaxJobs bounds the jobs with flag state; past it the least recently seen is forgotten
	// (its waiting summaries counted dropped). Default 64.
	MaxJobs int `mapstructure:"max_jobs"`
	// MaxAttributeLength: a summary string longer than this makes its event unreadable (the
	// values become metric labels downstream). Default 256.
	MaxAttributeLength int `mapstructure:"max_attribute_length"`
	// ReleaseInterval is how often summaries whose wait is over are decided. Default 100ms.
	ReleaseInterval time.Duration `mapstructure:"release_interval"`
}

func createDefaultConfig() *Config {
	d := diagnosis.DefaultConfig()
	return &Config{
		FlagWindow:         d.FlagWindow,
		FlagK:              d.FlagK,
		ClearSteps:         d.ClearSteps,
		ReorderWait:        5 * time.Second,
		MaxOpenSteps:       d.MaxOpenSteps,
		MaxJobs:            d.MaxJobs,
		MaxAttributeLength: 256,
		ReleaseInterval:    100 * time.Millisecond,
	}
}

// diagnosisConfig is the flag rule as the analysis takes it.
func (c *Config) diagnosisConfig() diagnosis.Config {
	d := diagnosis.DefaultConfig()
	d.FlagWindow, d.FlagK, d.ClearSteps = c.FlagWindow, c.FlagK, c.ClearSteps
	d.MaxOpenSteps, d.MaxJobs = c.MaxOpenSteps, c.MaxJobs
	return d
}

// Validate checks the configuration; each error names the YAML key.
func (c *Config) Validate() error {
	d := c.diagnosisConfig()
	errs := []error{d.Check()}
	if c.ReorderWait < 0 {
		errs = append(errs, fmt.Errorf("reorder_wait must be >= 0, got %s", c.ReorderWait))
	}
	if c.MaxAttributeLength <= 0 {
		errs = append(errs, fmt.Errorf("max_attribute_length must be > 0, got %d",
			c.MaxAttributeLength))
	}
	if c.ReleaseInterval <= 0 {
		errs = append(errs, fmt.Errorf("release_interval must be > 0, got %s", c.ReleaseInterval))
	}
	return errors.Join(errs...)
}
