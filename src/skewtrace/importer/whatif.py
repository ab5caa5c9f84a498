"""The what-if format: the sample traces of ByteDance's what-if analysis of stragglers
(OSDI'25, "Understanding Stragglers in Large Model Training Using What-if Analysis"), read as
they are.

A job is a table (parquet, read through pyarrow: ``pip install 'skewtrace[parquet]'``; or
CSV with the same columns) with one row per operation of one *worker*, a tensor-parallel
group of GPUs, and a metadata object ``{"dp_size", "pp_size", "tp_size", "world_size"}``.
``docs/import.md`` is the reference; in short:

- columns ``dp_rank, stage, rank, step, optype, start_ts, duration`` (required), ``seq_id,
  mc, mb_id, gmc`` (the rest of the format: ordering, chunk, microbatch) and this project's
  extensions ``host, switch, nic, bytes``;
- one span-contract rank per worker, dense: rank ``w = stage * dp_size + dp_rank``, world
  size ``dp_size * pp_size`` (the GPUs' world size would leave the Collector waiting for
  ranks that never come); the worker's own identity goes on its resource
  (``training.worker.first_gpu`` = the ``rank`` column, ``training.worker.gpus`` = tp_size,
  ``training.pipeline.stage``, ``training.dp_rank``);
- compute optypes become phase spans (:data:`PHASE_OF`), ``gc`` and
  ``layernorm-grads-all-reduce`` none (:data:`NO_SPAN`); the data-parallel collectives run in
  ``dp-stage<s>``, the embedding all-reduce in ``embedding-dp<d>`` (stage 0 and the last
  stage of replica d), messages in the replica's pipeline group ``pp-dp<d>`` with the peer
  found from the stage and chunk (:func:`peer_gmc`);
- sequence numbers (:func:`~.model.derived_seq`) are equal on every member by construction:
  a group's calls in a step are numbered in (optype, chunk, seq_id) order over the union of
  its members' rows, a pair's messages in (microbatch, sender's global chunk, direction)
  order over the matched messages;
- point-to-point ops a worker posted at the same ``start_ts`` (one Megatron batch) are
  asynchronous, a lone one blocking.

The metadata comes from ``--meta``, else a JSON file beside the table (:data:`META_NAMES`),
else the sizes are inferred from the rows (with a note). Times are in ``--time-unit``, else
the unit an epoch ``start_ts`` shows (:func:`infer_unit`).
"""

from __future__ import annotations

import csv
import decimal
import json
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from skewtrace import semconv
from skewtrace.importer.model import (
    ImportedJob,
    InputErrors,
    Problems,
    RankInput,
    add_missing_steps,
    derived_seq,
)
from skewtrace.rank._events import CollectiveEvent, PhaseEvent

TIME_UNITS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
"""``--time-unit`` choices: nanoseconds per unit (as the columnar reader's)."""

REQUIRED: tuple[str, ...] = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
SCHEMA: tuple[str, ...] = ("seq_id", "mc", "mb_id", "gmc")
"""The rest of the format's columns: read when present (see :class:`_Row`)."""
EXTENSIONS: tuple[str, ...] = ("host", "switch", "nic", "bytes")
"""This project's columns, as the columnar format has them."""
COLUMNS: tuple[str, ...] = REQUIRED + SCHEMA + EXTENSIONS

PARQUET_SUFFIXES: tuple[str, ...] = (".parquet", ".pq")
TABLE_SUFFIXES: tuple[str, ...] = (*PARQUET_SUFFIXES, ".csv")
META_NAMES: tuple[str, ...] = (
    "{stem}.json",
    "{stem}.meta.json",
    "{stem}_metadata.json",
    "metadata.json",
    "meta.json",
)
"""Where the metadata is looked for beside a table ``<stem>.parquet`` without ``--meta``."""
PARQUET_EXTRA = "pip install 'skewtrace[parquet]'"

FORWARD, BACKWARD = "forward", "backward"

PHASE_OF: dict[str, str] = {
    "forward-compute": semconv.SPAN_FORWARD,
    "backward-compute": semconv.SPAN_BACKWARD,
    "optimizer": semconv.SPAN_OPTIMIZER_STEP,
    "optimizer-clip-main-grad": semconv.SPAN_OPTIMIZER_STEP,
    "dataloader": semconv.SPAN_DATALOADER_FETCH,
}
"""Compute optypes and the phase span each becomes."""
NO_SPAN: tuple[str, ...] = ("gc", "layernorm-grads-all-reduce")
"""Work inside one worker that no traced phase stands for: no span (its time is the worker's
time between spans, as for a live rank)."""
DP_COLLECTIVES: dict[str, str] = {
    "grads-reduce-scatter": semconv.OP_REDUCE_SCATTER,
    "params-all-gather": semconv.OP_ALL_GATHER,
}
"""Collectives over the data-parallel group of the worker's stage."""
EMBEDDING_ALL_REDUCE = "embedding-grads-all-reduce"
P2P: dict[str, tuple[str, str]] = {
    "forward-send": (semconv.OP_SEND, FORWARD),
    "forward-recv": (semconv.OP_RECV, FORWARD),
    "backward-send": (semconv.OP_SEND, BACKWARD),
    "backward-recv": (semconv.OP_RECV, BACKWARD),
}
"""Point-to-point optypes: (op, direction)."""
OPTYPES: tuple[str, ...] = tuple(
    sorted({*PHASE_OF, *NO_SPAN, *DP_COLLECTIVES, EMBEDDING_ALL_REDUCE, *P2P})
)

# An epoch start_ts: 10^8 to 10^11 seconds (1973 to 5138), or the same in ms, us, ns.
_EPOCH_SECONDS_EXPONENT = 8
_INFER_ORDER = ("s", "ms", "us", "ns")
_META_SIZES = ("dp_size", "pp_size", "tp_size")
# Per worker, each of these must be the same on every row that gives it.
_PER_WORKER = ("host", "switch", "nic")


def is_whatif_header(names: Sequence[str]) -> bool:
    """Whether a table with these columns is in the what-if format."""
    lowered = {name.strip().lower() for name in names}
    return "optype" in lowered and "start_ts" in lowered


def csv_is_whatif(path: Path) -> bool:
    """Whether the CSV file's header row is the what-if format's (False if unreadable)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return header is not None and is_whatif_header(header)


def is_parquet(path: Path) -> bool:
    """By name (:data:`PARQUET_SUFFIXES`), else by the file's magic bytes."""
    if path.name.lower().endswith(PARQUET_SUFFIXES):
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def find_meta(tables: Sequence[Path]) -> Path | None:
    """The metadata file beside the tables (:data:`META_NAMES`, in that order, beside each
    table in turn), or None."""
    for table in tables:
        stem = table.name
        for suffix in TABLE_SUFFIXES:
            if stem.lower().endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        for pattern in META_NAMES:
            candidate = table.parent / pattern.format(stem=stem)
            if candidate.is_file():
                return candidate
    return None


def infer_unit(starts: Sequence[Decimal]) -> str | None:
    """The unit in which every start is an epoch time (s, ms, us or ns), or None."""
    if not starts:
        return None
    low, high = min(starts), max(starts)
    if low <= 0:
        return None
    # floor(log10(start)) 8 to 10 is seconds, 11 to 13 milliseconds, ...
    found = {(value.adjusted() - _EPOCH_SECONDS_EXPONENT) // 3 for value in (low, high)}
    if len(found) != 1:
        return None
    index = found.pop()
    return _INFER_ORDER[index] if 0 <= index < len(_INFER_ORDER) else None


def peer_gmc(optype: str, gmc: int) -> int:
    """The global model chunk (``mc * pp_size + stage``) at the other end of a message.

    A forward message goes to the next stage of the chunk, and from the last stage to stage 0
    of the next chunk: both are ``gmc + 1``; a backward one the other way, ``gmc - 1``."""
    _, direction = P2P[optype]
    send = optype.endswith("-send")
    ahead = (direction == FORWARD) == send
    return gmc + 1 if ahead else gmc - 1


@dataclass(frozen=True)
class Sizes:
    """The job's parallel layout."""

    dp: int
    pp: int
    tp: int
    chunks: int | None = None
    """Model chunks per worker (``num_model_chunks``), when the metadata says."""

    def worker(self, stage: int, dp_rank: int) -> int:
        return stage * self.dp + dp_rank

    @property
    def workers(self) -> int:
        return self.dp * self.pp


_MessageKey = tuple[int, int, str, int, int]
"""A message, as both its sides name it: (dp_rank, step, direction, sender's gmc, mb_id)."""


@dataclass(frozen=True)
class _Row:
    where: str
    order: int
    dp_rank: int
    stage: int
    first_gpu: int
    step: int
    optype: str
    start: Decimal
    duration: Decimal
    seq_id: int | None
    mc: int | None
    mb_id: int | None
    """None for -1 (no microbatch) and for an empty cell."""
    gmc: int | None
    nbytes: int
    topology: tuple[str | None, str | None, str | None]


@dataclass(frozen=True)
class _Op:
    """A checked row: its worker, chunk and times in nanoseconds."""

    row: _Row
    worker: int
    chunk: int
    gmc: int
    seq_id: int
    start_ns: int
    end_ns: int


class _Cells:
    """The cells of one row (CSV text or parquet values), parsed with errors that name the
    row and column."""

    def __init__(self, values: Mapping[str, object], where: str, problems: Problems) -> None:
        self.values = values
        self.where = where
        self.problems = problems
        self.ok = True

    def bad(self, column: str, message: str) -> None:
        self.ok = False
        self.problems.add(self.where, f"column {column!r}: {message}")

    def _raw(self, column: str) -> object:
        value = self.values.get(column)
        if isinstance(value, str):
            value = value.strip()
            return value or None
        return value

    def text(self, column: str) -> str | None:
        value = self._raw(column)
        return None if value is None else str(value)

    def integer(self, column: str, *, required: bool = False, minimum: int = 0) -> int | None:
        raw = self._raw(column)
        if raw is None:
            if required:
                self.bad(column, "empty")
            return None
        value: int | None = None
        if isinstance(raw, bool):
            value = None
        elif isinstance(raw, int):
            value = raw
        elif isinstance(raw, float) and raw.is_integer():
            value = int(raw)
        elif isinstance(raw, str):
            try:
                value = int(raw)
            except ValueError:
                value = None
        if value is None:
            self.bad(column, f"{raw!r} is not an integer")
            return None
        if value < minimum:
            self.bad(column, f"{raw!r} is {'negative' if minimum == 0 else f'below {minimum}'}")
            return None
        return value

    def number(self, column: str) -> Decimal | None:
        raw = self._raw(column)
        if raw is None:
            self.bad(column, "empty")
            return None
        try:
            if isinstance(raw, bool):
                raise decimal.InvalidOperation
            # A float through its shortest repr: 1790000000.1 is read as written.
            value = Decimal(repr(raw)) if isinstance(raw, float) else Decimal(str(raw))
        except decimal.InvalidOperation:
            self.bad(column, f"{raw!r} is not a number")
            return None
        if not value.is_finite():
            self.bad(column, f"{raw!r} is not a finite number")
            return None
        return value


def _parse(cells: _Cells, order: int) -> _Row | None:
    dp_rank = cells.integer("dp_rank", required=True)
    stage = cells.integer("stage", required=True)
    first_gpu = cells.integer("rank", required=True)
    step = cells.integer("step", required=True)
    optype = (cells.text("optype") or "").lower()
    if optype not in OPTYPES:
        raw = cells.text("optype")
        cells.bad(
            "optype",
            f"unknown optype {raw!r} (known: {', '.join(OPTYPES)})" if raw else "empty",
        )
    start = cells.number("start_ts")
    duration = cells.number("duration")
    if duration is not None and duration < 0:
        cells.bad("duration", f"{cells.text('duration')!r} is negative")
    seq_id = cells.integer("seq_id")
    mc = cells.integer("mc")
    mb_id = cells.integer("mb_id", minimum=-1)
    gmc = cells.integer("gmc")
    nbytes = cells.integer("bytes") or 0
    topology = (cells.text("host"), cells.text("switch"), cells.text("nic"))
    if not cells.ok:
        return None
    assert dp_rank is not None and stage is not None and first_gpu is not None
    assert step is not None and start is not None and duration is not None
    return _Row(
        where=cells.where,
        order=order,
        dp_rank=dp_rank,
        stage=stage,
        first_gpu=first_gpu,
        step=step,
        optype=optype,
        start=start,
        duration=duration,
        seq_id=seq_id,
        mc=mc,
        mb_id=None if mb_id is None or mb_id < 0 else mb_id,
        gmc=gmc,
        nbytes=nbytes,
        topology=topology,
    )


# -- reading the table ---------------------------------------------------------------------


def _header_ok(
    names: list[str], path: Path, where: str, problems: Problems, notes: list[str]
) -> bool:
    missing = [column for column in REQUIRED if column not in names]
    repeated = sorted({name for name in names if name and names.count(name) > 1})
    if missing or repeated:
        detail = []
        if missing:
            detail.append(f"missing column {', '.join(map(repr, missing))}")
        if repeated:
            detail.append(f"repeated column {', '.join(map(repr, repeated))}")
        problems.add(where, f"{'; '.join(detail)} (required: {', '.join(REQUIRED)})")
        return False
    unknown = [name for name in names if name and name not in COLUMNS]
    if unknown:
        notes.append(f"{path}: ignored unknown columns {', '.join(unknown)}")
    return True


def _csv_rows(path: Path, problems: Problems, notes: list[str]) -> Iterator[_Cells]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            try:
                header = next(reader, None)
            except csv.Error as exc:
                problems.add(f"{path}:1", f"not CSV ({exc})")
                return
            if header is None or not any(cell.strip() for cell in header):
                problems.add(f"{path}:1", "no header row (the file is empty)")
                return
            names = [cell.strip().lower() for cell in header]
            if not _header_ok(names, path, f"{path}:1", problems, notes):
                return
            while True:
                try:
                    cells = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    problems.add(f"{path}:{reader.line_num}", f"not CSV ({exc})")
                    return
                if not any(cell.strip() for cell in cells):
                    continue
                where = f"{path}:{reader.line_num}"
                if len(cells) != len(names):
                    problems.add(where, f"{len(cells)} fields, the header has {len(names)}")
                    continue
                yield _Cells(dict(zip(names, cells, strict=True)), where, problems)
    except UnicodeDecodeError as exc:
        problems.add(str(path), f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    except OSError as exc:
        problems.add(str(path), exc.strerror or str(exc))


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputErrors(
            [f"reading parquet needs pyarrow, which is not installed: {PARQUET_EXTRA}"]
        ) from None
    return pq


def _parquet_rows(path: Path, problems: Problems, notes: list[str]) -> Iterator[_Cells]:
    pq = _pyarrow_parquet()
    try:
        table = pq.read_table(path)
    except OSError as exc:
        problems.add(str(path), exc.strerror or str(exc))
        return
    except Exception as exc:  # pyarrow's ArrowInvalid and kin: not a parquet file
        problems.add(str(path), f"not a parquet file ({exc})")
        return
    names = [str(name).strip().lower() for name in table.column_names]
    if not _header_ok(names, path, f"{path}: columns", problems, notes):
        return
    columns = {
        name: table.column(index).to_pylist() for index, name in enumerate(names) if name in COLUMNS
    }
    for index in range(table.num_rows):
        values = {name: column[index] for name, column in columns.items()}
        yield _Cells(values, f"{path}: row {index + 1}", problems)


def read_meta(path: Path) -> tuple[Sizes, dict[str, Any]]:
    """The layout in a metadata file; raises :class:`~.model.InputErrors` naming the field."""
    problems = Problems()
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise InputErrors([f"{path}: {exc.strerror or exc}"]) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputErrors([f"{path}: not JSON ({exc})"]) from None
    if not isinstance(doc, dict):
        raise InputErrors([f"{path}: not a JSON object (the what-if metadata: dp_size, ...)"])
    values: dict[str, int] = {}
    for key in (*_META_SIZES, "world_size", "num_model_chunks"):
        value = doc.get(key)
        if value is None and key in _META_SIZES:
            problems.add(str(path), f"field {key}: missing")
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            problems.add(str(path), f"field {key}: {value!r} is not an integer")
        elif value is not None and value < 1:
            problems.add(str(path), f"field {key}: {value!r} must be at least 1")
        elif value is not None:
            values[key] = value
    problems.check()
    sizes = Sizes(
        values["dp_size"], values["pp_size"], values["tp_size"], values.get("num_model_chunks")
    )
    world = values.get("world_size")
    if world is not None and world != sizes.workers * sizes.tp:
        raise InputErrors(
            [
                f"{path}: field world_size: {world}, but dp_size * pp_size * tp_size is "
                f"{sizes.dp} * {sizes.pp} * {sizes.tp} = {sizes.workers * sizes.tp}"
            ]
        )
    return sizes, doc


# -- the reader ----------------------------------------------------------------------------


class _Reader:
    def __init__(self, job_id: str, unit: str | None) -> None:
        self.job_id = job_id
        self.unit = unit
        self.problems = Problems()
        self.notes: list[str] = []
        self.rows: list[_Row] = []

    def read(self, path: Path) -> None:
        cells_of = _parquet_rows if is_parquet(path) else _csv_rows
        for cells in cells_of(path, self.problems, self.notes):
            row = _parse(cells, len(self.rows))
            if row is not None:
                self.rows.append(row)

    # -- the layout ----------------------------------------------------------------------
    def infer_sizes(self) -> Sizes:
        dp = max(row.dp_rank for row in self.rows) + 1
        pp = max(row.stage for row in self.rows) + 1
        last = max(self.rows, key=lambda row: (row.stage * dp + row.dp_rank, row.order))
        worker = last.stage * dp + last.dp_rank
        if worker == 0:
            tp = 1
            how = "tp_size 1 assumed (one worker: its rank cannot tell)"
        else:
            tp, rest = divmod(last.first_gpu, worker)
            if rest or tp < 1:
                self.problems.add(
                    last.where,
                    f"cannot infer tp_size: rank {last.first_gpu} is not a multiple of stage "
                    f"{last.stage} * dp_size {dp} + dp_rank {last.dp_rank} = {worker}; give "
                    "the metadata (--meta)",
                )
                self.problems.check()
            how = f"tp_size {tp} from the rank column"
        self.notes.append(
            f"no metadata file (--meta, or {', '.join(_shown(META_NAMES))} beside the table): "
            f"inferred dp_size {dp} and pp_size {pp} from the largest dp_rank and stage, {how}"
        )
        return Sizes(dp, pp, tp)

    def checked(self, sizes: Sizes) -> list[_Op]:
        """Each row against the layout: its worker, chunk and global chunk."""
        chunks = sizes.chunks
        ops: list[tuple[_Row, int, int, int]] = []
        for row in self.rows:
            where = row.where
            if row.dp_rank >= sizes.dp:
                self.problems.add(where, f"column 'dp_rank': {row.dp_rank} >= dp_size {sizes.dp}")
                continue
            if row.stage >= sizes.pp:
                self.problems.add(where, f"column 'stage': {row.stage} >= pp_size {sizes.pp}")
                continue
            worker = sizes.worker(row.stage, row.dp_rank)
            expected = worker * sizes.tp
            if row.first_gpu != expected:
                self.problems.add(
                    where,
                    f"column 'rank': {row.first_gpu}, but (stage {row.stage} * dp_size "
                    f"{sizes.dp} + dp_rank {row.dp_rank}) * tp_size {sizes.tp} = {expected}",
                )
                continue
            chunk = self._chunk(row, sizes)
            if chunk is None:
                continue
            if chunks is not None and chunk >= chunks:
                self.problems.add(where, f"column 'mc': chunk {chunk} >= num_model_chunks {chunks}")
                continue
            ops.append((row, worker, chunk, chunk * sizes.pp + row.stage))
        self.problems.check()
        self._same_per_worker(ops)
        seq_ids = self._seq_ids([row for row, *_ in ops])
        self._duplicates(ops, seq_ids)
        self.problems.check()
        unit_ns = TIME_UNITS[self._unit()]
        out = []
        for row, worker, chunk, gmc in ops:
            start_ns = int(row.start * unit_ns)
            end_ns = start_ns + int(row.duration * unit_ns)
            out.append(_Op(row, worker, chunk, gmc, seq_ids[row.order], start_ns, end_ns))
        return out

    def _chunk(self, row: _Row, sizes: Sizes) -> int | None:
        if row.mc is not None:
            if row.gmc is not None and row.gmc != row.mc * sizes.pp + row.stage:
                self.problems.add(
                    row.where,
                    f"column 'gmc': {row.gmc}, but mc {row.mc} * pp_size {sizes.pp} + stage "
                    f"{row.stage} = {row.mc * sizes.pp + row.stage}",
                )
                return None
            return row.mc
        if row.gmc is not None:
            chunk, rest = divmod(row.gmc - row.stage, sizes.pp)
            if rest or chunk < 0:
                self.problems.add(
                    row.where,
                    f"column 'gmc': {row.gmc} is not mc * pp_size {sizes.pp} + stage "
                    f"{row.stage} for any mc",
                )
                return None
            return chunk
        return 0

    def _same_per_worker(self, ops: list[tuple[_Row, int, int, int]]) -> None:
        seen: dict[tuple[int, str], tuple[str, str]] = {}
        for row, worker, _, _ in ops:
            for column, value in zip(_PER_WORKER, row.topology, strict=True):
                if value is None:
                    continue
                first = seen.setdefault((worker, column), (value, row.where))
                if first[0] != value:
                    self.problems.add(
                        row.where,
                        f"column {column!r}: {value!r} for worker {worker} (stage {row.stage}, "
                        f"dp_rank {row.dp_rank}), but {first[1]} says {first[0]!r}",
                    )

    @staticmethod
    def _seq_ids(rows: list[_Row]) -> dict[int, int]:
        """Each row's seq_id: given, else its place among the worker's rows of its optype in
        the step, in start order."""
        by_kind: dict[tuple[int, int, int, str], list[_Row]] = defaultdict(list)
        for row in rows:
            by_kind[(row.stage, row.dp_rank, row.step, row.optype)].append(row)
        out: dict[int, int] = {}
        for group in by_kind.values():
            group.sort(key=lambda row: (row.start, row.order))
            for index, row in enumerate(group):
                out[row.order] = row.seq_id if row.seq_id is not None else index
        return out

    def _duplicates(self, ops: list[tuple[_Row, int, int, int]], seq_ids: dict[int, int]) -> None:
        seen: dict[tuple[object, ...], str] = {}
        for row, worker, chunk, _ in ops:
            ordering = row.seq_id if row.seq_id is not None else row.start
            key = (worker, row.step, row.optype, chunk, row.mb_id, ordering)
            first = seen.setdefault(key, row.where)
            if first != row.where:
                self.problems.add(
                    row.where,
                    f"duplicate of {first} (worker {worker}, step {row.step}, {row.optype}, "
                    f"mc {chunk}, mb_id {-1 if row.mb_id is None else row.mb_id}, seq_id "
                    f"{seq_ids[row.order]})",
                )

    def _unit(self) -> str:
        if self.unit is not None:
            return self.unit
        unit = infer_unit([row.start for row in self.rows])
        if unit is None:
            low = min(row.start for row in self.rows)
            high = max(row.start for row in self.rows)
            raise InputErrors(
                [
                    f"cannot tell the unit of start_ts and duration: start_ts runs from {low} "
                    f"to {high}, not an epoch time in s, ms, us or ns; pass --time-unit "
                    f"({', '.join(TIME_UNITS)})"
                ]
            )
        self.notes.append(
            f"start_ts looks like epoch {unit} ({min(row.start for row in self.rows):.4g}): "
            f"read start_ts and duration in {unit} (--time-unit to say otherwise)"
        )
        return unit

    # -- the events ----------------------------------------------------------------------
    def job(self, sizes: Sizes) -> ImportedJob:
        ops = self.checked(sizes)
        ranks: dict[tuple[str, int], RankInput] = {}
        for op in sorted(ops, key=lambda op: (op.worker, op.row.order)):
            key = (self.job_id, op.worker)
            if key not in ranks:
                ranks[key] = RankInput(
                    job=self.job_id,
                    rank=op.worker,
                    world_size=sizes.workers,
                    attributes={
                        semconv.WORKER_FIRST_GPU: op.worker * sizes.tp,
                        semconv.WORKER_GPUS: sizes.tp,
                        semconv.PIPELINE_STAGE: op.row.stage,
                        semconv.DP_RANK: op.row.dp_rank,
                    },
                )
            rank = ranks[key]
            host, switch, nic = op.row.topology
            rank.host = host or rank.host
            rank.switch = switch or rank.switch
            rank.nic = nic or rank.nic
        skipped: Counter[str] = Counter()
        collectives: list[_Op] = []
        messages: list[_Op] = []
        for op in ops:
            optype = op.row.optype
            if optype in PHASE_OF:
                ranks[(self.job_id, op.worker)].events.append(_phase(op))
            elif optype in NO_SPAN:
                skipped[optype] += 1
            elif optype in P2P:
                messages.append(op)
            else:
                collectives.append(op)
        self._collectives(collectives, sizes, ranks)
        chunks = sizes.chunks or max(op.chunk for op in ops) + 1
        self._messages(messages, sizes, chunks, ranks)
        self.problems.check()
        if skipped:
            counts = " and ".join(f"{n} {optype}" for optype, n in sorted(skipped.items()))
            self.notes.append(
                f"no span for {counts} rows: work inside one worker that no traced phase "
                "stands for (its time is the worker's time between spans)"
            )
        missing = sizes.workers - len(ranks)
        if missing:
            absent = sorted(set(range(sizes.workers)) - {w for _, w in ranks})
            shown = ", ".join(map(str, absent[:10])) + (", ..." if len(absent) > 10 else "")
            self.notes.append(
                f"{missing} of {sizes.workers} workers have no rows (ranks {shown}): the "
                "collectives they are members of wait for them until the Collector's wait "
                "timeout"
            )
        added = sum(add_missing_steps(rank) for rank in ranks.values())
        if added:
            self.notes.append(f"added {added} train.step spans (the format has no step rows)")
        return ImportedJob(ranks=dict(sorted(ranks.items())), notes=self.notes)

    def _collectives(
        self, ops: list[_Op], sizes: Sizes, ranks: dict[tuple[str, int], RankInput]
    ) -> None:
        placed: list[tuple[_Op, str, int, str, tuple[object, ...]]] = []
        left_out = 0
        for op in ops:
            row = op.row
            if row.optype in DP_COLLECTIVES:
                name, size = f"dp-stage{row.stage}", sizes.dp
                key: tuple[object, ...] = (row.optype, op.chunk, op.seq_id)
                placed.append((op, name, size, DP_COLLECTIVES[row.optype], key))
                continue
            # The embedding all-reduce: stage 0 and the last stage of one replica; the two
            # may hold it in different chunks, so the chunk is not part of its order.
            if sizes.pp < 2:
                left_out += 1
                continue
            if row.stage not in (0, sizes.pp - 1):
                self.problems.add(
                    row.where,
                    f"an {EMBEDDING_ALL_REDUCE} on stage {row.stage}: it runs over the first "
                    f"and the last stage (0 and {sizes.pp - 1})",
                )
                continue
            key = (row.optype, op.seq_id)
            placed.append((op, f"embedding-dp{row.dp_rank}", 2, semconv.OP_ALL_REDUCE, key))
        if left_out:
            self.notes.append(
                f"left out {left_out} {EMBEDDING_ALL_REDUCE} rows: with pp_size 1 there is "
                "no first and last stage to reduce between"
            )
        calls: dict[tuple[str, int], set[tuple[object, ...]]] = defaultdict(set)
        members: dict[tuple[str, int, tuple[object, ...]], set[int]] = defaultdict(set)
        for op, name, _, _, key in placed:
            calls[(name, op.row.step)].add(key)
            members[(name, op.row.step, key)].add(op.worker)
        numbers = {
            (name, step, key): derived_seq(step, index)
            for (name, step), keys in calls.items()
            # One group's keys have one shape: (optype, chunk, seq_id) or (optype, seq_id).
            for index, key in enumerate(sorted(keys))
        }
        for op, name, size, coll, key in placed:
            seq = numbers[(name, op.row.step, key)]
            ranks[(self.job_id, op.worker)].events.append(
                _collective(op, coll, name, size, seq, is_async=False, peer=None)
            )
        short = [
            (name, step, key)
            for (name, step, key), who in members.items()
            if len(who) < (2 if name.startswith("embedding") else sizes.dp)
        ]
        if short:
            name, step, key = min(short, key=lambda item: (item[1], item[0]))
            self.notes.append(
                f"{len(short)} collective calls lack rows of some members (the first: "
                f"{key[0]} in {name}, step {step}): the Collector releases them after its wait "
                "timeout"
            )

    def _messages(
        self,
        ops: list[_Op],
        sizes: Sizes,
        chunks: int,
        ranks: dict[tuple[str, int], RankInput],
    ) -> None:
        # Ops a worker posted at the same start_ts: one batch, asynchronous.
        posted = Counter((op.worker, op.row.step, op.start_ns) for op in ops)
        limit = sizes.pp * chunks
        sends: dict[_MessageKey, _Op] = {}
        recvs: dict[_MessageKey, _Op] = {}
        for op in ops:
            row = op.row
            coll, direction = P2P[row.optype]
            if row.mb_id is None:
                self.problems.add(
                    row.where, f"column 'mb_id': a {row.optype} needs its microbatch (not -1)"
                )
                continue
            other = peer_gmc(row.optype, op.gmc)
            if not 0 <= other < limit:
                where_to = "next" if other >= limit else "previous"
                self.problems.add(
                    row.where,
                    f"a {row.optype} on stage {row.stage}, mc {op.chunk}: no {where_to} stage "
                    f"or chunk to {'send to' if coll == semconv.OP_SEND else 'receive from'} "
                    f"(pp_size {sizes.pp}, {chunks} model chunks)",
                )
                continue
            if sizes.worker(other % sizes.pp, row.dp_rank) == op.worker:
                self.problems.add(
                    row.where, f"a {row.optype} to the worker itself (pp_size {sizes.pp})"
                )
                continue
            sender_gmc = op.gmc if coll == semconv.OP_SEND else other
            key = (row.dp_rank, row.step, direction, sender_gmc, row.mb_id)
            side = sends if coll == semconv.OP_SEND else recvs
            first = side.setdefault(key, op)
            if first is not op:
                self.problems.add(
                    row.where,
                    f"a second {row.optype} of microbatch {row.mb_id}, mc {op.chunk} in step "
                    f"{row.step} (the first: {first.row.where})",
                )
        self.problems.check()
        matched = set(sends) & set(recvs)
        lone_sends = [sends[key] for key in sends if key not in recvs]
        lone_recvs = [recvs[key] for key in recvs if key not in sends]
        if lone_sends or lone_recvs:
            first = min(lone_sends + lone_recvs, key=lambda op: op.row.order)
            self.notes.append(
                f"left out {len(lone_sends)} sends without their recv and {len(lone_recvs)} "
                f"recvs without their send (the first: {first.row.where}, {first.row.optype} "
                f"of microbatch {first.row.mb_id})"
            )
        counters: Counter[tuple[int, int, int, int]] = Counter()
        for key in sorted(matched, key=_message_order):
            send, recv = sends[key], recvs[key]
            pair = (send.row.dp_rank, send.worker, recv.worker, send.row.step)
            seq = derived_seq(send.row.step, counters[pair])
            counters[pair] += 1
            name = f"pp-dp{send.row.dp_rank}"
            for op, peer in ((send, recv.worker), (recv, send.worker)):
                coll = P2P[op.row.optype][0]
                batched = posted[(op.worker, op.row.step, op.start_ns)] > 1
                ranks[(self.job_id, op.worker)].events.append(
                    _collective(op, coll, name, sizes.pp, seq, is_async=batched, peer=peer)
                )


def _message_order(key: _MessageKey) -> tuple[int, int, int, int, bool]:
    """A pair's messages in a step: by microbatch, then the sender's global chunk, forward
    before backward (both directions can join one pair of workers with pp_size 2)."""
    dp_rank, step, direction, sender_gmc, mb_id = key
    return (dp_rank, step, mb_id, sender_gmc, direction != FORWARD)


def _shown(names: Sequence[str]) -> list[str]:
    return [name.replace("{stem}", "<stem>") for name in names]


def _phase(op: _Op) -> PhaseEvent:
    name = PHASE_OF[op.row.optype]
    # As the hooks record them: forward and backward say they were timed on the host.
    timing = semconv.TIMING_HOST if name in (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD) else None
    return PhaseEvent(name, op.row.step, op.start_ns, op.end_ns, timing, None, None)


def _collective(
    op: _Op, coll: str, pg: str, size: int, seq: int, *, is_async: bool, peer: int | None
) -> CollectiveEvent:
    return CollectiveEvent(
        step=op.row.step,
        start_ns=op.start_ns,
        end_ns=op.end_ns,
        op=coll,
        pg=pg,
        pg_size=size,
        seq=seq,
        nbytes=op.row.nbytes,
        is_async=is_async,
        source=semconv.SOURCE_API,
        timing=semconv.TIMING_HOST,
        cuda_handle=None,
        peer=peer,
    )


def read_whatif(
    paths: Sequence[Path],
    *,
    job_id: str,
    meta: Path | None = None,
    time_unit: str | None = None,
) -> ImportedJob:
    """The job in the what-if tables ``paths`` (one job; parquet or CSV), with the layout
    from ``meta`` (the metadata file; None: inferred from the rows) and times in
    ``time_unit`` (None: inferred from start_ts). Raises :class:`~.model.InputErrors` naming
    every bad row (up to a limit)."""
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ValueError(f"time unit {time_unit!r}: use one of {', '.join(TIME_UNITS)}")
    reader = _Reader(job_id, time_unit)
    sizes: Sizes | None = None
    if meta is not None:
        sizes, _ = read_meta(meta)
    for path in paths:
        reader.read(path)
    reader.problems.check()
    if not reader.rows:
        return ImportedJob(notes=reader.notes)
    if sizes is None:
        sizes = reader.infer_sizes()
    else:
        reader.notes.append(
            f"{meta}: dp_size {sizes.dp}, pp_size {sizes.pp}, tp_size {sizes.tp}: "
            f"{sizes.workers} workers, one rank each (rank = stage * dp_size + dp_rank)"
        )
    return reader.job(sizes)
