package semconv

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docPath is the source of truth for every cross-component name.
var docPath = filepath.Join("..", "..", "..", "..", "docs", "semantic-conventions.md")

var goNames = []string{
	AttrServiceName, AttrServiceInstanceID, AttrJobID, AttrRank, AttrLocalRank, AttrWorldSize,
	AttrHostName, AttrSwitch, AttrNIC,
	SpanStepRoot, SpanStep, SpanDataloaderFetch, SpanForward, SpanBackward, SpanOptimizerStep,
	SpanPacingDelay,
	AttrStep, AttrCollectiveOp, AttrCollectivePG, AttrCollectivePGSize, AttrCollectiveSeq,
	AttrCollectiveBytes, AttrCollectiveAsync, AttrCollectiveSource, AttrTiming,
	AttrBarrierSkew, AttrBarrierLateness, AttrBarrierWait, AttrBarrierTransfer, AttrClockOffset,
	AttrStraggler, AttrStragglerCause, AttrStragglerDomain, AttrBarrierMissingRanks,
	AttrBarrierMissing,
	CauseData, CauseCompute, CauseNetwork, CauseUnknown, DefaultPG, UnknownTopology,
	MetricBarrierSkew, MetricRankLateness, MetricRankWait, MetricStraggler, MetricStragglerDomain,
	MetricCollectiveIncomplete, MetricRankMissing, MetricClockOffset, MetricStepDuration,
}

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("reading %s: %v", docPath, err)
	}
	return string(b)
}

func TestEveryGoNameIsDocumented(t *testing.T) {
	doc := readDoc(t)
	for _, name := range goNames {
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("%q is not in docs/semantic-conventions.md", name)
		}
	}
	if !strings.Contains(doc, "`"+SpanCollectivePrefix) {
		t.Errorf("collective span prefix %q is not documented", SpanCollectivePrefix)
	}
}

// section returns the text under a "## title" heading up to the next one.
func section(t *testing.T, doc, title string) string {
	t.Helper()
	start := strings.Index(doc, "## "+title)
	if start < 0 {
		t.Fatalf("section %q not found", title)
	}
	rest := doc[start+3:]
	if end := strings.Index(rest, "\n## "); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

var firstColumn = regexp.MustCompile("(?m)^\\| `([a-z_.]+)`")

func TestEveryDocumentedAnnotationAndMetricIsAGoName(t *testing.T) {
	doc := readDoc(t)
	known := map[string]bool{}
	for _, n := range goNames {
		known[n] = true
	}
	for _, title := range []string{"Annotations added by the `barrierskew` processor",
		"Metrics (from the `barrierskew` connector)"} {
		rows := firstColumn.FindAllStringSubmatch(section(t, doc, title), -1)
		if len(rows) < 5 {
			t.Fatalf("section %q: only %d rows parsed", title, len(rows))
		}
		for _, row := range rows {
			if !known[row[1]] {
				t.Errorf("%q (section %q) has no Go constant", row[1], title)
			}
		}
	}
}
