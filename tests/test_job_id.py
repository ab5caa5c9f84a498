"""A job id without configuration: the ranks agree on one through the default process group's
store (``skewtrace.rank._job_id``), and the rank's identity is decided only once it is known
(``skewtrace.rank._identity``), spans waiting in the buffer until then.

- the store agreement on a real ``HashStore``: rank 0 writes (a value already there wins),
  the others read without waiting, and give up after the timeout or when the store fails;
- the resolver's order: the given id and the launcher's first, a single rank generates one,
  several ranks wait for the group and its store; zero-code without a group or a launcher
  holds for the grace period; at exit it decides or raises;
- the export thread holds the events while the identity is pending (none lost, none
  exported under a wrong identity) and drops and counts them, with one error line, when it
  cannot be had;
- ``instrument()`` after ``init_process_group`` on a two-rank (fake backend) group with no id:
  rank 0 writes the id, rank 1 reads it, the spans carry it; a rank 1 whose rank 0 never
  writes is not held up at the call and, after the timeout, drops and counts its spans;
- two ranks of ``torch.multiprocessing.spawn`` under zero-code, instrumented before
  ``init_process_group``, no id anywhere: one id, from the store (slow);
- an unmodified script (``examples/train_plain.py``) under ``opentelemetry-instrument`` and
  ``torchrun --master-port`` (static rendezvous: ``TORCHELASTIC_RUN_ID=none``), no job id
  anywhere, launched twice against the built collector: every rank's spans arrive, one id per
  launch, two launches two ids (slow, collector).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import needs
import skewtrace
from conftest import free_port
from skewtrace import semconv
from skewtrace.rank._events import STEP
from skewtrace.rank._export.materialize import Identity
from skewtrace.rank._export.thread import BackgroundExporter
from skewtrace.rank._identity import SINGLE_PROCESS_GRACE_S, Group, IdentityResolver
from skewtrace.rank._job_id import (
    DROP_REASON_NO_JOB_ID,
    JOB_ID_KEY,
    JobIdError,
    StoreJobId,
    job_id_key,
)
from skewtrace.rank._recorder import Recorder
from skewtrace.rank.config import ConfigError, job_id_from_env
from skewtrace.rank.resource import RankInfo, build_resource

REPO_ROOT = Path(__file__).resolve().parent.parent
JOB_VARS = ("SKEWTRACE_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# ------------------------------------------------------------------ the store agreement


def test_rank_zero_writes_and_the_others_read_without_waiting() -> None:
    store, clock = dist.HashStore(), _Clock()
    reader = StoreJobId(store, 1, timeout_s=60, clock=clock)
    assert reader.poll() is None  # rank 0 has not written yet: no wait, no error
    writer = StoreJobId(store, 0, timeout_s=60, clock=clock, generate=lambda: "job-abc")
    assert writer.poll() == "job-abc"
    assert reader.poll() == "job-abc"
    assert store.get(JOB_ID_KEY) == b"job-abc"
    # The key is skewtrace's own, away from torch's.
    assert JOB_ID_KEY.startswith("skewtrace/")


def test_a_value_already_in_the_store_wins() -> None:
    store = dist.HashStore()
    store.set(JOB_ID_KEY, "job-first")
    writer = StoreJobId(store, 0, timeout_s=60, generate=lambda: "job-second")
    assert writer.poll() == "job-first"


def test_reader_gives_up_after_the_timeout() -> None:
    clock = _Clock()
    reader = StoreJobId(dist.HashStore(), 3, timeout_s=30, clock=clock, sleep=clock.sleep)
    clock.now += 29
    assert reader.poll() is None
    assert reader.wait(0.5) is None  # bounded, and still before the deadline
    clock.now += 1
    with pytest.raises(JobIdError, match=r"rank 0 did not write one.*within 30 s"):
        reader.poll()


class _BrokenStore:
    def check(self, keys: list[str]) -> bool:
        raise RuntimeError("connection reset")

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        raise RuntimeError("connection reset")


@pytest.mark.parametrize("rank", [0, 1])
def test_a_failing_store_is_a_job_id_error(rank: int) -> None:
    with pytest.raises(JobIdError, match="store failed") as raised:
        StoreJobId(_BrokenStore(), rank, timeout_s=60).poll()
    assert raised.value.drop_reason == DROP_REASON_NO_JOB_ID


# ------------------------------------------------------------------ the resolver


def _resolver(
    env: dict[str, str],
    group: Group | None = None,
    *,
    zero_code: bool = True,
    clock: Callable[[], float] | None = None,
    job_id: str | None = None,
) -> IdentityResolver:
    return IdentityResolver(
        job_id,
        timeout_s=60,
        wait_for_rank=zero_code,
        final_wait_s=0.2,
        env=env,
        clock=clock or _Clock(),
        find_group=lambda: group,
    )


def test_given_ids_keep_their_order_and_torchruns_none_is_ignored() -> None:
    env = {"SKEWTRACE_JOB_ID": "a", "TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "c"}
    assert job_id_from_env("arg", env) == "arg"
    assert job_id_from_env(None, env) == "a"
    assert job_id_from_env(None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7"}) == "7"
    assert job_id_from_env(None, {"TORCHELASTIC_RUN_ID": "none"}) is None
    # An elastic restart is an attempt of its own; a count that is not one is the first.
    restarted = {"SKEWTRACE_JOB_ID": "a", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert job_id_from_env(None, restarted) == "a-attempt2"
    assert job_id_from_env("arg", restarted) == "arg-attempt2"
    assert job_id_from_env(None, {**restarted, "TORCHELASTIC_RESTART_COUNT": "0"}) == "a"
    assert job_id_from_env(None, {**restarted, "TORCHELASTIC_RESTART_COUNT": "x"}) == "a"
    assert job_id_from_env(None, {"TORCHELASTIC_RESTART_COUNT": "1"}) is None
    # torchrun's static rendezvous keeps one store for every attempt: the key names it.
    assert job_id_key({}) == JOB_ID_KEY
    assert job_id_key({"TORCHELASTIC_RESTART_COUNT": "1"}) == f"{JOB_ID_KEY}/attempt1"
    # A given id never touches the store.
    group = Group(1, 2, _BrokenStore())
    resolved = _resolver({"TORCHELASTIC_RUN_ID": "run-9"}, group).resolve()
    assert resolved == ("run-9", RankInfo(1, 1, 2))


def test_a_single_rank_generates_its_id() -> None:
    first = _resolver({"WORLD_SIZE": "1", "RANK": "0"}).resolve()
    second = _resolver({}, Group(0, 1, None)).resolve()
    assert first is not None and second is not None
    assert first[0].startswith("local-") and second[0].startswith("local-")
    assert first[0] != second[0]


def test_several_ranks_wait_for_the_group_then_agree_through_its_store() -> None:
    env = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    store = dist.HashStore()
    found: list[Group | None] = [None]
    rank1 = IdentityResolver(
        None, timeout_s=60, wait_for_rank=True, env=env, find_group=lambda: found[0]
    )
    assert rank1.resolve() is None  # no process group yet: nothing to agree through
    rank1.on_group(Group(1, 2, store))  # init_process_group set it
    assert rank1.resolve() is None  # rank 0 has not written yet
    rank0 = _resolver({"RANK": "0", "WORLD_SIZE": "2"}, Group(0, 2, store))
    resolved0 = rank0.resolve()
    assert resolved0 is not None and resolved0[0].startswith("job-")
    assert rank1.resolve() == (resolved0[0], RankInfo(1, 1, 2))
    assert rank1.resolve() is rank1.result  # decided once


def test_zero_code_without_group_or_launcher_holds_for_the_grace_then_is_a_single_rank() -> None:
    """A spawn child before init_process_group must not claim rank 0 of a world of one."""
    clock = _Clock()
    resolver = _resolver({}, None, clock=clock, job_id="given")
    assert resolver.resolve() is None
    clock.now += SINGLE_PROCESS_GRACE_S
    assert resolver.resolve() == ("given", RankInfo(0, 0, 1))
    # At exit it does not wait for the grace.
    assert _resolver({}, None, job_id="given").resolve(final=True) == ("given", RankInfo(0, 0, 1))


def test_at_exit_a_rank_without_group_or_store_value_raises() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2"}
    with pytest.raises(JobIdError, match="never saw a process group"):
        _resolver(env).resolve(final=True)
    # A real clock: the final wait (0.2 s here) sleeps.
    resolver = _resolver(env, Group(1, 2, dist.HashStore()), clock=time.monotonic)
    assert resolver.resolve() is None
    with pytest.raises(JobIdError, match="not in the process group's store"):
        resolver.resolve(final=True)
    assert resolver.rank_info == RankInfo(1, 1, 2)


def test_after_init_without_id_or_group_several_ranks_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"SKEWTRACE_JOB_ID.*init_process_group"):
        _resolver({"RANK": "0", "WORLD_SIZE": "4"}, zero_code=False).resolve()


# ------------------------------------------------------------------ the export thread


class _ListSink:
    sampler = None

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def export(self, spans: Any) -> bool:
        self.spans.extend(spans)
        return True

    def flush(self, timeout_millis: int) -> None:
        return None

    def shutdown(self) -> None:
        return None


def _steps(recorder: Recorder, count: int) -> None:
    for step in range(count):
        recorder.record((STEP, step, 10 + step, 11 + step))


def test_events_wait_for_the_identity_and_none_is_lost() -> None:
    recorder, sink = Recorder(64), _ListSink()
    known: list[Identity | None] = [None]
    exporter = BackgroundExporter(recorder, sink, lambda final: known[0], 1_000_000)
    _steps(recorder, 3)
    exporter._cycle(final=False)
    assert sink.spans == [] and len(recorder.events) == 3  # held, not drained
    known[0] = Identity("job-x", 1, build_resource("job-x", RankInfo(1, 1, 2), host_name="n"))
    exporter._cycle(final=False)
    steps = [s for s in sink.spans if s.name == "train.step"]
    assert len(steps) == 3
    assert {s.resource.attributes[semconv.JOB_ID] for s in sink.spans} == {"job-x"}
    assert recorder.dropped() == {}


def test_no_identity_drops_and_counts_with_one_error(caplog: pytest.LogCaptureFixture) -> None:
    recorder, sink = Recorder(64), _ListSink()

    def identity(final: bool) -> Identity | None:
        if not final:
            return None
        raise JobIdError("no job id: rank 0 did not write one")

    exporter = BackgroundExporter(recorder, sink, identity, 1_000_000)
    _steps(recorder, 2)
    with caplog.at_level(logging.WARNING, logger="skewtrace"):
        exporter._cycle(final=False)
        exporter._cycle(final=True)
        _steps(recorder, 3)
        exporter._cycle(final=True)
    assert sink.spans == []
    assert recorder.dropped() == {DROP_REASON_NO_JOB_ID: 5}
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "rank 0 did not write one" in errors[0].getMessage()
    assert "no_job_id" in errors[0].getMessage() and errors[0].exc_info is None


# ------------------------------------------------------------------ instrument(), fake group


@pytest.fixture
def no_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*JOB_VARS, "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SKEWTRACE_EXPORT_INTERVAL_MILLIS", "20")
    monkeypatch.setenv("SKEWTRACE_NODE_TELEMETRY", "false")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")


@pytest.mark.parametrize("rank", [0, 1])
def test_instrument_after_init_agrees_through_the_store(no_job_env: None, rank: int) -> None:
    """Two ranks of a fake-backend group on one in-memory store: this process plays one."""
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed import fake_pg  # noqa: F401 (registers "fake")

    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=2)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        store = c10d._get_default_store()
        if rank == 1:
            store.set(JOB_ID_KEY, "job-from-rank0")  # as rank 0 would have
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        skewtrace.instrument(optimizer=optimizer, tracer_provider=provider)
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
        skewtrace.uninstrument()
        written = store.get(JOB_ID_KEY).decode()
    finally:
        skewtrace.uninstrument()
        dist.destroy_process_group()
        provider.shutdown()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans].count("train.step") == 2
    assert {s.resource.attributes[semconv.JOB_ID] for s in spans} == {written}
    assert {s.resource.attributes[semconv.RANK] for s in spans} == {rank}
    if rank == 1:
        assert written == "job-from-rank0"
    else:
        assert written.startswith("job-")


# ------------------------------------------------------------------ mp.spawn, zero-code


def _spawned_rank(rank: int, port: int, out_dir: str) -> None:
    """Instrumented (zero-code) before init_process_group, as opentelemetry-instrument does
    in a spawn child; no job id anywhere."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    skewtrace.instrument(zero_code=True, tracer_provider=provider)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for _ in range(3):
        model(torch.ones(2, 4)).sum().backward()
        dist.all_reduce(torch.ones(1))
        optimizer.step()
    dist.destroy_process_group()
    skewtrace.uninstrument()
    spans = exporter.get_finished_spans()
    result = {
        "names": [s.name for s in spans],
        "jobs": sorted({str(s.resource.attributes[semconv.JOB_ID]) for s in spans}),
        "ranks": sorted({int(s.resource.attributes[semconv.RANK]) for s in spans}),  # type: ignore[arg-type]
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow
def test_spawned_ranks_without_job_id_agree_on_one(
    no_job_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_spawned_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(results):
        assert result["names"].count("train.step") == 3, result
        assert result["names"].count("collective.all_reduce") >= 3, result
        assert result["ranks"] == [rank]
    assert results[0]["jobs"] == results[1]["jobs"]
    (job,) = results[0]["jobs"]
    assert job.startswith("job-")


# ------------------------------------------------------------------ torchrun, the collector


def _launch(collector: Any, port: int, steps: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    python = sys.executable
    env = {
        k: v for k, v in os.environ.items() if k not in JOB_VARS and not k.startswith("SKEWTRACE_")
    }
    env.update(
        {
            "PATH": f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.otlp_grpc_endpoint}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
            "SKEWTRACE_NODE_TELEMETRY": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    instrument = str(Path(python).parent / "opentelemetry-instrument")
    command = [python, "-m", "torch.distributed.run", "--nnodes=1", "--node-rank=0",
               "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}",
               "--no-python", instrument, python, str(REPO_ROOT / "examples" / "train_plain.py"),
               "--steps", str(steps)]  # fmt: skip
    try:
        return subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=180, cwd=cwd
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        raise AssertionError(f"torchrun did not finish in 180 s: {text[-6000:]}") from None


def _ranks_by_job(spans: list[Any]) -> dict[str, set[int]]:
    by_job: dict[str, set[int]] = collections.defaultdict(set)
    for span in spans:
        by_job[str(span.resource[semconv.JOB_ID])].add(int(span.resource[semconv.RANK]))
    return by_job


def _wait_for_steps(collector: Any, ranks_of_jobs: int, steps: int) -> list[Any]:
    """The collector's exported spans once ``ranks_of_jobs`` (job, rank) pairs each have
    ``steps`` optimizer steps, or after 30 s."""

    def enough(spans: list[Any]) -> bool:
        seen = collections.Counter(
            (s.resource.get(semconv.JOB_ID), s.resource.get(semconv.RANK))
            for s in spans
            if s.name == "optimizer.step"
        )
        return len(seen) >= ranks_of_jobs and all(n >= steps for n in seen.values())

    deadline = time.monotonic() + 30
    spans = collector.exported_spans()
    while not enough(spans) and time.monotonic() < deadline:
        time.sleep(0.5)
        spans = collector.exported_spans()
    return [s for s in spans if semconv.RANK in s.resource]


@pytest.mark.slow
@pytest.mark.collector
def test_torchrun_static_rendezvous_without_job_id(otelcol_path: Path, tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "opentelemetry-instrument").exists():
        needs.unavailable("opentelemetry-instrument is not installed in this environment")
    from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess

    steps = 4
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path) as col:
        outputs = []
        for _ in range(2):
            proc = _launch(col, free_port(), steps, tmp_path)
            output = proc.stdout + proc.stderr
            assert proc.returncode == 0, output[-4000:]
            assert "no job id" not in output and "spans are dropped" not in output, output[-4000:]
            outputs.append(output)

        ours = _wait_for_steps(col, 4, steps)
    by_job = _ranks_by_job(ours)
    # One id per launch, shared by both ranks; two launches, two ids; none is torchrun's
    # "none" or a rank's own local id.
    assert len(by_job) == 2, (dict(by_job), outputs[0][-2000:])
    for job, ranks in by_job.items():
        assert ranks == {0, 1}, (job, ranks)
        assert job.startswith("job-"), job
    names = collections.Counter(
        (str(s.resource[semconv.JOB_ID]), int(s.resource[semconv.RANK]), s.name) for s in ours
    )
    for job in by_job:
        for rank in (0, 1):
            for name in ("train.step", "forward", "backward", "optimizer.step"):
                assert names[(job, rank, name)] >= steps - 1, (job, rank, name, names)
            assert names[(job, rank, "collective.all_reduce")] >= steps, names


def test_rank_zero_never_writing_drops_and_counts_without_blocking(
    no_job_env: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 1 of a fake-backend group whose rank 0 never writes an id: training goes on at
    full speed, and after the timeout its spans are dropped with one clear error."""
    from torch.testing._internal.distributed import fake_pg  # noqa: F401 (registers "fake")

    monkeypatch.setenv("SKEWTRACE_JOB_ID_TIMEOUT_MILLIS", "200")
    dist.init_process_group("fake", store=dist.HashStore(), rank=1, world_size=2)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with caplog.at_level(logging.WARNING, logger="skewtrace"):
            started = time.monotonic()
            skewtrace.instrument(optimizer=optimizer, tracer_provider=provider)
            assert time.monotonic() - started < 5  # no wait for the id at the call
            for _ in range(3):
                model(torch.ones(1, 2)).sum().backward()
                optimizer.step()
            session = skewtrace.SkewtraceInstrumentor().session
            assert session is not None
            deadline = time.monotonic() + 10
            while not session.recorder.dropped() and time.monotonic() < deadline:
                time.sleep(0.05)
            skewtrace.uninstrument()
    finally:
        skewtrace.uninstrument()
        dist.destroy_process_group()
        provider.shutdown()
    assert exporter.get_finished_spans() == ()
    assert session.recorder.dropped().get(DROP_REASON_NO_JOB_ID, 0) >= 3
    # skewtrace's own errors: caplog also holds other loggers' records (an OpenTelemetry
    # exporter left retrying by an earlier test in the same worker logs to its own logger).
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.split(".")[0] == "skewtrace"
    ]
    assert len(errors) == 1 and "did not write one" in errors[0], errors
