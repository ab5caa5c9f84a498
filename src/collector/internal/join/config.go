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
	// (incomplete) and counted as evicted. Default 4096.
	MaxPending int `mapstructure:"max_pending"`
	// MaxBufferedSpans bounds the collective spans held across all pending collectives; when
	// full the oldest collectives are released and counted as evicted. Default 262144.
	MaxBufferedSpans int `mapstructure:"max_buffered_spans"`

	diagnosis.Config `mapstructure:",squash"`
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		WaitTimeout:      5 * time.Second,
		MaxPending:       4096,
		MaxBufferedSpans: 262144,
		Config:           diagnosis.DefaultConfig(),
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
	errs = append(errs, c.Config.Check())
	return errors.Join(errs...)
}
