"""The reference replay of a what-if job: per step, the actual and ideal step times, the saving
of each set of ops put at its ideal, and the verdict (``README.md`` beside this file).

It reads the rows and the metadata only (never the generator's ground truth) and is written
apart from the Collector's engine, as plainly as it can be:

- a step's ops are grouped per worker into *units* (the ops it issued at one ``start_ts``: a
  batch, or one op), and each unit's gap (its issue minus the end of the worker's previous
  unit) is read;
- the messages (each recv matched to its send) and the collectives (members by optype,
  group, chunk and call index) give each its *transfer*, read as README says;
- every quantity (a compute op's duration, a gap, a transfer) is one *parameter*; a replay
  takes a value per parameter and evaluates the step's dependency graph (program order per
  worker, batch ends, collective and message completions) in a topological order found once
  per step.

    answers = analyze(read_csv("job.csv"), read_metadata("job.json"))
    for answer in answers:
        print(answer.step, answer.slowdown, answer.workers, answer.stages, answer.data)
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMPUTE = frozenset(
    (
        "forward-compute",
        "backward-compute",
        "optimizer-clip-main-grad",
        "optimizer",
        "gc",
        "dataloader",
        "layernorm-grads-all-reduce",
    )
)
SENDS = frozenset(("forward-send", "backward-send"))
RECVS = frozenset(("forward-recv", "backward-recv"))
DP_COLLECTIVES = frozenset(("grads-reduce-scatter", "params-all-gather"))
COLLECTIVES = DP_COLLECTIVES | {"embedding-grads-all-reduce"}
MESSAGE_KIND = "send_recv"
TOLERANCE_S = 1e-5
"""The self-test: a replay of the recorded values must end every unit within this."""
TOP = 8
"""Worker, link and replica sets replayed per step: those with the most excess."""


@dataclass(frozen=True)
class StepAnswer:
    step: int
    actual: float
    ideal: float
    slowdown: float
    workers: dict[int, str]
    """Worker index (stage * dp_size + dp_rank) -> cause: compute, data, host_work, network."""
    stages: frozenset[int]
    data: bool
    savings: dict[str, float]
    """Seconds saved by each replayed set: ``worker:3``, ``worker:3:compute`` (a named
    candidate's parts), ``link:3``, ``stage:1``, ``replica:0``, ``data``, ``kind:<optype>``
    (``kind:send_recv``, ``kind:gap`` for all gaps)."""


@dataclass
class _Op:
    w: int
    stage: int
    dp_rank: int
    optype: str
    start: float
    end: float
    mc: int
    mb: int
    start_us: int


# -- reading -------------------------------------------------------------------------------


def read_csv(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_metadata(path: str | Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(Path(path).read_text())
    return loaded


def _ops_by_step(rows: Iterable[Any], dp: int) -> dict[int, dict[int, list[_Op]]]:
    """step -> worker -> its ops in issue order (ties, a batch's ops: by optype, chunk, mb)."""
    raw = []
    for row in rows:
        get = row.__getitem__ if isinstance(row, Mapping) else row.__getattribute__
        stage, dp_rank, start = int(get("stage")), int(get("dp_rank")), int(get("start_ts"))
        raw.append(
            (
                int(get("step")),
                stage * dp + dp_rank,
                start,
                str(get("optype")),
                int(get("mc")),
                int(get("mb_id")),
                start + int(get("duration")),
                stage,
                dp_rank,
            )
        )
    if not raw:
        return {}
    origin = min(r[2] for r in raw)
    raw.sort()
    steps: dict[int, dict[int, list[_Op]]] = {}
    for step, w, start, optype, mc, mb, end, stage, dp_rank in raw:
        op = _Op(
            w, stage, dp_rank, optype, (start - origin) / 1e6, (end - origin) / 1e6, mc, mb, start
        )
        steps.setdefault(step, {}).setdefault(w, []).append(op)
    return steps


# -- one step's model ----------------------------------------------------------------------


@dataclass
class _Param:
    kind: str
    """The kind whose median is its ideal: a compute optype, ``gap:<optype>``, a collective
    optype or ``send_recv``."""
    category: str
    """``compute``, ``data`` (dataloader ops), ``host_work`` (gaps), ``message`` or
    ``collective``."""
    workers: tuple[int, ...]
    """Its owner (compute, gaps), the two ends (message) or the members (collective)."""
    stage: int = -1


@dataclass
class StepModel:
    """One step's units, parameters and replay program."""

    step: int
    pp: int
    dp: int
    params: list[_Param] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    """The recorded value of each parameter (index 0: a constant 0)."""
    program: list[tuple[int, int, tuple[int, ...] | None, int]] = field(default_factory=list)
    """Instructions (node, pred, preds, param): t[node] = t[pred] (or the max of t[preds]) +
    values[param], in a topological order."""
    initial: list[float] = field(default_factory=list)
    """t before a replay: each worker's entry node set."""
    unit_ends: list[int] = field(default_factory=list)
    """The end node of every unit."""
    recorded_ends: list[float] = field(default_factory=list)
    latest_entry: float = 0.0

    def replay(self, values: Sequence[float]) -> list[float]:
        t = list(self.initial)
        for node, pred, preds, param in self.program:
            if preds is None:
                t[node] = t[pred] + values[param]
            else:
                t[node] = max([t[p] for p in preds]) + values[param]
        return t

    def step_time(self, values: Sequence[float]) -> float:
        t = self.replay(values)
        return max(t[n] for n in self.unit_ends) - self.latest_entry

    def self_test(self) -> float:
        """Replay the recorded values; raise unless every unit ends where it was recorded."""
        t = self.replay(self.values)
        for node, recorded in zip(self.unit_ends, self.recorded_ends, strict=True):
            if abs(t[node] - recorded) > TOLERANCE_S:
                raise AssertionError(
                    f"step {self.step}: a unit replays to {t[node]:.6f} s, recorded {recorded:.6f}"
                )
        return max(t[n] for n in self.unit_ends) - self.latest_entry


def _message_key(op: _Op, pp: int) -> tuple[Any, ...]:
    """The message a p2p op belongs to: direction, replica, mb and the sender's (stage, chunk)."""
    direction = op.optype.split("-")[0]
    if op.optype in SENDS:
        return (direction, op.dp_rank, op.mb, op.stage, op.mc)
    if direction == "forward":
        sender = (op.stage - 1, op.mc) if op.stage > 0 else (pp - 1, op.mc - 1)
    else:
        sender = (op.stage + 1, op.mc) if op.stage < pp - 1 else (0, op.mc + 1)
    return (direction, op.dp_rank, op.mb, *sender)


def _units_by_worker(ops: dict[int, list[_Op]]) -> Iterable[list[_Op]]:
    """Each worker's batches: its ops posted at the same start_ts (more than one: a batch)."""
    for worker_ops in ops.values():
        unit: list[_Op] = []
        for op in worker_ops:
            if unit and unit[0].start_us != op.start_us:
                yield unit
                unit = []
            unit.append(op)
        if unit:
            yield unit


def build_step(
    step: int,
    ops: dict[int, list[_Op]],
    entries: dict[int, float],
    pp: int,
    dp: int,
    fresh: frozenset[int] = frozenset(),
) -> StepModel:
    """The model of one step: ``ops`` per worker in issue order, ``entries`` each worker's
    entry (its last end in the previous step, or, for the ``fresh`` workers, those without a
    previous step, its first issue: their first op has no gap)."""
    model = StepModel(step, pp, dp)
    model.params.append(_Param("zero", "zero", ()))
    model.values.append(0.0)
    nodes = 0

    def new_node() -> int:
        nonlocal nodes
        nodes += 1
        return nodes - 1

    def new_param(value: float, param: _Param) -> int:
        model.params.append(param)
        model.values.append(value)
        return len(model.values) - 1

    entry_node = {w: new_node() for w in sorted(ops)}
    instructions: list[tuple[int, int, tuple[int, ...] | None, int]] = []
    unit_issue: dict[int, int] = {}  # id(op) -> its unit's issue node
    unit_end: dict[int, int] = {}  # id(op) -> its unit's end node
    terms: dict[int, list[int]] = {}  # a unit's end node -> nodes whose max it is
    sends: dict[tuple[Any, ...], _Op] = {}
    recvs: dict[tuple[Any, ...], _Op] = {}
    collectives: dict[tuple[Any, ...], list[_Op]] = {}

    for w in sorted(ops):
        worker_ops = ops[w]
        units: list[list[_Op]] = []
        for op in worker_ops:
            if units and units[-1][0].start_us == op.start_us:
                units[-1].append(op)
            else:
                units.append([op])
        previous_node, previous_end = entry_node[w], entries[w]
        calls: dict[tuple[str, int], int] = {}
        for unit in units:
            issue, end = new_node(), new_node()
            first = unit[0]
            if w in fresh and previous_node == entry_node[w]:
                gap = 0  # the file's first step: no previous end, no gap (entry = first issue)
            else:
                gap = new_param(
                    first.start - previous_end,
                    _Param(f"gap:{first.optype}", "host_work", (w,), first.stage),
                )
            instructions.append((issue, previous_node, None, gap))
            terms[end] = [issue]
            model.unit_ends.append(end)
            model.recorded_ends.append(max(op.end for op in unit))
            for op in unit:
                unit_issue[id(op)], unit_end[id(op)] = issue, end
                if op.optype in SENDS:
                    sends[_message_key(op, pp)] = op
                elif op.optype in RECVS:
                    recvs[_message_key(op, pp)] = op
                elif op.optype in COLLECTIVES:
                    n = calls.get((op.optype, op.mc), 0)
                    calls[(op.optype, op.mc)] = n + 1
                    if op.optype in DP_COLLECTIVES:
                        group: tuple[Any, ...] = ("dp", op.stage)
                    else:
                        group = ("replica", op.dp_rank)
                    collectives.setdefault((op.optype, group, op.mc, n), []).append(op)
                else:  # COMPUTE, and any optype this format does not name
                    category = "data" if op.optype == "dataloader" else "compute"
                    duration = op.end - op.start
                    param = new_param(duration, _Param(op.optype, category, (w,), op.stage))
                    if len(unit) == 1:
                        terms[end] = []
                        instructions.append((end, issue, None, param))
                    else:
                        term = new_node()
                        instructions.append((term, issue, None, param))
                        terms[end].append(term)
            previous_node, previous_end = end, max(op.end for op in unit)

    # A step in which no worker posted point-to-point ops together (no batch) ran on a
    # transport whose sends do not wait for their receivers: under rendezvous, 1F1B's order
    # of separate sends and receives deadlocks (a stage's send of activations waits for the
    # next stage, which waits on its own send of gradients back). Every message is then
    # eager, its transfer the send's duration, however early its receiver was posted.
    batched = any(len(units) > 1 for units in _units_by_worker(ops))
    if set(sends) != set(recvs):
        unmatched = sorted(set(sends) ^ set(recvs))[:5]
        raise ValueError(f"step {step}: unmatched p2p ops {unmatched}")
    for key, send in sends.items():
        recv = recvs[key]
        node = new_node()
        workers = (send.w, recv.w)
        if not batched or send.end < recv.start:  # eager (see above)
            param = new_param(send.end - send.start, _Param(MESSAGE_KIND, "message", workers))
            instructions.append((node, unit_issue[id(send)], None, param))
            terms[unit_end[id(send)]].append(node)
            terms[unit_end[id(recv)]].append(node)
        else:
            transfer = min(send.end, recv.end) - max(send.start, recv.start)
            param = new_param(transfer, _Param(MESSAGE_KIND, "message", workers))
            preds = (unit_issue[id(send)], unit_issue[id(recv)])
            instructions.append((node, -1, preds, param))
            terms[unit_end[id(send)]].append(node)
            terms[unit_end[id(recv)]].append(node)
    for (optype, _, _, _), members in collectives.items():
        node = new_node()
        transfer = min(op.end for op in members) - max(op.start for op in members)
        workers = tuple(sorted(op.w for op in members))
        param = new_param(transfer, _Param(optype, "collective", workers))
        instructions.append((node, -1, tuple(unit_issue[id(op)] for op in members), param))
        for op in members:
            terms[unit_end[id(op)]].append(node)
    for end, nodes_of_end in terms.items():
        if nodes_of_end:
            instructions.append((end, -1, tuple(nodes_of_end), 0))

    model.program = _topological(instructions, nodes, step)
    model.initial = [0.0] * nodes
    for w, node in entry_node.items():
        model.initial[node] = entries[w]
    model.latest_entry = max(entries.values())
    return model


def _topological(
    instructions: list[tuple[int, int, tuple[int, ...] | None, int]], nodes: int, step: int
) -> list[tuple[int, int, tuple[int, ...] | None, int]]:
    """Kahn's order of the instructions; raises on a cycle (a deadlock)."""
    producer: list[int] = [-1] * nodes
    for i, (node, _, _, _) in enumerate(instructions):
        producer[node] = i
    waiting = [0] * len(instructions)
    users: list[list[int]] = [[] for _ in instructions]
    for i, (_, pred, preds, _) in enumerate(instructions):
        for p in (pred,) if preds is None else preds:
            if producer[p] >= 0:
                waiting[i] += 1
                users[producer[p]].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(instructions[i])
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if len(order) != len(instructions):
        raise ValueError(f"step {step}: the ops' dependencies have a cycle (a deadlock)")
    return order


# -- the analysis --------------------------------------------------------------------------


def _medians(model: StepModel, by_stage: bool) -> list[float]:
    """Each parameter's ideal: the median of its kind (within its stage when by_stage, for
    compute ops and gaps; transfers are not per stage)."""
    groups: dict[tuple[str, int], list[float]] = {}
    keys = []
    for param, value in zip(model.params, model.values, strict=True):
        stage = param.stage if by_stage else -1
        keys.append((param.kind, stage))
        groups.setdefault((param.kind, stage), []).append(value)
    medians = {key: statistics.median(values) for key, values in groups.items()}
    return [medians[key] for key in keys]


def _with(values: list[float], targets: list[float], indices: Iterable[int]) -> list[float]:
    changed = list(values)
    for i in indices:
        changed[i] = targets[i]
    return changed


def _top(excess: dict[int, float], n: int = TOP) -> list[int]:
    return sorted(excess, key=lambda k: (-excess[k], k))[:n]


def analyze_step(model: StepModel, min_fraction: float = 0.03) -> StepAnswer:
    """One step's answer.

    *Ideal*: every parameter at the median of its kind over all workers of the step (a
    compute op: its optype; a gap: ``gap:<optype>`` of the op it precedes, for a batch the
    first of its ops by optype; a collective: its optype; a message: ``send_recv``).

    *Sets* (saving = actual - the replay with only the set at its ideal): each worker (its
    compute ops and gaps) and each worker's link (its messages' and its collectives'
    transfers), each for the ``TOP`` workers with the most excess (the sum of max(0, value -
    ideal) over the set); each stage; each replica (the ``TOP`` with the most excess); data
    balance (every compute op and gap at the median of its kind within its stage); each kind
    (``kind:gap``: all gaps).

    *Verdict*, threshold = ``min_fraction`` x actual:

    - data is named if saving(data) >= threshold and > 1.25 x the largest worker saving;
    - stage s is named if saving(stage) >= threshold, > 1.25 x the largest saving of a
      (replayed) worker of the stage and, when data is named, >= 0.5 x saving(data) (a
      stage's set also evens out its replicas: without this, a sequence-length imbalance
      over several replicas names stages);
    - worker w is named if saving(w) >= threshold, >= 0.8 x saving(its stage) and, when data
      is named, >= 0.5 x saving(data); its cause is the part of its set that saves most
      alone: ``compute`` (its compute ops but the dataloader), ``data`` (its dataloader ops),
      ``host_work`` (its gaps);
    - the link with the largest saving is named (``network``) if it saves >= threshold and
      >= 1.25 x the next link; a worker named for its own work as well keeps whichever of
      the two saves more.
    """
    actual = model.self_test()
    values = model.values
    ideal_values = _medians(model, by_stage=False)
    ideal = model.step_time(ideal_values)
    dp = model.dp

    def saving(indices: Iterable[int], targets: list[float] = ideal_values) -> float:
        return actual - model.step_time(_with(values, targets, indices))

    own: dict[int, list[int]] = {}  # worker -> its compute ops and gaps
    link: dict[int, list[int]] = {}  # worker -> its transfers
    kinds: dict[str, list[int]] = {}
    for i, param in enumerate(model.params):
        if param.category in ("compute", "data", "host_work"):
            own.setdefault(param.workers[0], []).append(i)
            kinds.setdefault("gap" if param.category == "host_work" else param.kind, []).append(i)
        elif param.category in ("message", "collective"):
            for w in param.workers:
                link.setdefault(w, []).append(i)
            kinds.setdefault(param.kind, []).append(i)

    def excess(indices: list[int]) -> float:
        return sum(max(0.0, values[i] - ideal_values[i]) for i in indices)

    savings: dict[str, float] = {}
    worker_saving = {w: saving(own[w]) for w in _top({w: excess(i) for w, i in own.items()})}
    link_saving = {w: saving(link[w]) for w in _top({w: excess(i) for w, i in link.items()})}
    stage_saving, replica_sets = {}, {}
    for stage in range(model.pp):
        stage_saving[stage] = saving(i for w in own if w // dp == stage for i in own[w])
    for w, indices in own.items():
        replica_sets.setdefault(w % dp, []).extend(indices)
    replica_excess = {r: excess(i) for r, i in replica_sets.items()}
    replica_saving = {r: saving(replica_sets[r]) for r in _top(replica_excess)}
    compute_and_gaps = [i for indices in own.values() for i in indices]
    data_saving = saving(compute_and_gaps, _medians(model, by_stage=True))
    savings.update({f"worker:{w}": s for w, s in worker_saving.items()})
    savings.update({f"link:{w}": s for w, s in link_saving.items()})
    savings.update({f"stage:{s}": v for s, v in stage_saving.items()})
    savings.update({f"replica:{r}": s for r, s in replica_saving.items()})
    savings["data"] = data_saving
    for kind, indices in sorted(kinds.items()):
        savings[f"kind:{kind}"] = saving(indices)

    threshold = min_fraction * actual
    largest_worker = max(worker_saving.values(), default=0.0)
    data = data_saving >= threshold and data_saving > 1.25 * largest_worker
    stages = set()
    for stage, value in stage_saving.items():
        of_stage = [s for w, s in worker_saving.items() if w // dp == stage]
        if value < threshold or value <= 1.25 * max(of_stage, default=0.0):
            continue
        # A stage's set also evens out its replicas: with the data named, the stage must save
        # at least half of what balancing the data saves (as a worker must).
        if data and value < 0.5 * data_saving:
            continue
        stages.add(stage)

    workers: dict[int, str] = {}
    for w, value in sorted(worker_saving.items()):
        if value < threshold or value < 0.8 * stage_saving[w // dp]:
            continue
        if data and value < 0.5 * data_saving:
            continue
        parts = {
            "compute": [i for i in own[w] if model.params[i].category == "compute"],
            "data": [i for i in own[w] if model.params[i].category == "data"],
            "host_work": [i for i in own[w] if model.params[i].category == "host_work"],
        }
        part_saving = {}
        for part, indices in parts.items():
            if indices:
                part_saving[part] = savings[f"worker:{w}:{part}"] = saving(indices)
        workers[w] = max(part_saving, key=lambda p: part_saving[p])

    if link_saving:
        ranked = sorted(link_saving, key=lambda w: (-link_saving[w], w))
        best = ranked[0]
        runner_up = link_saving[ranked[1]] if len(ranked) > 1 else 0.0
        value = link_saving[best]
        named = value >= threshold and value >= 1.25 * runner_up
        if named and (best not in workers or value > worker_saving[best]):
            workers[best] = "network"

    return StepAnswer(
        step=model.step,
        actual=actual,
        ideal=ideal,
        slowdown=actual / ideal if ideal > 0 else float("inf"),
        workers=workers,
        stages=frozenset(stages),
        data=data,
        savings=savings,
    )


def build_steps(rows: Iterable[Any], metadata: Mapping[str, Any]) -> list[StepModel]:
    """Every step's model, the entries carried from step to step."""
    dp, pp = int(metadata["dp_size"]), int(metadata["pp_size"])
    models = []
    last_end: dict[int, float] = {}
    for step, ops in sorted(_ops_by_step(rows, dp).items()):
        entries = {w: last_end.get(w, worker_ops[0].start) for w, worker_ops in ops.items()}
        fresh = frozenset(w for w in ops if w not in last_end)
        models.append(build_step(step, ops, entries, pp, dp, fresh))
        for w, worker_ops in ops.items():
            last_end[w] = max(op.end for op in worker_ops)
    return models


def analyze(
    rows: Iterable[Any], metadata: Mapping[str, Any], min_fraction: float = 0.03
) -> list[StepAnswer]:
    """The answer of every step of the job. ``rows``: mappings (a CSV's) or objects with the
    columns as attributes; start_ts and duration in microseconds."""
    return [analyze_step(model, min_fraction) for model in build_steps(rows, metadata)]
