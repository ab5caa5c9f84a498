package spanio

import (
	"reflect"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

func TestClassify(t *testing.T) {
	cases := map[string]Kind{
		"collective.all_reduce": KindCollective,
		"collective.":           KindOther,
		"collectives":           KindOther,
		"train.step":            KindPhase,
		"train.step.root":       KindOther,
		"optimizer.step":        KindPhase,
		"pacing.delay":          KindPhase,
	}
	for name, want := range cases {
		if got, _ := Classify(name); got != want {
			t.Errorf("%q: kind %d, want %d", name, got, want)
		}
	}
}

func TestParseResourceAcceptsStringIntegersFromEnv(t *testing.T) {
	res := pcommon.NewResource()
	// OTEL_RESOURCE_ATTRIBUTES can only carry strings.
	res.Attributes().PutStr(semconv.AttrJobID, "j")
	res.Attributes().PutStr(semconv.AttrRank, "12")
	res.Attributes().PutStr(semconv.AttrWorldSize, "16")
	r := ParseResource(res, 256)
	if r.Reason != "" || r.Rank != 12 || r.WorldSize != 16 || r.Switch != semconv.UnknownTopology {
		t.Errorf("parsed %+v", r)
	}
	res.Attributes().PutStr(semconv.AttrRank, "twelve")
	if r := ParseResource(res, 256); r.Reason != "mistyped:training.rank" {
		t.Errorf("reason %q", r.Reason)
	}
	res.Attributes().Remove(semconv.AttrJobID)
	if r := ParseResource(res, 256); r.Reason != "missing:training.job.id" {
		t.Errorf("reason %q", r.Reason)
	}
}

func TestAnnotateThenReadBack(t *testing.T) {
	span := ptrace.NewSpan()
	r := &join.Released[int]{Skew: 0.02, Transfer: 0.001, MissingRanks: 2, Missing: []int{3, 5},
		Reason: join.ReleasedTimeout}
	m := &join.Member[int]{Lateness: 0.02, Wait: 0, ClockOffset: -1.5,
		Verdict: join.VerdictStraggler, Cause: semconv.CauseData, Domain: "switch:leaf1"}
	Annotate(span, r, m)
	if !IsAnnotated(span) {
		t.Fatal("annotated span not recognised")
	}
	got := ReadAnnotations(span)
	want := Annotations{Skew: 0.02, Transfer: 0.001, Lateness: 0.02, ClockOffset: -1.5,
		Verdict: join.VerdictStraggler, Cause: semconv.CauseData, MissingRanks: 2,
		Missing: []int{3, 5}, Released: semconv.ReleasedTimeout}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	if got := ParseRanks("1, x,-2,7,"); !reflect.DeepEqual(got, []int{1, 7}) {
		t.Errorf("ParseRanks kept %v, want [1 7]", got)
	}
	missing, _ := span.Attributes().Get(semconv.AttrBarrierMissing)
	domain, _ := span.Attributes().Get(semconv.AttrStragglerDomain)
	if missing.Str() != "3,5" || domain.Str() != "switch:leaf1" {
		t.Errorf("missing %q domain %q", missing.Str(), domain.Str())
	}
	clear := ptrace.NewSpan()
	Annotate(clear, &join.Released[int]{}, &join.Member[int]{Verdict: join.VerdictClear})
	if a := ReadAnnotations(clear); a.Verdict != join.VerdictClear {
		t.Errorf("clear verdict read as %d", a.Verdict)
	}
	unchanged := ptrace.NewSpan()
	Annotate(unchanged, &join.Released[int]{}, &join.Member[int]{Verdict: join.VerdictUnchanged})
	if _, ok := unchanged.Attributes().Get(semconv.AttrStraggler); ok {
		t.Errorf("unchanged verdict wrote training.straggler")
	}
}

func TestOversizedAttributesAreMalformed(t *testing.T) {
	huge := strings.Repeat("x", 257)
	for _, key := range []string{semconv.AttrJobID, semconv.AttrHostName, semconv.AttrSwitch,
		semconv.AttrNIC} {
		res := pcommon.NewResource()
		res.Attributes().PutStr(semconv.AttrJobID, "j")
		res.Attributes().PutInt(semconv.AttrRank, 1)
		res.Attributes().PutStr(key, huge)
		if r := ParseResource(res, 256); r.Reason != "oversized:"+key {
			t.Errorf("%s of 257 bytes: reason %q", key, r.Reason)
		}
		res.Attributes().PutStr(key, huge[:256])
		if r := ParseResource(res, 256); r.Reason != "" {
			t.Errorf("%s of 256 bytes: reason %q", key, r.Reason)
		}
	}
	res := pcommon.NewResource()
	res.Attributes().PutStr(semconv.AttrJobID, "j")
	res.Attributes().PutInt(semconv.AttrRank, 1)
	r := ParseResource(res, 256)
	for _, key := range []string{semconv.AttrCollectivePG, semconv.AttrCollectiveOp} {
		span := ptrace.NewSpan()
		span.SetName("collective.all_reduce")
		span.Attributes().PutStr(semconv.AttrCollectivePG, "g")
		span.Attributes().PutInt(semconv.AttrCollectiveSeq, 1)
		span.Attributes().PutInt(semconv.AttrCollectivePGSize, 2)
		span.Attributes().PutInt(semconv.AttrStep, 1)
		span.Attributes().PutStr(key, huge)
		var a join.Arrival[int]
		if reason := ParseCollective(span, &r, &a); reason != "oversized:"+key {
			t.Errorf("%s of 257 bytes: reason %q", key, reason)
		}
	}
}

func TestUnjoinedMark(t *testing.T) {
	span := ptrace.NewSpan()
	if Unjoined(span) {
		t.Fatal("fresh span marked")
	}
	MarkUnjoined(span, "late_arrival")
	if !Unjoined(span) || IsAnnotated(span) {
		t.Fatal("mark not read back, or read as a join")
	}
}

// A forward's training.input.size is read when it is a positive int; a mistyped, negative
// or missing one is left out and the phase still parses (its timing stands without it).
func TestParsePhaseReadsAForwardsInputSize(t *testing.T) {
	res := pcommon.NewResource()
	res.Attributes().PutStr(semconv.AttrJobID, "j")
	res.Attributes().PutInt(semconv.AttrRank, 1)
	res.Attributes().PutInt(semconv.AttrWorldSize, 2)
	r := ParseResource(res, 256)
	span := ptrace.NewSpan()
	span.Attributes().PutInt(semconv.AttrStep, 3)
	span.SetStartTimestamp(10)
	span.SetEndTimestamp(20)
	for _, c := range []struct {
		name string
		set  func(pcommon.Map)
		kind diagnosis.PhaseKind
		want int64
	}{
		{"int", func(m pcommon.Map) { m.PutInt(semconv.AttrInputSize, 4096) }, diagnosis.PhaseForward, 4096},
		{"string", func(m pcommon.Map) { m.PutStr(semconv.AttrInputSize, "4096") }, diagnosis.PhaseForward, 0},
		{"negative", func(m pcommon.Map) { m.PutInt(semconv.AttrInputSize, -1) }, diagnosis.PhaseForward, 0},
		{"missing", func(m pcommon.Map) { m.Remove(semconv.AttrInputSize) }, diagnosis.PhaseForward, 0},
		{"not a forward", func(m pcommon.Map) { m.PutInt(semconv.AttrInputSize, 4096) }, diagnosis.PhaseBackward, 0},
	} {
		c.set(span.Attributes())
		ph, ok := ParsePhase(span, &r, c.kind)
		if !ok || ph.Step != 3 || ph.InputSize != c.want {
			t.Errorf("%s: parsed %+v (ok %v), want input %d", c.name, ph, ok, c.want)
		}
	}
}
