"""Bounds on what clients can make the pacer keep, count and log.

- :data:`MAX_VALUE_LENGTH`: the longest job id (or rank text) the pacer keeps, on both inputs.
- :func:`loggable`: how client-supplied text appears in a log line (a short, escaped repr).
- :class:`LogBudget`: at most ``burst`` lines per message per interval, then one line saying
  how many were held back, so a client cannot make the log grow faster than that.
- :class:`ReasonCounts`: thread-safe counters by reason, read by ``/healthz`` and the
  pacer's own metrics alike.
- :class:`IngestCounters`: what happened to the data points received (taken, not read,
  dropped by reason: over a bound among them); kept in the windows, under their lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

MAX_VALUE_LENGTH = 256
"""Characters in a job id (or a rank's text); longer ones are refused over HTTP and OTLP."""

_LOGGABLE_CHARS = 64


def loggable(text: str, limit: int = _LOGGABLE_CHARS) -> str:
    """``repr(text)`` cut to about ``limit`` characters, with the full length when cut.

    ``repr`` escapes newlines and control characters, so client text cannot forge log lines.
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"


class LogBudget:
    """Lets each message template through at most ``burst`` times per ``interval_s``.

    The first line after a held-back stretch says how many were held. Keyed by the template
    (not the formatted text), so distinct client-supplied values share one budget.
    """

    def __init__(
        self,
        burst: int = 20,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # template -> [start of the current interval, lines passed in it, lines held back]
        self._state: dict[str, list[float]] = {}

    def log(
        self,
        logger: logging.Logger,
        level: int,
        msg: str,
        *args: object,
        exc_info: bool = False,
        burst: int | None = None,
    ) -> bool:
        """Log ``msg % args`` unless this template has spent its budget; True when logged.

        ``burst`` overrides the budget's for this template (1: once per interval).
        """
        if not logger.isEnabledFor(level):
            return False
        now = self._clock()
        with self._lock:
            state = self._state.get(msg)
            if state is None or now - state[0] >= self._interval_s:
                held = int(state[2]) if state is not None else 0
                if len(self._state) > 256:  # templates are a handful; never grows with clients
                    self._state.clear()
                state = self._state[msg] = [now, 0, 0]
            else:
                held = 0
            if state[1] >= (self._burst if burst is None else burst):
                state[2] += 1
                return False
            state[1] += 1
        if held:
            msg = f"{msg} [{held} similar lines held back]"
        logger.log(level, msg, *args, exc_info=exc_info)
        return True


class ReasonCounts:
    """Counts by reason; safe to add to from server threads."""

    def __init__(self, *reasons: str) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter({reason: 0 for reason in reasons})

    def add(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] += n

    def get(self, reason: str) -> int:
        with self._lock:
            return self._counts[reason]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@dataclass
class IngestCounters:
    """What happened to the data points received; exposed at ``/healthz`` and in logs."""

    points_accepted: int = 0
    points_unused: int = 0
    """Known metrics the policy does not read (skew, straggler, clock offset, ...)."""
    points_unknown_metric: int = 0
    points_invalid: int = 0
    """Missing job or rank, wrong type, NaN or negative sums, unsupported temporality."""
    points_too_long: int = 0
    """A job id or rank longer than ``MAX_VALUE_LENGTH`` characters."""
    points_over_job_limit: int = 0
    """Points of jobs beyond ``max_jobs``."""
    points_over_rank_limit: int = 0
    """Points of ranks beyond ``max_ranks_per_job``."""
    points_over_series_limit: int = 0
    """Points of series beyond ``max_series_per_job`` (or ``max_series`` in all)."""
    resets: int = 0
    """Cumulative series that restarted (start time changed or count went down)."""
    step_starts_invalid: int = 0
    """Step ages reported by ranks with their polls that were not a finite number of seconds
    in [0, ``MAX_STEP_AGE_S``] (ignored; the poll is answered)."""

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def rejected(self) -> dict[str, int]:
        """Points dropped (and reported back as rejected), by reason."""
        return {
            REJECTED_INVALID: self.points_invalid,
            REJECTED_TOO_LONG: self.points_too_long,
            REJECTED_JOB_LIMIT: self.points_over_job_limit,
            REJECTED_RANK_LIMIT: self.points_over_rank_limit,
            REJECTED_SERIES_LIMIT: self.points_over_series_limit,
        }


REJECTED_INVALID = "invalid"
REJECTED_TOO_LONG = "too_long"
REJECTED_JOB_LIMIT = "job_limit"
REJECTED_RANK_LIMIT = "rank_limit"
REJECTED_SERIES_LIMIT = "series_limit"
