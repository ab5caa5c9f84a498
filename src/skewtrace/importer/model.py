"""What both readers produce: each rank's identity and the events its hooks would have recorded.

An :class:`ImportedJob` holds one :class:`RankInput` per (job, rank): the resource keys and
the rank's :mod:`skewtrace.rank._events` (phases, steps, collectives) with epoch-nanosecond times.
The rules both readers share live here too: the op names (from :mod:`skewtrace.semconv`),
derived sequence numbers, a ``train.step`` for a step that has none, and placing traces
recorded on a clock of their own on the epoch.

Problems with the input are collected in :class:`Problems` (each naming its file and line, or
event and field) and raised together as :class:`InputErrors`, so one run shows every mistake
up to a limit and nothing is sent.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from skewtrace import semconv
from skewtrace.rank._events import CollectiveEvent, Event, PhaseEvent, StepEvent

PHASES: tuple[str, ...] = (
    semconv.SPAN_DATALOADER_FETCH,
    semconv.SPAN_FORWARD,
    semconv.SPAN_BACKWARD,
    semconv.SPAN_OPTIMIZER_STEP,
    semconv.SPAN_STEP,
)
"""The phase span names an input may name (``train.step`` included)."""

COLLECTIVE_OPS: frozenset[str] = frozenset(
    value
    for name, value in vars(semconv).items()
    if name.startswith("OP_") and value != semconv.OP_SEND_RECV
)
"""The ``training.collective.op`` values a rank emits (``send_recv`` is the Collector's own)."""

P2P_OPS: frozenset[str] = frozenset((semconv.OP_SEND, semconv.OP_RECV))

SEQ_STRIDE = 1_000_000
"""A derived sequence number is ``step * SEQ_STRIDE + n`` (the n-th call of its group, or the
n-th message of its pair, in the step): equal on every member when they made the same calls
in each step, and a rank whose trace starts a step later or lost a row shifts nothing
outside that step."""

RELATIVE_BEFORE_NS = 1_000_000_000 * 1_000_000_000
"""Times that all end before this (2001-09-09 as epoch nanoseconds) are taken as measured
from an origin of their own (a monotonic clock, the job's start) and moved so that the
latest ends at the time of the import."""

MAX_PROBLEMS = 20
"""Problems reported before reading stops."""


class InputErrors(Exception):
    """The input cannot be imported; ``problems`` name where (nothing was sent)."""

    def __init__(self, problems: list[str], truncated: bool = False) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        self.truncated = truncated


class Problems:
    """Problems found so far; :meth:`add` raises once :data:`MAX_PROBLEMS` are in."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.found.append(f"{where}: {message}")
        if len(self.found) >= MAX_PROBLEMS:
            raise InputErrors(self.found, truncated=True)

    def check(self) -> None:
        if self.found:
            raise InputErrors(self.found)


@dataclass
class RankInput:
    """One rank of one job: its resource keys and its events."""

    job: str
    rank: int
    world_size: int
    host: str = semconv.UNKNOWN
    switch: str = semconv.UNKNOWN
    nic: str = semconv.UNKNOWN
    events: list[Event] = field(default_factory=list)
    attributes: dict[str, str | int] = field(default_factory=dict)
    """More resource attributes of the rank (a what-if worker's identity:
    ``training.worker.first_gpu``, ...); the training keys above win over them."""

    def steps(self) -> set[int]:
        return {event.step for event in self.events}


@dataclass
class ImportedJob:
    """Everything read from the input, checked and ready to become spans."""

    ranks: dict[tuple[str, int], RankInput] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What was left out or assumed, one line each (printed as warnings)."""

    def jobs(self) -> list[str]:
        return sorted({job for job, _ in self.ranks})

    def steps_with_collectives(self, job: str) -> set[int]:
        """The steps of ``job`` the Collector writes a summary for."""
        return {
            event.step
            for (j, _), rank in self.ranks.items()
            if j == job
            for event in rank.events
            if isinstance(event, CollectiveEvent)
        }

    def counts(self) -> tuple[int, int, int]:
        """(ranks, steps, events) over all jobs."""
        steps = {(job, step) for (job, _), rank in self.ranks.items() for step in rank.steps()}
        return len(self.ranks), len(steps), sum(len(r.events) for r in self.ranks.values())


def derived_seq(step: int, index: int) -> int:
    """The sequence number of the ``index``-th call (from 0) of a group in ``step``."""
    return step * SEQ_STRIDE + index


def add_missing_steps(rank: RankInput) -> int:
    """A ``train.step`` for each step of the rank that has spans but none: as the live
    instrumentation measures it, from the end of the rank's previous step (when that step is
    there and ended before this one's first span) to the end of its last span. Returns how
    many were added."""
    spans: dict[int, tuple[int, int]] = {}
    given: dict[int, StepEvent] = {}
    for event in rank.events:
        if isinstance(event, StepEvent):
            given[event.step] = event
            continue
        low, high = spans.get(event.step, (event.start_ns, event.end_ns))
        spans[event.step] = (min(low, event.start_ns), max(high, event.end_ns))
    added = 0
    ends: dict[int, int] = {step: event.end_ns for step, event in given.items()}
    for step in sorted(spans):
        if step in given:
            continue
        start, end = spans[step]
        previous = ends.get(step - 1)
        if previous is not None and previous <= start:
            start = previous
        rank.events.append(StepEvent(step, start, end))
        ends[step] = end
        added += 1
    return added


def place_on_epoch(ranks: Iterable[RankInput], now_ns: int | None = None) -> bool:
    """Move times measured from an origin of their own (all ending before
    :data:`RELATIVE_BEFORE_NS`) so that the latest ends now; one shift for all ranks, so
    their times stay comparable. Returns whether they were moved."""
    ranks = list(ranks)
    latest = max((event.end_ns for rank in ranks for event in rank.events), default=0)
    if latest >= RELATIVE_BEFORE_NS or latest == 0:
        return False
    shift = (time.time_ns() if now_ns is None else now_ns) - latest
    for rank in ranks:
        rank.events = [_shifted(event, shift) for event in rank.events]
    return True


def _shifted(event: Event, shift: int) -> Event:
    if isinstance(event, (PhaseEvent, StepEvent, CollectiveEvent)):
        return event._replace(start_ns=event.start_ns + shift, end_ns=event.end_ns + shift)
    raise TypeError(f"unexpected event {event!r}")


def local_ranks(ranks: Iterable[RankInput]) -> dict[tuple[str, int], int]:
    """Each rank's position among the ranks of its job on its host; with the host unknown,
    the rank itself (as the instrumentation assumes without ``LOCAL_RANK``)."""
    by_host: dict[tuple[str, str], list[int]] = defaultdict(list)
    for rank in ranks:
        by_host[(rank.job, rank.host)].append(rank.rank)
    out: dict[tuple[str, int], int] = {}
    for (job, host), members in by_host.items():
        for position, member in enumerate(sorted(members)):
            out[(job, member)] = member if host == semconv.UNKNOWN else position
    return out
