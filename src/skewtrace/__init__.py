"""skewtrace: OpenTelemetry spans for every rank of a distributed PyTorch training job.

Usage, after ``torch.distributed.init_process_group``::

    import skewtrace
    skewtrace.instrument(model=ddp_model, optimizer=optimizer, dataloader=train_loader)
    for batch in train_loader:          # the training loop stays as it is
        ...
    skewtrace.uninstrument()            # optional: restores everything and flushes

Each rank then emits, per step, ``train.step`` (children of one ``train.step.root`` per step,
in one trace per (job, step)), ``dataloader.fetch``, ``forward``, ``backward``,
``optimizer.step``, ``collective.<op>`` for every ``torch.distributed`` collective and DDP
gradient bucket, and ``pacing.delay`` when a pacer is configured. Names are in
``docs/semantic-conventions.md``; settings in ``docs/configuration.md``.

- ``model``: forward/backward hooks; a ``DistributedDataParallel`` also gets a communication
  hook that wraps the default all-reduce or the user's hook registered *after* this call.
- ``optimizer``: its step ends each ``train.step``; without one, every optimizer's step does.
- ``dataloader``: instrumented in place (the same object keeps working in the loop).
- ``tracer_provider`` / ``meter_provider``: an SDK provider to use; otherwise a global SDK
  TracerProvider is used if one is set, else a private OTLP exporter configured by the
  standard ``OTEL_EXPORTER_OTLP_*`` variables. The global provider is never replaced.
  Of a TracerProvider, skewtrace applies the sampler (per span; a step's spans share one
  trace ID on every rank, so a trace-ID-ratio sampler keeps or drops whole steps, the same
  steps on every rank), the span processors' ``on_end`` (their exporters and batching) and
  the resource (the rank's ``training.*`` attributes win). It does not call ``on_start``
  (spans are built after they end, on the export thread), nor use the provider's ID
  generator (IDs derive from job and step so ranks agree) or span limits.
- ``job_id``, ``pacer_url``, ``buffer_events``, ``export_interval_millis``,
  ``shutdown_timeout_millis``: override the ``SKEWTRACE_*`` variables.
- ``pacing_client``: an object with ``current_delay() -> (seconds, version)`` to use instead
  of the HTTP client that ``pacer_url`` creates.
- ``zero_code``: ``False`` (default) resolves the rank and job id now and hooks only what is
  passed (plus every collective and, without an optimizer, every optimizer's step).
  ``True`` is what ``opentelemetry-instrument python train.py`` does with no code change:
  callable before ``init_process_group`` (identity resolved at the first export), and it
  also instruments each ``DistributedDataParallel`` built later when no ``model`` is given
  and every ``DataLoader`` when no ``dataloader`` is given (see
  :mod:`skewtrace.instrumentor`).

Instrumentation never raises into training after ``instrument()`` returns: export failures
and full buffers are logged once and counted.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from skewtrace.version import __version__

if TYPE_CHECKING:
    from skewtrace.instrumentor import SkewtraceInstrumentor

__all__ = [
    "SkewtraceInstrumentor",
    "__version__",
    "flush",
    "instrument",
    "is_instrumented",
    "traced_iterable",
    "uninstrument",
]


def instrument(
    *,
    model: Any | None = None,
    optimizer: Any | None = None,
    dataloader: Any | None = None,
    job_id: str | None = None,
    tracer_provider: Any | None = None,
    meter_provider: Any | None = None,
    pacer_url: str | None = None,
    pacing_client: Any | None = None,
    buffer_events: int | None = None,
    export_interval_millis: int | None = None,
    shutdown_timeout_millis: int | None = None,
    zero_code: bool = False,
) -> None:
    """Instrument this rank's training; a second call warns and does nothing.

    The arguments are described in the module docstring (``help(skewtrace)``) and in
    ``docs/configuration.md``. With a ``tracer_provider`` (or a global SDK one), its sampler
    and its span processors' ``on_end`` apply to skewtrace's spans; ``on_start`` is never
    called, and the provider's ID generator and span limits are not used.

    Raises ``skewtrace.config.ConfigError`` when the settings are unusable, e.g. no job id
    with more than one rank (with ``zero_code=True`` that one is found at the first export:
    logged, and the spans discarded).
    """
    from skewtrace.instrumentor import SkewtraceInstrumentor

    instrumentor = SkewtraceInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        warnings.warn(
            "skewtrace.instrument() called twice; the second call does nothing",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    instrumentor.instrument(
        model=model,
        optimizer=optimizer,
        dataloader=dataloader,
        job_id=job_id,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        pacer_url=pacer_url,
        pacing_client=pacing_client,
        buffer_events=buffer_events,
        export_interval_millis=export_interval_millis,
        shutdown_timeout_millis=shutdown_timeout_millis,
        zero_code=zero_code,
        skip_dep_check=True,
    )


def uninstrument() -> None:
    """Restore everything ``instrument()`` wrapped and flush pending spans (bounded)."""
    from skewtrace.instrumentor import SkewtraceInstrumentor

    instrumentor = SkewtraceInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


def is_instrumented() -> bool:
    from skewtrace.instrumentor import SkewtraceInstrumentor

    return bool(SkewtraceInstrumentor().is_instrumented_by_opentelemetry)


def flush() -> None:
    """Ask the export thread to export what is buffered now (does not wait)."""
    from skewtrace.instrumentor import SkewtraceInstrumentor

    session = SkewtraceInstrumentor().session
    if session is not None:
        session.flush()


def traced_iterable(iterable: Iterable[Any]) -> Iterator[Any]:
    """For loaders that cannot be instrumented in place: ``for b in traced_iterable(x)``."""
    from skewtrace.instrumentor import traced_iterable as _traced

    return _traced(iterable)


def __getattr__(name: str) -> Any:
    if name == "SkewtraceInstrumentor":
        from skewtrace.instrumentor import SkewtraceInstrumentor

        return SkewtraceInstrumentor
    raise AttributeError(name)
