package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
)

// JoinMode says which collective spans the connector reads as the barrierskew processor
// annotated them and which it joins with its own engine (the `join` key).
type JoinMode string

const (
	// JoinAuto reads the collective spans the processor annotated and joins the others
	// with the own engine, span by span; a span the processor marked unjoined is neither.
	JoinAuto JoinMode = "auto"
	// JoinAnnotated only reads annotated collective spans: the others are skipped (counted in
	// spans_malformed as not_annotated) and the own engine joins and analyzes nothing.
	JoinAnnotated JoinMode = "annotated"
	// JoinOwn joins every collective span with the own engine and analyzes its steps itself,
	// ignoring whatever the processor wrote: annotations, unjoined marks and step summaries.
	JoinOwn JoinMode = "own"
)

// Config is the barrierskew connector's configuration. The join keys (used for the spans
// the connector joins itself, see Join) are documented on join.Config and in README.md.
type Config struct {
	join.Config `mapstructure:",squash"`

	// Join chooses between reading the processor's annotations and joining with the own
	// engine: auto, annotated or own (see JoinMode). Default auto.
	Join JoinMode `mapstructure:"join"`

	// MetricsFlushInterval is how often the cumulative metrics are emitted. Default 1s.
	MetricsFlushInterval time.Duration `mapstructure:"metrics_flush_interval"`
	// MetricsResendInterval: a flush emits the histograms observed since the previous flush,
	// and every series at least this often (0: every series at every flush). At 4096 ranks a
	// full flush is ~13,000 histogram points; a job with a step every few seconds changes
	// them once a step, not once a flush. Keep it under the Prometheus exporter's
	// metric_expiration (5m in our configs). Default 1m.
	MetricsResendInterval time.Duration `mapstructure:"metrics_resend_interval"`
	// HistogramBuckets are the explicit bucket bounds, in seconds, of every histogram.
	// Default 0.0005 .. 10 (ms to s).
	HistogramBuckets []float64 `mapstructure:"histogram_buckets"`
	// MaxSeries bounds the data point series per metric; new series beyond it are dropped
	// and counted. Default 20000.
	MaxSeries int `mapstructure:"max_series"`
	// ClockOffsetSmoothing is the EWMA weight of a new per-host clock offset sample.
	// Default 0.2.
	ClockOffsetSmoothing float64 `mapstructure:"clock_offset_smoothing"`
	// ExemplarsPerPoint bounds the exemplars kept per histogram point between flushes
	// (0 disables exemplars). Default 4.
	ExemplarsPerPoint int `mapstructure:"exemplars_per_point"`
	// DedupWindow is how many recent collective keys are remembered to count each annotated
	// collective's skew once although every member's span carries it. A collective's members
	// are released together and a retried export comes seconds later, so the window needs a
	// few steps: 16384 is 30 steps of a 4096-rank job with tensor-parallel groups of 8 (540
	// collectives a step). Default 16384 (about 2 MB).
	DedupWindow int `mapstructure:"dedup_window"`
	// SeriesIdleTimeout forgets a series (and stops emitting it) when it has not been
	// updated for this long, so finished jobs free their share of max_series. Default 15m.
	SeriesIdleTimeout time.Duration `mapstructure:"series_idle_timeout"`
}

func createDefaultConfig() *Config {
	return &Config{
		Config:                join.DefaultConfig(),
		Join:                  JoinAuto,
		MetricsFlushInterval:  time.Second,
		MetricsResendInterval: time.Minute,
		HistogramBuckets: []float64{
			0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
		},
		MaxSeries:            20000,
		ClockOffsetSmoothing: 0.2,
		ExemplarsPerPoint:    4,
		DedupWindow:          16384,
		SeriesIdleTimeout:    15 * time.Minute,
	}
}

// Validate checks the configuration; each error names the YAML key.
func (c *Config) Validate() error {
	errs := []error{c.Config.Check()}
	switch c.Join {
	case JoinAuto, JoinAnnotated, JoinOwn:
	default:
		errs = append(errs, fmt.Errorf("join must be %s, %s or %s, got %q",
			JoinAuto, JoinAnnotated, JoinOwn, c.Join))
	}
	if c.MetricsFlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("metrics_flush_interval must be > 0, got %s",
			c.MetricsFlushInterval))
	}
	if len(c.HistogramBuckets) == 0 {
		errs = append(errs, errors.New("histogram_buckets must not be empty"))
	} else if !sort.SliceIsSorted(c.HistogramBuckets, func(i, j int) bool {
		return c.HistogramBuckets[i] < c.HistogramBuckets[j]
	}) || hasDuplicates(c.HistogramBuckets) {
		errs = append(errs, fmt.Errorf("histogram_buckets must be strictly increasing, got %v",
			c.HistogramBuckets))
	}
	if c.MaxSeries <= 0 {
		errs = append(errs, fmt.Errorf("max_series must be > 0, got %d", c.MaxSeries))
	}
	if c.ClockOffsetSmoothing <= 0 || c.ClockOffsetSmoothing > 1 {
		errs = append(errs, fmt.Errorf("clock_offset_smoothing must be in (0, 1], got %g",
			c.ClockOffsetSmoothing))
	}
	if c.ExemplarsPerPoint < 0 {
		errs = append(errs, fmt.Errorf("exemplars_per_point must be >= 0, got %d",
			c.ExemplarsPerPoint))
	}
	if c.DedupWindow <= 0 {
		errs = append(errs, fmt.Errorf("dedup_window must be > 0, got %d", c.DedupWindow))
	}
	if c.MetricsResendInterval < 0 {
		errs = append(errs, fmt.Errorf("metrics_resend_interval must be >= 0, got %s",
			c.MetricsResendInterval))
	}
	if c.SeriesIdleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("series_idle_timeout must be > 0, got %s",
			c.SeriesIdleTimeout))
	}
	return errors.Join(errs...)
}

func hasDuplicates(sorted []float64) bool {
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return true
		}
	}
	return false
}
