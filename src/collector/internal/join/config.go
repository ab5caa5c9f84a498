package join

import (
	"errors"
	"fmt"
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
)

// Config tunes the join engine. Both barrierskew components embed it (squashed), so the
// YAML keys below are the components' keys and Check's errors name them. The step
// analysis' keys (flags, costs, causes) are diagnosis.Config's, squashed in too.
type Config struct {
	// WaitTimeout is how long a collective waits for its missing members after its first
	// member arrived before it is released incomplete. Default 5s.
	WaitTimeout time.Duration `mapstructure:"wait_timeout"`
	// MaxPending bounds the collectives waiting for members; when full the oldest is released
	// (incomplete) and counted as evicted. Each point-to-point message is a collective of
	// two: a 4096-rank pipeline step of 4 stages and 4 microbatches has about 25,000, all
	// waiting at once while one stage's ranks have reported and the next stage's not yet
	// (at 4096 the 4096-rank job of benchmarks/whatif_corpus.py had 72,756 of its spans
	// rejected as late, members of collectives released incomplete, and read no slowdown).
	// Default 65536.
	MaxPending int `mapstructure:"max_pending"`
	// MaxBufferedSpans bounds the collective spans held across all pending collectives; when
	// full the oldest collectives are released and counted as evicted. Default 262144.
	MaxBufferedSpans int `mapstructure:"max_buffered_spans"`
	// MaxWait is how long past its first arrival a collective may wait for members whose
	// rank is still delivering spans (a backlog after an outage, a lagging exporter): a
	// late-delivered member is not a missing one. Default 30s; at least wait_timeout.
	MaxWait time.Duration `mapstructure:"max_wait"`
	// StartupGrace: collectives that begin within this long after the component started
	// wait up to max_wait, and those released incomplete then are "partial" (their missing
	// members may have gone to the instance before a restart), not counted as missing.
	// Default 30s; 0 disables.
	StartupGrace time.Duration `mapstructure:"startup_grace"`
	// MaxAttributeLength bounds the string attributes the join keeps and turns into metric
	// labels (job id, host, switch, NIC, group, op); a span with a longer one is malformed.
	// Default 256.
	MaxAttributeLength int `mapstructure:"max_attribute_length"`

	diagnosis.Config `mapstructure:",squash"`
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		WaitTimeout:        5 * time.Second,
		MaxPending:         65536,
		MaxBufferedSpans:   262144,
		MaxWait:            30 * time.Second,
		StartupGrace:       30 * time.Second,
		MaxAttributeLength: 256,
		Config:             diagnosis.DefaultConfig(),
	}
}

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
	if c.MaxWait < c.WaitTimeout {
		errs = append(errs, fmt.Errorf("max_wait must be >= wait_timeout=%s, got %s",
			c.WaitTimeout, c.MaxWait))
	}
	if c.StartupGrace < 0 {
		errs = append(errs, fmt.Errorf("startup_grace must be >= 0, got %s", c.StartupGrace))
	}
	if c.MaxAttributeLength < 1 {
		errs = append(errs, fmt.Errorf("max_attribute_length must be >= 1, got %d",
			c.MaxAttributeLength))
	}
	errs = append(errs, c.Config.Check())
	return errors.Join(errs...)
}
