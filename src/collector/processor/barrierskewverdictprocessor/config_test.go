package barrierskewverdictprocessor

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/skewtrace/skewtrace/src/collector/processor/barrierskewverdictprocessor/internal/metadata"
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
	want := createDefaultConfig()
	want.FlagWindow, want.FlagK, want.ClearSteps = 16, 6, 4
	want.ReorderWait, want.MaxOpenSteps, want.MaxJobs = 2*time.Second, 8, 4
	require.Equal(t, want, custom)

	err = load("bad").Validate()
	require.Error(t, err)
	for _, key := range []string{"flag_window", "reorder_wait", "max_attribute_length",
		"release_interval"} {
		require.ErrorContains(t, err, key)
	}
}
