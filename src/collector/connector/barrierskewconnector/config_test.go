package barrierskewconnector

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/confmap/confmaptest"
)

func TestConfigFromTestdata(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	custom := createDefaultConfig()
	custom.WaitTimeout = 3 * time.Second
	custom.FlagK, custom.FlagWindow, custom.ClearSteps = 2, 5, 1
	custom.MetricsFlushInterval = 500 * time.Millisecond
	custom.HistogramBuckets = []float64{0.001, 0.01, 0.1, 1}
	custom.MaxSeries = 500
	custom.ClockOffsetSmoothing = 0.5
	custom.ExemplarsPerPoint = 0
	custom.DedupWindow = 1024
	custom.SeriesIdleTimeout = time.Hour
	joinAnnotated, joinOwn := createDefaultConfig(), createDefaultConfig()
	joinAnnotated.Join, joinOwn.Join = JoinAnnotated, JoinOwn

	cases := []struct {
		id      string
		want    *Config
		wantErr string // the YAML key the error must name
	}{
		{id: "barrierskew", want: createDefaultConfig()},
		{id: "barrierskew/custom", want: custom},
		{id: "barrierskew/zero_flush", wantErr: "metrics_flush_interval"},
		{id: "barrierskew/empty_buckets", wantErr: "histogram_buckets"},
		{id: "barrierskew/unsorted_buckets", wantErr: "histogram_buckets"},
		{id: "barrierskew/duplicate_buckets", wantErr: "histogram_buckets"},
		{id: "barrierskew/zero_max_series", wantErr: "max_series"},
		{id: "barrierskew/smoothing_above_one", wantErr: "clock_offset_smoothing"},
		{id: "barrierskew/negative_exemplars", wantErr: "exemplars_per_point"},
		{id: "barrierskew/zero_dedup_window", wantErr: "dedup_window"},
		{id: "barrierskew/zero_series_idle_timeout", wantErr: "series_idle_timeout"},
		{id: "barrierskew/bad_join_key", wantErr: "flag_k"},
		{id: "barrierskew/join_annotated", want: joinAnnotated},
		{id: "barrierskew/join_own", want: joinOwn},
		{id: "barrierskew/bad_join", wantErr: "join"},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			sub, err := cm.Sub(tc.id)
			if err != nil {
				t.Fatal(err)
			}
			cfg := NewFactory().CreateDefaultConfig().(*Config)
			if err := sub.Unmarshal(cfg); err != nil {
				t.Fatal(err)
			}
			err = cfg.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr+" ") {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg, tc.want) {
				t.Errorf("config %+v, want %+v", cfg, tc.want)
			}
		})
	}
}

func TestJoinModeValidation(t *testing.T) {
	if got := createDefaultConfig().Join; got != JoinAuto {
		t.Fatalf("default join %q, want auto", got)
	}
	for _, tc := range []struct {
		join    JoinMode
		wantErr string
	}{
		{join: "auto"},
		{join: "annotated"},
		{join: "own"},
		{join: "", wantErr: `join must be auto, annotated or own, got ""`},
		{join: "Auto", wantErr: `join must be auto, annotated or own, got "Auto"`},
		{join: "processor", wantErr: `join must be auto, annotated or own, got "processor"`},
	} {
		t.Run(string(tc.join), func(t *testing.T) {
			cfg := createDefaultConfig()
			cfg.Join = tc.join
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("join %q: %v", tc.join, err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Fatalf("join %q: error %v, want %q", tc.join, err, tc.wantErr)
			}
		})
	}
}
