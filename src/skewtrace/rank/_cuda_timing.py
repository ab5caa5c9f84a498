"""Device-side durations for CUDA work, without ever waiting for the GPU.

CUDA kernels run asynchronously, so clock reads around ``forward()`` on the host measure
how long it took to *launch* the work, not to do it. Here a pair of
``torch.cuda.Event(enable_timing=True)`` is recorded on the stream around the work, and a
background thread later asks the events whether they are done with the non-blocking
``query()``; only then is ``elapsed_time`` read. Nothing here calls ``synchronize()``.

Events come from a fixed pool, so memory is bounded and the hot path allocates nothing
after warm-up. When the pool is empty, :meth:`CudaEventTimer.start` returns ``None`` and
the caller keeps its host timing; the refusal is counted.

Threads: ``start``/``stop`` run on the training thread, ``poll`` on one background thread.
They share only ``collections.deque`` objects, whose ``append``/``popleft`` are atomic, so
the hot path takes no lock.

For NCCL, :func:`register_nccl_completion_hook` hands the process group's own per-work
timing to a callback where the installed torch supports it.
"""

from __future__ import annotations

import collections
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CudaEventTimer",
    "NcclWorkTiming",
    "cuda_available_for",
    "register_nccl_completion_hook",
]

_logger = logging.getLogger(__name__)


class _TimingEvent(Protocol):
    """The part of ``torch.cuda.Event`` the timer uses."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


def _torch_timing_event() -> _TimingEvent:
    import torch

    event: _TimingEvent = torch.cuda.Event(enable_timing=True)
    return event


_FREE, _STARTED, _STOPPED = 0, 1, 2


def _record(event: Any, stream: object | None) -> None:
    """Records ``event`` on ``stream``, or on the current stream when None."""
    if stream is None:
        event.record()
    else:
        event.record(stream)


class CudaEventTimer:
    """A bounded pool of CUDA event pairs, resolved later with non-blocking ``query()``.

    ``event_factory`` builds one timing event; it defaults to
    ``torch.cuda.Event(enable_timing=True)`` (tests pass a fake). Events are created on
    first use of a slot, so an idle timer costs no CUDA resources.

    Handles are unique for the life of the timer (a slot's handle changes each time the
    slot is reused), so a result from :meth:`poll` can never be mistaken for a newer
    ``start`` that got the same slot while the result was being read.
    """

    def __init__(
        self,
        pool_size: int = 4096,
        *,
        event_factory: Callable[[], _TimingEvent] | None = None,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        self._factory = event_factory or _torch_timing_event
        self._starts: list[_TimingEvent | None] = [None] * pool_size
        self._ends: list[_TimingEvent | None] = [None] * pool_size
        self._state = [_FREE] * pool_size
        self._handle = list(range(pool_size))  # slot -> its current handle
        self._free: collections.deque[int] = collections.deque(range(pool_size))
        self._stopped: collections.deque[int] = collections.deque()
        self._pending: list[int] = []  # slots, owned by the polling thread
        self.pool_size = pool_size
        self.exhausted = 0
        """``start`` calls refused because every pair was in flight (host timing used)."""
        self.failed = 0
        """Pairs whose events raised (a CUDA error); their duration is lost."""
        self.misused = 0
        """``stop``/``discard`` calls with a handle that was not started."""

    def _release(self, slot: int) -> None:
        self._state[slot] = _FREE
        self._handle[slot] += self.pool_size  # the next user of the slot gets a new handle
        self._free.append(slot)

    def _started_slot(self, handle: int) -> int | None:
        slot = handle % self.pool_size
        if handle < 0 or self._handle[slot] != handle or self._state[slot] != _STARTED:
            self.misused += 1
            return None
        return slot

    def start(self, stream: object | None = None) -> int | None:
        """Record a start event on ``stream`` (default: the current stream).

        Returns a handle for :meth:`stop`, or ``None`` when the pool is exhausted or the
        event could not be recorded; the caller then times on the host.
        """
        try:
            # LIFO: the slot freed last is reused first, so a timer with few pairs in
            # flight creates few CUDA events however large the pool is.
            slot = self._free.pop()
        except IndexError:
            self.exhausted += 1
            return None
        try:
            event = self._starts[slot]
            if event is None:
                event, end_event = self._factory(), self._factory()
                self._starts[slot], self._ends[slot] = event, end_event
            _record(event, stream)
        except Exception as error:
            self.failed += 1
            self._release(slot)
            _logger.debug("skewtrace: CUDA start event failed: %r", error)
            return None
        self._state[slot] = _STARTED
        return self._handle[slot]

    def stop(self, handle: int, stream: object | None = None) -> None:
        """Record the end event of ``handle`` on ``stream``; :meth:`poll` resolves it."""
        slot = self._started_slot(handle)
        if slot is None:
            return
        event = self._ends[slot]
        try:
            assert event is not None  # created together with the start event
            _record(event, stream)
        except Exception as error:
            self.failed += 1
            self._release(slot)
            _logger.debug("skewtrace: CUDA end event failed: %r", error)
            return
        self._state[slot] = _STOPPED
        self._stopped.append(slot)

    def discard(self, handle: int) -> None:
        """Give back a started handle whose work will not be stopped (an exception in
        forward, say); without this the slot would be lost for good."""
        slot = self._started_slot(handle)
        if slot is not None:
            self._release(slot)

    @property
    def in_flight(self) -> int:
        """Pairs handed out and not yet resolved or discarded."""
        return self.pool_size - len(self._free)

    def poll(self) -> list[tuple[int, float]]:
        """(handle, elapsed seconds) for every stopped pair whose events both completed.

        Uses ``query()`` only, so it never waits for the GPU; pairs still running stay
        pending for the next call. Resolved slots go back to the pool. Call from one
        thread at a time.
        """
        while True:
            try:
                self._pending.append(self._stopped.popleft())
            except IndexError:
                break
        resolved: list[tuple[int, float]] = []
        still_running: list[int] = []
        for slot in self._pending:
            start, end = self._starts[slot], self._ends[slot]
            assert start is not None and end is not None
            try:
                # Start and end may sit on different streams: both must report done
                # before elapsed_time may be read.
                if not (end.query() and start.query()):
                    still_running.append(slot)
                    continue
                elapsed = start.elapsed_time(end) / 1000.0  # milliseconds
            except Exception as error:
                self.failed += 1
                _logger.debug("skewtrace: CUDA event pair %d failed: %r", slot, error)
            else:
                resolved.append((self._handle[slot], elapsed))
            self._release(slot)
        self._pending = still_running
        return resolved


def cuda_available_for(module_or_tensor: object) -> bool:
    """True when CUDA works here and ``module_or_tensor`` (a tensor or a module with
    parameters or buffers) lives on a CUDA device. Never raises; never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if not torch.cuda.is_available():
            return False
        if isinstance(module_or_tensor, torch.Tensor):
            return bool(module_or_tensor.is_cuda)
        if isinstance(module_or_tensor, torch.nn.Module):
            for tensor in module_or_tensor.parameters():
                return bool(tensor.is_cuda)
            for tensor in module_or_tensor.buffers():
                return bool(tensor.is_cuda)
    except Exception as error:
        _logger.debug("skewtrace: cannot tell the device of %r: %r", type(module_or_tensor), error)
    return False


# --------------------------------------------------------------------------------------
# NCCL completion hook


@dataclass(frozen=True)
class NcclWorkTiming:
    """One finished NCCL work item, as ``ProcessGroup._register_on_completion_hook``
    reports it. Times are seconds."""

    op_type: str
    """c10d's ``OpType`` name: ``ALLREDUCE``, ``ALLGATHER``, ``_ALLGATHER_BASE``, ..."""

    seq: int
    """The NCCL process group's own sequence number of the work."""

    started: float
    """When the collective was called, on the steady clock (comparable with
    ``time.monotonic()`` on Linux)."""

    finished: float
    """When the watchdog saw it complete (can lag the real end), same clock."""

    active_duration: float
    """Launch to completion on the GPU, measured by CUDA events; the figure to use."""


def _seconds(value: Any) -> float:
    # pybind11 hands steady_clock time points and durations to Python as timedelta.
    total_seconds = getattr(value, "total_seconds", None)
    return float(total_seconds()) if total_seconds is not None else float(value)


def _nccl_backend_name(pg: Any) -> str | None:
    try:
        import torch.distributed as dist

        return str(dist.get_backend(pg))
    except Exception:
        pass
    # A group c10d does not know by handle (made by hand, not by new_group) still names
    # its own default backend.
    try:
        return str(pg._get_backend_name())
    except Exception:
        return None


def register_nccl_completion_hook(
    pg: object,
    callback: Callable[[NcclWorkTiming], None],
    *,
    enable_timing: bool = True,
) -> bool:
    """Call ``callback`` with an :class:`NcclWorkTiming` for every finished work of ``pg``.

    Returns False (and registers nothing) where this cannot work: the installed torch
    has no ``_register_on_completion_hook``, the group's backend is not NCCL, or the
    backend refuses it. torch 2.15's default ``nccl`` backend is the torchcomms-based
    "nccl2", which only offers completion hooks to C++ (they may not take the GIL), so
    this returns True only with the classic ProcessGroupNCCL (``TORCH_DIST_USE_NCCL2=0``
    or backend ``nccl-legacy``). Its hook needs collective timing:
    ``TORCH_NCCL_ENABLE_TIMING=1``, or ``enable_timing=True`` switches it on for this
    group. Only one such hook per group is allowed by torch.

    The callback runs on c10d's hook thread with the GIL held: keep it short. Its
    exceptions are logged, never raised into c10d.
    """
    register = getattr(pg, "_register_on_completion_hook", None)
    if register is None:
        return False
    backend = _nccl_backend_name(pg)
    if backend is None or "nccl" not in backend:
        return False

    def hook(work_info: Any) -> None:
        try:
            op_type = work_info.op_type
            callback(
                NcclWorkTiming(
                    op_type=str(getattr(op_type, "name", op_type)),
                    seq=int(work_info.seq),
                    started=_seconds(work_info.time_started),
                    finished=_seconds(work_info.time_finished),
                    active_duration=_seconds(work_info.active_duration),
                )
            )
        except Exception as error:
            _logger.debug("skewtrace: NCCL completion callback failed: %r", error)

    try:
        register(hook)
        return True
    except Exception as first_error:
        # The classic backend refuses the hook unless collective timing is on.
        enable = getattr(pg, "_enable_collectives_timing", None)
        if not enable_timing or enable is None or "TIMING" not in str(first_error).upper():
            _logger.debug("skewtrace: no NCCL completion hook on %s: %r", backend, first_error)
            return False
    try:
        enable()
        register(hook)
        return True
    except Exception as error:
        _logger.debug("skewtrace: no NCCL completion hook on %s: %r", backend, error)
        return False
