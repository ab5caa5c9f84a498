// Package heldbatch holds the barrierskew processor's collective spans between the incoming
// batch that took them and the release of their collectives: one held batch per incoming
// batch and (job, step), kept encoded (OTLP protobuf, S2-compressed) while it waits, and
// decoded with the join engine's figures written when its last collective is released. It
// also orders what leaves the processor (InFlight). The processor keeps the Collector
// plumbing (consuming, forwarding, the release ticker, telemetry); this package is the state
// machine of the spans it holds and their codec.
//
// A held batch's life:
//
//	Store.Next + Member.Take   taking: spans move in from the incoming batch
//	Store.Release              a collective released: its members' notes are written
//	Store.Seal                 the incoming batch is done: ready at once if nothing is
//	                           pending, else the released spans split off (ready) and the
//	                           rest encoded
//	Store.Release ...          the last pending collective released: ready
//	Store.TakeReady, Decode    forwarded, decoded and annotated
package heldbatch

import (
	"bytes"

	"github.com/klauspost/compress/s2"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/spanio"
)

// maxEncodeScratch is the largest compression buffer a Store keeps between batches.
const maxEncodeScratch = 4 << 20

// Batch is the collective spans one incoming batch handed to the engine, moved out of it
// under copies of their resources and scopes. From the end of that batch until the last of
// its collectives is released it is held encoded (OTLP protobuf, S2-compressed): bytes take
// a fraction of the memory of decoded pdata and the GC does not scan them, and at thousands
// of ranks the processor holds about one step of every rank's collective spans. The spans of
// one batch repeat their attribute keys and most values, so S2 takes the protobuf to about a
// tenth of its size (28 MB -> 2.5 MB for a 4096-rank step; docs/performance.md).
type Batch struct {
	// traces: the spans while the batch is being taken, or when it needs no encoding (every
	// collective released by the batch that took them).
	traces ptrace.Traces
	data   []byte
	// at: where the spans of the incoming batch's (resource, scope) went in traces.
	at      map[[2]int]ptrace.SpanSlice
	spans   int
	pending int
	// notes: each span's annotations by its index (the order in which the batch took them),
	// written as its collective is released.
	notes []spanio.Note
	// order: the index of each span in data when some of the batch's spans left before it
	// was encoded (nil: data holds every span, in index order).
	order []int32
	// written: the spans in traces are annotated already.
	written bool
	// sealed: the incoming batch is done; the held batch is forwarded once pending is 0.
	sealed bool
}

// Spans is how many spans were taken into the batch. The part of a batch that stays held
// when its released spans were split off at Seal still counts those.
func (b *Batch) Spans() int { return b.spans }

// Member is how a held collective span is found: its batch and its index in it (the join
// engine's reference to the span).
type Member struct {
	batch *Batch
	index int
}

// stepKey is a (job, step): the unit a held batch holds.
type stepKey struct {
	job  string
	step int64
}

// Store is the held batches of one processor: those of the incoming batch being taken, and
// those whose every collective was released, to forward. The zero value is ready. It is not
// safe for concurrent use (the processor calls it under its lock).
type Store struct {
	// taking: the held batches of the incoming batch being taken, one per (job, step): a
	// rank's batch often ends one step and begins the next, and the spans of the step that
	// completes first must not wait for the next one's.
	taking map[stepKey]*Batch
	// ready: held batches whose every collective was released, to forward.
	ready []*Batch
	// encoded is seal's compression buffer.
	encoded []byte
}

// Next returns the Member the next span taken for (job, step) from the incoming batch will
// be, creating that step's held batch on first use. Until Member.Take the span is not in it:
// a span the engine rejects is not taken.
func (s *Store) Next(job string, step int64) Member {
	k := stepKey{job: job, step: step}
	b, ok := s.taking[k]
	if !ok {
		if s.taking == nil {
			s.taking = make(map[stepKey]*Batch)
		}
		b = &Batch{}
		s.taking[k] = b
	}
	return Member{batch: b, index: b.spans}
}

// Take moves span, of the incoming batch's resource rs and scope ss at (their indexes),
// into m's held batch as its next span: m is what Next returned for it, and no other span
// was taken into the batch since. Its collective is pending until Store.Release.
func (m Member) Take(rs ptrace.ResourceSpans, ss ptrace.ScopeSpans, at [2]int, span ptrace.Span) {
	b := m.batch
	span.MoveTo(b.slice(rs, ss, at).AppendEmpty())
	b.spans++
	b.pending++
}

// Release writes the engine's figures for the members of released collective r into their
// held batches' notes, and queues every sealed batch that has no pending member left. The
// caller recycles r.
func (s *Store) Release(r *join.Released[Member]) {
	c := spanio.NewCollectiveNote(r)
	for i := range r.Members {
		m := &r.Members[i]
		b := m.Ref.batch
		if m.Ref.index >= len(b.notes) {
			b.notes = append(b.notes, make([]spanio.Note, max(m.Ref.index+1, b.spans)-len(b.notes))...)
		}
		b.notes[m.Ref.index] = spanio.NewNote(c, m)
		b.pending--
		if b.pending == 0 && b.sealed {
			s.ready = append(s.ready, b)
		}
	}
}

// Seal ends the taking of the incoming batch: every held batch it filled is sealed (see
// seal) and the next incoming batch starts new ones. It returns the errors of the batches
// that could not be encoded; those are held decoded instead (more memory, nothing lost).
func (s *Store) Seal() []error {
	var errs []error
	for _, b := range s.taking {
		if err := s.seal(b); err != nil {
			errs = append(errs, err)
		}
	}
	clear(s.taking)
	return errs
}

// TakeReady hands over the held batches that are ready to forward, in the order they became
// ready.
func (s *Store) TakeReady() []*Batch {
	ready := s.ready
	s.ready = nil
	return ready
}

// slice returns where the held batch keeps the spans of the incoming batch's (resource,
// scope) at, copying the resource and scope the first time. The spans are taken in the
// incoming batch's order, so each (resource, scope)'s are contiguous and the order of the
// held batch's traces is the order of the spans' indexes.
func (b *Batch) slice(rs ptrace.ResourceSpans, ss ptrace.ScopeSpans, at [2]int) ptrace.SpanSlice {
	if spans, ok := b.at[at]; ok {
		return spans
	}
	if b.at == nil {
		b.traces = ptrace.NewTraces()
		b.at = make(map[[2]int]ptrace.SpanSlice)
	}
	out := b.traces.ResourceSpans().AppendEmpty()
	rs.Resource().CopyTo(out.Resource())
	out.SetSchemaUrl(rs.SchemaUrl())
	outSS := out.ScopeSpans().AppendEmpty()
	ss.Scope().CopyTo(outSS.Scope())
	outSS.SetSchemaUrl(ss.SchemaUrl())
	b.at[at] = outSS.Spans()
	return outSS.Spans()
}

// seal ends the taking of a held batch. The spans whose collectives this very batch released
// (a tensor-parallel group whose ranks share the batch, say) are ready at once; the others
// are encoded until their collectives are released. An encoding error leaves them decoded.
func (s *Store) seal(b *Batch) error {
	b.at = nil
	b.sealed = true
	switch {
	case b.spans == 0:
		return nil
	case b.pending == 0:
		s.ready = append(s.ready, b)
		return nil
	case b.pending < b.spans:
		s.ready = append(s.ready, b.splitReleased())
	}
	data, err := (&ptrace.ProtoMarshaler{}).MarshalTraces(b.traces)
	if err != nil {
		return err
	}
	// s2.Encode's output keeps the capacity of its worst case (more than the input): the held
	// copy is exactly as long as the compressed bytes.
	s.encoded = s2.Encode(s.encoded[:cap(s.encoded)], data)
	b.data, b.traces = bytes.Clone(s.encoded), ptrace.Traces{}
	if cap(s.encoded) > maxEncodeScratch {
		s.encoded = nil
	}
	return nil
}

// splitReleased moves the spans whose notes are written out of the held batch into a batch
// of their own, annotated, and records the original index of each span that stays.
func (b *Batch) splitReleased() *Batch {
	done := &Batch{traces: ptrace.NewTraces(), written: true}
	b.order = make([]int32, 0, b.pending)
	i := 0
	rss := b.traces.ResourceSpans()
	for r := range rss.Len() {
		rs := rss.At(r)
		sss := rs.ScopeSpans()
		for s := range sss.Len() {
			ss := sss.At(s)
			var to ptrace.SpanSlice
			moved := false
			ss.Spans().RemoveIf(func(span ptrace.Span) bool {
				index := i
				i++
				if index >= len(b.notes) || b.notes[index].CollectiveNote == nil {
					b.order = append(b.order, int32(index))
					return false
				}
				if !moved {
					out := done.traces.ResourceSpans().AppendEmpty()
					rs.Resource().CopyTo(out.Resource())
					out.SetSchemaUrl(rs.SchemaUrl())
					outSS := out.ScopeSpans().AppendEmpty()
					ss.Scope().CopyTo(outSS.Scope())
					outSS.SetSchemaUrl(ss.SchemaUrl())
					to, moved = outSS.Spans(), true
				}
				b.notes[index].Write(span)
				b.notes[index] = spanio.Note{}
				span.MoveTo(to.AppendEmpty())
				done.spans++
				return true
			})
		}
	}
	return done
}

// Decode returns the held batch's spans with their annotations written, or false when its
// encoding cannot be read back (it cannot happen with an encoding seal wrote).
func (b *Batch) Decode() (ptrace.Traces, bool) {
	if b.written {
		return b.traces, true
	}
	td := b.traces
	if b.data != nil {
		data, err := s2.Decode(nil, b.data)
		if err != nil {
			return ptrace.Traces{}, false
		}
		td, err = (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(data)
		if err != nil {
			return ptrace.Traces{}, false
		}
		b.data = nil
	}
	want := b.spans
	if b.order != nil {
		want = len(b.order)
	}
	if td.SpanCount() != want {
		return ptrace.Traces{}, false
	}
	i := 0
	rss := td.ResourceSpans()
	for r := range rss.Len() {
		sss := rss.At(r).ScopeSpans()
		for s := range sss.Len() {
			spans := sss.At(s).Spans()
			for k := range spans.Len() {
				index := i
				if b.order != nil {
					index = int(b.order[i])
				}
				b.notes[index].Write(spans.At(k))
				i++
			}
		}
	}
	b.notes, b.order = nil, nil
	return td, true
}
