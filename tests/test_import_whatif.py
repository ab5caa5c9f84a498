"""``skewtrace import`` of what-if tables (ByteDance's straggler traces, OSDI'25): the spans.

Small hand-written jobs (tests/whatif/README.md, "The format") go through the reader
(:func:`skewtrace.importer.whatif.read_whatif`) and the live path's materializer
(:func:`skewtrace.importer.spans.spans_by_step`); the command line is run with ``--dry-run``.
No Collector: fast. Checked: span names, groups and their sizes, message peers (the
interleaved chunk boundary included), the asynchronous flag of batched messages, sequence
numbers equal on every member of a collective and on both sides of a message, one rank per
worker (world size dp * pp), the worker's resource attributes, the time unit, the metadata
file, the parquet path, and bad tables (exit 2, the row named, nothing sent).
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from skewtrace import semconv
from skewtrace.cli import main
from skewtrace.importer.command import CSV, WHATIF, input_files
from skewtrace.importer.model import SEQ_STRIDE, ImportedJob
from skewtrace.importer.spans import spans_by_step
from skewtrace.importer.whatif import OPTYPES, infer_unit, peer_gmc, read_whatif
from skewtrace.rank._events import CollectiveEvent, PhaseEvent

COLUMNS = ["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc",
           "mb_id", "gmc"]  # fmt: skip
T0_US = 1_790_000_000_000_000
"""Epoch microseconds (2026), as the corpus writes times."""
OP_US = 100
"""Every op's duration; ops of one worker start 150 us apart (a batch at the same time)."""

# One worker's ops in order: (optype, mb_id, mc, batched with the previous op).
Op = tuple[str, int, int, bool]

# 1F1B, pp 2, 2 microbatches (Megatron's order). Stage 0 posts forward-send(1) with
# backward-recv(0), stage 1 backward-send(0) with forward-recv(1): send_forward_recv_backward
# and send_backward_recv_forward, one batch each.
STAGE0: list[Op] = [
    ("dataloader", 0, 0, False),
    ("forward-compute", 0, 0, False),
    ("forward-send", 0, 0, False),
    ("dataloader", 1, 0, False),
    ("forward-compute", 1, 0, False),
    ("forward-send", 1, 0, False),
    ("backward-recv", 0, 0, True),
    ("backward-compute", 0, 0, False),
    ("backward-recv", 1, 0, False),
    ("backward-compute", 1, 0, False),
    ("grads-reduce-scatter", -1, 0, False),
    ("embedding-grads-all-reduce", -1, 0, False),
    ("optimizer-clip-main-grad", -1, 0, False),
    ("optimizer", -1, 0, False),
    ("params-all-gather", -1, 0, False),
    ("gc", -1, 0, False),
]
STAGE1: list[Op] = [
    ("forward-recv", 0, 0, False),
    ("forward-compute", 0, 0, False),
    ("backward-compute", 0, 0, False),
    ("backward-send", 0, 0, False),
    ("forward-recv", 1, 0, True),
    ("forward-compute", 1, 0, False),
    ("backward-compute", 1, 0, False),
    ("backward-send", 1, 0, False),
    ("grads-reduce-scatter", -1, 0, False),
    ("layernorm-grads-all-reduce", -1, 0, False),
    ("embedding-grads-all-reduce", -1, 0, False),
    ("optimizer", -1, 0, False),
    ("params-all-gather", -1, 0, False),
]


def worker_rows(
    ops: list[Op], *, dp_rank: int, stage: int, dp: int, pp: int, tp: int, step: int,
    batched: bool = True, t0: int = T0_US,
) -> list[dict[str, Any]]:  # fmt: skip
    """The worker's rows: seq_id counts its ops of each optype in the step."""
    rows: list[dict[str, Any]] = []
    seqs: Counter[str] = Counter()
    t = t0 + step * 1_000_000 + (stage * dp + dp_rank) * 7
    previous = t
    for optype, mb, mc, with_previous in ops:
        start = previous if batched and with_previous else t
        rows.append(
            {"dp_rank": dp_rank, "stage": stage, "rank": (stage * dp + dp_rank) * tp,
             "step": step, "optype": optype, "start_ts": start, "duration": OP_US,
             "seq_id": seqs[optype], "mc": mc, "mb_id": mb, "gmc": mc * pp + stage}
        )  # fmt: skip
        seqs[optype] += 1
        previous, t = start, start + 150
    return rows


def one_f_one_b(
    *, dp: int = 2, tp: int = 8, steps: int = 2, batched: bool = True
) -> list[dict[str, Any]]:
    rows = []
    for step in range(steps):
        for dp_rank in range(dp):
            for stage, ops in enumerate((STAGE0, STAGE1)):
                rows += worker_rows(
                    ops, dp_rank=dp_rank, stage=stage, dp=dp, pp=2, tp=tp, step=step,
                    batched=batched,
                )  # fmt: skip
    return rows


def interleaved_ops(stage: int, pp: int, chunks: int, microbatches: int) -> list[Op]:
    """Every forward, then every backward (chunk by chunk), with the messages between."""
    ops: list[Op] = []
    for mc in range(chunks):
        for mb in range(microbatches):
            if (stage, mc) != (0, 0):
                ops.append(("forward-recv", mb, mc, False))
            ops.append(("forward-compute", mb, mc, False))
            if (stage, mc) != (pp - 1, chunks - 1):
                ops.append(("forward-send", mb, mc, False))
    for mc in reversed(range(chunks)):
        for mb in range(microbatches):
            if (stage, mc) != (pp - 1, chunks - 1):
                ops.append(("backward-recv", mb, mc, False))
            ops.append(("backward-compute", mb, mc, False))
            if (stage, mc) != (0, 0):
                ops.append(("backward-send", mb, mc, False))
    for mc in range(chunks):
        ops.append(("grads-reduce-scatter", -1, mc, False))
    ops.append(("optimizer", -1, 0, False))
    return ops


def interleaved(pp: int, chunks: int = 2, dp: int = 1, tp: int = 2) -> list[dict[str, Any]]:
    rows = []
    for dp_rank in range(dp):
        for stage in range(pp):
            ops = interleaved_ops(stage, pp, chunks, 2)
            rows += worker_rows(ops, dp_rank=dp_rank, stage=stage, dp=dp, pp=pp, tp=tp, step=0)
    return rows


def write_table(
    path: Path, rows: Iterable[dict[str, Any]], columns: list[str] | None = None
) -> Path:
    rows = list(rows)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns or [*COLUMNS, *_extra(rows)])
        writer.writeheader()
        writer.writerows(rows)
    return path


def _extra(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({key for row in rows for key in row} - set(COLUMNS))


def write_meta(path: Path, dp: int, pp: int, tp: int, **more: Any) -> Path:
    doc = {"dp_size": dp, "pp_size": pp, "tp_size": tp, "world_size": dp * pp * tp, **more}
    path.write_text(json.dumps(doc))
    return path


def collectives(job: ImportedJob) -> list[tuple[int, CollectiveEvent]]:
    return [
        (rank, event)
        for (_, rank), r in job.ranks.items()
        for event in r.events
        if isinstance(event, CollectiveEvent)
    ]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["import", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_joinable(job: ImportedJob) -> None:
    """Every collective's members share its seq; every message has both sides, one each."""
    members: dict[tuple[Any, ...], set[int]] = defaultdict(set)
    sizes: dict[str, set[int]] = defaultdict(set)
    sides: Counter[tuple[Any, ...]] = Counter()
    for rank, e in collectives(job):
        if e.op in (semconv.OP_SEND, semconv.OP_RECV):
            assert e.peer is not None
            src, dst = (rank, e.peer) if e.op == semconv.OP_SEND else (e.peer, rank)
            sides[(e.pg, src, dst, e.seq, e.op)] += 1
            assert e.seq // SEQ_STRIDE == e.step
        else:
            members[(e.pg, e.op, e.seq)].add(rank)
            sizes[e.pg].add(e.pg_size)
            assert e.seq // SEQ_STRIDE == e.step
    for (pg, _, _), ranks in members.items():
        assert {len(ranks)} == sizes[pg], (pg, ranks)
    for (pg, src, dst, seq, _), count in sides.items():
        assert count == 1, (pg, src, dst, seq)
        assert sides[(pg, src, dst, seq, semconv.OP_SEND)] == 1
        assert sides[(pg, src, dst, seq, semconv.OP_RECV)] == 1


# -- the mapping ----------------------------------------------------------------------------


def test_1f1b_becomes_one_rank_per_worker_with_its_groups_and_peers(tmp_path: Path) -> None:
    # dp 2, pp 2, tp 8: 4 workers of 8 GPUs; worker w = stage * 2 + dp_rank.
    path = write_table(tmp_path / "job.csv", one_f_one_b(dp=2, tp=8))
    job = read_whatif([path], job_id="wi", meta=write_meta(tmp_path / "job.json", 2, 2, 8))
    assert sorted(rank for _, rank in job.ranks) == [0, 1, 2, 3]
    assert {r.world_size for r in job.ranks.values()} == {4}  # dp * pp, not the 32 GPUs
    for (_, w), rank in job.ranks.items():
        stage, dp_rank = divmod(w, 2)
        assert rank.attributes == {
            semconv.WORKER_FIRST_GPU: w * 8,
            semconv.WORKER_GPUS: 8,
            semconv.PIPELINE_STAGE: stage,
            semconv.DP_RANK: dp_rank,
        }
        assert (rank.host, rank.switch, rank.nic) == (semconv.UNKNOWN,) * 3

    # Phases: optimizer and its clip are both optimizer.step; gc and the layernorm
    # all-reduce have no span; a train.step per worker and step is added.
    def phases(rank: int) -> Counter[str]:
        return Counter(
            e.name if isinstance(e, PhaseEvent) else semconv.SPAN_STEP
            for e in job.ranks[("wi", rank)].events
            if e.step == 0 and not isinstance(e, CollectiveEvent)
        )

    assert phases(0) == {
        semconv.SPAN_DATALOADER_FETCH: 2, semconv.SPAN_FORWARD: 2, semconv.SPAN_BACKWARD: 2,
        semconv.SPAN_OPTIMIZER_STEP: 2, semconv.SPAN_STEP: 1,
    }  # fmt: skip
    assert phases(2) == {
        semconv.SPAN_FORWARD: 2, semconv.SPAN_BACKWARD: 2, semconv.SPAN_OPTIMIZER_STEP: 1,
        semconv.SPAN_STEP: 1,
    }  # fmt: skip
    assert any("4 gc and 4 layernorm-grads-all-reduce" in note for note in job.notes)
    # Groups and sizes.
    seen = {(rank, e.op, e.pg, e.pg_size, e.peer) for rank, e in collectives(job)}
    for w in range(4):
        stage, d = divmod(w, 2)
        assert (w, semconv.OP_REDUCE_SCATTER, f"dp-stage{stage}", 2, None) in seen
        assert (w, semconv.OP_ALL_GATHER, f"dp-stage{stage}", 2, None) in seen
        assert (w, semconv.OP_ALL_REDUCE, f"embedding-dp{d}", 2, None) in seen
        other = w + 2 if stage == 0 else w - 2  # the replica's other stage
        assert (w, semconv.OP_SEND, f"pp-dp{d}", 2, other) in seen
        assert (w, semconv.OP_RECV, f"pp-dp{d}", 2, other) in seen
    assert_joinable(job)
    # Collectives numbered per group and step in (optype, mc, seq_id) order.
    seqs = {(rank, e.step, e.op): e.seq for rank, e in collectives(job) if e.peer is None}
    assert seqs[(0, 1, semconv.OP_REDUCE_SCATTER)] == SEQ_STRIDE + 0
    assert seqs[(1, 1, semconv.OP_ALL_GATHER)] == SEQ_STRIDE + 1
    assert seqs[(2, 1, semconv.OP_ALL_REDUCE)] == SEQ_STRIDE + 0
    # Messages per pair and step in microbatch order, the same on both sides.
    sends = sorted(
        (e.step, e.seq, e.start_ns) for rank, e in collectives(job)
        if rank == 0 and e.op == semconv.OP_SEND
    )  # fmt: skip
    assert [s[:2] for s in sends] == [(0, 0), (0, 1), (1, SEQ_STRIDE), (1, SEQ_STRIDE + 1)]
    assert sends[0][2] < sends[1][2]


def test_p2p_posted_together_are_async_and_a_lone_one_blocking(tmp_path: Path) -> None:
    for batched in (True, False):
        path = write_table(tmp_path / f"b{batched}.csv", one_f_one_b(batched=batched))
        job = read_whatif([path], job_id="wi")
        flags = Counter((rank, e.op, e.is_async) for rank, e in collectives(job) if e.step == 0)
        if batched:
            # Stage 0: forward-send(1) with backward-recv(0); stage 1: backward-send(0) with
            # forward-recv(1). Each worker's other message of each kind is blocking.
            for w in range(4):
                assert flags[(w, semconv.OP_SEND, True)] == 1
                assert flags[(w, semconv.OP_RECV, True)] == 1
                assert flags[(w, semconv.OP_SEND, False)] == 1
                assert flags[(w, semconv.OP_RECV, False)] == 1
        else:
            assert {key[2] for key in flags} == {False}
        assert all(not e.is_async for _, e in collectives(job) if e.peer is None)
        assert_joinable(job)


@pytest.mark.parametrize("pp", [2, 3])
def test_interleaved_messages_cross_the_chunk_boundary(pp: int, tmp_path: Path) -> None:
    # 2 chunks: the last stage's forward-send of chunk 0 goes to stage 0 (chunk 1), stage 0's
    # backward-send of chunk 1 to the last stage (chunk 0).
    rows = interleaved(pp, chunks=2, dp=2, tp=2)
    path = write_table(tmp_path / "il.csv", rows)
    job = read_whatif(
        [path], job_id="wi", meta=write_meta(tmp_path / "m.json", 2, pp, 2, num_model_chunks=2)
    )
    assert not [note for note in job.notes if "left out" in note]
    by_start = {((row["stage"] * 2 + row["dp_rank"]), row["start_ts"] * 1000): row for row in rows}
    checked = 0
    for rank, e in collectives(job):
        row = by_start[(rank, e.start_ns)]
        if e.peer is None:
            assert (e.pg, e.pg_size) == (f"dp-stage{row['stage']}", 2)
            continue
        stage, mc, d = row["stage"], row["mc"], row["dp_rank"]
        assert (e.pg, e.pg_size) == (f"pp-dp{d}", pp)
        step = 1 if row["optype"] in ("forward-send", "backward-recv") else -1
        peer_stage = (stage + step) % pp
        assert e.peer == peer_stage * 2 + d, row
        if row["optype"] == "forward-send" and stage == pp - 1:
            assert (mc, e.peer) == (0, d)  # stage 0, next chunk
            checked += 1
        if row["optype"] == "backward-send" and stage == 0:
            assert (mc, e.peer) == (1, (pp - 1) * 2 + d)  # last stage, previous chunk
            checked += 1
    assert checked == 2 * 2 * 2  # 2 replicas x 2 microbatches x both boundaries
    assert_joinable(job)
    # Two reduce-scatters per worker (one per chunk), numbered in chunk order.
    seqs = sorted(
        e.seq for rank, e in collectives(job) if rank == 0 and e.op == semconv.OP_REDUCE_SCATTER
    )
    assert seqs == [0, 1]


def test_peer_gmc_is_one_chunk_position_on() -> None:
    assert peer_gmc("forward-send", 3) == 4
    assert peer_gmc("forward-recv", 3) == 2
    assert peer_gmc("backward-send", 3) == 2
    assert peer_gmc("backward-recv", 3) == 4


def test_extension_columns_and_the_resource(tmp_path: Path) -> None:
    rows = one_f_one_b(dp=2, tp=4, steps=1)
    for row in rows:
        w = row["stage"] * 2 + row["dp_rank"]
        row.update(host=f"node{w // 2}", switch="leaf0", nic=f"ib{w % 2}", bytes=1024)
    job = read_whatif([write_table(tmp_path / "t.csv", rows)], job_id="wi")
    assert {(r.rank, r.host, r.nic) for r in job.ranks.values()} == {
        (w, f"node{w // 2}", f"ib{w % 2}") for w in range(4)
    }
    assert {e.nbytes for _, e in collectives(job)} == {1024}
    spans = [s for batch in spans_by_step(job).values() for s in batch]
    for span in spans:
        resource = span.resource.attributes
        w = resource[semconv.RANK]
        assert resource[semconv.WORLD_SIZE] == 4
        assert resource[semconv.WORKER_FIRST_GPU] == w * 4
        assert resource[semconv.WORKER_GPUS] == 4
        assert resource[semconv.PIPELINE_STAGE] == w // 2
        assert resource[semconv.DP_RANK] == w % 2
        assert resource[semconv.SWITCH] == "leaf0"
    names = Counter(s.name for s in spans)
    assert names["collective.send"] == names["collective.recv"] == 8
    assert names[semconv.SPAN_STEP_ROOT] == 1


def test_embedding_all_reduce_without_stages_is_left_out(tmp_path: Path) -> None:
    rows = []
    for d in range(2):
        rows += worker_rows(
            [("forward-compute", 0, 0, False), ("backward-compute", 0, 0, False),
             ("embedding-grads-all-reduce", -1, 0, False), ("grads-reduce-scatter", -1, 0, False)],
            dp_rank=d, stage=0, dp=2, pp=1, tp=1, step=0,
        )  # fmt: skip
    job = read_whatif([write_table(tmp_path / "dp.csv", rows)], job_id="wi")
    assert {e.op for _, e in collectives(job)} == {semconv.OP_REDUCE_SCATTER}
    assert any("left out 2 embedding-grads-all-reduce" in n for n in job.notes)


def test_a_message_without_its_other_side_is_left_out_with_a_note(tmp_path: Path) -> None:
    rows = one_f_one_b(steps=1)
    lost = next(
        i for i, r in enumerate(rows) if r["optype"] == "forward-recv" and r["dp_rank"] == 1
    )
    del rows[lost]
    job = read_whatif([write_table(tmp_path / "t.csv", rows)], job_id="wi")
    assert any("left out 1 sends without their recv and 0 recvs" in n for n in job.notes)
    assert_joinable(job)
    sends = [e for rank, e in collectives(job) if rank == 1 and e.op == semconv.OP_SEND]
    assert len(sends) == 1  # the lone forward-send has no span


def test_workers_whose_chunk_is_only_in_gmc(tmp_path: Path) -> None:
    rows = interleaved(3, chunks=2)
    for row in rows:
        row["mc"] = ""
    job = read_whatif([write_table(tmp_path / "t.csv", rows)], job_id="wi")
    assert not [n for n in job.notes if "left out" in n]
    assert_joinable(job)


# -- metadata, units, formats ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["job.json", "job.meta.json", "job_metadata.json", "metadata.json", "meta.json"]
)
def test_metadata_beside_the_table(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path / "job.csv", one_f_one_b(dp=2, tp=8, steps=1))
    write_meta(tmp_path / name, 2, 2, 8)
    code, out, err = cli(capsys, str(path), "--dry-run")
    assert code == 0, err
    assert "(4 ranks, 1 steps)" in out
    assert f"{name}: dp_size 2, pp_size 2, tp_size 8" in err


def test_meta_option_wins_and_without_one_the_sizes_are_inferred(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_table(tmp_path / "job.csv", one_f_one_b(dp=2, tp=8, steps=1))
    code, _, err = cli(capsys, str(path), "--dry-run")
    assert code == 0, err
    assert "no metadata file" in err
    assert "inferred dp_size 2 and pp_size 2" in err and "tp_size 8 from the rank column" in err
    # A metadata file elsewhere, named with --meta; one that disagrees with the rows fails.
    other = write_meta(tmp_path / "elsewhere.json", 2, 2, 4)
    code, _, err = cli(capsys, str(path), "--meta", str(other), "--dry-run")
    assert code == 2
    assert "job.csv:2: column 'rank': 0" not in err
    assert "column 'rank': 8, but (stage 0 * dp_size 2 + dp_rank 1) * tp_size 4 = 4" in err
    assert "nothing was sent" in err


@pytest.mark.parametrize(
    ("unit", "scale"), [("s", Decimal("1e-6")), ("ms", Decimal("1e-3")), ("us", 1), ("ns", 1000)]
)
def test_time_unit_inferred_from_epoch_start(
    unit: str, scale: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = one_f_one_b(steps=1)
    for row in rows:
        row["start_ts"] = Decimal(row["start_ts"]) * scale
        row["duration"] = Decimal(row["duration"]) * scale
    assert infer_unit([Decimal(row["start_ts"]) for row in rows]) == unit
    job = read_whatif([write_table(tmp_path / "t.csv", rows)], job_id="wi")
    assert any(f"looks like epoch {unit}" in note for note in job.notes)
    starts = sorted(e.start_ns for r in job.ranks.values() for e in r.events)
    assert starts[0] == T0_US * 1000
    assert all(e.end_ns - e.start_ns == OP_US * 1000 for _, e in collectives(job))


def test_relative_times_need_the_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = one_f_one_b(steps=1)
    for row in rows:
        row["start_ts"] -= T0_US
    assert infer_unit([Decimal(row["start_ts"]) for row in rows]) is None
    path = write_table(tmp_path / "t.csv", rows)
    code, _, err = cli(capsys, str(path), "--dry-run")
    assert code == 2
    assert "cannot tell the unit of start_ts" in err and "--time-unit" in err
    code, _, err = cli(capsys, str(path), "--time-unit", "us", "--dry-run")
    assert code == 0, err
    assert "moved so that the last span ends now" in err


def test_infer_unit_edges() -> None:
    assert infer_unit([Decimal("1790000000.5")]) == "s"
    assert infer_unit([Decimal(1_790_000_000_000)]) == "ms"
    assert infer_unit([Decimal(1_790_000_000_000_000_000)]) == "ns"
    assert infer_unit([Decimal(0), Decimal(1_790_000_000)]) is None
    assert infer_unit([Decimal(1_790_000_000), Decimal(1_790_000_000_000)]) is None  # mixed
    assert infer_unit([Decimal(10) ** 21]) is None
    assert infer_unit([]) is None


def test_the_format_is_told_from_the_header(tmp_path: Path) -> None:
    whatif = write_table(tmp_path / "w.csv", one_f_one_b(steps=1))
    columnar = tmp_path / "c.csv"
    columnar.write_text("rank,step,op,start,duration\n0,0,forward,1790000000,0.1\n")
    assert input_files([str(whatif)], "auto") == ([whatif], WHATIF)
    assert input_files([str(columnar)], "auto") == ([columnar], CSV)
    (tmp_path / "dir").mkdir()
    write_table(tmp_path / "dir" / "part.csv", one_f_one_b(steps=1))
    assert input_files([str(tmp_path / "dir")], "auto")[1] == WHATIF


def test_parquet_reads_as_the_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = one_f_one_b(dp=2, tp=8)
    csv_job = read_whatif([write_table(tmp_path / "job.csv", rows)], job_id="wi")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "job.parquet")
    parquet_job = read_whatif([tmp_path / "job.parquet"], job_id="wi")
    assert parquet_job.ranks == csv_job.ranks
    # Seconds as floats: read through their shortest repr, as written.
    seconds = [{**row, "start_ts": row["start_ts"] / 1e6, "duration": 1e-4} for row in rows]
    pq.write_table(pa.Table.from_pylist(seconds), tmp_path / "s.parquet")
    job = read_whatif([tmp_path / "s.parquet"], job_id="wi")
    assert any("looks like epoch s" in note for note in job.notes)
    assert {e.end_ns - e.start_ns for _, e in collectives(job)} == {100_000}
    write_meta(tmp_path / "job.json", 2, 2, 8)
    code, out, err = cli(capsys, str(tmp_path / "job.parquet"), "--dry-run")
    assert code == 0, err
    assert "(4 ranks, 2 steps)" in out and "job.json: dp_size 2" in err
    # A bad cell names its row.
    rows[5]["optype"] = "forward"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    code, _, err = cli(capsys, str(tmp_path / "bad.parquet"), "--dry-run")
    assert code == 2
    assert "bad.parquet: row 6: column 'optype': unknown optype 'forward'" in err


def test_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "job.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    code, _, err = cli(capsys, str(path), "--dry-run")
    assert code == 2
    assert "pip install 'skewtrace[parquet]'" in err and "nothing was sent" in err


# -- bad tables: exit 2, the row named, nothing sent ----------------------------------------


def _changed(row_index: int, **changes: Any) -> list[dict[str, Any]]:
    rows = one_f_one_b(steps=1)
    rows[row_index].update(changes)
    return rows


BAD: dict[str, tuple[list[dict[str, Any]], list[str] | None, list[str]]] = {
    "missing column": (one_f_one_b(steps=1), [c for c in COLUMNS if c != "duration"],
                       ["t.csv:1:", "missing column 'duration'"]),
    "unknown optype": (_changed(2, optype="fwd-send"), None,
                       ["t.csv:4:", "unknown optype 'fwd-send'", "forward-send", "gc"]),
    "rank disagrees": (_changed(0, rank=3), None,
                       ["t.csv:2:", "column 'rank': 3, but (stage 0 * dp_size 2 + dp_rank 0) "
                        "* tp_size 8 = 0"]),
    "duplicate": (one_f_one_b(steps=1)[:3] + one_f_one_b(steps=1), None,
                  ["t.csv:5: duplicate of ",
                   "t.csv:2 (worker 0, step 0, dataloader, mc 0, mb_id 0"]),
    "bad number": (_changed(1, start_ts="17900000x"), None,
                   ["t.csv:3:", "column 'start_ts': '17900000x' is not a number"]),
    "negative duration": (_changed(1, duration=-5), None, ["t.csv:3:", "'-5' is negative"]),
    "message without a microbatch": (_changed(2, mb_id=-1), None,
                                     ["t.csv:4:", "forward-send needs its microbatch"]),
    "gmc disagrees": (_changed(1, gmc=3), None,
                      ["t.csv:3:", "column 'gmc': 3, but mc 0 * pp_size 2 + stage 0 = 0"]),
    "no previous stage": (_changed(2, optype="backward-send"), None,
                          ["t.csv:4:", "no previous stage or chunk to send to"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_tables_are_named_and_nothing_is_sent(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows, columns, expected = BAD[case]
    if columns is not None:
        rows = [{k: v for k, v in row.items() if k in columns} for row in rows]
    path = write_table(tmp_path / "t.csv", rows, columns)
    write_meta(tmp_path / "t.json", 2, 2, 8, num_model_chunks=1)
    code, out, err = cli(capsys, str(path), "--dry-run")
    assert code == 2, (out, err)
    assert "Traceback" not in err
    for text in expected:
        assert text in err, (text, err)
    assert "nothing was sent" in err


def test_every_optype_is_listed() -> None:
    assert set(OPTYPES) == {
        "forward-compute", "backward-compute", "optimizer-clip-main-grad", "optimizer", "gc",
        "dataloader", "forward-send", "forward-recv", "backward-send", "backward-recv",
        "grads-reduce-scatter", "params-all-gather", "embedding-grads-all-reduce",
        "layernorm-grads-all-reduce",
    }  # fmt: skip


def test_phase_events_time_forward_and_backward_on_the_host(tmp_path: Path) -> None:
    job = read_whatif([write_table(tmp_path / "t.csv", one_f_one_b(steps=1))], job_id="wi")
    timings = {
        (e.name, e.timing)
        for r in job.ranks.values()
        for e in r.events
        if isinstance(e, PhaseEvent)
    }
    assert (semconv.SPAN_FORWARD, semconv.TIMING_HOST) in timings
    assert (semconv.SPAN_OPTIMIZER_STEP, None) in timings


def test_the_report_says_which_worker_a_rank_is() -> None:
    from skewtrace.report.collect import _rank_info

    resource = {semconv.WORKER_FIRST_GPU: 40, semconv.WORKER_GPUS: 8,
                semconv.PIPELINE_STAGE: 1, semconv.DP_RANK: 1}  # fmt: skip
    assert _rank_info(5, resource).worker == "stage 1, replica 1, GPUs 40-47"
    assert _rank_info(5, {**resource, semconv.WORKER_GPUS: 1}).worker.endswith("GPU 40")
    assert _rank_info(5, {semconv.PIPELINE_STAGE: 1}).worker == ""  # a rank process


def test_a_worker_without_rows_is_named(tmp_path: Path) -> None:
    rows = [row for row in one_f_one_b(steps=1) if (row["stage"], row["dp_rank"]) != (1, 1)]
    job = read_whatif([write_table(tmp_path / "t.csv", rows)], job_id="wi", meta=None)
    # The sizes are inferred from the rows left: dp 2, pp 2 (worker 2 is there).
    assert sorted(rank for _, rank in job.ranks) == [0, 1, 2]
    assert {r.world_size for r in job.ranks.values()} == {4}
    notes = "\n".join(job.notes)
    assert "1 of 4 workers have no rows (ranks 3)" in notes
    assert "collective calls lack rows of some members" in notes
    assert "left out 2 sends without their recv and 2 recvs without their send" in notes
