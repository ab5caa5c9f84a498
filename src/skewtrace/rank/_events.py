"""The events the hooks record: one ``NamedTuple`` per kind, the only place their fields are named.

On the hot path an event is a plain tuple: an integer kind (``PHASE``, ``STEP``,
``COLLECTIVE``, ``PACING``, ``CHECKPOINT``) and then the fields of that kind's class in order, e.g.
``(PHASE, name, step, start_ns, end_ns, timing, cuda_handle, input_size)``. Building the NamedTuple
itself there would cost more per event (``tuple.__new__`` about 0.1 us, the class call
about 0.3 us), and so would a head that is the class object (a tuple holding only ints,
strings and None is untracked by the garbage collector; one holding a class is not);
``benchmarks/overhead.py`` prints the figures. The export thread turns each raw tuple into
its NamedTuple with :func:`typed` (which checks the field count) and reads it by field name.
Adding a field is a line here, the hook that fills it and the materializer line that reads
it.

Times are ``time.perf_counter_ns()`` values; the materializer converts them to epoch
nanoseconds with one anchor taken when the recorder is created, so durations never see wall
clock steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class PhaseEvent(NamedTuple):
    """``dataloader.fetch``, ``forward``, ``backward`` or ``optimizer.step``."""

    name: str
    """The span name (a ``semconv.SPAN_*`` constant)."""
    step: int
    start_ns: int
    end_ns: int
    timing: str | None
    """``semconv.TIMING_HOST``, or None where the attribute is left out."""
    cuda_handle: int | None
    """The CUDA event pair timing it (``CudaEventTimer`` handle), None on the host."""
    input_size: int | None = None
    """``forward``: the elements of the tensors the call received (``training.input.size``);
    None for other phases and for a call that received no tensor."""
    balance: tuple[str, int, int] | None = None
    """``dataloader.fetch`` of a batch from a work-balanced sampler: (``training.balance.mode``,
    ``training.balance.version``, ``training.balance.cost_version``); None otherwise. Optional
    in a raw event: the hooks that never fill it record the fields before it only."""


class StepEvent(NamedTuple):
    """One ``train.step``: from the previous step's end to the end of ``optimizer.step``."""

    step: int
    start_ns: int
    end_ns: int


class CollectiveEvent(NamedTuple):
    """One collective call, or one DDP gradient bucket."""

    step: int
    start_ns: int
    end_ns: int
    op: str
    pg: str
    """The process group's name (``default`` for the world group)."""
    pg_size: int
    seq: int
    """The group's sequence number: the same on every member for the same call."""
    nbytes: int
    is_async: bool
    source: str
    """``api`` (a ``torch.distributed`` function) or ``ddp`` (a gradient bucket)."""
    timing: str
    cuda_handle: int | None
    peer: int | None = None
    """The other rank (global) of a point-to-point ``send``/``recv``, None for collectives."""


class PacingEvent(NamedTuple):
    """The delay the pacer asked for, as it was applied."""

    step: int
    start_ns: int
    end_ns: int
    delay_s: float
    version: int


class CheckpointEvent(NamedTuple):
    """One ``torch.save`` (``checkpoint.save``) or ``torch.load`` (``checkpoint.load``)."""

    name: str
    """The span name (a ``semconv.SPAN_CHECKPOINT_*`` constant)."""
    step: int
    start_ns: int
    end_ns: int
    nbytes: int | None
    """The file's size; None for a stream, or a file not there after a failed call."""
    path_kind: str
    """``training.checkpoint.path_kind``: ``local``, ``network``, ``memory``, ``stream``, ..."""


class LayersEvent(NamedTuple):
    """One sampled step's per-layer times of the rank's model (``pipeline.layers``)."""

    step: int
    start_ns: int
    end_ns: int
    names: tuple[str, ...]
    """The model's layers (child modules), in order."""
    forward_s: tuple[float, ...]
    """Each layer's forward seconds in the step, summed over its calls."""
    backward_s: tuple[float, ...]
    """Each layer's backward seconds in the step, summed over its calls."""
    microbatches: int
    """The model's forwards in the step."""


Event = PhaseEvent | StepEvent | CollectiveEvent | PacingEvent | CheckpointEvent | LayersEvent

PHASE = 0
"""Kind of a raw :class:`PhaseEvent`."""
STEP = 1
"""Kind of a raw :class:`StepEvent`."""
COLLECTIVE = 2
"""Kind of a raw :class:`CollectiveEvent`."""
PACING = 3
"""Kind of a raw :class:`PacingEvent`."""
CHECKPOINT = 4
"""Kind of a raw :class:`CheckpointEvent`."""
LAYERS = 5
"""Kind of a raw :class:`LayersEvent`."""

EVENT_CLASSES: tuple[type[Event], ...] = (
    PhaseEvent,
    StepEvent,
    CollectiveEvent,
    PacingEvent,
    CheckpointEvent,
    LayersEvent,
)
"""The event class of each kind, indexed by kind."""

RawEvent = tuple[Any, ...]
"""What the hot path records: ``(kind, *fields)``, or an ``Event`` itself (tests, tools)."""


def typed(raw: RawEvent) -> Event:
    """The event ``raw`` stands for; raises when its kind is unknown or its field count wrong
    (fields with a default, at the end, may be left out)."""
    if type(raw) in EVENT_CLASSES:
        return raw  # type: ignore[return-value]  # already an Event
    kind = raw[0]
    if type(kind) is not int or not 0 <= kind < len(EVENT_CLASSES):
        raise ValueError(f"unknown event kind in {raw!r}")
    cls = EVENT_CLASSES[kind]
    if len(raw) - 1 == len(cls._fields):
        event: Event = cls._make(raw[1:])
    else:
        event = cls(*raw[1:])  # TypeError when a field without a default is missing
    return event
