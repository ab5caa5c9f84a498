package spanio

import (
	"crypto/sha256"
	"math"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// SummaryServiceName is the service.name of the step summaries the Collector writes.
const SummaryServiceName = "skewtrace-collector"

// StepTraceID is the trace ID every rank derives for (job, step): the first 16 bytes of
// sha256("skewtrace/trace/<job>/<step>") (src/skewtrace/_ids.py).
func StepTraceID(job string, step int64) pcommon.TraceID {
	return traceIDOf(stepKey("trace", job, step))
}

// StepRootSpanID is the span ID of the step root span: the first 8 bytes of
// sha256("skewtrace/root/<job>/<step>"), 1 when that is all zeros.
func StepRootSpanID(job string, step int64) pcommon.SpanID {
	return spanIDOf(stepKey("root", job, step))
}

// stepKey is the string a (job, step) ID is derived from: "skewtrace/<kind>/<job>/<step>".
func stepKey(kind, job string, step int64) string {
	return "skewtrace/" + kind + "/" + job + "/" + strconv.FormatInt(step, 10)
}

// traceIDOf is the first 16 bytes of sha256(key).
func traceIDOf(key string) pcommon.TraceID {
	sum := sha256.Sum256([]byte(key))
	var id pcommon.TraceID
	copy(id[:], sum[:16])
	return id
}

// spanIDOf is the first 8 bytes of sha256(key), 1 when that is all zeros.
func spanIDOf(key string) pcommon.SpanID {
	sum := sha256.Sum256([]byte(key))
	var id pcommon.SpanID
	copy(id[:], sum[:8])
	if id.IsEmpty() {
		id[7] = 1
	}
	return id
}

// AppendSummary writes a step's analysis as a train.step.summary span in the step's trace
// (a child of the step root span), under a resource of its own carrying the job id.
// Events carry the step's root causes and the flags after it.
func AppendSummary(td ptrace.Traces, res *diagnosis.StepResult) {
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr(semconv.AttrServiceName, SummaryServiceName)
	rs.Resource().Attributes().PutStr(semconv.AttrJobID, res.Job)
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("github.com/skewtrace/skewtrace/src/collector/internal/diagnosis")
	span := ss.Spans().AppendEmpty()
	span.SetName(semconv.SpanStepSummary)
	span.SetTraceID(StepTraceID(res.Job, res.Step))
	span.SetParentSpanID(StepRootSpanID(res.Job, res.Step))
	span.SetSpanID(StepSummarySpanID(res.Job, res.Step))
	span.SetKind(ptrace.SpanKindInternal)
	end := pcommon.Timestamp(max(0, res.EndUnixNano))
	span.SetEndTimestamp(end)
	span.SetStartTimestamp(end - pcommon.Timestamp(min(float64(end), res.Duration*1e9)))
	attrs := span.Attributes()
	attrs.PutInt(semconv.AttrStep, res.Step)
	attrs.PutDouble(semconv.AttrStepDuration, res.Duration)
	attrs.PutDouble(semconv.AttrStepWhatIf, res.WhatIf)
	attrs.PutDouble(semconv.AttrJobSlowdown, res.Slowdown)
	if res.ReplayChecked {
		attrs.PutDouble(semconv.AttrReplayError, res.ReplayError)
	}
	if res.Deferred {
		attrs.PutBool(semconv.AttrVerdictDeferred, true)
	}
	attrs.PutInt(semconv.AttrStepRanks, int64(res.Ranks))
	if res.World > 0 {
		attrs.PutInt(semconv.AttrWorldSize, int64(res.World))
	}
	if res.Absent > 0 {
		attrs.PutInt(semconv.AttrStepAbsent, int64(res.Absent))
		attrs.PutStr(semconv.AttrStepAbsentRanks, FormatRanks(res.AbsentRanks))
	}
	attrs.PutInt(semconv.AttrStepSlowCollectives, int64(res.SlowCollectives))
	if res.MinSaving > 0 {
		attrs.PutDouble(semconv.AttrStepMinSaving, res.MinSaving)
	}
	for i := range res.RootCauses {
		rc := &res.RootCauses[i]
		ev := span.Events().AppendEmpty()
		ev.SetName(semconv.EventRootCause)
		ev.SetTimestamp(end)
		a := ev.Attributes()
		a.PutStr(semconv.AttrStragglerCause, rc.Cause)
		if rc.Rank >= 0 {
			putRank(a, rc.Rank, rc.Topology)
			a.PutDouble(semconv.AttrRankCost, rc.Cost)
			if rc.Before != "" {
				a.PutStr(semconv.AttrStragglerBefore, rc.Before)
			}
		} else {
			a.PutDouble(semconv.AttrFabricCost, rc.Cost)
		}
		if rc.Suspect != nil {
			putSuspect(a, *rc.Suspect)
		}
		if isImbalance(rc.Cause) {
			putImbalance(a, rc.Cause, rc.Stage, rc.Ranks, rc.Excess, rc.Cost, rc.Fix)
			putPartition(a, rc.Partition)
		}
	}
	for i := range res.Attribution {
		sv := &res.Attribution[i]
		ev := span.Events().AppendEmpty()
		ev.SetName(semconv.EventAttribution)
		ev.SetTimestamp(end)
		ev.Attributes().PutStr(semconv.AttrAttributionKind, sv.Kind)
		ev.Attributes().PutDouble(semconv.AttrAttributionSaves, sv.Saves)
	}
	for i := range res.Groups {
		gp := &res.Groups[i]
		ev := span.Events().AppendEmpty()
		ev.SetName(semconv.EventGroupPhase)
		ev.SetTimestamp(end)
		a := ev.Attributes()
		a.PutStr(semconv.AttrCollectivePG, gp.PG)
		a.PutStr(semconv.AttrCollectiveOp, gp.Op)
		a.PutStr(semconv.AttrGroupHosts, gp.Hosts)
		a.PutDouble(semconv.AttrGroupPhaseStart, gp.Start)
		a.PutDouble(semconv.AttrGroupPhaseDuration, gp.Duration)
		a.PutStr(semconv.AttrGroupSwitches, gp.Switches)
	}
	for i := range res.Imbalances {
		im := &res.Imbalances[i]
		ev := span.Events().AppendEmpty()
		ev.SetName(semconv.EventImbalance)
		ev.SetTimestamp(end)
		a := ev.Attributes()
		a.PutStr(semconv.AttrStragglerCause, im.Cause)
		putImbalance(a, im.Cause, im.Stage, im.Ranks, im.Excess, im.Cost, im.Fix)
		putPartition(a, im.Partition)
	}
	for i := range res.Flagged {
		f := &res.Flagged[i]
		ev := span.Events().AppendEmpty()
		ev.SetName(semconv.EventStraggler)
		ev.SetTimestamp(end)
		a := ev.Attributes()
		putRank(a, f.Rank, f.Topology)
		a.PutStr(semconv.AttrStragglerCause, f.Cause)
		a.PutDouble(semconv.AttrRankCost, f.Cost)
		if f.Before != "" {
			a.PutStr(semconv.AttrStragglerBefore, f.Before)
		}
		if f.Domain != "" {
			a.PutStr(semconv.AttrStragglerDomain, f.Domain)
		}
	}
	for i := range res.Suspects {
		s := &res.Suspects[i]
		ev := span.Events().AppendEmpty()
		ev.SetName(semconv.EventSuspect)
		ev.SetTimestamp(end)
		a := ev.Attributes()
		putSuspect(a, s.Suspect)
		a.PutDouble(semconv.AttrFabricCost, s.Cost)
		a.PutBool(semconv.AttrSuspectDerived, s.Derived)
	}
}

func isImbalance(cause string) bool {
	return cause == semconv.CauseStageImbalance || cause == semconv.CauseDataImbalance
}

func putImbalance(a pcommon.Map, cause string, stage int, ranks []int, excess, cost float64,
	fix string,
) {
	if cause == semconv.CauseStageImbalance {
		a.PutInt(semconv.AttrPipelineStage, int64(stage))
	}
	if len(ranks) > 0 {
		a.PutStr(semconv.AttrImbalanceRanks, FormatRanks(ranks))
	}
	a.PutDouble(semconv.AttrImbalanceExcess, excess)
	a.PutDouble(semconv.AttrImbalanceCost, cost)
	a.PutStr(semconv.AttrImbalanceFix, fix)
}

// putPartition writes an advised partition (training.imbalance.partition*); nothing for nil.
func putPartition(a pcommon.Map, p *diagnosis.Partition) {
	if p == nil {
		return
	}
	ints := func(key string, v []int) {
		s := a.PutEmptySlice(key)
		s.EnsureCapacity(len(v))
		for _, x := range v {
			s.AppendEmpty().SetInt(int64(x))
		}
	}
	doubles := func(key string, v []float64) {
		s := a.PutEmptySlice(key)
		s.EnsureCapacity(len(v))
		for _, x := range v {
			s.AppendEmpty().SetDouble(x)
		}
	}
	ints(semconv.AttrImbalancePartition, p.Layers)
	ints(semconv.AttrImbalancePartitionCurrent, p.Current)
	doubles(semconv.AttrImbalancePartitionBefore, p.Before)
	doubles(semconv.AttrImbalancePartitionAfter, p.After)
	a.PutDouble(semconv.AttrImbalancePartitionSaving, p.Saving)
}

// readPartition reads putPartition's attributes: nil unless the advised and current layer
// counts are positive, of one length (at most diagnosis.MaxProfileLayers stages), and each
// stage has its time before and after.
func readPartition(a pcommon.Map) *diagnosis.Partition {
	ints := func(key string) []int {
		v, ok := a.Get(key)
		if !ok || v.Type() != pcommon.ValueTypeSlice || v.Slice().Len() > diagnosis.MaxProfileLayers {
			return nil
		}
		out := make([]int, 0, v.Slice().Len())
		for i := range v.Slice().Len() {
			x := v.Slice().At(i)
			if x.Type() != pcommon.ValueTypeInt || x.Int() < 1 || x.Int() > diagnosis.MaxProfileLayers {
				return nil
			}
			out = append(out, int(x.Int()))
		}
		return out
	}
	doubles := func(key string) []float64 {
		v, ok := a.Get(key)
		if !ok || v.Type() != pcommon.ValueTypeSlice || v.Slice().Len() > diagnosis.MaxProfileLayers {
			return nil
		}
		out := make([]float64, 0, v.Slice().Len())
		for i := range v.Slice().Len() {
			x := v.Slice().At(i)
			if x.Type() != pcommon.ValueTypeDouble {
				return nil
			}
			out = append(out, x.Double())
		}
		return out
	}
	p := &diagnosis.Partition{Layers: ints(semconv.AttrImbalancePartition),
		Current: ints(semconv.AttrImbalancePartitionCurrent),
		Before:  doubles(semconv.AttrImbalancePartitionBefore),
		After:   doubles(semconv.AttrImbalancePartitionAfter),
		Saving:  seconds(a, semconv.AttrImbalancePartitionSaving)}
	n := len(p.Layers)
	if n == 0 || len(p.Current) != n || len(p.Before) != n || len(p.After) != n {
		return nil
	}
	return p
}

// parseRanks reads FormatRanks' text; a value that is not a rank ends it (unlike
// ParseRanks, it keeps every rank of a stage, not join.MaxMissingNamed of them).
func parseRanks(text string) []int {
	if text == "" {
		return nil
	}
	var out []int
	for _, f := range strings.Split(text, ",") {
		r, err := strconv.Atoi(f)
		if err != nil || r < 0 || r >= diagnosisMaxRank {
			return out
		}
		out = append(out, r)
	}
	return out
}

// readImbalance reads putImbalance's attributes.
func readImbalance(a pcommon.Map) (stage int, ranks []int, excess, cost float64, fix string) {
	stage = -1
	if v, ok := a.Get(semconv.AttrPipelineStage); ok && v.Type() == pcommon.ValueTypeInt &&
		v.Int() >= 0 && v.Int() < diagnosisMaxRank {
		stage = int(v.Int())
	}
	return stage, parseRanks(str(a, semconv.AttrImbalanceRanks)),
		double(a, semconv.AttrImbalanceExcess), double(a, semconv.AttrImbalanceCost),
		str(a, semconv.AttrImbalanceFix)
}

func putRank(a pcommon.Map, rank int, t diagnosis.Topology) {
	a.PutInt(semconv.AttrRank, int64(rank))
	a.PutStr(semconv.AttrHostName, t.Host)
	a.PutStr(semconv.AttrSwitch, t.Switch)
	a.PutStr(semconv.AttrNIC, t.NIC)
}

func putSuspect(a pcommon.Map, s diagnosis.Suspect) {
	a.PutStr(semconv.AttrSuspectKind, s.Kind.String())
	a.PutStr(semconv.AttrSuspectName, s.Name)
	if s.Kind == diagnosis.SuspectNIC {
		a.PutStr(semconv.AttrHostName, s.Host)
	}
	a.PutStr(semconv.AttrStragglerDomain, s.ID())
}

// IsSummary reports whether a span is a step summary.
func IsSummary(span ptrace.Span) bool { return span.Name() == semconv.SpanStepSummary }

// ReadSummary reads what AppendSummary wrote (the job from the resource). Missing or
// mistyped fields read as zero values; ok is false when the span cannot be a summary. A
// string longer than maxLen, a cause that is not one of the four, or a rank out of range
// makes its event (or, for the job id, the summary) unreadable: the values become metric
// labels.
func ReadSummary(span ptrace.Span, res pcommon.Resource, maxLen int) (diagnosis.StepResult, bool) {
	var out diagnosis.StepResult
	job, ok := res.Attributes().Get(semconv.AttrJobID)
	if !ok || job.Type() != pcommon.ValueTypeStr || job.Str() == "" || len(job.Str()) > maxLen {
		return out, false
	}
	out.Job = job.Str()
	attrs := span.Attributes()
	step, ok := attrs.Get(semconv.AttrStep)
	if !ok || step.Type() != pcommon.ValueTypeInt {
		return out, false
	}
	out.Step = step.Int()
	out.Duration = double(attrs, semconv.AttrStepDuration)
	out.WhatIf = double(attrs, semconv.AttrStepWhatIf)
	out.Slowdown = double(attrs, semconv.AttrJobSlowdown)
	if v, ok := attrs.Get(semconv.AttrReplayError); ok && v.Type() == pcommon.ValueTypeDouble {
		out.ReplayError, out.ReplayChecked = v.Double(), true
	}
	out.Ranks = int(max(0, min(diagnosisMaxRank, integer(attrs, semconv.AttrStepRanks))))
	out.World = int(max(0, min(diagnosisMaxRank, integer(attrs, semconv.AttrWorldSize))))
	out.Absent = int(max(0, min(diagnosisMaxRank, integer(attrs, semconv.AttrStepAbsent))))
	out.AbsentRanks = parseRanks(str(attrs, semconv.AttrStepAbsentRanks))
	out.SlowCollectives = int(max(0, min(1<<31-1, integer(attrs, semconv.AttrStepSlowCollectives))))
	out.MinSaving = seconds(attrs, semconv.AttrStepMinSaving)
	if v, ok := attrs.Get(semconv.AttrVerdictDeferred); ok && v.Type() == pcommon.ValueTypeBool {
		out.Deferred = v.Bool()
	}
	out.EndUnixNano = int64(span.EndTimestamp())
	events := span.Events()
	for i := range events.Len() {
		ev := events.At(i)
		a := ev.Attributes()
		if !boundedEvent(a, maxLen) {
			continue
		}
		switch ev.Name() {
		case semconv.EventRootCause:
			rc := diagnosis.RootCause{Rank: -1, Cause: str(a, semconv.AttrStragglerCause),
				Stage: -1}
			if rank, ok := rankOf(a); ok {
				rc.Rank = rank
				rc.Topology = topologyOf(a)
				rc.Cost = double(a, semconv.AttrRankCost)
				rc.Before = str(a, semconv.AttrStragglerBefore)
			} else {
				rc.Cost = double(a, semconv.AttrFabricCost)
			}
			if s, ok := suspectOf(a); ok {
				rc.Suspect = &s
			}
			if isImbalance(rc.Cause) {
				rc.Stage, rc.Ranks, rc.Excess, rc.Cost, rc.Fix = readImbalance(a)
				rc.Partition = readPartition(a)
			}
			out.RootCauses = append(out.RootCauses, rc)
		case semconv.EventStraggler:
			rank, ok := rankOf(a)
			if !ok {
				continue
			}
			out.Flagged = append(out.Flagged, diagnosis.RankFlag{
				Rank: rank, Topology: topologyOf(a), Cause: str(a, semconv.AttrStragglerCause),
				Cost: double(a, semconv.AttrRankCost), Domain: str(a, semconv.AttrStragglerDomain),
				Before: str(a, semconv.AttrStragglerBefore),
			})
		case semconv.EventAttribution:
			kind := str(a, semconv.AttrAttributionKind)
			if kind == "" {
				continue
			}
			out.Attribution = append(out.Attribution, diagnosis.Saving{Kind: kind,
				Saves: double(a, semconv.AttrAttributionSaves)})
		case semconv.EventGroupPhase:
			pg := str(a, semconv.AttrCollectivePG)
			if pg == "" || len(out.Groups) >= diagnosis.MaxGroupPhases {
				continue
			}
			out.Groups = append(out.Groups, diagnosis.GroupPhase{PG: pg,
				Op: str(a, semconv.AttrCollectiveOp), Hosts: str(a, semconv.AttrGroupHosts),
				Start:    seconds(a, semconv.AttrGroupPhaseStart),
				Duration: seconds(a, semconv.AttrGroupPhaseDuration),
				Switches: str(a, semconv.AttrGroupSwitches)})
		case semconv.EventImbalance:
			cause := str(a, semconv.AttrStragglerCause)
			if !isImbalance(cause) {
				continue
			}
			im := diagnosis.ImbalanceFlag{Cause: cause}
			im.Stage, im.Ranks, im.Excess, im.Cost, im.Fix = readImbalance(a)
			im.Partition = readPartition(a)
			out.Imbalances = append(out.Imbalances, im)
		case semconv.EventSuspect:
			s, ok := suspectOf(a)
			if !ok {
				continue
			}
			derived := false
			if v, ok := a.Get(semconv.AttrSuspectDerived); ok && v.Type() == pcommon.ValueTypeBool {
				derived = v.Bool()
			}
			out.Suspects = append(out.Suspects, diagnosis.SuspectFlag{Suspect: s,
				Cost: double(a, semconv.AttrFabricCost), Derived: derived})
		}
	}
	return out, true
}

// boundedEvent reports whether every string of an event is at most maxLen long and its cause,
// if any, is a known one.
func boundedEvent(a pcommon.Map, maxLen int) bool {
	ok := true
	a.Range(func(_ string, v pcommon.Value) bool {
		if v.Type() == pcommon.ValueTypeStr && len(v.Str()) > maxLen {
			ok = false
		}
		return ok
	})
	if !ok {
		return false
	}
	switch str(a, semconv.AttrStragglerCause) {
	case "", semconv.CauseData, semconv.CauseCompute, semconv.CauseHostWork, semconv.CauseNetwork,
		semconv.CauseUnknown,
		semconv.CauseStageImbalance, semconv.CauseDataImbalance:
		return true
	default:
		return false
	}
}

func double(a pcommon.Map, key string) float64 {
	if v, ok := a.Get(key); ok && v.Type() == pcommon.ValueTypeDouble {
		return v.Double()
	}
	return 0
}

// seconds reads a duration: 0 when it is missing, mistyped, negative, NaN or infinite (a
// forged summary must not poison a moving average).
func seconds(a pcommon.Map, key string) float64 {
	if v := double(a, key); v > 0 && !math.IsInf(v, 1) {
		return v
	}
	return 0
}

func integer(a pcommon.Map, key string) int64 {
	if v, ok := a.Get(key); ok && v.Type() == pcommon.ValueTypeInt {
		return v.Int()
	}
	return 0
}

func str(a pcommon.Map, key string) string {
	if v, ok := a.Get(key); ok && v.Type() == pcommon.ValueTypeStr {
		return v.Str()
	}
	return ""
}

func rankOf(a pcommon.Map) (int, bool) {
	v, ok := a.Get(semconv.AttrRank)
	if !ok || v.Type() != pcommon.ValueTypeInt || v.Int() < 0 || v.Int() >= diagnosisMaxRank {
		return 0, false
	}
	return int(v.Int()), true
}

// diagnosisMaxRank bounds ranks read back from summaries (as join.MaxRanks does spans).
const diagnosisMaxRank = 1 << 20

func topologyOf(a pcommon.Map) diagnosis.Topology {
	return diagnosis.Topology{Host: str(a, semconv.AttrHostName), Switch: str(a, semconv.AttrSwitch),
		NIC: str(a, semconv.AttrNIC)}
}

func suspectOf(a pcommon.Map) (diagnosis.Suspect, bool) {
	name := str(a, semconv.AttrSuspectName)
	if name == "" {
		return diagnosis.Suspect{}, false
	}
	s := diagnosis.Suspect{Name: name}
	switch str(a, semconv.AttrSuspectKind) {
	case "nic":
		s.Kind = diagnosis.SuspectNIC
		s.Host = str(a, semconv.AttrHostName)
	case "host":
		s.Kind = diagnosis.SuspectHost
	case "uplink":
		s.Kind = diagnosis.SuspectUplink
	case "switch":
		s.Kind = diagnosis.SuspectSwitch
	default:
		return diagnosis.Suspect{}, false
	}
	return s, true
}

// StepSummarySpanID is the span ID of a step's train.step.summary span: the first 8 bytes of
// sha256("skewtrace/summary/<job>/<step>").
func StepSummarySpanID(job string, step int64) pcommon.SpanID {
	return spanIDOf(stepKey("summary", job, step))
}

// RankStepSpanID is the span ID of one rank's train.step span of a step: the first 8 bytes
// of sha256("skewtrace/rankstep/<job>/<step>/<rank>") (src/skewtrace/_ids.py), so that a step
// summary can link to any rank's step without having seen it.
func RankStepSpanID(job string, step int64, rank int) pcommon.SpanID {
	return spanIDOf(stepKey("rankstep", job, step) + "/" + strconv.Itoa(rank))
}

// RankStepTraceID is the trace that holds one rank's spans of a step when the traceshape
// processor stores a job one trace per (step, rank): the first 16 bytes of
// sha256("skewtrace/ranktrace/<job>/<step>/<rank>").
func RankStepTraceID(job string, step int64, rank int) pcommon.TraceID {
	return traceIDOf(stepKey("ranktrace", job, step) + "/" + strconv.Itoa(rank))
}
