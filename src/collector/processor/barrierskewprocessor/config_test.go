package barrierskewprocessor

import (
	"path/filepath"
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
	custom.WaitTimeout = 2 * time.Second
	custom.MaxPending = 128
	custom.MaxBufferedSpans = 10000
	custom.MaxPhaseEntries = 4096
	custom.MinCost = 2 * time.Millisecond
	custom.MinCostFraction = 0.1
	custom.FlagWindow, custom.FlagK, custom.ClearSteps = 20, 5, 2
	custom.AnalysisDelay = 500 * time.Millisecond
	custom.MaxOpenSteps = 4
	custom.MaxStepOps = 5000
	custom.MinTransferExcess = 2 * time.Millisecond
	custom.CauseMinFraction = 0.6
	custom.NetworkFactor = 3
	custom.MaxJobs = 8
	custom.ReleaseInterval = 50 * time.Millisecond

	cases := []struct {
		id      string
		want    *Config
		wantErr string // the YAML key the error must name
	}{
		{id: "barrierskew", want: createDefaultConfig()},
		{id: "barrierskew/custom", want: custom},
		{id: "barrierskew/zero_wait_timeout", wantErr: "wait_timeout"},
		{id: "barrierskew/negative_max_pending", wantErr: "max_pending"},
		{id: "barrierskew/zero_max_buffered_spans", wantErr: "max_buffered_spans"},
		{id: "barrierskew/zero_max_phase_entries", wantErr: "max_phase_entries"},
		{id: "barrierskew/negative_min_cost", wantErr: "min_cost"},
		{id: "barrierskew/fraction_one", wantErr: "min_cost_fraction"},
		{id: "barrierskew/flag_k_above_window", wantErr: "flag_k"},
		{id: "barrierskew/clear_steps_above_window", wantErr: "clear_steps"},
		{id: "barrierskew/negative_analysis_delay", wantErr: "analysis_delay"},
		{id: "barrierskew/zero_max_open_steps", wantErr: "max_open_steps"},
		{id: "barrierskew/zero_max_step_ops", wantErr: "max_step_ops"},
		{id: "barrierskew/negative_min_transfer_excess", wantErr: "min_transfer_excess"},
		{id: "barrierskew/old_key_clear_k", wantErr: "clear_k"},
		{id: "barrierskew/huge_window", wantErr: "flag_window"},
		{id: "barrierskew/cause_fraction_zero", wantErr: "cause_min_fraction"},
		{id: "barrierskew/network_factor_one", wantErr: "network_factor"},
		{id: "barrierskew/zero_max_jobs", wantErr: "max_jobs"},
		{id: "barrierskew/zero_release_interval", wantErr: "release_interval"},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			sub, err := cm.Sub(tc.id)
			if err != nil {
				t.Fatal(err)
			}
			cfg := NewFactory().CreateDefaultConfig().(*Config)
			if err := sub.Unmarshal(cfg); err != nil {
				// A key the component does not have is refused when decoding, by name.
				if tc.wantErr == "" || !strings.Contains(err.Error(), "invalid keys: "+tc.wantErr) {
					t.Fatal(err)
				}
				return
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
			if *cfg != *tc.want {
				t.Errorf("config %+v, want %+v", cfg, tc.want)
			}
		})
	}
}
