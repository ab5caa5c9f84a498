"""PyTorch profiler (Kineto) traces, one Chrome-trace JSON per rank, as the ranks' events.

The files Holistic Trace Analysis reads: ``torch.profiler`` with a schedule and
``prof.step()`` each iteration, exported per rank (``export_chrome_trace``,
``tensorboard_trace_handler``; ``.json`` or ``.json.gz``). Read from each file:

- ``distributedInfo``: ``rank``, ``world_size`` (required), ``pg_config`` (the process groups
  the rank is in); ``host_name`` (``host.name``); ``baseTimeNanoseconds`` plus each event's
  ``ts`` (microseconds) is the epoch time (without it ``ts`` is taken as epoch microseconds).
- Steps: each ``ProfilerStep#N`` annotation is ``train.step`` of step N, and every other
  span belongs to the step whose window holds its start (a collective: its launch).
- ``dataloader.fetch``: each ``enumerate(DataLoader)#...`` annotation.
- ``optimizer.step``: each outermost ``Optimizer.step#...`` annotation.
- ``forward``: each outermost ``<Module>.forward`` / ``## forward ##`` annotation (DDP and
  FSDP record one); without one, from the end of the step's last fetch before its backward
  (or the step's start) to the start of its backward: one per step, and it then includes
  what ran in between (the loss, ``zero_grad``).
- ``backward``: from the first to the last ``autograd::engine::evaluate_function:`` op of
  the step (any thread), through the DDP reducer's ops that follow (its wait for the
  gradient buckets, as the live span includes it); split at the forward annotations when a
  step has several.
- Collectives: NCCL kernels that carry the collective's metadata (``Collective name``,
  ``Process Group Name``/``Description``/``Ranks``, ``Group size``, ``Seq``, ``In msg
  nelems``, ``dtype``, ``Src``/``Dst Rank``) give device times (``training.timing``
  ``cuda_event``), launched at their ``record_param_comms``; gloo's ``gloo:<op>``
  executions give the end and their ``c10d::<op>`` call the start, the asynchronous flag and
  a message's peer (with ``record_shapes=True``); ``record_param_comms`` alone gives the
  call's host time. Names map to :mod:`skewtrace.semconv`'s ops (``_allgather_base``,
  ``allgather_into_tensor_coalesced``, ``alltoall_base``... to their base op); ``wait`` and
  coalescing markers are not collectives. Without a ``Seq`` (gloo; and always for messages,
  which are numbered per sender and receiver), sequence numbers are derived per step
  (:func:`~.model.derived_seq`). A DDP bucket (an asynchronous all-reduce launched during
  backward) has ``training.collective.source`` ``ddp``.

What a trace cannot show is in ``docs/import.md`` ("What Kineto traces cannot tell").
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skewtrace import semconv
from skewtrace.importer.model import (
    COLLECTIVE_OPS,
    P2P_OPS,
    ImportedJob,
    Problems,
    RankInput,
    derived_seq,
)
from skewtrace.rank._events import CollectiveEvent, Event, PhaseEvent, StepEvent

_STEP = re.compile(r"ProfilerStep#(\d+)$")
_FETCH_PREFIX = "enumerate(DataLoader)#"
_OPTIMIZER = re.compile(r"Optimizer\.step#")
_FORWARD_SUFFIX, _FORWARD_MARK = ".forward", "## forward ##"
_BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
_DDP_REDUCER_PREFIX = "torch.distributed.ddp.reducer::"
_RECORD = "record_param_comms"
_GLOO_PREFIX, _C10D_PREFIX = "gloo:", "c10d::"
# Host-side annotations (older PyTorch wrote ProfilerStep#N as a cpu_op); never the
# gpu_user_annotation copies the profiler adds on the device's rows.
_USER = "user_annotation"
_ANNOTATIONS = frozenset((_USER, "cpu_op"))
_KERNEL = "kernel"
_COLLECTIVE_NAME = "Collective name"
_DEFAULT_PG_DESC = "default_pg"
# How far a gloo execution may start before the c10d call that queued it is seen to start
# (both are host clock reads on different threads).
_LAUNCH_SLACK_US = 1.0

# Op names -> semconv ops: underscores dropped, then these endings taken off until one
# matches (allgather_into_tensor_coalesced -> allgather -> all_gather).
_OPS_BY_KEY = {op.replace("_", ""): op for op in COLLECTIVE_OPS}
_SUFFIXES = ("coalesced", "intotensor", "tensor", "base", "single", "v")
_ANY_SOURCE = "anysource"

_DTYPE_BYTES = {
    # c10::ScalarType names (record_param_comms' dtype)
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    # C++ type names (an op's "Input type" with record_shapes)
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}


def base_op(name: str) -> str | None:
    """The semconv op of a collective's name in a trace (``gloo:all_reduce``,
    ``c10d::_allgather_base_``, ``allreduce_coalesced``), None when it is not one."""
    key = name.rsplit(":", 1)[-1].strip("_").replace("_", "").lower()
    if key.endswith(_ANY_SOURCE):
        return None  # a receive from any rank cannot be joined (nor is it traced live)
    while key not in _OPS_BY_KEY:
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key = key[: -len(suffix)]
                break
        else:
            return None
    return _OPS_BY_KEY[key]


def _dtype_bytes(name: object) -> int:
    text = str(name)
    if text.startswith("Float8"):
        return 1
    return _DTYPE_BYTES.get(text, 0)


@dataclass(frozen=True)
class _Ev:
    """One complete ("X") event of the trace."""

    index: int
    name: str
    cat: str
    ts: float
    dur: float
    tid: object
    args: dict[str, Any]

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True)
class _Group:
    name: str
    desc: str
    size: int
    ranks: tuple[int, ...] | None

    @property
    def span_name(self) -> str:
        """``training.collective.pg``: ``default`` for the world group, as the hooks name it."""
        return semconv.DEFAULT_PG_NAME if self.desc == _DEFAULT_PG_DESC else self.name


@dataclass
class _Call:
    """One collective call of the rank, before its step and sequence number are known."""

    op: str
    pg: str
    pg_size: int
    seq: int | None
    launch: float
    start: float
    end: float
    nbytes: int
    is_async: bool
    peer: int | None
    timing: str


@dataclass
class _Trace:
    """One rank's file, with the events this reader uses sorted by kind."""

    path: Path
    rank: int
    world_size: int
    host: str
    base_ns: int
    groups: list[_Group]
    steps: list[tuple[int, _Ev]] = field(default_factory=list)
    fetches: list[_Ev] = field(default_factory=list)
    optimizers: list[_Ev] = field(default_factory=list)
    forwards: list[_Ev] = field(default_factory=list)
    backward_ops: list[_Ev] = field(default_factory=list)
    reducer_ops: list[_Ev] = field(default_factory=list)
    kernels: list[_Ev] = field(default_factory=list)
    records: list[_Ev] = field(default_factory=list)
    gloo: list[_Ev] = field(default_factory=list)
    c10d: list[_Ev] = field(default_factory=list)

    def ns(self, ts_us: float) -> int:
        return self.base_ns + round(ts_us * 1000)

    def group(self, name: str) -> _Group | None:
        return next((g for g in self.groups if g.name == name), None)


# -- loading and checking ---------------------------------------------------------------------


def _load(path: Path, problems: Problems) -> dict[str, Any] | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        problems.add(str(path), getattr(exc, "strerror", None) or str(exc))
        return None
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        problems.add(f"{path}:{exc.lineno}", f"not JSON ({exc.msg} at column {exc.colno})")
        return None
    except UnicodeDecodeError as exc:
        problems.add(str(path), f"not JSON text ({exc.reason})")
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        problems.add(
            str(path),
            "field traceEvents: missing (not a PyTorch profiler trace: expected a JSON "
            "object with a traceEvents list)",
        )
        return None
    return doc


def _integer(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _groups(info: dict[str, Any], path: Path, problems: Problems) -> list[_Group]:
    raw = info.get("pg_config", [])
    if not isinstance(raw, list):
        problems.add(str(path), "field distributedInfo.pg_config: not a list")
        return []
    groups = []
    for i, entry in enumerate(raw):
        where = f"field distributedInfo.pg_config[{i}]"
        if not isinstance(entry, dict):
            problems.add(str(path), f"{where}: not an object")
            continue
        size = _integer(entry.get("pg_size"))
        ranks = entry.get("ranks")
        members = (
            tuple(int(r) for r in ranks)
            if isinstance(ranks, list) and all(_integer(r) is not None for r in ranks)
            else None
        )
        if size is None or size < 1:
            size = len(members) if members else 0
        if not size:
            problems.add(str(path), f"{where}.pg_size: missing or not a positive integer")
            continue
        groups.append(
            _Group(str(entry.get("pg_name", "")), str(entry.get("pg_desc", "")), size, members)
        )
    return groups


def _trace(path: Path, problems: Problems) -> _Trace | None:
    doc = _load(path, problems)
    if doc is None:
        return None
    info = doc.get("distributedInfo")
    if not isinstance(info, dict):
        problems.add(
            str(path),
            "field distributedInfo: missing (not the trace of a distributed job: "
            "torch.distributed must be initialized while profiling)",
        )
        return None
    rank, world = _integer(info.get("rank")), _integer(info.get("world_size"))
    for key, value in (("rank", rank), ("world_size", world)):
        if value is None or value < 0:
            problems.add(str(path), f"field distributedInfo.{key}: missing or not an integer")
    if rank is None or world is None or rank < 0 or world < 0:
        return None
    if rank >= world:
        problems.add(str(path), f"field distributedInfo.rank: {rank} is outside world {world}")
        return None
    base = doc.get("baseTimeNanoseconds", 0)
    if _integer(base) is None:
        problems.add(str(path), "field baseTimeNanoseconds: not an integer")
        return None
    host = doc.get("host_name") or info.get("host_name")
    trace = _Trace(
        path=path,
        rank=rank,
        world_size=world,
        host=str(host) if host else semconv.UNKNOWN,
        base_ns=int(base),
        groups=_groups(info, path, problems),
    )
    _sort_events(trace, doc["traceEvents"], problems)
    if not trace.steps:
        problems.add(
            str(path),
            "no ProfilerStep#N events: profile with a torch.profiler.schedule and call "
            "prof.step() once per iteration",
        )
    return trace


def _event(raw: dict[str, Any], index: int, path: Path, problems: Problems) -> _Ev | None:
    """The complete event, with its times checked (the caller uses it)."""
    name = str(raw["name"])
    times = []
    for key in ("ts", "dur"):
        value = raw.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or (key == "dur" and value < 0)
        ):
            problems.add(
                str(path),
                f"traceEvents[{index}] ({name!r}): field {key}: "
                f"{'missing' if value is None else repr(value)} is not a "
                f"{'non-negative ' if key == 'dur' else ''}number of microseconds",
            )
            return None
        times.append(float(value))
    args = raw.get("args")
    return _Ev(
        index,
        name,
        str(raw.get("cat", "")),
        times[0],
        times[1],
        raw.get("tid"),
        args if isinstance(args, dict) else {},
    )


def _kind(name: str, cat: str, args: dict[str, Any] | None) -> str | None:
    """Which list of :class:`_Trace` an event belongs to, None for none."""
    if cat in _ANNOTATIONS:
        if _STEP.match(name):
            return "steps"
        if name.startswith(_FETCH_PREFIX):
            return "fetches"
        if _OPTIMIZER.match(name):
            return "optimizers"
        if cat == _USER and (name.endswith(_FORWARD_SUFFIX) or name == _FORWARD_MARK):
            return "forwards"
    if name.startswith(_BACKWARD_PREFIX):
        return "backward_ops"
    if name.startswith(_DDP_REDUCER_PREFIX):
        return "reducer_ops"
    meta = isinstance(args, dict) and _COLLECTIVE_NAME in args
    if cat == _KERNEL:
        return "kernels" if meta else None
    if name == _RECORD:
        return "records" if meta else None
    if name.startswith(_GLOO_PREFIX) and base_op(name):
        return "gloo"
    if name.startswith(_C10D_PREFIX) and base_op(name):
        return "c10d"
    return None


def _sort_events(trace: _Trace, events: list[Any], problems: Problems) -> None:
    for index, raw in enumerate(events):
        if not isinstance(raw, dict):
            problems.add(str(trace.path), f"traceEvents[{index}]: not an object")
            continue
        name = raw.get("name")
        if raw.get("ph") != "X" or not isinstance(name, str):
            continue
        args = raw.get("args")
        kind = _kind(name, str(raw.get("cat", "")), args if isinstance(args, dict) else None)
        if kind is None:
            continue
        event = _event(raw, index, trace.path, problems)
        if event is None:
            continue
        if kind == "steps":
            match = _STEP.match(name)
            assert match is not None
            trace.steps.append((int(match.group(1)), event))
        elif kind in ("records", "kernels") and base_op(str(event.args[_COLLECTIVE_NAME])) is None:
            continue  # wait, coalescing markers
        else:
            getattr(trace, kind).append(event)
    for kind in ("fetches", "optimizers", "forwards", "backward_ops", "reducer_ops"):
        getattr(trace, kind).sort(key=lambda e: e.ts)
    for kind in ("kernels", "records", "gloo", "c10d"):
        getattr(trace, kind).sort(key=lambda e: (e.ts, e.index))
    trace.steps.sort(key=lambda item: item[1].ts)
    seen: dict[int, int] = {}
    for number, event in trace.steps:
        if number in seen:
            problems.add(
                str(trace.path),
                f"traceEvents[{event.index}] (ProfilerStep#{number}): step {number} again "
                f"(also traceEvents[{seen[number]}])",
            )
        seen[number] = event.index


# -- phases -------------------------------------------------------------------------------------


def _outermost(events: Iterable[_Ev]) -> list[_Ev]:
    """The events not inside an earlier one of the list (a wrapper's nested annotation)."""
    kept: list[_Ev] = []
    for event in sorted(events, key=lambda e: (e.ts, -e.dur)):
        if kept and event.ts >= kept[-1].ts and event.end <= kept[-1].end:
            continue
        kept.append(event)
    return kept


def _in(events: list[_Ev], low: float, high: float) -> list[_Ev]:
    """The events (sorted by start) that start in [low, high)."""
    starts = [e.ts for e in events]
    return events[bisect.bisect_left(starts, low) : bisect.bisect_left(starts, high)]


@dataclass
class _StepPhases:
    events: list[Event]
    backward: list[tuple[float, float]]
    """The backward windows (microseconds), for telling DDP buckets."""


def _phases(trace: _Trace, number: int, window: _Ev) -> _StepPhases:
    low, high = window.ts, window.end
    ns = trace.ns
    events: list[Event] = [StepEvent(number, ns(low), ns(high))]
    fetches = _outermost(_in(trace.fetches, low, high))
    for fetch in fetches:
        events.append(
            PhaseEvent(
                semconv.SPAN_DATALOADER_FETCH, number, ns(fetch.ts), ns(fetch.end), None, None
            )
        )
    for opt in _outermost(_in(trace.optimizers, low, high)):
        events.append(
            PhaseEvent(semconv.SPAN_OPTIMIZER_STEP, number, ns(opt.ts), ns(opt.end), None, None)
        )
    forwards = _outermost(_in(trace.forwards, low, high))
    backward_ops = _in(trace.backward_ops, low, high)
    # Backward passes: split at each forward annotation after the first.
    bounds = [f.ts for f in forwards[1:]] + [high]
    passes: list[tuple[float, float]] = []
    start = low
    for bound in bounds:
        ops = [op for op in backward_ops if start <= op.ts < bound]
        if ops:
            first, last = ops[0].ts, max(op.end for op in ops)
            reducer = [r.end for r in _in(trace.reducer_ops, first, bound)]
            passes.append((first, max([last, *reducer])))
        start = bound
    host = semconv.TIMING_HOST
    if forwards:
        for fwd in forwards:
            events.append(
                PhaseEvent(semconv.SPAN_FORWARD, number, ns(fwd.ts), ns(fwd.end), host, None)
            )
    elif passes:
        first_backward = passes[0][0]
        begin = max([low, *(f.end for f in fetches if f.end <= first_backward)])
        events.append(
            PhaseEvent(semconv.SPAN_FORWARD, number, ns(begin), ns(first_backward), host, None)
        )
    for first, last in passes:
        events.append(PhaseEvent(semconv.SPAN_BACKWARD, number, ns(first), ns(last), host, None))
    return _StepPhases(events, passes)


# -- collectives ----------------------------------------------------------------------------


def _match(
    timed: list[_Ev], calls: list[_Ev], op_of: Any, slack: float = _LAUNCH_SLACK_US
) -> list[_Ev | None]:
    """For each timed event, the call that issued it: the oldest unmatched call of the same
    op (``op_of``'s key) that started before it (calls and timed events are in order)."""
    queues: dict[object, deque[_Ev]] = defaultdict(deque)
    out: list[_Ev | None] = []
    pending = iter(calls)
    upcoming = next(pending, None)
    for event in timed:
        while upcoming is not None and upcoming.ts <= event.ts + slack:
            queues[op_of(upcoming)].append(upcoming)
            upcoming = next(pending, None)
        queue = queues[op_of(event)]
        out.append(queue.popleft() if queue else None)
    return out


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def _global(group: _Group | None, meta_ranks: object, group_rank: int) -> int | None:
    """A group's rank as a global rank; None when the group's members are not known."""
    ranks = group.ranks if group is not None else None
    if ranks is None and isinstance(meta_ranks, str) and "..." not in meta_ranks:
        try:
            ranks = tuple(int(r) for r in meta_ranks.strip("[]").split(",") if r.strip())
        except ValueError:
            ranks = None
    if ranks is None:
        is_world = group is not None and group.desc == _DEFAULT_PG_DESC
        return group_rank if is_world else None
    return ranks[group_rank] if 0 <= group_rank < len(ranks) else None


class _Collectives:
    """A trace's collective calls, with notes on what had to be left out."""

    def __init__(self, trace: _Trace, problems: Problems, notes: list[str]) -> None:
        self.trace = trace
        self.problems = problems
        self.notes = notes
        self.unjoinable = 0
        self.ambiguous = False

    def calls(self) -> list[_Call]:
        trace = self.trace
        if trace.kernels:
            launches = _match(trace.kernels, trace.records, _meta_key)
            return self._keep(
                self._from_meta(k.args, k.ts, k.end, r.ts if r else k.ts, semconv.TIMING_CUDA_EVENT)
                for k, r in zip(trace.kernels, launches, strict=True)
            )
        if trace.gloo:
            callers = trace.records or trace.c10d
            issued = _match(trace.gloo, callers, _op_key)
            return self._keep(self._gloo(e, c) for e, c in zip(trace.gloo, issued, strict=True))
        return self._keep(
            self._from_meta(r.args, r.ts, r.end, r.ts, semconv.TIMING_HOST) for r in trace.records
        )

    def _keep(self, calls: Iterable[_Call | None]) -> list[_Call]:
        kept = [call for call in calls if call is not None]
        if self.unjoinable:
            self.notes.append(
                f"{self.trace.path}: left out {self.unjoinable} point-to-point messages whose "
                "peer the trace does not give (profile with record_shapes=True)"
            )
        return kept

    def _from_meta(
        self, args: dict[str, Any], start: float, end: float, launch: float, timing: str
    ) -> _Call | None:
        op = base_op(str(args[_COLLECTIVE_NAME]))
        assert op is not None
        trace = self.trace
        name = str(args.get("Process Group Name", ""))
        group = trace.group(name)
        desc = str(args.get("Process Group Description", group.desc if group else ""))
        pg = semconv.DEFAULT_PG_NAME if desc == _DEFAULT_PG_DESC or not name else name
        size = _integer(args.get("Group size")) or (group.size if group else trace.world_size)
        peer = None
        if op in P2P_OPS:
            key = "Dst Rank" if op == semconv.OP_SEND else "Src Rank"
            group_rank = _integer(args.get(key))
            if group is None and pg == semconv.DEFAULT_PG_NAME:
                group = _Group(name, _DEFAULT_PG_DESC, trace.world_size, None)
            peer = (
                None
                if group_rank is None
                else _global(group, args.get("Process Group Ranks"), group_rank)
            )
            if peer is None or peer == trace.rank:
                self.unjoinable += 1
                return None
        seq = None if op in P2P_OPS else _integer(args.get("Seq"))
        nelems = _integer(args.get("In msg nelems")) or 0
        return _Call(
            op=op,
            pg=pg,
            pg_size=size,
            seq=seq,
            launch=launch,
            start=start,
            end=end,
            nbytes=nelems * _dtype_bytes(args.get("dtype")),
            is_async=_truthy(args.get("Is asynchronized op", False)),
            peer=peer,
            timing=timing,
        )

    def _gloo(self, execution: _Ev, caller: _Ev | None) -> _Call | None:
        if caller is not None and caller.name == _RECORD:
            call = self._from_meta(
                caller.args, caller.ts, execution.end, caller.ts, semconv.TIMING_HOST
            )
            if call is not None:
                call.nbytes = call.nbytes or _input_bytes(execution.args)
            return call
        op = base_op(execution.name)
        assert op is not None
        group = self._sole_group()
        if group is None:
            return None
        inputs = caller.args.get("Concrete Inputs", []) if caller is not None else []
        inputs = inputs if isinstance(inputs, list) else []
        peer = None
        if op in P2P_OPS:
            group_rank = _integer(inputs[2]) if len(inputs) > 2 else None
            peer = None if group_rank is None else _global(group, None, group_rank)
            if peer is None or peer == self.trace.rank:
                self.unjoinable += 1
                return None
        flags = [str(v) for v in inputs if str(v) in ("True", "False")]
        start = caller.ts if caller is not None else execution.ts
        return _Call(
            op=op,
            pg=group.span_name,
            pg_size=group.size,
            seq=None,
            launch=start,
            start=min(start, execution.ts),
            end=execution.end,
            nbytes=_input_bytes(execution.args),
            is_async=bool(flags) and flags[0] == "True",
            peer=peer,
            timing=semconv.TIMING_HOST,
        )

    def _sole_group(self) -> _Group | None:
        """The group every gloo collective of the rank ran on: its only group. Gloo records
        no group per call, so with several the calls cannot be told apart (a problem)."""
        trace = self.trace
        mine = [g for g in trace.groups if g.ranks is None or trace.rank in g.ranks]
        if not mine:
            return _Group("0", _DEFAULT_PG_DESC, trace.world_size, None)
        if len(mine) == 1:
            return mine[0]
        if not self.ambiguous:
            self.ambiguous = True
            names = ", ".join(f"{g.name} ({g.desc})" for g in mine)
            self.problems.add(
                str(trace.path),
                f"field distributedInfo.pg_config: rank {trace.rank} is in several groups "
                f"({names}) and its gloo collectives do not say which one they ran on "
                "(PyTorch records no record_param_comms for gloo); such a job can be "
                "imported from NCCL traces, or as a table with a pg column",
            )
        return None


def _meta_key(event: _Ev) -> tuple[str, str | None]:
    return str(event.args.get("Process Group Name", "")), base_op(
        str(event.args.get(_COLLECTIVE_NAME, ""))
    )


def _op_key(event: _Ev) -> str | None:
    if event.name == _RECORD:
        return base_op(str(event.args.get(_COLLECTIVE_NAME, "")))
    return base_op(event.name)


def _input_bytes(args: dict[str, Any]) -> int:
    """Bytes of an op's inputs from ``Input Dims`` and ``Input type`` (record_shapes)."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return 0
    total = 0
    for shape, dtype in zip(dims, types, strict=False):
        size = _dtype_bytes(dtype)
        if size and isinstance(shape, list) and all(isinstance(d, int) for d in shape):
            total += size * math.prod(shape)
    return total


# -- the job ------------------------------------------------------------------------------------


def _rank_events(trace: _Trace, problems: Problems, notes: list[str]) -> list[Event]:
    windows = [(number, event) for number, event in trace.steps]
    starts = [event.ts for _, event in windows]
    events: list[Event] = []
    backward: dict[int, list[tuple[float, float]]] = {}
    for number, window in windows:
        phases = _phases(trace, number, window)
        events += phases.events
        backward[number] = phases.backward
    outside = 0
    by_key: dict[tuple[object, ...], list[tuple[_Call, int]]] = defaultdict(list)
    for call in _Collectives(trace, problems, notes).calls():
        i = bisect.bisect_right(starts, call.launch) - 1
        if i < 0 or call.launch >= windows[i][1].end:
            outside += 1
            continue
        number = windows[i][0]
        key: tuple[object, ...] = (call.pg,)
        if call.peer is not None:
            key = (
                (call.pg, trace.rank, call.peer)
                if call.op == semconv.OP_SEND
                else (call.pg, call.peer, trace.rank)
            )
        by_key[(*key, number)].append((call, number))
    if outside:
        notes.append(f"{trace.path}: left out {outside} collectives launched outside every step")
    for calls in by_key.values():
        calls.sort(key=lambda item: item[0].launch)
        for index, (call, number) in enumerate(calls):
            ddp = (
                call.op == semconv.OP_ALL_REDUCE
                and call.is_async
                and any(low <= call.launch <= high for low, high in backward[number])
            )
            events.append(
                CollectiveEvent(
                    step=number,
                    start_ns=trace.ns(call.start),
                    end_ns=trace.ns(call.end),
                    op=call.op,
                    pg=call.pg,
                    pg_size=call.pg_size,
                    seq=call.seq if call.seq is not None else derived_seq(number, index),
                    nbytes=call.nbytes,
                    is_async=call.is_async,
                    source=semconv.SOURCE_DDP if ddp else semconv.SOURCE_API,
                    timing=call.timing,
                    cuda_handle=None,
                    peer=call.peer,
                )
            )
    return events


def read_kineto(paths: Sequence[Path], *, job_id: str) -> ImportedJob:
    """The job of one trace file per rank; raises :class:`~.model.InputErrors` naming every
    bad file, event and field (up to a limit)."""
    problems = Problems()
    notes: list[str] = []
    traces = [t for t in (_trace(path, problems) for path in paths) if t is not None]
    problems.check()
    by_rank: dict[int, _Trace] = {}
    for trace in traces:
        first = by_rank.setdefault(trace.rank, trace)
        if first is not trace:
            problems.add(str(trace.path), f"rank {trace.rank} again (also {first.path})")
        if trace.world_size != traces[0].world_size:
            problems.add(
                str(trace.path),
                f"field distributedInfo.world_size: {trace.world_size}, but "
                f"{traces[0].path} says {traces[0].world_size}",
            )
    problems.check()
    ranks: dict[tuple[str, int], RankInput] = {}
    for rank, trace in sorted(by_rank.items()):
        ranks[(job_id, rank)] = RankInput(
            job=job_id,
            rank=rank,
            world_size=trace.world_size,
            host=trace.host,
            events=_rank_events(trace, problems, notes),
        )
    problems.check()
    world = traces[0].world_size if traces else 0
    if traces and len(by_rank) < world:
        notes.append(
            f"the traces are of {len(by_rank)} of {world} ranks: collectives with the others "
            "are released incomplete by the Collector (after its wait_timeout)"
        )
    return ImportedJob(ranks=ranks, notes=notes)
