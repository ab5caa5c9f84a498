"""The columnar format: one row per phase or collective call of one rank, as CSV.

Columns (``docs/import.md`` is the reference; a header row names them, in any order):

- required: ``rank``, ``step``, ``op``, ``start``, ``duration``;
- read when present (the rest of the schema of ByteDance's what-if traces): ``stage`` (the
  pipeline stage: a collective without ``pg`` runs in its stage's data-parallel group),
  ``seq``; ``dp_rank`` and ``microbatch`` are accepted and not sent (no span carries them);
- optional: ``pg``, ``peer``, ``bytes``, ``async``, ``host``, ``switch``, ``nic``,
  ``world_size``, ``job``, ``input_size`` (a ``forward`` row's input elements, e.g. its
  tokens: ``training.input.size``, the evidence of a data imbalance without stages).

``op`` is a phase span name (``dataloader.fetch``, ``forward``, ``backward``,
``optimizer.step``, ``train.step``) or a collective op (``all_reduce``, ``send``, ...; also
written ``collective.all_reduce``), both from :mod:`skewtrace.semconv`. ``start`` and
``duration`` are decimal numbers in ``time_unit`` (seconds by default); ``start`` is since the
Unix epoch or since an origin of the file's own (:func:`~.model.place_on_epoch`).

What is derived when it is not given: a collective's group (``pg``: the data-parallel group
of the rank's stage when the file has several stages, else the world group ``default``), its
``pg_size`` (the world size for ``default``, the ranks of the stage, or the ranks with rows
in a named group), its ``seq`` (:func:`~.model.derived_seq`, per group, or per sender and
receiver for ``send``/``recv``), the world size (the largest rank plus one) and each rank's
``train.step`` (:func:`~.model.add_missing_steps`).
"""

from __future__ import annotations

import csv
import decimal
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from skewtrace import semconv
from skewtrace.importer.model import (
    COLLECTIVE_OPS,
    P2P_OPS,
    PHASES,
    ImportedJob,
    Problems,
    RankInput,
    add_missing_steps,
    derived_seq,
)
from skewtrace.rank._events import CollectiveEvent, PhaseEvent, StepEvent

TIME_UNITS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
"""``--time-unit`` choices: nanoseconds per unit."""

REQUIRED: tuple[str, ...] = ("rank", "step", "op", "start", "duration")
SCHEMA: tuple[str, ...] = ("dp_rank", "stage", "seq", "microbatch")
OPTIONAL: tuple[str, ...] = (
    "pg",
    "peer",
    "bytes",
    "async",
    "host",
    "switch",
    "nic",
    "world_size",
    "job",
    "input_size",
)
COLUMNS: tuple[str, ...] = REQUIRED + SCHEMA + OPTIONAL

_TRUE = frozenset(("1", "true", "yes"))
_FALSE = frozenset(("0", "false", "no", ""))
# Per rank, each of these must be the same on every row that gives it.
_PER_RANK = ("host", "switch", "nic", "stage")


@dataclass(frozen=True)
class _Row:
    where: str
    """``file:line``."""
    order: int
    """Position in the input, for ties."""
    job: str
    rank: int
    step: int
    op: str
    start_ns: int
    end_ns: int
    stage: int | None
    seq: int | None
    pg: str | None
    peer: int | None
    nbytes: int
    is_async: bool
    input_size: int | None = None


class _Fields:
    """The cells of one row, parsed with errors that name the file, line and column."""

    def __init__(self, values: dict[str, str], where: str, problems: Problems) -> None:
        self.values = values
        self.where = where
        self.problems = problems
        self.ok = True

    def _bad(self, column: str, message: str) -> None:
        self.ok = False
        self.problems.add(self.where, f"column {column!r}: {message}")

    def text(self, column: str) -> str | None:
        return self.values.get(column) or None

    def integer(self, column: str, *, required: bool = False) -> int | None:
        raw = self.values.get(column, "")
        if not raw:
            if required:
                self._bad(column, "empty")
            return None
        try:
            value = int(raw)
        except ValueError:
            self._bad(column, f"{raw!r} is not an integer")
            return None
        if value < 0:
            self._bad(column, f"{raw!r} is negative")
            return None
        return value

    def number(self, column: str) -> Decimal | None:
        raw = self.values.get(column, "")
        try:
            value = Decimal(raw)
        except decimal.InvalidOperation:
            self._bad(column, f"{raw!r} is not a number" if raw else "empty")
            return None
        if not value.is_finite():
            self._bad(column, f"{raw!r} is not a finite number")
            return None
        return value

    def boolean(self, column: str) -> bool:
        raw = self.values.get(column, "").lower()
        if raw in _TRUE:
            return True
        if raw not in _FALSE:
            self._bad(column, f"{raw!r} is not a boolean (true/false, 1/0)")
        return False


def _op(fields: _Fields) -> str | None:
    raw = fields.values.get("op", "")
    name = raw.removeprefix(semconv.SPAN_COLLECTIVE_PREFIX)
    if name in PHASES or name in COLLECTIVE_OPS:
        return name
    fields._bad(
        "op",
        f"unknown op {raw!r} (phases: {', '.join(PHASES)}; collectives: "
        f"{', '.join(sorted(COLLECTIVE_OPS))})",
    )
    return None


def _parse_row(
    fields: _Fields, order: int, job_id: str, unit_ns: int
) -> tuple[_Row | None, dict[str, str | int | None]]:
    """The row, or None when a cell is bad (the problem is recorded); and its per-rank cells."""
    rank = fields.integer("rank", required=True)
    step = fields.integer("step", required=True)
    op = _op(fields)
    start = fields.number("start")
    duration = fields.number("duration")
    if duration is not None and duration < 0:
        fields._bad("duration", f"{fields.values['duration']!r} is negative")
    stage = fields.integer("stage")
    seq = fields.integer("seq")
    peer = fields.integer("peer")
    nbytes = fields.integer("bytes") or 0
    input_size = fields.integer("input_size")
    is_async = fields.boolean("async")
    for column in ("dp_rank", "microbatch"):
        fields.integer(column)
    world_size = fields.integer("world_size")
    if world_size == 0:
        fields._bad("world_size", "must be at least 1")
    per_rank: dict[str, str | int | None] = {
        "host": fields.text("host"),
        "switch": fields.text("switch"),
        "nic": fields.text("nic"),
        "stage": stage,
        "world_size": world_size,
    }
    if not fields.ok or rank is None or step is None or op is None:
        return None, per_rank
    assert start is not None and duration is not None
    start_ns = int(start * unit_ns)
    end_ns = start_ns + int(duration * unit_ns)
    row = _Row(
        where=fields.where,
        order=order,
        job=job_id,
        rank=rank,
        step=step,
        op=op,
        start_ns=start_ns,
        end_ns=end_ns,
        stage=stage,
        seq=seq,
        pg=fields.text("pg"),
        peer=peer,
        nbytes=nbytes,
        is_async=is_async,
        input_size=input_size if op == semconv.SPAN_FORWARD else None,
    )
    return row, per_rank


class _Reader:
    """Rows of every file, then the events they make."""

    def __init__(self, job_id: str | None, default_job: str, unit_ns: int) -> None:
        self.job_id = job_id
        self.default_job = default_job
        self.unit_ns = unit_ns
        self.problems = Problems()
        self.rows: list[_Row] = []
        # (job, rank) -> column -> (value, where it was first given)
        self.per_rank: dict[tuple[str, int], dict[str, tuple[str | int, str]]] = defaultdict(dict)
        # job -> (world size, where)
        self.world: dict[str, tuple[int, str]] = {}
        self.notes: list[str] = []

    # -- pass 1: rows --------------------------------------------------------------------
    def read_file(self, path: Path) -> None:
        try:
            with path.open(newline="", encoding="utf-8-sig") as f:
                self._read(path, csv.reader(f))
        except UnicodeDecodeError as exc:
            self.problems.add(str(path), f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        except OSError as exc:
            self.problems.add(str(path), exc.strerror or str(exc))

    def _read(self, path: Path, reader: Any) -> None:
        try:
            header = next(reader, None)
        except csv.Error as exc:
            self.problems.add(f"{path}:1", f"not CSV ({exc})")
            return
        if header is None or not any(cell.strip() for cell in header):
            self.problems.add(f"{path}:1", "no header row (the file is empty)")
            return
        names = [cell.strip().lower() for cell in header]
        missing = [column for column in REQUIRED if column not in names]
        repeated = sorted({name for name in names if name and names.count(name) > 1})
        if missing or repeated:
            detail = []
            if missing:
                detail.append(f"missing column {', '.join(map(repr, missing))}")
            if repeated:
                detail.append(f"repeated column {', '.join(map(repr, repeated))}")
            self.problems.add(f"{path}:1", f"{'; '.join(detail)} (required: {', '.join(REQUIRED)})")
            return
        unknown = [name for name in names if name and name not in COLUMNS]
        if unknown:
            self.notes.append(f"{path}: ignored unknown columns {', '.join(unknown)}")
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                self.problems.add(f"{path}:{reader.line_num}", f"not CSV ({exc})")
                return
            if not any(cell.strip() for cell in cells):
                continue
            where = f"{path}:{reader.line_num}"
            if len(cells) != len(names):
                self.problems.add(where, f"{len(cells)} fields, the header has {len(names)}")
                continue
            values = {name: cell.strip() for name, cell in zip(names, cells, strict=True)}
            self._row(values, where)

    def _row(self, values: dict[str, str], where: str) -> None:
        fields = _Fields(values, where, self.problems)
        job = self.job_id or values.get("job") or self.default_job
        row, per_rank = _parse_row(fields, len(self.rows), job, self.unit_ns)
        if row is None:
            return
        self._same_for_rank(row, per_rank)
        world = per_rank["world_size"]
        if isinstance(world, int):
            seen = self.world.setdefault(job, (world, where))
            if seen[0] != world:
                self.problems.add(
                    where, f"column 'world_size': {world}, but {seen[1]} says {seen[0]}"
                )
                return
        self.rows.append(row)

    def _same_for_rank(self, row: _Row, per_rank: dict[str, str | int | None]) -> None:
        known = self.per_rank[(row.job, row.rank)]
        for column in _PER_RANK:
            value = per_rank[column]
            if value is None:
                continue
            seen = known.setdefault(column, (value, row.where))
            if seen[0] != value:
                self.problems.add(
                    row.where,
                    f"column {column!r}: {value!r} for rank {row.rank}, but {seen[1]} "
                    f"says {seen[0]!r}",
                )

    # -- pass 2: events ------------------------------------------------------------------
    def job(self) -> ImportedJob:
        self.problems.check()
        worlds = self._world_sizes()
        self.problems.check()
        ranks: dict[tuple[str, int], RankInput] = {}
        for (job, rank), known in sorted(self.per_rank.items()):
            ranks[(job, rank)] = RankInput(
                job=job,
                rank=rank,
                world_size=worlds[job],
                host=str(known.get("host", (semconv.UNKNOWN, ""))[0]),
                switch=str(known.get("switch", (semconv.UNKNOWN, ""))[0]),
                nic=str(known.get("nic", (semconv.UNKNOWN, ""))[0]),
            )
        self._events(ranks, worlds)
        self.problems.check()
        added = sum(add_missing_steps(rank) for rank in ranks.values())
        if added:
            self.notes.append(f"added {added} train.step spans for (rank, step)s without a row")
        return ImportedJob(ranks=ranks, notes=self.notes)

    def _world_sizes(self) -> dict[str, int]:
        largest: dict[str, tuple[int, str]] = {}
        for row in self.rows:
            for rank in (row.rank, row.peer):
                if rank is not None and rank >= largest.get(row.job, (-1, ""))[0]:
                    largest[row.job] = (rank, row.where)
        worlds: dict[str, int] = {}
        for job, (rank, where) in largest.items():
            given = self.world.get(job)
            if given is None:
                worlds[job] = rank + 1
            elif rank >= given[0]:
                self.problems.add(where, f"rank {rank} is outside world_size {given[0]}")
            else:
                worlds[job] = given[0]
        return worlds

    def _stages(self) -> dict[str, dict[int, int]]:
        """job -> rank -> stage, for jobs whose rows name several stages."""
        stages: dict[str, dict[int, int]] = defaultdict(dict)
        for (job, rank), known in self.per_rank.items():
            if "stage" in known:
                stages[job][rank] = int(known["stage"][0])
        return {job: by_rank for job, by_rank in stages.items() if len(set(by_rank.values())) > 1}

    def _group(self, row: _Row, stages: dict[str, dict[int, int]]) -> str:
        if row.pg:
            return row.pg
        stage = stages.get(row.job, {}).get(row.rank)
        if stage is not None and row.op not in P2P_OPS:
            return f"dp-stage{stage}"
        return semconv.DEFAULT_PG_NAME

    def _events(self, ranks: dict[tuple[str, int], RankInput], worlds: dict[str, int]) -> None:
        stages = self._stages()
        members: dict[tuple[str, str], set[int]] = defaultdict(set)
        for row in self.rows:
            if row.op in COLLECTIVE_OPS:
                members[(row.job, self._group(row, stages))].add(row.rank)
        for job, by_rank in stages.items():
            for rank_id, stage in by_rank.items():
                members[(job, f"dp-stage{stage}")].add(rank_id)
        # (job, rank, group key, step) -> rows, for the sequence numbers
        calls: dict[tuple[str, int, tuple[object, ...], int], list[_Row]] = defaultdict(list)
        step_rows: dict[tuple[str, int, int], str] = {}
        for row in self.rows:
            if row.op == semconv.SPAN_STEP:
                first = step_rows.setdefault((row.job, row.rank, row.step), row.where)
                if first != row.where:
                    self.problems.add(
                        row.where, f"a second train.step of this rank, step ({first})"
                    )
                    continue
            if row.op in PHASES:
                ranks[(row.job, row.rank)].events.append(self._phase(row))
                continue
            pg = self._group(row, stages)
            key: tuple[object, ...] = (pg,)
            if row.op in P2P_OPS:
                if not self._peer_ok(row, worlds[row.job]):
                    continue
                assert row.peer is not None
                src, dst = (
                    (row.rank, row.peer) if row.op == semconv.OP_SEND else (row.peer, row.rank)
                )
                key = (pg, src, dst)
            calls[(row.job, row.rank, key, row.step)].append(row)
        for (job, rank_id, key, step), rows in calls.items():
            pg = str(key[0])
            size = worlds[job] if pg == semconv.DEFAULT_PG_NAME else len(members[(job, pg)])
            for row, seq in self._numbered(rows, key, step):
                ranks[(job, rank_id)].events.append(self._collective(row, pg, size, seq))

    def _peer_ok(self, row: _Row, world: int) -> bool:
        if row.peer is None:
            self.problems.add(row.where, f"column 'peer': a {row.op} needs the other rank")
            return False
        if row.peer == row.rank:
            self.problems.add(row.where, f"column 'peer': {row.peer} is the rank itself")
            return False
        if row.peer >= world:
            self.problems.add(row.where, f"column 'peer': {row.peer} is outside world {world}")
            return False
        return True

    def _numbered(
        self, rows: list[_Row], key: tuple[object, ...], step: int
    ) -> list[tuple[_Row, int]]:
        """Each call with its sequence number: the given one, else derived in start order."""
        rows.sort(key=lambda r: (r.start_ns, r.order))
        given = [row for row in rows if row.seq is not None]
        if given and len(given) < len(rows):
            lacking = next(row for row in rows if row.seq is None)
            self.problems.add(
                lacking.where,
                f"column 'seq': empty, but {given[0].where} gives one for the same rank, "
                f"group and step (give all or none)",
            )
            return []
        if not given:
            return [(row, derived_seq(step, index)) for index, row in enumerate(rows)]
        seen: dict[int, str] = {}
        for row in rows:
            assert row.seq is not None
            if row.seq in seen:
                self.problems.add(
                    row.where, f"column 'seq': {row.seq} repeats {seen[row.seq]} ({key[0]})"
                )
            seen[row.seq] = row.where
        return [(row, int(row.seq or 0)) for row in rows]

    @staticmethod
    def _phase(row: _Row) -> PhaseEvent | StepEvent:
        if row.op == semconv.SPAN_STEP:
            return StepEvent(row.step, row.start_ns, row.end_ns)
        # As the hooks record them: forward and backward say they were timed on the host.
        timing = (
            semconv.TIMING_HOST if row.op in (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD) else None
        )
        return PhaseEvent(row.op, row.step, row.start_ns, row.end_ns, timing, None, row.input_size)

    @staticmethod
    def _collective(row: _Row, pg: str, size: int, seq: int) -> CollectiveEvent:
        return CollectiveEvent(
            step=row.step,
            start_ns=row.start_ns,
            end_ns=row.end_ns,
            op=row.op,
            pg=pg,
            pg_size=size,
            seq=seq,
            nbytes=row.nbytes,
            is_async=row.is_async,
            source=semconv.SOURCE_API,
            timing=semconv.TIMING_HOST,
            cuda_handle=None,
            peer=row.peer if row.op in P2P_OPS else None,
        )


def read_csv(
    paths: Sequence[Path], *, job_id: str | None, default_job: str, time_unit: str = "s"
) -> ImportedJob:
    """The job in ``paths`` (one table, or one per rank); raises
    :class:`~.model.InputErrors` naming every bad line (up to a limit)."""
    reader = _Reader(job_id, default_job, TIME_UNITS[time_unit])
    for path in paths:
        reader.read_file(path)
    return reader.job()
