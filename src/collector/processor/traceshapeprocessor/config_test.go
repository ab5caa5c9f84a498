package traceshapeprocessor

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/skewtrace/skewtrace/src/collector/processor/traceshapeprocessor/internal/metadata"
)

func TestConfigFromYAML(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)
	load := func(name string) *Config {
		sub, err := cm.Sub(component.NewIDWithName(metadata.Type, name).String())
		require.NoError(t, err)
		cfg := createDefaultConfig()
		require.NoError(t, sub.Unmarshal(cfg))
		return cfg
	}

	def := load("")
	require.NoError(t, def.Validate())
	require.Equal(t, createDefaultConfig(), def)

	custom := load("custom")
	require.NoError(t, custom.Validate())
	require.Equal(t, &Config{MaxTraceSpans: 2000, SampleRanks: 0, MaxLinks: 8, MaxJobs: 16, MaxRequestSpans: 100}, custom)

	err = load("bad").Validate()
	require.Error(t, err)
	for _, key := range []string{"max_trace_spans", "sample_ranks", "max_links", "max_jobs", "max_request_spans"} {
		require.ErrorContains(t, err, key)
	}
}
