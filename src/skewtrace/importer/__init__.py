"""``skewtrace import``: recorded traces in, the instrumentation's own spans out.

A job that ran without skewtrace still has timings: a team's own per-rank timers written as
a table (:mod:`.columnar`), the sample traces of ByteDance's what-if analysis of stragglers
(:mod:`.whatif`, parquet or CSV), or PyTorch profiler traces, one Chrome-trace JSON per rank
(:mod:`.kineto`). Every reader produces the same thing (:mod:`.model`): per rank, the events
the live hooks would have recorded (:mod:`skewtrace.rank._events`). From there the live path takes
over: :mod:`.spans` builds the spans with the materializer the ranks use (same IDs, parents,
resource keys and attributes) and :mod:`.send` writes them with the ranks' OTLP encoder to a
Collector. With ``--report`` :mod:`.collector` runs a private Collector for the analysis and
the HTML report is written from its span file. :mod:`.command` is the subcommand.

The whole input is read and checked before anything is sent: a bad file is one error
naming the file and line (CSV), row (parquet) or the event and field (JSON), exit status 2,
nothing sent. User documentation: ``docs/import.md``.
"""
