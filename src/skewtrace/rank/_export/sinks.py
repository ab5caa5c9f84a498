"""Where finished spans go: the user's TracerProvider, or a private exporter.

What a user's ``TracerProvider`` applies to skewtrace's spans (also in
``docs/configuration.md``): its sampler (``should_sample`` per span, in
:mod:`.materialize`), its span processors' ``on_end`` (so their exporters and batching), and
its resource (merged under the rank's attributes). Not applied: ``on_start`` (spans are
built as finished ``ReadableSpan``s on the export thread; there is no live span to start),
its ID generator (trace IDs are derived from (job, step) so ranks agree), span limits
(skewtrace's spans carry a few scalar attributes and no events or links), and the SDK's
experimental tracer configurator.

Only public SDK API is used: the provider's tracer for skewtrace's scope exposes the
provider's ``sampler`` and ``span_processor`` (the same multi-processor that
``add_span_processor`` adds to, so processors added later are fed too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Sampler

from skewtrace.rank._export.materialize import SCOPE

logger = logging.getLogger("skewtrace")


class SpanSink(Protocol):
    @property
    def sampler(self) -> Sampler | None:
        """The sampler the materializer applies to spans bound for this sink, if any."""
        ...

    def export(self, spans: Sequence[ReadableSpan]) -> bool: ...
    def flush(self, timeout_millis: int) -> None: ...
    def shutdown(self) -> None: ...


class ProcessorSink:
    """Feeds a user TracerProvider: its sampler decides, its span processors export."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        tracer = provider.get_tracer(SCOPE.name, SCOPE.version)
        # A provider built with OTEL_SDK_DISABLED=true hands out a NoOpTracer, which has
        # neither: its spans are discarded, as the SDK would.
        self._processor: Any | None = getattr(tracer, "span_processor", None)
        self._sampler: Sampler | None = getattr(tracer, "sampler", None)
        if self._processor is None:
            logger.info("skewtrace: the TracerProvider is disabled; spans are discarded")

    @property
    def sampler(self) -> Sampler | None:
        return self._sampler

    def export(self, spans: Sequence[ReadableSpan]) -> bool:
        if self._processor is None:
            return True
        on_end = self._processor.on_end
        for span in spans:
            on_end(span)
        return True

    def flush(self, timeout_millis: int) -> None:
        self._provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        # The provider is the user's; it shuts down with their program.
        return None


class ExporterSink:
    """A private span exporter, created lazily on the export thread; nothing is sampled."""

    def __init__(self, factory: Callable[[], SpanExporter]) -> None:
        self._factory = factory
        self._exporter: SpanExporter | None = None
        self._lock = threading.Lock()

    @property
    def sampler(self) -> Sampler | None:
        # What is stored is the Collector's decision, made after the cross-rank join.
        return None

    def _get(self) -> SpanExporter:
        with self._lock:
            if self._exporter is None:
                self._exporter = self._factory()
            return self._exporter

    def export(self, spans: Sequence[ReadableSpan]) -> bool:
        return self._get().export(spans) == SpanExportResult.SUCCESS

    def flush(self, timeout_millis: int) -> None:
        return None

    def shutdown(self) -> None:
        with self._lock:
            exporter = self._exporter
        if exporter is not None:
            # Also aborts a retry backoff in progress on the export thread.
            exporter.shutdown()
