"""Cumulative data-loader wait, counted where events leave the buffer, not where they enter.

``training.dataloader.wait`` is the sum of the rank's ``dataloader.fetch`` spans. Summing on
the hot path would add work to every batch; instead :class:`FetchCountingRecorder` adds up
the fetch events as the export thread drains them (every ``SKEWTRACE_EXPORT_INTERVAL_MILLIS``),
so the training thread does exactly what it did before. The figure therefore lags by up to
one export interval, and fetches dropped because the buffer was full are not in it (they are
counted in ``skewtrace.events.dropped``).
"""

from __future__ import annotations

from skewtrace import semconv
from skewtrace.rank._events import PHASE, PhaseEvent, RawEvent
from skewtrace.rank._recorder import Recorder


class FetchCountingRecorder(Recorder):
    """A :class:`~skewtrace.rank._recorder.Recorder` that keeps the fetches' count and total wait.

    Only the consumer side (``drain``) is extended; ``record`` is the base class's.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.fetches = 0
        self.fetch_wait_ns = 0

    def drain(self, limit: int) -> list[RawEvent]:
        taken = super().drain(limit)
        fetches = 0
        wait_ns = 0
        for event in taken:
            if event[0] == PHASE and event[1] == semconv.SPAN_DATALOADER_FETCH:
                fetches += 1
                wait_ns += event[4] - event[3]
            elif isinstance(event, PhaseEvent) and event.name == semconv.SPAN_DATALOADER_FETCH:
                fetches += 1
                wait_ns += event.end_ns - event.start_ns
        if fetches:
            self.fetch_wait_ns += wait_ns
            self.fetches += fetches
        return taken
