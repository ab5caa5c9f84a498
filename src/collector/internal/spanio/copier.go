package spanio

import "go.opentelemetry.io/collector/pdata/ptrace"

// Copier copies chosen spans of an input batch into new batches, each span under a copy of
// its resource and scope, made once per (input resource, input scope) and batch rather than
// once per span. A batch holds at most maxSpans spans (0: no limit, so one batch).
type Copier struct {
	max   int
	done  []ptrace.Traces
	cur   ptrace.Traces
	spans int
	rs    ptrace.ResourceSpans
	ss    ptrace.ScopeSpans
	// at: the input (resource, scope) that rs and ss copy in cur; -1 when none.
	at [2]int
}

// NewCopier returns an empty Copier whose batches hold at most maxSpans spans (0: no limit).
func NewCopier(maxSpans int) *Copier {
	return &Copier{max: maxSpans, cur: ptrace.NewTraces(), at: [2]int{-1, -1}}
}

// Add copies span (of input resource i, scope j) into the output and returns the copy. Spans
// of one input resource and scope are added one after the other.
func (o *Copier) Add(in ptrace.ResourceSpans, i int, inSS ptrace.ScopeSpans, j int, span ptrace.Span) ptrace.Span {
	if o.max > 0 && o.spans >= o.max {
		o.done = append(o.done, o.cur)
		o.cur, o.spans, o.at = ptrace.NewTraces(), 0, [2]int{-1, -1}
	}
	if o.at[0] != i {
		o.rs = o.cur.ResourceSpans().AppendEmpty()
		in.Resource().CopyTo(o.rs.Resource())
		o.rs.SetSchemaUrl(in.SchemaUrl())
		o.at = [2]int{i, -1}
	}
	if o.at[1] != j {
		o.ss = o.rs.ScopeSpans().AppendEmpty()
		inSS.Scope().CopyTo(o.ss.Scope())
		o.ss.SetSchemaUrl(inSS.SchemaUrl())
		o.at[1] = j
	}
	out := o.ss.Spans().AppendEmpty()
	span.CopyTo(out)
	o.spans++
	return out
}

// Batches returns the output's batches, none empty.
func (o *Copier) Batches() []ptrace.Traces {
	if o.spans > 0 {
		o.done = append(o.done, o.cur)
		o.cur, o.spans, o.at = ptrace.NewTraces(), 0, [2]int{-1, -1}
	}
	return o.done
}

// Traces returns everything copied as one batch (for a Copier without a limit; empty when
// nothing was).
func (o *Copier) Traces() ptrace.Traces {
	if batches := o.Batches(); len(batches) > 0 {
		return batches[0]
	}
	return ptrace.NewTraces()
}
