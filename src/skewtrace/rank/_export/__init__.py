"""Off the hot path: the recorder's events become OTel spans and leave the process.

One daemon thread (:mod:`.thread`) wakes every ``export_interval_millis``, drains the
recorder, has :mod:`.materialize` build ``ReadableSpan`` objects (deterministic trace IDs,
parents, timestamps, CUDA durations, the user's sampler), and hands them to a sink
(:mod:`.sinks`): the span processors of the user's TracerProvider, or a private OTLP
exporter (:mod:`.exporters`) whose gRPC requests are encoded by :mod:`.otlp_wire`.
:mod:`.self_metrics` reports what was dropped, exported and failed.

Nothing here raises into training: failures are logged and counted
(``skewtrace.spans.export_failed``). The final flush is bounded by ``shutdown_timeout_millis``.
"""
