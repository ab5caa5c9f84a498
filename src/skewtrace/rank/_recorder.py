"""The hot path: what the training thread does per event.

Recording an event is two clock reads and one ``deque.append`` of a plain tuple headed by
its kind (:mod:`skewtrace.rank._events` names the fields); nothing is formatted, hashed or
allocated beyond the tuple. A background thread (:mod:`skewtrace.rank._export.thread`) turns the
events into spans. ``deque.append`` and ``popleft`` are atomic under the GIL, so producers
(the training thread, autograd and gloo callback threads) and the single consumer need no
lock. The buffer is bounded: past ``capacity`` an event is dropped and counted, and the
first drop is logged once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from skewtrace.rank._events import STEP, RawEvent

logger = logging.getLogger("skewtrace")

DROP_REASON_BUFFER_FULL = "buffer_full"

now_ns = time.perf_counter_ns

STEP_ENDS_KEPT = 1024


class Recorder:
    """The rank's bounded event buffer and its step counter."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.events: deque[RawEvent] = deque()
        self.active = True
        # The step of the iteration in progress; advanced after optimizer.step.
        self.step = 0
        # Where the current train.step began: the previous step's end, else the first event.
        self.step_start_ns: int | None = None
        self.paced_step = -1
        self.epoch_anchor_ns = time.time_ns() - time.perf_counter_ns()
        # (step, end_ns) of the last steps: what a collective read later (from c10d's Flight
        # Recorder) is attributed to a step by.
        self.step_ends: deque[tuple[int, int]] = deque(maxlen=STEP_ENDS_KEPT)
        self._dropped: dict[str, int] = {}
        self._drop_lock = threading.Lock()
        self._drop_logged = False

    def record(self, event: RawEvent) -> None:
        events = self.events
        if len(events) < self.capacity:
            events.append(event)
        else:
            self.count_drop(DROP_REASON_BUFFER_FULL)

    def count_drop(self, reason: str, count: int = 1) -> None:
        with self._drop_lock:
            self._dropped[reason] = self._dropped.get(reason, 0) + count
            first = not self._drop_logged
            self._drop_logged = True
        if first:
            logger.warning(
                "skewtrace: dropping events (%s; buffer of %d events); further drops are "
                "counted in the skewtrace.events.dropped metric, not logged",
                reason,
                self.capacity,
            )

    def dropped(self) -> dict[str, int]:
        with self._drop_lock:
            return dict(self._dropped)

    def mark_activity(self, start_ns: int) -> None:
        """The first timed event of the first step opens it."""
        if self.step_start_ns is None:
            self.step_start_ns = start_ns

    def end_step(self, end_ns: int) -> None:
        """Close the current train.step at ``end_ns`` (the end of optimizer.step)."""
        start = self.step_start_ns if self.step_start_ns is not None else end_ns
        self.record((STEP, self.step, start, end_ns))
        self.step_ends.append((self.step, end_ns))
        self.step += 1
        self.step_start_ns = end_ns

    def drain(self, limit: int) -> list[RawEvent]:
        """Take up to ``limit`` events, oldest first (consumer side only)."""
        events = self.events
        taken: list[RawEvent] = []
        append = taken.append
        popleft = events.popleft
        for _ in range(min(limit, len(events))):
            try:
                append(popleft())
            except IndexError:
                break
        return taken
