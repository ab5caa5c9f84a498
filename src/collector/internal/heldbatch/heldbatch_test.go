package heldbatch

import (
	"fmt"
	"slices"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
)

// incoming returns an incoming batch of one resource (with one scope) per entry of spans,
// holding that many spans. Span k of the batch (counting across resources) is named
// "span<k>" and has attribute "k"; resource i has host.name "node<i>" and a schema URL, its
// scope a name and version.
func incoming(spans ...int) ptrace.Traces {
	td := ptrace.NewTraces()
	k := 0
	for i, n := range spans {
		rs := td.ResourceSpans().AppendEmpty()
		rs.SetSchemaUrl(fmt.Sprintf("https://schema/%d", i))
		rs.Resource().Attributes().PutStr(semconv.AttrHostName, fmt.Sprintf("node%d", i))
		ss := rs.ScopeSpans().AppendEmpty()
		ss.SetSchemaUrl("https://scope-schema")
		ss.Scope().SetName(fmt.Sprintf("scope%d", i))
		ss.Scope().SetVersion("1.2.3")
		for range n {
			s := ss.Spans().AppendEmpty()
			s.SetName(fmt.Sprintf("span%d", k))
			s.SetSpanID(pcommon.SpanID{byte(k + 1)})
			s.SetTraceID(pcommon.TraceID{byte(i + 1)})
			s.SetStartTimestamp(pcommon.Timestamp(1000 + k))
			s.SetEndTimestamp(pcommon.Timestamp(2000 + k))
			s.Status().SetMessage("kept")
			s.Events().AppendEmpty().SetName("an event")
			s.Links().AppendEmpty().SetSpanID(pcommon.SpanID{9})
			s.Attributes().PutInt("k", int64(k))
			k++
		}
	}
	return td
}

// take moves every span of td into s's held batch for (job, step), as the processor takes
// collective spans, and returns their Members in the order taken.
func take(s *Store, td ptrace.Traces, job string, step int64) []Member {
	var out []Member
	rss := td.ResourceSpans()
	for i := range rss.Len() {
		rs := rss.At(i)
		sss := rs.ScopeSpans()
		for j := range sss.Len() {
			ss := sss.At(j)
			ss.Spans().RemoveIf(func(span ptrace.Span) bool {
				m := s.Next(job, step)
				m.Take(rs, ss, [2]int{i, j}, span)
				out = append(out, m)
				return true
			})
		}
	}
	return out
}

// skewOf is the skew the test's release of span k writes.
func skewOf(k int) float64 { return float64(k) + 0.5 }

// release releases one collective per span index in ks (each span its collective's only
// member), with skewOf(k) as its skew.
func release(s *Store, members []Member, ks ...int) {
	for _, k := range ks {
		r := &join.Released[Member]{Skew: skewOf(k),
			Members: []join.Member[Member]{{Lateness: float64(k), Ref: members[k]}}}
		s.Release(r)
	}
}

// spansOf returns the "k" attribute of every span of the batches' decoded traces, in order,
// failing the test on a batch that does not decode or a span whose annotations are not its
// own.
func spansOf(t *testing.T, batches []*Batch) []int {
	t.Helper()
	var ks []int
	for _, b := range batches {
		td, ok := b.Decode()
		if !ok {
			t.Fatal("a held batch did not decode")
		}
		rss := td.ResourceSpans()
		for i := range rss.Len() {
			sss := rss.At(i).ScopeSpans()
			for j := range sss.Len() {
				spans := sss.At(j).Spans()
				for n := range spans.Len() {
					attrs := spans.At(n).Attributes()
					kv, _ := attrs.Get("k")
					k := int(kv.Int())
					skew, ok := attrs.Get(semconv.AttrBarrierSkew)
					if !ok || skew.Double() != skewOf(k) {
						t.Errorf("span %d: skew %v (written %v), want %g", k, skew.AsRaw(), ok, skewOf(k))
					}
					if late, _ := attrs.Get(semconv.AttrBarrierLateness); late.Double() != float64(k) {
						t.Errorf("span %d: lateness %g, want %d", k, late.Double(), k)
					}
					ks = append(ks, k)
				}
			}
		}
	}
	return ks
}

// A held batch's spans leave when their collectives are released: those released by the
// batch that took them at Seal (split off when others stay), the rest, encoded meanwhile,
// when their last collective is released. Every span leaves once, with its own annotations.
func TestSealAndReleaseLeaveEverySpanOnceWithItsNotes(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before: the spans (of 5) whose collectives are released before Seal.
		before []int
		// atSeal: the spans ready at Seal; encoded: whether the rest is held encoded.
		atSeal  []int
		encoded bool
		// after: the releases after Seal, one group at a time, and the spans ready after each.
		after   [][]int
		readied [][]int
	}{
		{name: "every collective released by the batch that took it",
			before: []int{0, 1, 2, 3, 4}, atSeal: []int{0, 1, 2, 3, 4}},
		{name: "none released before seal",
			encoded: true,
			after:   [][]int{{4, 0}, {2, 3, 1}}, readied: [][]int{nil, {0, 1, 2, 3, 4}}},
		{name: "partial release keeps the remainder held",
			before: []int{1, 3}, atSeal: []int{1, 3}, encoded: true,
			after: [][]int{{0}, {4, 2}}, readied: [][]int{nil, {0, 2, 4}}},
		{name: "only the last span left pending",
			before: []int{0, 1, 2, 3}, atSeal: []int{0, 1, 2, 3}, encoded: true,
			after: [][]int{{4}}, readied: [][]int{{4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Store
			members := take(&s, incoming(2, 3), "job", 7)
			b := members[0].batch
			for _, m := range members {
				if m.batch != b {
					t.Fatal("the spans of one (job, step) went to different held batches")
				}
			}
			release(&s, members, tc.before...)
			if got := s.TakeReady(); len(got) != 0 {
				t.Fatalf("%d batches ready before Seal", len(got))
			}
			if errs := s.Seal(); len(errs) != 0 {
				t.Fatal(errs)
			}
			if got := spansOf(t, s.TakeReady()); !slices.Equal(got, tc.atSeal) {
				t.Errorf("ready at Seal: spans %v, want %v", got, tc.atSeal)
			}
			if encoded := b.data != nil; encoded != tc.encoded {
				t.Errorf("held encoded %v, want %v", encoded, tc.encoded)
			}
			if tc.encoded && b.traces != (ptrace.Traces{}) {
				t.Error("an encoded batch kept its decoded spans")
			}
			for i, ks := range tc.after {
				release(&s, members, ks...)
				if got := spansOf(t, s.TakeReady()); !slices.Equal(got, tc.readied[i]) {
					t.Errorf("ready after releasing %v: spans %v, want %v", ks, got, tc.readied[i])
				}
			}
		})
	}
}

// A batch of only released spans splits into one done batch, annotated, with nothing left.
func TestSplitReleasedOfAFullyReleasedBatchLeavesNothing(t *testing.T) {
	var s Store
	members := take(&s, incoming(2, 1), "job", 0)
	release(&s, members, 0, 1, 2)
	b := members[0].batch
	done := b.splitReleased()
	if done.Spans() != 3 || !done.written {
		t.Fatalf("done batch: %d spans, written %v; want 3, true", done.Spans(), done.written)
	}
	if n := b.traces.SpanCount(); n != 0 || len(b.order) != 0 {
		t.Fatalf("%d spans (order %v) left in the held batch, want none", n, b.order)
	}
	if got := spansOf(t, []*Batch{done}); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("done batch spans %v", got)
	}
}

// An encoded batch decodes to what was taken: spans (IDs, times, name, status, events, links,
// attributes), resources and scopes with their schema URLs, plus the annotations.
func TestDecodeRoundTripsSpansResourcesAndScopes(t *testing.T) {
	var s Store
	want := incoming(2, 3)
	in := ptrace.NewTraces()
	want.CopyTo(in)
	members := take(&s, in, "job", 0)
	if errs := s.Seal(); len(errs) != 0 {
		t.Fatal(errs)
	}
	if members[0].batch.data == nil {
		t.Fatal("the pending batch was not encoded")
	}
	release(&s, members, 0, 1, 2, 3, 4)
	ready := s.TakeReady()
	if len(ready) != 1 {
		t.Fatalf("%d batches ready, want 1", len(ready))
	}
	got, ok := ready[0].Decode()
	if !ok {
		t.Fatal("decode failed")
	}
	rss := got.ResourceSpans()
	for i := range rss.Len() {
		sss := rss.At(i).ScopeSpans()
		for j := range sss.Len() {
			spans := sss.At(j).Spans()
			for k := range spans.Len() {
				span := spans.At(k)
				if _, ok := span.Attributes().Get(semconv.AttrBarrierSkew); !ok {
					t.Errorf("%s not annotated", span.Name())
				}
				spanio.StripAnnotations(span)
			}
		}
	}
	if !ptraceEqual(got, want) {
		t.Fatal("the decoded batch differs from the one taken (annotations aside)")
	}
	if ready[0].data != nil || ready[0].notes != nil {
		t.Error("the decoded batch kept its encoding or notes")
	}
}

// ptraceEqual compares two traces by their protobuf encoding.
func ptraceEqual(a, b ptrace.Traces) bool {
	m := &ptrace.ProtoMarshaler{}
	ab, err1 := m.MarshalTraces(a)
	bb, err2 := m.MarshalTraces(b)
	return err1 == nil && err2 == nil && slices.Equal(ab, bb)
}

// An encoding that does not read back (or holds another number of spans) fails Decode: the
// processor counts the spans lost.
func TestDecodeOfACorruptEncodingFails(t *testing.T) {
	for name, corrupt := range map[string]func(b *Batch){
		"not s2":           func(b *Batch) { b.data = []byte("not s2 at all") },
		"one span missing": func(b *Batch) { b.spans++ },
	} {
		t.Run(name, func(t *testing.T) {
			var s Store
			members := take(&s, incoming(3), "job", 0)
			s.Seal()
			release(&s, members, 0, 1, 2)
			ready := s.TakeReady()
			if len(ready) != 1 {
				t.Fatalf("%d batches ready, want 1", len(ready))
			}
			corrupt(ready[0])
			if _, ok := ready[0].Decode(); ok {
				t.Fatal("a corrupt held batch decoded")
			}
		})
	}
}

// One incoming batch holding two steps makes two held batches: the step that completes first
// leaves without waiting for the other. Seal starts afresh: the next incoming batch's spans
// of the same step go to a new held batch.
func TestEachStepOfAnIncomingBatchIsHeldOnItsOwn(t *testing.T) {
	var s Store
	step0 := take(&s, incoming(2), "job", 0)
	step1 := take(&s, incoming(2), "job", 1)
	other := take(&s, incoming(1), "other", 0)
	if step0[0].batch == step1[0].batch || step0[0].batch == other[0].batch {
		t.Fatal("steps or jobs share a held batch")
	}
	s.Seal()
	release(&s, step0, 0, 1)
	ready := s.TakeReady()
	if len(ready) != 1 || ready[0] != step0[0].batch {
		t.Fatalf("%d batches ready, want step 0's only", len(ready))
	}
	if got := s.TakeReady(); got != nil {
		t.Fatalf("TakeReady handed %d batches twice", len(got))
	}
	next := take(&s, incoming(1), "job", 0)
	if next[0].batch == step0[0].batch || next[0].index != 0 {
		t.Fatal("after Seal a step's spans went to the sealed batch")
	}
}

// Next names the span's place before the engine accepts it; a step whose every span was
// rejected (never taken) seals to nothing.
func TestABatchWithNothingTakenIsNeverReady(t *testing.T) {
	var s Store
	m := s.Next("job", 0)
	if m.index != 0 || s.Next("job", 0) != m {
		t.Fatal("Next moved on without a Take")
	}
	if errs := s.Seal(); len(errs) != 0 {
		t.Fatal(errs)
	}
	if got := s.TakeReady(); len(got) != 0 {
		t.Fatalf("%d empty batches ready", len(got))
	}
}

// The compression buffer kept between batches is bounded.
func TestEncodeScratchIsBounded(t *testing.T) {
	var s Store
	td := incoming(1)
	span := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
	// Incompressible: a long attribute of distinct bytes.
	big := make([]byte, 2*maxEncodeScratch)
	x := uint32(1)
	for i := range big {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		big[i] = byte(x)
	}
	span.Attributes().PutEmptyBytes("blob").FromRaw(big)
	take(&s, td, "job", 0)
	if errs := s.Seal(); len(errs) != 0 {
		t.Fatal(errs)
	}
	if cap(s.encoded) > maxEncodeScratch {
		t.Fatalf("kept a %d-byte compression buffer (bound %d)", cap(s.encoded), maxEncodeScratch)
	}
}
