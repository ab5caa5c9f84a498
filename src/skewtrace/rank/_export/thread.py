"""The export thread: every interval, drain the recorder, materialize, export; the final
flush at exit is bounded by ``shutdown_timeout_millis``.

Spans are built only once the rank's identity is known (:mod:`skewtrace.rank._identity`, asked
every cycle): until then the events stay in the recorder's bounded buffer, so nothing is
exported under a wrong job id or rank. If the identity cannot be had, what was recorded
is dropped and counted (``skewtrace.events.dropped{reason=no_job_id}``) with one error
line. Without a sink (``OTEL_TRACES_EXPORTER=none``) events are drained and discarded,
neither materialized nor counted."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import ReadableSpan

from skewtrace.rank._export.materialize import CudaPoller, Identity, SpanMaterializer
from skewtrace.rank._export.sinks import SpanSink
from skewtrace.rank._recorder import Recorder

logger = logging.getLogger("skewtrace")

# Spans per export call: keeps one OTLP request well under gRPC's 4 MiB default.
_EXPORT_BATCH = 512
# While the identity is pending, ask again this often rather than every interval: rank 0's
# job id is read as soon as it is written (and before a short-lived rank 0, which may hold
# the store, is gone). Asking costs microseconds, a store round trip at most.
_PENDING_RETRY_S = 0.05


class ExportStats:
    def __init__(self) -> None:
        self.exported = 0
        self.failed = 0
        # CPU the export thread spent (materialize + export): what skewtrace costs off the
        # hot path, measurable even when step times are too noisy to compare.
        self.cpu_ns = 0


class BackgroundExporter:
    """The daemon thread: drain, materialize, export, every interval; bounded final flush."""

    def __init__(
        self,
        recorder: Recorder,
        sink: SpanSink | None,
        identity: Callable[[bool], Identity | None],
        interval_millis: int,
        cuda_timer: CudaPoller | None = None,
        before_drain: Callable[[], None] | None = None,
    ) -> None:
        self._recorder = recorder
        # Run at the start of each cycle (the hooks' completion poll, hooks._work).
        self._before_drain = before_drain
        self._sink = sink
        self._identity = identity
        self._interval_s = interval_millis / 1000.0
        self._cuda_timer = cuda_timer
        self._materializer: SpanMaterializer | None = None
        self._disabled = False
        self._pending = True
        self._drop_reason = "no_identity"
        self.stats = ExportStats()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # Set when the final flush ran out of time: the thread stops exporting at once.
        self._abandoned = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skewtrace-export", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set_cuda_timer(self, timer: CudaPoller) -> None:
        """A CUDA model appeared after start (zero-code); takes effect for new spans."""
        self._cuda_timer = timer
        if self._materializer is not None:
            self._materializer.cuda_timer = timer

    def _run(self) -> None:
        from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, set_value

        # Our own OTLP calls must not be traced by other instrumentations (grpc, requests).
        attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            while not self._stop.is_set():
                pending = self._pending and not self._disabled
                self._wake.wait(
                    min(self._interval_s, _PENDING_RETRY_S) if pending else self._interval_s
                )
                self._wake.clear()
                self._cycle(final=False)
            self._cycle(final=True)
        finally:
            self._done.set()

    def _cycle(self, final: bool) -> None:
        cpu_start = time.thread_time_ns()
        try:
            self._cycle_inner(final)
        finally:
            self.stats.cpu_ns += time.thread_time_ns() - cpu_start

    def _cycle_inner(self, final: bool) -> None:
        try:
            if self._before_drain is not None:
                self._before_drain()
            materializer = self._get_materializer(final)
            if self._sink is None:
                self._discard(None)
                return
            if materializer is None:
                if self._disabled:
                    self._discard(self._drop_reason)
                # Else the identity is not known yet: the events wait in the buffer.
                return
            while not self._abandoned.is_set():
                events = self._recorder.drain(_EXPORT_BATCH)
                if not events and not final:
                    return
                spans = materializer.materialize(events, final=final and not events)
                if spans:
                    self._export(spans)
                if not events:
                    return
                if not final and self._stop.is_set():
                    return
        except Exception:
            logger.exception("skewtrace: export cycle failed; continuing")

    def _discard(self, reason: str | None) -> None:
        """Empty the buffer (bounded memory); ``reason``: count the events as dropped."""
        while True:
            events = self._recorder.drain(self._recorder.capacity)
            if not events:
                return
            if reason is not None:
                self._recorder.count_drop(reason, len(events))

    def _get_materializer(self, final: bool) -> SpanMaterializer | None:
        if self._materializer is None and not self._disabled:
            try:
                identity = self._identity(final)
            except Exception as exc:
                self._disabled = True
                self._drop_reason = getattr(exc, "drop_reason", self._drop_reason)
                if hasattr(exc, "drop_reason"):
                    logger.error(
                        "skewtrace: %s. This rank's spans are dropped (counted in "
                        "skewtrace.events.dropped{reason=%s}); training goes on",
                        exc,
                        self._drop_reason,
                    )
                else:
                    logger.exception("skewtrace: cannot identify this rank; spans are dropped")
                return None
            self._pending = identity is None
            if identity is None or self._sink is None:
                return None
            self._materializer = SpanMaterializer(
                identity, self._recorder.epoch_anchor_ns, self._cuda_timer, self._sink.sampler
            )
        return self._materializer

    def _export(self, spans: list[ReadableSpan]) -> None:
        assert self._sink is not None
        try:
            ok = self._sink.export(spans)
        except Exception:
            if not self._abandoned.is_set():
                logger.warning("skewtrace: span export raised", exc_info=True)
            ok = False
        if ok:
            self.stats.exported += len(spans)
        else:
            self.stats.failed += len(spans)

    def flush_now(self) -> None:
        self._wake.set()

    def shutdown(self, timeout_millis: int) -> bool:
        """Stop the thread after a final drain; True if everything finished in time."""
        deadline = time.monotonic() + timeout_millis / 1000.0
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._done.wait(max(0.0, deadline - time.monotonic()))
        finished = self._done.is_set() or not self._thread.is_alive()
        if self._sink is None:
            return finished
        if finished:
            try:
                self._sink.flush(max(0, int((deadline - time.monotonic()) * 1000)))
            except Exception:
                logger.debug("skewtrace: flush failed", exc_info=True)
        else:
            self._abandoned.set()
            logger.warning(
                "skewtrace: final export did not finish within %d ms; remaining spans dropped",
                timeout_millis,
            )
        try:
            self._sink.shutdown()
        except Exception:
            logger.debug("skewtrace: exporter shutdown failed", exc_info=True)
        return finished
