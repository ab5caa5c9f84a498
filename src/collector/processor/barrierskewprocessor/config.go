package barrierskewprocessor // import "github.com/skewtrace/skewtrace/src/collector/processor/barrierskewprocessor"

import (
	"errors"
	"fmt"
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
)

// Config is the barrierskew processor's configuration. The join keys are documented on
// join.Config and in README.md.
type Config struct {
	join.Config `mapstructure:",squash"`

	// ReleaseInterval is how often a background ticker releases collectives whose
	// wait_timeout expired. Default 100ms.
	ReleaseInterval time.Duration `mapstructure:"release_interval"`
}

func createDefaultConfig() *Config {
	return &Config{
		Config:          join.DefaultConfig(),
		ReleaseInterval: 100 * time.Millisecond,
	}
}

// Validate checks the configuration; each error names the YAML key.
func (c *Config) Validate() error {
	errs := []error{c.Config.Check()}
	if c.ReleaseInterval <= 0 {
		errs = append(errs, fmt.Errorf("release_interval must be > 0, got %s", c.ReleaseInterval))
	}
	return errors.Join(errs...)
}
