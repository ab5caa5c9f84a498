"""Collectives read from c10d's Flight Recorder (skewtrace.rank.flight_recorder).

The parser runs on dumps in the format ``torch._C._distributed_c10d._dump_fr_trace`` writes
(tests/data/flight_recorder/*.json, recorded from gloo here and written after torch's
FlightRecorder.hpp for NCCL). The reader runs for real in a gloo job of two processes
(this file is the rank worker when run as a script), once with
``SKEWTRACE_COLLECTIVES=flight_recorder`` and once with ``hooks``: each path has a span for
every collective the job ran (counted by the job itself, and by c10d's own per-group
sequence numbers), and the two paths give the same (step, op, group, seq, bytes) per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from conftest import free_port  # noqa: E402

DATA = HERE.parent / "data" / "flight_recorder"
STEPS = 3
WORLD = 2


# ---------------------------------------------------------------------------- parser


def test_parse_gloo_dump_recorded_here() -> None:
    from skewtrace.rank.flight_recorder import parse_dump

    dump = json.loads((DATA / "gloo_torch_2.15.json").read_text())
    entries = parse_dump(dump)
    # send/recv are not in a gloo dump at all; every entry is a collective.
    assert [e.op for e in entries] == [
        "all_reduce", "all_reduce", "all_gather", "broadcast", "all_reduce", "all_reduce",
        "barrier",
    ]  # fmt: skip
    first = entries[0]
    assert (first.pg_name, first.pg_desc, first.backend) == ("0", "default_pg", "gloo")
    assert first.seq == 1 and first.nbytes == 4000
    assert first.completed_ns is None and first.retired  # gloo records no completion time
    assert entries[2].nbytes == 4000  # all_gather: the input, not the gathered output
    assert entries[5].pg_name == "1" and entries[5].seq == 1  # a second group counts its own
    assert entries[6].nbytes == 0


def test_parse_nccl_dump_takes_completion_and_skips_p2p() -> None:
    from skewtrace.rank.flight_recorder import parse_dump

    dump = json.loads((DATA / "nccl_shape.json").read_text())
    entries = parse_dump(dump)
    assert [(e.op, e.seq) for e in entries] == [
        ("all_reduce", 1), ("reduce_scatter", 2), ("all_gather", 3),
    ]  # fmt: skip
    assert entries[0].completed_ns == 1700000000002000000
    assert entries[0].duration_ms == pytest.approx(0.5)
    assert entries[1].nbytes == 2 * 1024 * 2  # [2, 1024] BFloat16
    assert entries[2].completed_ns is None and not entries[2].retired  # still in flight


class _FakeApi:
    """``_dump_fr_trace`` over a list of entry dicts the test edits."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.status = 0

    def _dump_fr_trace(self, collectives: bool, stacks: bool, active: bool, backend: str) -> bytes:
        import pickle

        data: dict[str, Any] = {"version": "2.10", "pg_status": {"0": {"n": self.status}}}
        if collectives:
            data["entries"] = [e for e in self.entries if e["profiling_name"].startswith(backend)]
        return pickle.dumps(data)


def _entry(seq: int, *, retired: bool = True, created: int = 0) -> dict[str, Any]:
    return {
        "profiling_name": "gloo:all_reduce", "process_group": ("0", "default_pg"),
        "collective_seq_id": seq, "input_sizes": [[2]], "input_dtypes": ["Float"],
        "time_created_ns": created or time.time_ns(), "retired": retired, "state": "scheduled",
        "is_p2p": False,
    }  # fmt: skip


def test_reader_records_each_entry_once_waits_for_retirement_and_counts_the_lost() -> None:
    from skewtrace.rank._events import CollectiveEvent, typed
    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.flight_recorder import (
        DROP_REASON_NEVER_COMPLETED,
        DROP_REASON_OVERWRITTEN,
        FlightRecorderReader,
        GroupInfo,
    )

    api = _FakeApi()
    recorder = Recorder(1000)
    reader = FlightRecorderReader(
        recorder, lambda name: GroupInfo("default", 2), backends=("gloo",), c10d_c=api
    )
    api.entries = [_entry(1), _entry(2, retired=False)]
    api.status = 1
    assert reader.poll() == 1
    assert reader.poll() == 0  # nothing new, the pending one still in flight
    api.entries[1]["retired"] = True
    api.entries.append(_entry(3))
    api.status = 2
    assert reader.poll() == 2
    # The ring wrapped: 4 and 5 were overwritten before a read saw them.
    api.entries = [_entry(6), _entry(7, retired=False)]
    api.status = 3
    assert reader.poll() == 1
    reader.stop(timeout_s=0.1)
    events = [typed(e) for e in recorder.drain(100)]
    assert all(isinstance(e, CollectiveEvent) for e in events)
    assert [e.seq for e in events] == [0, 1, 2, 5]  # type: ignore[union-attr]
    assert recorder.dropped() == {DROP_REASON_OVERWRITTEN: 2, DROP_REASON_NEVER_COMPLETED: 1}


def test_entries_overwritten_before_the_first_read_are_counted() -> None:
    """The ring wrapped before the reader's first read: the group's sequence number when
    reading began says how many were lost."""
    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.flight_recorder import (
        DROP_REASON_OVERWRITTEN,
        FlightRecorderReader,
        GroupInfo,
    )

    class Api(_FakeApi):
        def _dump_fr_trace(self, c: bool, st: bool, a: bool, backend: str) -> bytes:
            import pickle

            data = pickle.loads(super()._dump_fr_trace(c, st, a, backend))
            data["pg_status"] = {"0": {"last_enqueued_collective": 3}}
            return pickle.dumps(data)

    api = Api()
    recorder = Recorder(100)
    reader = FlightRecorderReader(
        recorder, lambda name: GroupInfo("default", 2), backends=("gloo",), c10d_c=api
    )
    reader._snapshot()
    api.entries = [dict(_entry(6), pg_id=0), dict(_entry(7), pg_id=0)]
    assert reader.poll() == 2
    assert recorder.dropped() == {DROP_REASON_OVERWRITTEN: 2}


def test_nccl_spans_take_the_device_duration_else_the_watchdogs_discovery() -> None:
    from skewtrace.rank._events import typed
    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.flight_recorder import FlightRecorderReader, GroupInfo, parse_dump

    dump = json.loads((DATA / "nccl_shape.json").read_text())
    recorder = Recorder(10)
    reader = FlightRecorderReader(
        recorder, lambda name: GroupInfo("default", 2), backends=("nccl",), c10d_c=object()
    )
    timed = parse_dump(dump)[0]
    untimed = timed._replace(duration_ms=None, seq=4)
    for entry in (timed, untimed):
        reader._record(entry, GroupInfo("default", 2), 0)
    a, b = (typed(e) for e in recorder.drain(10))
    anchor = recorder.epoch_anchor_ns
    assert (a.start_ns + anchor, a.end_ns - a.start_ns) == (timed.created_ns, 500_000)  # type: ignore[union-attr]
    assert a.timing == "flight_recorder"  # type: ignore[union-attr]
    assert (b.end_ns + anchor, b.timing) == (timed.completed_ns, "flight_recorder_polled")  # type: ignore[union-attr]


def test_auto_reads_nccl_only_with_device_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    from skewtrace.rank import flight_recorder as fr

    monkeypatch.setattr(fr, "group_backends", lambda pg: ["nccl"])
    monkeypatch.setattr(fr, "self_recording", lambda backend: True)
    monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING", raising=False)
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    assert not fr.covers(object(), "auto")
    assert fr.covers(object(), "flight_recorder")
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    assert fr.covers(object(), "auto")
    assert not fr.covers(object(), "hooks")
    monkeypatch.setattr(fr, "group_backends", lambda pg: ["gloo"])
    assert not fr.covers(object(), "auto")
    assert fr.covers(object(), "flight_recorder")


def test_step_is_the_first_step_ending_after_the_call() -> None:
    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.flight_recorder import step_at

    recorder = Recorder(10)
    assert step_at(recorder, 5) == 0
    recorder.end_step(100)
    recorder.end_step(200)
    assert [step_at(recorder, t) for t in (50, 100, 150, 250)] == [0, 1, 1, 2]


def test_a_failing_read_is_counted_never_raised() -> None:
    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.flight_recorder import (
        DROP_REASON_READ_FAILED,
        FlightRecorderReader,
        GroupInfo,
    )

    class Broken:
        def _dump_fr_trace(self, *args: Any) -> bytes:
            raise RuntimeError("no recorder")

    recorder = Recorder(10)
    reader = FlightRecorderReader(
        recorder, lambda name: GroupInfo("g", 1), backends=("gloo",), c10d_c=Broken()
    )
    assert reader.poll() == 0
    assert recorder.dropped() == {DROP_REASON_READ_FAILED: 1}


# ---------------------------------------------------------------------------- one rank


def _spans_after_uninstrument(exporter: Any) -> list[Any]:
    import skewtrace

    skewtrace.uninstrument()
    return [s for s in exporter.get_finished_spans() if s.name.startswith("collective.")]


@pytest.mark.usefixtures("unit_job")
def test_flight_recorder_path_on_one_rank_every_api(
    world_of_one: None, memory_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every API on the Flight Recorder path, no group hook installed: functional
    collectives included, and the functional all-gather and reduce-scatter too, whose gloo
    works never report completion to the hooks (they lose those spans; gloo still retires
    the entries)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import skewtrace

    monkeypatch.setenv("SKEWTRACE_COLLECTIVES", "flight_recorder")
    monkeypatch.setenv("SKEWTRACE_FLIGHT_RECORDER_INTERVAL_MILLIS", "5")
    provider, exporter = memory_provider
    skewtrace.instrument(tracer_provider=provider)
    session = skewtrace.SkewtraceInstrumentor().session
    assert session is not None and session.flight_recorder is not None
    group = dist.group.WORLD
    assert not session.ctx.process_groups._hooked  # type: ignore[union-attr]
    before = group._get_sequence_number_for_group()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    funcol.all_reduce(t, "sum", group).wait()
    funcol.all_gather_single(t, 0, group).wait()
    funcol.reduce_scatter_single(t, "sum", 0, group).wait()
    dist.broadcast(t, src=0)
    dist.barrier()
    ran = group._get_sequence_number_for_group() - before
    spans = _spans_after_uninstrument(exporter)
    assert sorted(s.attributes["training.collective.seq"] for s in spans) == [
        before + i for i in range(ran)
    ]
    assert [s.attributes["training.collective.op"] for s in spans].count("all_gather") == 1
    assert session.recorder.dropped() == {}


@pytest.mark.usefixtures("unit_job")
def test_ddp_buckets_on_the_flight_recorder_path_are_counted_once(
    world_of_one: None, memory_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No comm hook is installed where the Flight Recorder covers DDP's group: each bucket's
    all-reduce has one span, read from the recorder, in the step that ran it."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import skewtrace

    monkeypatch.setenv("SKEWTRACE_COLLECTIVES", "flight_recorder")
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 8)), bucket_cap_mb=0.001
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    provider, exporter = memory_provider
    skewtrace.instrument(model=model, optimizer=optimizer, tracer_provider=provider)
    assert not hasattr(model, "_skewtrace_comm_hook_slot")
    group = dist.group.WORLD
    before = group._get_sequence_number_for_group()
    per_step = []
    for _ in range(3):
        start = group._get_sequence_number_for_group()
        model(torch.ones(2, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        per_step.append(group._get_sequence_number_for_group() - start)
    ran = group._get_sequence_number_for_group() - before
    spans = _spans_after_uninstrument(exporter)
    assert ran >= 3 and len(spans) == ran
    assert {s.attributes["training.collective.source"] for s in spans} == {"api"}
    steps = [s.attributes["training.step"] for s in spans]
    assert [steps.count(i) for i in range(3)] == per_step


@pytest.mark.usefixtures("unit_job")
def test_without_the_flight_recorder_api_the_hooks_run_logged_once(
    world_of_one: None,
    memory_provider: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import torch
    import torch.distributed as dist

    import skewtrace
    from skewtrace.rank import flight_recorder

    monkeypatch.setenv("SKEWTRACE_COLLECTIVES", "flight_recorder")
    monkeypatch.setattr(flight_recorder, "api", lambda: None)
    provider, exporter = memory_provider
    with caplog.at_level("WARNING", logger="skewtrace"):
        skewtrace.instrument(tracer_provider=provider)
    assert sum("no Flight Recorder" in r.getMessage() for r in caplog.records) == 1
    dist.all_reduce(torch.ones(2))
    (span,) = _spans_after_uninstrument(exporter)
    assert span.attributes["training.timing"] == "host"


@pytest.mark.usefixtures("unit_job")
def test_auto_keeps_gloo_on_the_hooks(world_of_one: None, memory_provider: Any) -> None:
    """gloo records no completion times: auto reads no gloo group from the Flight Recorder."""
    import torch
    import torch.distributed as dist

    import skewtrace

    provider, exporter = memory_provider
    skewtrace.instrument(tracer_provider=provider)
    dist.all_reduce(torch.ones(2))
    (span,) = _spans_after_uninstrument(exporter)
    assert span.attributes["training.timing"] == "host"


# ---------------------------------------------------------------------------- rank side


def _job(rank: int) -> dict[str, Any]:
    """A few steps of every collective kind, sync and async; returns what it ran."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    sub = dist.new_group([0, 1])
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    import skewtrace

    exporter, provider = _memory_provider()
    skewtrace.instrument(optimizer=optimizer, tracer_provider=provider)
    world = dist.group.WORLD
    before = {
        "default": world._get_sequence_number_for_group(),
        "sub": sub._get_sequence_number_for_group(),
    }
    ran: dict[str, int] = {"default": 0, "sub": 0}
    # Per group, in call order: the job's own (before, after) epoch times of each collective,
    # from before the call to after its wait.
    windows: dict[str, list[tuple[int, int]]] = {"default": [], "sub": []}

    def call(group: str, fn: Any, count: int = 1) -> None:
        before = time.time_ns()
        fn()
        after = time.time_ns()
        windows[group].extend([(before, after)] * count)
        ran[group] += count

    def two_async() -> None:
        works = [dist.all_reduce(torch.ones(n), async_op=True) for _ in range(2)]
        for w in works:
            w.wait()

    n = 256
    t = torch.ones(n) * (rank + 1)
    for _ in range(STEPS):
        call("default", lambda: dist.all_reduce(t))
        call("default", lambda: dist.all_reduce(t, async_op=True).wait())
        call("default", two_async, 2)
        call("default", lambda: dist.all_gather([torch.empty(n) for _ in range(WORLD)], t))
        call("default", lambda: dist.all_gather_into_tensor(torch.empty(n * WORLD), t))
        call("default", lambda: dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * WORLD)))
        call("default", lambda: dist.broadcast(t, src=0))
        call("default", lambda: dist.broadcast(t, src=1, async_op=True).wait())
        call("default", lambda: funcol.wait_tensor(funcol.all_reduce(t, "sum", world)))
        call("sub", lambda: dist.all_reduce(t, group=sub))
        call("default", lambda: dist.barrier())
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    after = {
        "default": world._get_sequence_number_for_group(),
        "sub": sub._get_sequence_number_for_group(),
    }
    skewtrace.uninstrument()
    spans = []
    for s in exporter.get_finished_spans():
        if not s.name.startswith("collective."):
            continue
        spans.append(
            {"name": s.name, "start": s.start_time, "end": s.end_time, **dict(s.attributes)}
        )
    return {
        "rank": rank,
        "ran": ran,
        "c10d_ran": {k: after[k] - before[k] for k in after},
        "sub_name": str(sub.group_name),
        "spans": spans,
        "windows": windows,
    }  # fmt: skip


def _memory_provider() -> tuple[Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def worker_main() -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = _job(dist.get_rank())
    dist.destroy_process_group()
    Path(os.environ["FR_TEST_OUT"]).joinpath(f"rank{result['rank']}.json").write_text(
        json.dumps(result)
    )


def _run_job(tmp: Path, collectives: str) -> list[dict[str, Any]]:
    out = tmp / collectives
    out.mkdir()
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ)
        env.update(
            RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FR_TEST_OUT=str(out),
            SKEWTRACE_JOB_ID="fr-test", SKEWTRACE_COLLECTIVES=collectives,
            SKEWTRACE_FLIGHT_RECORDER_INTERVAL_MILLIS="5", SKEWTRACE_EXPORT_INTERVAL_MILLIS="50",
            OTEL_METRICS_EXPORTER="none", OTEL_TRACES_EXPORTER="none",
            TORCH_FR_BUFFER_SIZE="256",
        )  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(HERE), "--worker"], env=env))
    for p in procs:
        assert p.wait(timeout=240) == 0
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def both_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("fr")
    return {path: _run_job(tmp, path) for path in ("flight_recorder", "hooks")}


def _key(span: dict[str, Any], sub_name: str) -> tuple[Any, ...]:
    op = span["training.collective.op"]
    return (
        span["training.step"],
        op,
        span["training.collective.pg"].replace(sub_name, "sub"),
        span["training.collective.seq"],
        span["training.collective.bytes"],
    )


def _complete(result: dict[str, Any]) -> None:
    """Every collective the job ran has exactly one span (counted per group by the job, and
    by c10d's own sequence numbers), numbered 0..n-1 on each group."""
    ran = result["ran"]
    assert result["c10d_ran"] == ran
    for group, count in ran.items():
        pg = "default" if group == "default" else result["sub_name"]
        seqs = sorted(
            s["training.collective.seq"] for s in result["spans"]
            if s["training.collective.pg"] == pg
        )  # fmt: skip
        assert seqs == list(range(count)), (group, seqs)


@pytest.mark.parametrize("path", ["flight_recorder", "hooks"])
def test_every_collective_the_job_ran_has_a_span(
    both_paths: dict[str, list[dict[str, Any]]], path: str
) -> None:
    for result in both_paths[path]:
        _complete(result)


def test_completeness_check_fails_when_a_span_is_missing(
    both_paths: dict[str, list[dict[str, Any]]],
) -> None:
    """The check above is not vacuous: one span less fails it."""
    result = dict(both_paths["flight_recorder"][0])
    result["spans"] = result["spans"][1:]
    with pytest.raises(AssertionError):
        _complete(result)


def test_timing_says_where_times_came_from(both_paths: dict[str, list[dict[str, Any]]]) -> None:
    for result in both_paths["flight_recorder"]:
        assert {s["training.timing"] for s in result["spans"]} == {"flight_recorder_polled"}
    for result in both_paths["hooks"]:
        assert {s["training.timing"] for s in result["spans"]} == {"host"}


def test_both_paths_give_the_same_spans(both_paths: dict[str, list[dict[str, Any]]]) -> None:
    """Same (step, op, group, seq, bytes) on each rank, but for one difference of the backend:
    gloo runs reduce_scatter_tensor as an all-reduce and records it so in the Flight Recorder
    (NCCL records reduce_scatter)."""
    for fr, hooks in zip(both_paths["flight_recorder"], both_paths["hooks"], strict=True):
        fr_keys = sorted(_key(s, fr["sub_name"]) for s in fr["spans"])
        hook_keys = sorted(
            tuple("all_reduce" if v == "reduce_scatter" else v for v in _key(s, hooks["sub_name"]))
            for s in hooks["spans"]
        )
        assert fr_keys == hook_keys


@pytest.mark.parametrize("path", ["flight_recorder", "hooks"])
def test_span_times_lie_within_the_calls_own_clock(
    both_paths: dict[str, list[dict[str, Any]]], path: str
) -> None:
    """Each span against the job's own clock around the call (from before it to after its
    wait): it starts inside that window (the Flight Recorder entry is created as the call
    enqueues), and it ends after it starts and no later than the window's end or, on the
    Flight Recorder path, a few reads after it (gloo retires an entry some time after its
    work completes; the reader reads every 5 ms here, on a loaded machine). How long before
    the window's end a span may end is not checked: a thread descheduled between the work's
    completion and the clock read after its wait (milliseconds on a loaded machine) moves
    the window's end, not the span."""
    slack = 5_000_000  # 5 ms: two clocks (the recorder's anchor and time_ns), threads
    late = 1_000_000_000 if path == "flight_recorder" else slack
    for result in both_paths[path]:
        for group, windows in result["windows"].items():
            pg = "default" if group == "default" else result["sub_name"]
            spans = sorted(
                (s for s in result["spans"] if s["training.collective.pg"] == pg),
                key=lambda s: s["training.collective.seq"],
            )
            assert len(spans) == len(windows)
            for span, (before, after) in zip(spans, windows, strict=True):
                assert before - slack <= span["start"] <= after + slack, span
                assert span["start"] <= span["end"] <= after + late, (span, after)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker_main()
