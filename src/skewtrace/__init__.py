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
  :mod:`skewtrace.rank.instrumentor`).

Instrumentation never raises into training after ``instrument()`` returns: export failures
and full buffers are logged once and counted.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from skewtrace.version import __version__

if TYPE_CHECKING:
    from skewtrace.rank.instrumentor import SkewtraceInstrumentor

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

    Raises ``skewtrace.rank.config.ConfigError`` when the settings are unusable, e.g. no job id
    with more than one rank (with ``zero_code=True`` that one is found at the first export:
    logged, and the spans discarded).
    """
    from skewtrace.rank.instrumentor import SkewtraceInstrumentor

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
    from skewtrace.rank.instrumentor import SkewtraceInstrumentor

    instrumentor = SkewtraceInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


def is_instrumented() -> bool:
    from skewtrace.rank.instrumentor import SkewtraceInstrumentor

    return bool(SkewtraceInstrumentor().is_instrumented_by_opentelemetry)


def flush() -> None:
    """Ask the export thread to export what is buffered now (does not wait)."""
    from skewtrace.rank.instrumentor import SkewtraceInstrumentor

    session = SkewtraceInstrumentor().session
    if session is not None:
        session.flush()


def traced_iterable(iterable: Iterable[Any]) -> Iterator[Any]:
    """For loaders that cannot be instrumented in place: ``for b in traced_iterable(x)``."""
    from skewtrace.rank.instrumentor import traced_iterable as _traced

    return _traced(iterable)


def __getattr__(name: str) -> Any:
    if name == "SkewtraceInstrumentor":
        from skewtrace.rank.instrumentor import SkewtraceInstrumentor

        return SkewtraceInstrumentor
    raise AttributeError(name)


# The layout: what a training process imports is under skewtrace.rank; the services and tools
# it talks to are skewtrace.controller, .timeline, .report, .importer and .cluster (with the
# console script, skewtrace.cli); what both use (semconv, version, _options, _ids, ...) is here
# at the top. The modules that lived at the top before that split still import, from their new
# place, with a DeprecationWarning: the old name is the new module itself (one module object,
# so classes, singletons and isinstance checks are shared), its submodules included.
MOVED: dict[str, str] = {
    "skewtrace.rebalance": "skewtrace.rank.rebalance_sampler",
    "skewtrace.instrumentor": "skewtrace.rank.instrumentor",
    "skewtrace.config": "skewtrace.rank.config",
    "skewtrace.resource": "skewtrace.rank.resource",
    "skewtrace.hooks": "skewtrace.rank.hooks",
    "skewtrace.telemetry": "skewtrace.rank.telemetry",
    "skewtrace.topology": "skewtrace.rank.topology",
    "skewtrace.pacer.client": "skewtrace.rank.pacing_client",
    "skewtrace.pacer": "skewtrace.rank.pacing_client",
    "skewtrace._export": "skewtrace.rank._export",
    "skewtrace._events": "skewtrace.rank._events",
    "skewtrace._recorder": "skewtrace.rank._recorder",
    "skewtrace._identity": "skewtrace.rank._identity",
    "skewtrace._job_id": "skewtrace.rank._job_id",
    "skewtrace._cuda_timing": "skewtrace.rank._cuda_timing",
    "skewtrace._hostlist": "skewtrace.rank.topology._hostlist",
    "skewtrace.demo": "skewtrace.cluster.demo",
    "skewtrace.demo_command": "skewtrace.cluster.command",
    "skewtrace.controller.decision": "skewtrace.decision",
}


def moved_to(name: str) -> str | None:
    """The module an old ``skewtrace`` module name now is (its submodules too), else None."""
    if name in MOVED:
        return MOVED[name]
    for old, new in MOVED.items():
        if name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def exec_module(self, module: ModuleType) -> None:
        warnings.warn(
            f"{module.__name__} is deprecated: it moved to {self.new}",
            DeprecationWarning,
            stacklevel=2,
        )
        name = module.__name__
        new = importlib.import_module(self.new)
        if not hasattr(new, "__path__") and any(old.startswith(name + ".") for old in MOVED):
            # An old package now one module (skewtrace.pacer): a package of that module's
            # names, so that its old submodules still import.
            module.__path__ = []
            vars(module).update((k, v) for k, v in vars(new).items() if not k.startswith("__"))
            return
        # The import system returns what sys.modules holds under the name once this returns.
        sys.modules[name] = new


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("skewtrace."):
            return None
        new = moved_to(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _MovedLoader(new))


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    # First: an old package's submodule must not be found again under its new package's path.
    sys.meta_path.insert(0, _MovedFinder())
