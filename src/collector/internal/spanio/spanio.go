// Package spanio translates between pdata spans and the join engine: it reads collective and
// phase spans (with their resource) into join values, and writes the engine's figures back
// as span annotations. Both barrierskew components use it, so they read and write the same
// names (internal/semconv).
package spanio

import (
	"math"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// Kind classifies a span by name.
type Kind uint8

const (
	// KindOther passes through untouched.
	KindOther Kind = iota
	// KindCollective is a collective.<op> span.
	KindCollective
	// KindPhase is train.step, dataloader.fetch, forward, backward or optimizer.step.
	KindPhase
)

// Classify returns the span's kind and, for phases, which phase.
func Classify(name string) (Kind, diagnosis.PhaseKind) {
	switch name {
	case semconv.SpanStep:
		return KindPhase, diagnosis.PhaseStep
	case semconv.SpanDataloaderFetch:
		return KindPhase, diagnosis.PhaseFetch
	case semconv.SpanForward:
		return KindPhase, diagnosis.PhaseForward
	case semconv.SpanBackward:
		return KindPhase, diagnosis.PhaseBackward
	case semconv.SpanOptimizerStep:
		return KindPhase, diagnosis.PhaseOptimizer
	case semconv.SpanPacingDelay:
		return KindPhase, diagnosis.PhaseDelay
	}
	if len(name) > len(semconv.SpanCollectivePrefix) &&
		strings.HasPrefix(name, semconv.SpanCollectivePrefix) {
		return KindCollective, 0
	}
	return KindOther, 0
}

// Resource is what the join needs from a rank's resource. Reason is non-empty when a
// required attribute is missing or mistyped; every collective span under it is malformed.
type Resource struct {
	Job       string
	Rank      int
	WorldSize int
	join.Topology
	Reason string
	// maxLen bounds the strings read from its spans too (join.Config.MaxAttributeLength).
	maxLen int
}

// ParseResource reads a rank's resource. Integers may be strings because
// OTEL_RESOURCE_ATTRIBUTES can only carry strings. A string attribute the join keeps (and
// turns into metric labels) longer than maxLen makes the resource malformed
// ("oversized:<key>").
func ParseResource(res pcommon.Resource, maxLen int) Resource {
	attrs := res.Attributes()
	r := Resource{maxLen: maxLen}
	job, reason := stringAttr(attrs, semconv.AttrJobID, true, maxLen)
	if reason != "" {
		r.Reason = reason
	}
	r.Job = job
	rank, reason := resourceInt(attrs, semconv.AttrRank, true)
	if reason != "" && r.Reason == "" {
		r.Reason = reason
	}
	r.Rank = int(rank)
	world, reason := resourceInt(attrs, semconv.AttrWorldSize, false)
	if reason != "" && r.Reason == "" {
		r.Reason = reason
	}
	r.WorldSize = int(world)
	host, reason := stringAttr(attrs, semconv.AttrHostName, false, maxLen)
	if reason != "" && r.Reason == "" {
		r.Reason = reason
	}
	r.Host = host
	for _, t := range []struct {
		key string
		dst *string
	}{{semconv.AttrSwitch, &r.Switch}, {semconv.AttrNIC, &r.NIC}} {
		name, reason := topologyName(attrs, t.key, maxLen)
		if reason != "" && r.Reason == "" {
			r.Reason = reason
		}
		*t.dst = name
	}
	return r
}

func topologyName(attrs pcommon.Map, key string, maxLen int) (string, string) {
	v, ok := attrs.Get(key)
	if !ok || v.Type() != pcommon.ValueTypeStr || v.Str() == "" {
		return semconv.UnknownTopology, ""
	}
	if len(v.Str()) > maxLen {
		return "", "oversized:" + key
	}
	return v.Str(), ""
}

func stringAttr(attrs pcommon.Map, key string, required bool, maxLen int) (string, string) {
	v, ok := attrs.Get(key)
	if !ok {
		if required {
			return "", "missing:" + key
		}
		return "", ""
	}
	if v.Type() != pcommon.ValueTypeStr || (required && v.Str() == "") {
		return "", "mistyped:" + key
	}
	if len(v.Str()) > maxLen {
		return "", "oversized:" + key
	}
	return v.Str(), ""
}

// ResourceInt reads an integer resource attribute, which may be a string of digits
// (OTEL_RESOURCE_ATTRIBUTES carries only strings); ok is false when it is absent or neither.
func ResourceInt(attrs pcommon.Map, key string) (int64, bool) {
	n, reason := resourceInt(attrs, key, true)
	return n, reason == ""
}

func resourceInt(attrs pcommon.Map, key string, required bool) (int64, string) {
	v, ok := attrs.Get(key)
	if !ok {
		if required {
			return 0, "missing:" + key
		}
		return 0, ""
	}
	switch v.Type() {
	case pcommon.ValueTypeInt:
		return v.Int(), ""
	case pcommon.ValueTypeStr:
		n, err := strconv.ParseInt(v.Str(), 10, 64)
		if err != nil {
			return 0, "mistyped:" + key
		}
		return n, ""
	default:
		return 0, "mistyped:" + key
	}
}

func spanInt(attrs pcommon.Map, key string) (int64, string) {
	v, ok := attrs.Get(key)
	if !ok {
		return 0, "missing:" + key
	}
	if v.Type() != pcommon.ValueTypeInt {
		return 0, "mistyped:" + key
	}
	return v.Int(), ""
}

// ParseCollective fills a from a collective span and its parsed resource. It returns the
// malformed reason ("" when the span can be joined).
func ParseCollective[R any](span ptrace.Span, res *Resource, a *join.Arrival[R]) string {
	if res.Reason != "" {
		return res.Reason
	}
	attrs := span.Attributes()
	pg, reason := stringAttr(attrs, semconv.AttrCollectivePG, true, res.maxLen)
	if reason != "" {
		return reason
	}
	seq, reason := spanInt(attrs, semconv.AttrCollectiveSeq)
	if reason != "" {
		return reason
	}
	pgSize, reason := spanInt(attrs, semconv.AttrCollectivePGSize)
	if reason != "" {
		return reason
	}
	step, reason := spanInt(attrs, semconv.AttrStep)
	if reason != "" {
		return reason
	}
	if pgSize < 1 || pgSize > join.MaxRanks {
		return "pg_size_mismatch"
	}
	op, reason := stringAttr(attrs, semconv.AttrCollectiveOp, false, res.maxLen)
	if reason != "" {
		return reason
	}
	if op == "" {
		op = strings.TrimPrefix(span.Name(), semconv.SpanCollectivePrefix)
		if len(op) > res.maxLen {
			return "oversized:span.name"
		}
	}
	p2p, role := false, diagnosis.RoleCollective
	if op == semconv.OpSend || op == semconv.OpRecv {
		// A point-to-point message joins its sender and receiver: the key names the pair
		// and direction, the sequence number counts messages on it.
		peer, reason := spanInt(attrs, semconv.AttrCollectivePeer)
		if reason != "" {
			return reason
		}
		if peer < 0 || peer >= join.MaxRanks || peer == int64(res.Rank) ||
			(res.WorldSize > 0 && peer >= int64(res.WorldSize)) {
			return "rank_outside_group"
		}
		src, dst := int64(res.Rank), peer
		role = diagnosis.RoleSend
		if op == semconv.OpRecv {
			src, dst = peer, int64(res.Rank)
			role = diagnosis.RoleRecv
		}
		pg = pg + "/p2p/" + strconv.FormatInt(src, 10) + ">" + strconv.FormatInt(dst, 10)
		pgSize, p2p, op = 2, true, semconv.OpSendRecv
	}
	var bytes int64
	if v, ok := attrs.Get(semconv.AttrCollectiveBytes); ok && v.Type() == pcommon.ValueTypeInt {
		bytes = v.Int()
	}
	var async bool
	if v, ok := attrs.Get(semconv.AttrCollectiveAsync); ok && v.Type() == pcommon.ValueTypeBool {
		async = v.Bool()
	}
	*a = join.Arrival[R]{
		Key:           join.Key{Job: res.Job, PG: pg, Seq: seq},
		Op:            op,
		PGSize:        int(pgSize),
		Step:          step,
		Rank:          res.Rank,
		WorldSize:     res.WorldSize,
		Topology:      res.Topology,
		StartUnixNano: int64(span.StartTimestamp()),
		EndUnixNano:   int64(span.EndTimestamp()),
		Bytes:         bytes,
		Async:         async,
		P2P:           p2p,
		Role:          role,
		Ref:           a.Ref,
	}
	return ""
}

// ParsePhase reads a phase span; ok is false when it cannot be attributed to a (job, step,
// rank) or its duration is negative (such spans only pass through).
func ParsePhase(span ptrace.Span, res *Resource, kind diagnosis.PhaseKind) (join.Phase, bool) {
	if res.Reason != "" {
		return join.Phase{}, false
	}
	step, reason := spanInt(span.Attributes(), semconv.AttrStep)
	if reason != "" {
		return join.Phase{}, false
	}
	start, end := span.StartTimestamp(), span.EndTimestamp()
	if end < start {
		return join.Phase{}, false
	}
	var input int64
	if kind == diagnosis.PhaseForward {
		// Optional: a size that is missing, not an int or not positive is left out (the
		// span's timing stands without it).
		if v, reason := spanInt(span.Attributes(), semconv.AttrInputSize); reason == "" && v > 0 {
			input = v
		}
	}
	return join.Phase{
		Job:           res.Job,
		Step:          step,
		Rank:          res.Rank,
		Kind:          kind,
		StartUnixNano: int64(start),
		EndUnixNano:   int64(end),
		InputSize:     input,
		WorldSize:     res.WorldSize,
	}, true
}

// IsAnnotated reports whether the barrierskew processor already joined this span.
func IsAnnotated(span ptrace.Span) bool {
	attrs := span.Attributes()
	if _, ok := attrs.Get(semconv.AttrBarrierSkew); ok {
		return true
	}
	_, ok := attrs.Get(semconv.AttrBarrierMissingRanks)
	return ok
}

// CollectiveNote is what a released collective writes on every member's span; one is shared
// by the members' Notes.
type CollectiveNote struct {
	Skew, Transfer, Slowdown float64
	MissingRanks             int
	// Missing (the ranks, comma-separated) and Released are set when MissingRanks > 0.
	Missing, Released string
}

// NewCollectiveNote takes the collective-wide figures of released collective r.
func NewCollectiveNote[R any](r *join.Released[R]) *CollectiveNote {
	c := &CollectiveNote{Skew: r.Skew, Transfer: r.Transfer, Slowdown: r.Slowdown,
		MissingRanks: r.MissingRanks}
	if r.MissingRanks > 0 {
		c.Missing = FormatRanks(r.Missing)
		c.Released = r.Reason.String()
	}
	return c
}

// Note is the engine's figures for one member of a released collective, kept until its span
// is written (the barrierskew processor holds spans encoded and annotates them when their
// batch is decoded).
type Note struct {
	*CollectiveNote
	Lateness, Wait, ClockOffset float64
	Verdict                     join.Verdict
	Cause, Domain               string
}

// NewNote takes member m's figures; c is its collective's note.
func NewNote[R any](c *CollectiveNote, m *join.Member[R]) Note {
	return Note{CollectiveNote: c, Lateness: m.Lateness, Wait: m.Wait, ClockOffset: m.ClockOffset,
		Verdict: m.Verdict, Cause: m.Cause, Domain: m.Domain}
}

// Annotate writes the engine's figures for member m of released collective r onto span.
func Annotate[R any](span ptrace.Span, r *join.Released[R], m *join.Member[R]) {
	n := NewNote(NewCollectiveNote(r), m)
	n.Write(span)
}

// Write puts the note's annotations on span.
func (n *Note) Write(span ptrace.Span) {
	attrs := span.Attributes()
	// Exactly the room the annotations take: the slice grows once, to its final size (a
	// released step is annotated at once, so spare capacity is held step-wide).
	size := 5
	if n.Slowdown > 0 {
		size++
	}
	switch n.Verdict {
	case join.VerdictStraggler:
		size += 3
	case join.VerdictClear:
		size++
	}
	if n.MissingRanks > 0 {
		size += 3
	}
	attrs.EnsureCapacity(attrs.Len() + size)
	attrs.PutDouble(semconv.AttrBarrierSkew, n.Skew)
	attrs.PutDouble(semconv.AttrBarrierLateness, n.Lateness)
	attrs.PutDouble(semconv.AttrBarrierWait, n.Wait)
	attrs.PutDouble(semconv.AttrBarrierTransfer, n.Transfer)
	attrs.PutDouble(semconv.AttrClockOffset, n.ClockOffset)
	if n.Slowdown > 0 {
		attrs.PutDouble(semconv.AttrCollectiveSlowdown, n.Slowdown)
	}
	switch n.Verdict {
	case join.VerdictStraggler:
		attrs.PutBool(semconv.AttrStraggler, true)
		attrs.PutStr(semconv.AttrStragglerCause, n.Cause)
		if n.Domain != "" {
			attrs.PutStr(semconv.AttrStragglerDomain, n.Domain)
		}
	case join.VerdictClear:
		attrs.PutBool(semconv.AttrStraggler, false)
	}
	if n.MissingRanks > 0 {
		attrs.PutInt(semconv.AttrBarrierMissingRanks, int64(n.MissingRanks))
		attrs.PutStr(semconv.AttrBarrierMissing, n.Missing)
		attrs.PutStr(semconv.AttrBarrierReleased, n.Released)
	}
}

// isAnnotationKey reports whether k is an attribute only the barrierskew processor writes.
// A switch, not a map: it runs for every attribute of every collective span, and comparing
// lengths and bytes is cheaper than hashing each key.
func isAnnotationKey(k string) bool {
	switch k {
	case semconv.AttrBarrierSkew, semconv.AttrBarrierLateness,
		semconv.AttrBarrierWait, semconv.AttrBarrierTransfer,
		semconv.AttrClockOffset, semconv.AttrCollectiveSlowdown,
		semconv.AttrStraggler, semconv.AttrStragglerCause,
		semconv.AttrStragglerDomain, semconv.AttrBarrierMissingRanks,
		semconv.AttrBarrierMissing, semconv.AttrBarrierReleased,
		semconv.AttrBarrierUnjoined:
		return true
	}
	return false
}

// StripAnnotations removes from a span every attribute the processor writes (a span that
// arrives with them claims figures nobody measured).
func StripAnnotations(span ptrace.Span) {
	span.Attributes().RemoveIf(func(k string, _ pcommon.Value) bool { return isAnnotationKey(k) })
}

// MarkUnjoined records on a collective span the processor forwards without a join (malformed
// or rejected) why, so that a connector behind it does not join it a second time.
func MarkUnjoined(span ptrace.Span, reason string) {
	span.Attributes().PutStr(semconv.AttrBarrierUnjoined, reason)
}

// Unjoined reports whether the processor forwarded this span without a join.
func Unjoined(span ptrace.Span) bool {
	_, ok := span.Attributes().Get(semconv.AttrBarrierUnjoined)
	return ok
}

// FormatRanks joins ranks with commas.
func FormatRanks(ranks []int) string {
	var b strings.Builder
	for i, rank := range ranks {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(rank))
	}
	return b.String()
}

// Annotations are the processor's annotations read back from a span.
type Annotations struct {
	Skew         float64
	Transfer     float64
	Lateness     float64
	Wait         float64
	ClockOffset  float64
	Verdict      join.Verdict
	Cause        string
	MissingRanks int
	// Missing are the ranks named in training.barrier.missing (unparsable entries skipped).
	Missing []int
	// Released is why an incomplete collective was released ("" when complete, or from a
	// processor that did not say).
	Released string
}

// ReadAnnotations reads what Annotate wrote. Missing or mistyped figures read as 0.
func ReadAnnotations(span ptrace.Span) Annotations {
	attrs := span.Attributes()
	num := func(key string) float64 {
		if v, ok := attrs.Get(key); ok && v.Type() == pcommon.ValueTypeDouble {
			return v.Double()
		}
		return 0
	}
	a := Annotations{
		Skew:        num(semconv.AttrBarrierSkew),
		Transfer:    num(semconv.AttrBarrierTransfer),
		Lateness:    num(semconv.AttrBarrierLateness),
		Wait:        num(semconv.AttrBarrierWait),
		ClockOffset: num(semconv.AttrClockOffset),
		Verdict:     join.VerdictUnchanged,
	}
	if v, ok := attrs.Get(semconv.AttrStraggler); ok && v.Type() == pcommon.ValueTypeBool {
		a.Verdict = join.VerdictClear
		if v.Bool() {
			a.Verdict = join.VerdictStraggler
			a.Cause = semconv.CauseUnknown
			if c, ok := attrs.Get(semconv.AttrStragglerCause); ok && c.Type() == pcommon.ValueTypeStr {
				a.Cause = c.Str()
			}
		}
	}
	if v, ok := attrs.Get(semconv.AttrBarrierMissingRanks); ok && v.Type() == pcommon.ValueTypeInt {
		a.MissingRanks = int(v.Int())
	}
	if v, ok := attrs.Get(semconv.AttrBarrierMissing); ok && v.Type() == pcommon.ValueTypeStr {
		a.Missing = ParseRanks(v.Str())
	}
	if v, ok := attrs.Get(semconv.AttrBarrierReleased); ok && v.Type() == pcommon.ValueTypeStr {
		a.Released = v.Str()
	}
	return a
}

// ParseRanks reads FormatRanks' output, skipping entries that are not ranks, at most
// join.MaxMissingNamed of them.
func ParseRanks(text string) []int {
	var ranks []int
	for field := range strings.SplitSeq(text, ",") {
		if len(ranks) >= join.MaxMissingNamed {
			break
		}
		rank, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || rank < 0 || rank >= join.MaxRanks {
			continue
		}
		ranks = append(ranks, rank)
	}
	return ranks
}

// IsLayers reports whether a span is a rank's layer profile (pipeline.layers).
func IsLayers(span ptrace.Span) bool { return span.Name() == semconv.SpanPipelineLayers }

// ParseLayers reads a pipeline.layers span: the step, the layer names (each at most the
// resource's maxLen long), each layer's forward and backward seconds (one per name, finite,
// >= 0; ints are read as seconds too) and the micro-batches. ok is false when any of it is
// missing or malformed (the span only passes through then).
func ParseLayers(span ptrace.Span, res *Resource) (diagnosis.LayerProfile, bool) {
	var p diagnosis.LayerProfile
	if res.Reason != "" {
		return p, false
	}
	attrs := span.Attributes()
	step, reason := spanInt(attrs, semconv.AttrStep)
	if reason != "" {
		return p, false
	}
	p.Step = step
	names, ok := attrs.Get(semconv.AttrPipelineLayers)
	if !ok || names.Type() != pcommon.ValueTypeSlice || names.Slice().Len() == 0 ||
		names.Slice().Len() > diagnosis.MaxProfileLayers {
		return p, false
	}
	n := names.Slice().Len()
	p.Names = make([]string, 0, n)
	for i := range n {
		v := names.Slice().At(i)
		if v.Type() != pcommon.ValueTypeStr || len(v.Str()) > res.maxLen {
			return p, false
		}
		p.Names = append(p.Names, v.Str())
	}
	times := func(key string) []float64 {
		v, ok := attrs.Get(key)
		if !ok || v.Type() != pcommon.ValueTypeSlice || v.Slice().Len() != n {
			return nil
		}
		out := make([]float64, 0, n)
		for i := range n {
			x := v.Slice().At(i)
			var f float64
			switch x.Type() {
			case pcommon.ValueTypeDouble:
				f = x.Double()
			case pcommon.ValueTypeInt:
				f = float64(x.Int())
			default:
				return nil
			}
			if !(f >= 0) || math.IsInf(f, 1) {
				return nil
			}
			out = append(out, f)
		}
		return out
	}
	p.Forward, p.Backward = times(semconv.AttrPipelineLayerForward), times(semconv.AttrPipelineLayerBackward)
	if p.Forward == nil || p.Backward == nil {
		return p, false
	}
	if mb, reason := spanInt(attrs, semconv.AttrPipelineMicrobatches); reason == "" && mb > 0 {
		p.Microbatches = int(min(mb, 1<<30))
	}
	return p, true
}
