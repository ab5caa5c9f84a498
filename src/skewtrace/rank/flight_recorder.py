"""Collectives read from c10d's Flight Recorder instead of a Python hook per call.

c10d keeps a process-wide ring buffer, the Flight Recorder (``FlightRecorder.hpp``), of the
collectives its backends run: op (``profiling_name`` ``"<backend>:<op>"``), group (name and
description), the group's sequence number (``collective_seq_id``), input and output sizes
and dtypes, the time the entry was created (when the call enqueued the work, host clock),
and, where the backend reports it, when it started and completed and how long it took on
the device. ``torch._C._distributed_c10d._dump_fr_trace`` returns the buffer as a pickle.
This module turns each completed entry into the same ``CollectiveEvent`` the Python hooks
record, on a thread of its own: the training thread pays nothing per collective beyond what
PyTorch already does.

What this build of PyTorch records (2.15.0, CPU build, measured; ``docs/performance.md``):

- ``ProcessGroupGloo`` records every collective unconditionally (it is in
  ``distributed_c10d._FR_SELF_RECORDING_BACKENDS``), buffer ``TORCH_FR_BUFFER_SIZE`` (or
  ``TORCH_NCCL_TRACE_BUFFER_SIZE``), 2000 entries by default, 0 off. Functional collectives
  are recorded too. Point-to-point ``send``/``recv`` are not: they stay on the Python hooks.
  Gloo runs ``reduce_scatter_tensor`` as an all-reduce and records it as ``gloo:all_reduce``
  (the span says ``all_reduce``), and a list ``reduce_scatter`` as one all-reduce per input
  (so c10d's sequence numbers advance by more than one for that call).
- Gloo entries stay ``state: scheduled`` with no start, completion or duration: gloo's works
  have no ``getDuration`` and no completion hook, and ``TORCH_NCCL_ENABLE_TIMING`` changes
  nothing. The entry's ``retired`` flag turns true some time after the work completes. So on
  gloo the span's end is when this reader first saw the entry retired
  (``training.timing=flight_recorder_polled``): up to one poll interval late, more on a busy
  host. NCCL entries carry ``time_discovered_completed_ns`` (when its watchdog saw the work
  done: also polled, ``flight_recorder_polled``) and, with ``TORCH_NCCL_ENABLE_TIMING=1``,
  ``duration_ms``, the device's own duration: the span is then its creation plus that
  (``training.timing=flight_recorder``).
- A dump copies and pickles the whole ring while holding the GIL: about 15-20 us per entry
  in the buffer on the 2-core test machine (a 2000-entry dump stalled another Python thread
  25-40 ms). That cost is per read, whatever is new; size ``TORCH_FR_BUFFER_SIZE`` to the
  collectives issued between reads, and read only when the group status (a 5 us call) says
  something was enqueued.

Sequence numbers: ``training.collective.seq`` is c10d's ``collective_seq_id - 1`` (0 for a
group's first collective): equal on every member, counted from the group's creation where the
hooks count from ``instrument()``. Entries lost to the ring wrapping between two reads show
as gaps in a group's sequence and are counted as dropped (``flight_recorder_overwritten``).
A step is attributed by the entry's creation time against the step boundaries the recorder
keeps. The Flight Recorder does not record ``async_op``: spans read from it say
``training.collective.async=false``.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from skewtrace import semconv
from skewtrace.rank._events import COLLECTIVE
from skewtrace.rank._recorder import Recorder

logger = logging.getLogger("skewtrace")

DROP_REASON_OVERWRITTEN = "flight_recorder_overwritten"
"""Entries the ring overwrote before they were read (gaps in a group's sequence)."""
DROP_REASON_NEVER_COMPLETED = "flight_recorder_never_completed"
"""Entries still not completed when instrumentation ended, or past the pending bound."""
DROP_REASON_READ_FAILED = "flight_recorder_read_failed"

MAX_PENDING = 8192

# Backends whose entries carry a completion time (NCCL's watchdog discovers it) and, with
# TORCH_NCCL_ENABLE_TIMING=1, the device duration (``duration_ms``).
BACKENDS_WITH_COMPLETION = frozenset({"nccl", "nccl-legacy", "xccl"})
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"


def device_timing_enabled() -> bool:
    import os

    return os.environ.get(TIMING_ENV, "").strip().lower() in ("1", "true", "yes", "on")


# The op part of a profiling name -> training.collective.op. Others (split, new_window,
# coalesced markers) are skipped; point-to-point entries are skipped by is_p2p.
_OPS: dict[str, str] = {
    "all_reduce": semconv.OP_ALL_REDUCE,
    "allreduce": semconv.OP_ALL_REDUCE,
    "allreduce_coalesced": semconv.OP_ALL_REDUCE,
    "all_reduce_barrier": semconv.OP_ALL_REDUCE,
    "all_gather": semconv.OP_ALL_GATHER,
    "all_gather_single": semconv.OP_ALL_GATHER,
    "all_gather_v": semconv.OP_ALL_GATHER,
    "_all_gather_base": semconv.OP_ALL_GATHER,
    "all_gather_into_tensor_coalesced": semconv.OP_ALL_GATHER,
    "allgather_coalesced": semconv.OP_ALL_GATHER,
    "ALLGATHER_coalesced": semconv.OP_ALL_GATHER,
    "reduce_scatter": semconv.OP_REDUCE_SCATTER,
    "reduce_scatter_single": semconv.OP_REDUCE_SCATTER,
    "reduce_scatter_v": semconv.OP_REDUCE_SCATTER,
    "_reduce_scatter_base": semconv.OP_REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": semconv.OP_REDUCE_SCATTER,
    "REDUCE_SCATTER_coalesced": semconv.OP_REDUCE_SCATTER,
    "broadcast": semconv.OP_BROADCAST,
    "_broadcast_oop": semconv.OP_BROADCAST,
    "reduce": semconv.OP_REDUCE,
    "_reduce_oop": semconv.OP_REDUCE,
    "gather": semconv.OP_GATHER,
    "scatter": semconv.OP_SCATTER,
    "all_to_all": semconv.OP_ALL_TO_ALL,
    "all_to_all_single": semconv.OP_ALL_TO_ALL,
    "all_to_all_v_single": semconv.OP_ALL_TO_ALL,
    "barrier": semconv.OP_BARRIER,
}

# c10::ScalarType names (as the dump spells them) -> bytes per element.
_ITEMSIZE: dict[str, int] = {
    "Byte": 1, "Char": 1, "Bool": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2,
    "Float": 4, "Double": 8, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "BFloat16": 2, "UInt16": 2, "UInt32": 4, "UInt64": 8, "Float8_e5m2": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1,
    "QInt8": 1, "QUInt8": 1, "QInt32": 4,
}  # fmt: skip


class FrEntry(NamedTuple):
    """One Flight Recorder entry, as much of it as a span needs."""

    pg_name: str
    """c10d's group name (``"0"`` for the world group)."""
    pg_desc: str
    backend: str
    op: str
    seq: int
    """``collective_seq_id`` (1 for a group's first collective)."""
    nbytes: int
    created_ns: int
    """Epoch nanoseconds, host clock."""
    completed_ns: int | None
    """Epoch nanoseconds, when the backend saw it complete; None where it does not say."""
    retired: bool
    duration_ms: float | None
    pg_id: int = -1
    """c10d's id of the group in the recorder (the key of the dump's ``pg_status``)."""


def _numel(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def entry_bytes(sizes: Any, dtypes: Any) -> int:
    """Bytes of the inputs: each tensor's elements times its dtype's size (4 if unknown)."""
    total = 0
    dtypes = list(dtypes or [])
    for i, dims in enumerate(sizes or []):
        itemsize = _ITEMSIZE.get(str(dtypes[i]) if i < len(dtypes) else "", 4)
        total += _numel(dims) * itemsize
    return total


def parse_entry(raw: Mapping[str, Any]) -> FrEntry | None:
    """The entry ``raw`` (one dict of a dump's ``entries``, pickle or JSON form) as a
    collective; None for point-to-point and for ops that are not collectives."""
    if raw.get("is_p2p"):
        return None
    backend, _, name = str(raw.get("profiling_name", "")).rpartition(":")
    op = _OPS.get(name.split(" ", 1)[0])
    if op is None:
        return None
    pg = raw.get("process_group") or ("", "")
    completed = raw.get("time_discovered_completed_ns") or None
    duration = raw.get("duration_ms")
    return FrEntry(
        pg_name=str(pg[0]),
        pg_desc=str(pg[1]) if len(pg) > 1 else "",
        backend=backend,
        op=op,
        seq=int(raw.get("collective_seq_id", 0)),
        nbytes=entry_bytes(raw.get("input_sizes"), raw.get("input_dtypes")),
        created_ns=int(raw.get("time_created_ns", 0)),
        completed_ns=int(completed) if completed else None,
        retired=bool(raw.get("retired", False)) or raw.get("state") == "completed",
        duration_ms=float(duration) if duration is not None else None,
        pg_id=int(raw.get("pg_id", -1)),
    )


def parse_dump(dump: bytes | Mapping[str, Any]) -> list[FrEntry]:
    """Every collective of a dump (``_dump_fr_trace``'s pickle, or its loaded dict)."""
    data = pickle.loads(dump) if isinstance(dump, (bytes, bytearray)) else dump
    out = []
    for raw in data.get("entries", []) or []:
        entry = parse_entry(raw)
        if entry is not None:
            out.append(entry)
    return out


# -- what the installed PyTorch offers ----------------------------------------------------


def api() -> Any | None:
    """``torch._C._distributed_c10d`` if it can dump the Flight Recorder, else None."""
    try:
        from torch._C import _distributed_c10d as c10d_c
    except ImportError:
        return None
    if not hasattr(c10d_c, "_dump_fr_trace"):
        return None
    return c10d_c


def buffer_size() -> int:
    """The ring's size as c10d reads it (first variable set wins; 2000 if neither)."""
    import os

    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(var, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                return 2000
    return 2000


def group_backends(pg: Any) -> list[str]:
    """The backend names serving ``pg`` (``["gloo"]``, ``["nccl"]``, ...)."""
    import torch.distributed.distributed_c10d as c10d

    try:
        config = c10d._world.pg_backend_config.get(pg)
        if config:
            # "cpu:gloo,cuda:nccl" or "gloo"
            names = [part.split(":")[-1] for part in str(config).split(",")]
            return sorted({n for n in names if n})
    except Exception:
        pass
    try:
        return [str(c10d.get_backend(pg))]
    except Exception:
        return []


def self_recording(backend: str) -> bool:
    """Whether ``backend`` writes its collectives to the Flight Recorder by itself."""
    import torch.distributed.distributed_c10d as c10d

    known = getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if known is None:
        return False
    return backend in {str(b) for b in known}


def covers(pg: Any, mode: str) -> bool:
    """Whether collectives of ``pg`` are read from the Flight Recorder under ``mode``
    (``auto``: where every backend of the group records itself *and* reports each
    collective's device duration, NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``;
    ``flight_recorder``: wherever every backend records itself)."""
    if mode not in ("auto", "flight_recorder") or api() is None or buffer_size() <= 0:
        return False
    backends = group_backends(pg)
    if not backends or not all(self_recording(b) for b in backends):
        return False
    if mode == "auto":
        return device_timing_enabled() and all(b in BACKENDS_WITH_COMPLETION for b in backends)
    return True


# -- the reader ---------------------------------------------------------------------------


class GroupInfo(NamedTuple):
    name: str
    size: int


class FlightRecorderReader:
    """Reads new completed entries every ``interval_s`` on its own daemon thread and records
    each as a ``CollectiveEvent``.

    ``resolve_group(pg_name)`` gives the span's group name and size for c10d's group name,
    or None when the group is not one this reader covers (its collectives are on the hooks,
    or this rank is not in it). Never raises into the caller; a read that fails is counted.
    """

    def __init__(
        self,
        recorder: Recorder,
        resolve_group: Callable[[str], GroupInfo | None],
        interval_s: float = 0.05,
        backends: Iterable[str] = ("gloo", "nccl"),
        c10d_c: Any | None = None,
    ) -> None:
        self.recorder = recorder
        self.resolve_group = resolve_group
        self.interval_s = interval_s
        self._api = c10d_c if c10d_c is not None else api()
        self.backends = tuple(backends)
        # Per (backend, c10d group name): the highest sequence number recorded or skipped,
        # and the entries seen but not complete yet (seq -> entry).
        self._done: dict[tuple[str, str], int] = {}
        self._pending: dict[tuple[str, str], dict[int, FrEntry]] = {}
        self._last_status: dict[str, Any] = {}
        # Entries created before this are not ours: the ring is process-wide and outlives
        # groups (a group made later may reuse a destroyed one's name and numbers).
        self.since_ns = time.time_ns()
        # Each group's last enqueued sequence number when reading began: entries after it
        # that the ring overwrote before the first read are counted as lost too.
        self._baseline: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failed_logged = False
        self.reads = 0
        self.recorded = 0
        self.read_ns = 0

    # -- lifecycle ------------------------------------------------------------------------
    def _snapshot(self) -> None:
        baseline: dict[tuple[str, int], int] = {}
        for backend in self.backends:
            try:
                data = pickle.loads(self._api._dump_fr_trace(False, False, False, backend))  # type: ignore[union-attr]
                for pg_id, status in (data.get("pg_status") or {}).items():
                    baseline[(backend, int(pg_id))] = int(status["last_enqueued_collective"])
            except Exception:
                continue
        self._baseline = baseline

    def start(self) -> None:
        if self._thread is not None or self._api is None:
            return
        self._snapshot()
        self._thread = threading.Thread(
            target=self._run, name="skewtrace-flight-recorder", daemon=True
        )
        self._thread.start()

    def drain(self, timeout_s: float = 0.5) -> None:
        """Read until nothing is in flight (gloo retires an entry a little after its work
        completes), for at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self.poll(final=True)
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(min(self.interval_s, 0.01))
            self.poll(final=True)

    def forget_groups(self) -> None:
        """Groups are going (``destroy_process_group``): what is read next is of new ones."""
        with self._lock:
            left = sum(len(p) for p in self._pending.values())
            self._pending.clear()
            self._done.clear()
            self.since_ns = time.time_ns()
            if self._api is not None:
                self._snapshot()
        if left:
            self.recorder.count_drop(DROP_REASON_NEVER_COMPLETED, left)

    def in_flight(self) -> int:
        with self._lock:
            return sum(len(p) for p in self._pending.values())

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread, read one last time, count what never completed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.drain()
        with self._lock:
            left = sum(len(p) for p in self._pending.values())
            self._pending.clear()
        if left:
            self.recorder.count_drop(DROP_REASON_NEVER_COMPLETED, left)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    # -- reading --------------------------------------------------------------------------
    def _status_changed(self, backend: str) -> bool:
        """Cheap check (group status only, a few us): anything enqueued or completed since
        the last read, or entries still pending?"""
        try:
            status = pickle.loads(self._api._dump_fr_trace(False, False, False, backend))  # type: ignore[union-attr]
            status = status.get("pg_status")
        except Exception:
            return True
        if status == self._last_status.get(backend):
            return any(k[0] == backend and v for k, v in self._pending.items())
        self._last_status[backend] = status
        return True

    def poll(self, final: bool = False) -> int:
        """One read of every backend; returns the events recorded. Never raises."""
        if self._api is None:
            return 0
        recorded = 0
        with self._lock:
            for backend in self.backends:
                try:
                    if not final and not self._status_changed(backend):
                        continue
                    t0 = time.perf_counter_ns()
                    dump = self._api._dump_fr_trace(True, False, False, backend)
                    self.read_ns += time.perf_counter_ns() - t0
                    self.reads += 1
                    recorded += self._take(parse_dump(dump), time.time_ns())
                except Exception:
                    self.recorder.count_drop(DROP_REASON_READ_FAILED)
                    if not self._failed_logged:
                        self._failed_logged = True
                        logger.warning(
                            "skewtrace: reading the Flight Recorder (%s) failed; collectives "
                            "read from it may be missing",
                            backend,
                            exc_info=True,
                        )
        self.recorded += recorded
        return recorded

    def _take(self, entries: list[FrEntry], now_epoch_ns: int) -> int:
        """Record the entries that completed; keep the ones in flight; count gaps."""
        recorder = self.recorder
        by_group: dict[tuple[str, str], list[FrEntry]] = {}
        since = self.since_ns
        for e in entries:
            if e.created_ns < since:
                continue
            by_group.setdefault((e.backend, e.pg_name), []).append(e)
        recorded = 0
        for key, group_entries in by_group.items():
            info = self.resolve_group(key[1])
            if info is None:
                continue
            done = self._done.get(key)
            pending = self._pending.setdefault(key, {})
            group_entries.sort(key=lambda e: e.seq)
            if done is None:
                # First read of this group: it had enqueued this many when reading began (a
                # group made since: none); entries older than that are not ours.
                first = group_entries[0]
                done = self._baseline.get((first.backend, first.pg_id), 0)
                if done >= first.seq:  # enqueued between the snapshot's two reads
                    done = first.seq - 1
            expected = done + 1
            for e in group_entries:
                if e.seq <= done and e.seq not in pending:
                    continue  # already recorded
                if e.seq > expected and e.seq not in pending:
                    lost = e.seq - expected
                    if lost > 0:
                        recorder.count_drop(DROP_REASON_OVERWRITTEN, lost)
                if e.seq >= expected:
                    expected = e.seq + 1
                if e.retired or e.completed_ns is not None:
                    pending.pop(e.seq, None)
                    self._record(e, info, now_epoch_ns)
                    recorded += 1
                else:
                    pending[e.seq] = e
            # Pending entries overwritten before they completed.
            oldest = group_entries[0].seq
            for seq in [s for s in pending if s < oldest]:
                del pending[seq]
                recorder.count_drop(DROP_REASON_OVERWRITTEN)
            if len(pending) > MAX_PENDING:
                for seq in sorted(pending)[: len(pending) - MAX_PENDING]:
                    del pending[seq]
                    recorder.count_drop(DROP_REASON_NEVER_COMPLETED)
            self._done[key] = max(expected - 1, done)
        return recorded

    def _record(self, e: FrEntry, info: GroupInfo, now_epoch_ns: int) -> None:
        recorder = self.recorder
        anchor = recorder.epoch_anchor_ns
        start = e.created_ns - anchor
        if e.duration_ms is not None:
            # The device's own duration (NCCL with TORCH_NCCL_ENABLE_TIMING=1): from the
            # kernel's start, where this rank arrived on the device, to the collective's end.
            end = start + int(e.duration_ms * 1e6)
            timing = semconv.TIMING_FLIGHT_RECORDER
        else:
            # When someone saw it done: NCCL's watchdog, else (gloo) this reader.
            end_epoch = e.completed_ns if e.completed_ns is not None else now_epoch_ns
            end = max(end_epoch - anchor, start)
            timing = semconv.TIMING_FLIGHT_RECORDER_POLLED
        recorder.record(
            (
                COLLECTIVE,
                step_at(recorder, start),
                start,
                end,
                e.op,
                info.name,
                info.size,
                e.seq - 1,
                e.nbytes,
                False,
                semconv.SOURCE_API,
                timing,
                None,
                None,
            )
        )


def step_at(recorder: Recorder, perf_ns: int) -> int:
    """The step a call made at ``perf_ns`` (a ``perf_counter_ns`` value) belongs to: the
    first step whose end is after it, else the step in progress."""
    step_now = recorder.step  # before the bounds: a step ending meanwhile is then in them
    try:
        bounds = list(recorder.step_ends)
    except RuntimeError:  # the training thread appended meanwhile
        return step_now
    i = bisect_right(bounds, perf_ns, key=lambda b: b[1])
    if i < len(bounds):
        return int(bounds[i][0])
    return step_now
