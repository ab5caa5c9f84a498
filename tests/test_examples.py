"""The examples run as their README says, against the real otelcol-skewtrace.

- ``examples/train_2d.py``: six gloo ranks as three pipeline stages of two data-parallel
  replicas, with a compute straggler on rank 4 from step 10, through the collector
  (otelcol.yaml + file-export.yaml), once per ``--grad-sync`` (DDP, and a blocking
  all-reduce). Every rank's spans arrive; the three stage groups' gradient all-reduces,
  every pipeline message and the world's loss all-reduce are joined complete; the step
  summaries flag rank 4 for compute, and nobody else, ever (with DDP, its replica waits for
  the gradient buckets inside backward: waiting, not work); the progress file and the
  step_stats lines are written. Bad
  fault specs are usage errors.
- ``examples/zero_code.sh``: ``examples/train_plain.py`` (DDP, no skewtrace import) under
  ``opentelemetry-instrument`` with two gloo ranks; its spans reach the collector.
- ``examples/slurm/train.sbatch`` and ``examples/torchrun_nccl.sh`` pass ``bash -n`` and run
  against stand-ins for ``srun``/``scontrol``/``torchrun``/``nvidia-smi`` that record what
  they were given (no Slurm cluster or GPU here: the NCCL run itself is not tested);
  ``examples/slurm/topology.conf`` parses into the switches it draws.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import needs
from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess, FileSpan
from live_checks import assert_flagged_at_some_point
from scenario_run import StepVerdict, read_verdicts
from skewtrace import semconv

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"
BIN = Path(sys.executable).parent

STEPS_2D = 30
STRAGGLER_RANK, STRAGGLER_FROM = 4, 10
WORLD_2D, PP = 6, 3


def _env(collector: CollectorProcess, job: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p
        ),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.otlp_grpc_endpoint}",
        "SKEWTRACE_JOB_ID": job,
        "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
    }


def _job_spans(
    collector: CollectorProcess, job: str, done: Any, timeout_s: float
) -> list[FileSpan]:
    deadline = time.monotonic() + timeout_s
    while True:
        spans = [s for s in collector.exported_spans() if s.resource.get(semconv.JOB_ID) == job]
        if done(spans) or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def _load_example(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------ train_2d.py


def _step_stats(stdout: str) -> list[dict[str, Any]]:
    """The ranks' step_stats lines: each a JSON object on a line of its own, although the
    ranks share one stdout pipe."""
    return [json.loads(line) for line in stdout.splitlines() if '"step_stats"' in line]


@dataclass
class Run2D:
    grad_sync: str
    spans: list[FileSpan]
    verdicts: dict[int, StepVerdict]
    stats: list[dict[str, Any]]
    progress: list[dict[str, Any]]
    output: str


# The DDP variant in `make test`; the explicit all-reduce one under `make eval`.
@pytest.fixture(scope="module", params=["ddp", pytest.param("allreduce", marks=pytest.mark.eval)])
def run_2d(
    request: pytest.FixtureRequest, otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run2D]:
    grad_sync = request.param
    tmp = tmp_path_factory.mktemp(f"train2d-{grad_sync}")
    job = f"ex2d-{uuid.uuid4().hex[:8]}"
    progress = tmp / "progress.jsonl"
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp) as col:
        proc = subprocess.run(
            [sys.executable, str(EXAMPLES / "train_2d.py"), "--nprocs", str(WORLD_2D),
             "--pp", str(PP), "--steps", str(STEPS_2D), "--job-id", job,
             "--straggler", f"{STRAGGLER_RANK}:compute:0.05@{STRAGGLER_FROM}:",
             "--progress-file", str(progress), "--grad-sync", grad_sync],
            env=_env(col, job),
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-4000:]

        def summaries_done(spans: list[FileSpan]) -> bool:
            return sum(s.name == semconv.SPAN_STEP_SUMMARY for s in spans) >= STEPS_2D

        spans = _job_spans(col, job, summaries_done, timeout_s=30)
        verdicts = read_verdicts(col).get(job, {})
    stats = _step_stats(proc.stdout)
    lines = progress.read_text().splitlines() if progress.exists() else []
    yield Run2D(grad_sync, spans, verdicts, stats, [json.loads(line) for line in lines], output)


@pytest.mark.slow
@pytest.mark.collector
def test_2d_every_rank_delivers_every_step(run_2d: Run2D) -> None:
    steps = collections.defaultdict(set)
    for span in run_2d.spans:
        if span.name == semconv.SPAN_STEP:
            steps[int(span.resource[semconv.RANK])].add(int(span.attributes[semconv.STEP]))
    # The last step's train.step ends at uninstrument: some ranks may not close it.
    for rank in range(WORLD_2D):
        assert set(range(STEPS_2D - 1)) <= steps[rank], (rank, sorted(steps[rank]))


@pytest.mark.slow
@pytest.mark.collector
def test_2d_stage_groups_pipeline_messages_and_the_loss_all_reduce_join(run_2d: Run2D) -> None:
    collectives = [s for s in run_2d.spans if s.name.startswith("collective.")]
    assert collectives
    for span in collectives:
        assert semconv.BARRIER_SKEW in span.attributes, ("not joined", span.name, span.attributes)
        assert semconv.BARRIER_MISSING_RANKS not in span.attributes, span.attributes

    # The gradients' all-reduces: one group per stage, its members the stage's two replicas.
    source = semconv.SOURCE_DDP if run_2d.grad_sync == "ddp" else semconv.SOURCE_API
    members: dict[str, set[int]] = collections.defaultdict(set)
    for span in collectives:
        if (
            span.name == "collective.all_reduce"
            and span.attributes[semconv.COLLECTIVE_PG_SIZE] == WORLD_2D // PP
        ):
            assert span.attributes[semconv.COLLECTIVE_SOURCE] == source
            members[str(span.attributes[semconv.COLLECTIVE_PG])].add(
                int(span.resource[semconv.RANK])
            )
    assert sorted(members.values(), key=min) == [{0, 1}, {2, 3}, {4, 5}], members

    # Pipeline messages: per step, an activation and a gradient over each of the two links of
    # each of the two replicas, seen by both sides.
    messages = [s for s in collectives if s.name in ("collective.send", "collective.recv")]
    assert len(messages) == STEPS_2D * 2 * 2 * 2 * 2, collections.Counter(s.name for s in messages)
    pairs = {
        (int(s.resource[semconv.RANK]), int(s.attributes[semconv.COLLECTIVE_PEER]))
        for s in messages
    }
    links = [(0, 2), (2, 4), (1, 3), (3, 5)]
    assert pairs == {*links, *((b, a) for a, b in links)}, pairs

    # The loss: one world all-reduce per step on every rank, joined by all six.
    world = collections.Counter(
        int(s.attributes[semconv.STEP])
        for s in collectives
        if s.name == "collective.all_reduce"
        and s.attributes[semconv.COLLECTIVE_PG_SIZE] == WORLD_2D
    )
    assert world == {step: WORLD_2D for step in range(STEPS_2D)}, world


@pytest.mark.slow
@pytest.mark.collector
def test_2d_compute_straggler_flagged(run_2d: Run2D) -> None:
    """Every step analysed, and the compute straggler flagged for compute at some point after
    it turned slow (what a live run proves; the 2-D job's verdicts step by step are tested on
    the main job's recordings, tests/test_recorded_verdicts.py)."""
    assert sorted(run_2d.verdicts) == list(range(STEPS_2D)), sorted(run_2d.verdicts)
    assert_flagged_at_some_point(
        run_2d.spans, STRAGGLER_RANK, semconv.CAUSE_COMPUTE, STRAGGLER_FROM
    )


@pytest.mark.slow
@pytest.mark.collector
def test_2d_progress_file_and_step_stats(run_2d: Run2D) -> None:
    assert [p["step"] for p in run_2d.progress] == list(range(STEPS_2D))
    times = [p["t"] for p in run_2d.progress]
    assert times == sorted(times) and abs(times[-1] - time.time()) < 600
    stats = sorted(run_2d.stats, key=lambda s: s["rank"])
    assert [s["rank"] for s in stats] == list(range(WORLD_2D)), run_2d.output[-3000:]
    for s in stats:
        assert (s["stage"], s["replica"]) == divmod(s["rank"], WORLD_2D // PP)
        assert s["steps"] == STEPS_2D and s["instrumented"]
        assert s["step_time_mean_s"] > 0 and s["throughput_samples_s"] > 0
        assert 0 <= s["step_time_cv"] < 5
    # One synchronous job: every rank's mean step is the same within a few percent.
    means = [s["step_time_mean_s"] for s in stats]
    assert max(means) < 1.1 * min(means), means


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--straggler", "4:disk:0.1"], "KIND must be one of"),
        (["--straggler", "4:compute"], "expected RANK:KIND:AMOUNT"),
        (["--straggler", "4:compute:0.1@9:3"], "need 0 <= START <= END"),
        (["--straggler", "4:compute:0.1@x:"], "the window must be"),
        (["--straggler", "6:compute:0.1"], "rank 6 is not in a job of 6 ranks"),
        (["--jitter", "1,3"], "expected RANKS:AMOUNT"),
        (["--jitter", "1,9:0.1"], "--jitter: rank 9"),
        (["--slow-rank", "2:0.5"], "FACTOR >= 1"),
        (["--slow-rank", "two:2"], "expected RANK:FACTOR"),
        (["--pp", "4"], "--pp 4 does not divide the world size 6"),
        (["--activation-bytes", "0"], "--activation-bytes must be >= 4"),
    ],
)
def test_2d_bad_arguments_are_usage_errors(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    example = _load_example("train_2d", monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--nprocs", "6", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_2d_fault_windows_and_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    example = _load_example("train_2d", monkeypatch)
    args = example.parse_args(
        ["--straggler", "4:compute:0.05@10:", "--straggler", "1:data:0.2@3:5",
         "--straggler", "4:compute:0.01", "--jitter", "0,4:0.02@2:4", "--slow-rank", "2:1.5"],
        6,
    )  # fmt: skip
    faults = sys.modules["_faults"]
    rank4 = faults.RankFaults(4, args.straggler, args.jitter, args.slow_rank, seed=0)
    assert rank4.compute_s(9) == pytest.approx(0.01)
    assert rank4.compute_s(10) == pytest.approx(0.06) and rank4.compute_s(10**6) > 0.05
    assert 0.01 <= rank4.compute_s(2) <= 0.03
    rank1 = faults.RankFaults(1, args.straggler, args.jitter, args.slow_rank, seed=0)
    assert [rank1.data_s(s) for s in (2, 3, 4, 5)] == [0, 0.2, 0.2, 0]
    assert rank1.compute_s(3) == 0 and rank1.slow_factor == 1.0
    assert faults.RankFaults(2, [], [], args.slow_rank, seed=0).slow_factor == 1.5
    layout = example.Layout(rank=3, world=6, pp=3)
    assert (layout.stage, layout.replica, layout.prev, layout.next) == (1, 1, 1, 5)
    assert example.Layout(rank=4, world=6, pp=3).next is None
    with pytest.raises(argparse.ArgumentTypeError):
        faults.parse_straggler("1:compute:-1")


# ------------------------------------------------------------------------ zero code


@pytest.mark.slow
@pytest.mark.collector
def test_zero_code_example_reaches_the_collector(otelcol_path: Path, tmp_path: Path) -> None:
    if not (BIN / "opentelemetry-instrument").exists():
        needs.unavailable("opentelemetry-instrument is not installed in this environment")
    assert "import skewtrace" not in (EXAMPLES / "train_plain.py").read_text()
    job = f"ex-zc-{uuid.uuid4().hex[:8]}"
    steps = 6
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path) as col:
        env = {**_env(col, job), "NPROC": "2", "PYTHON": sys.executable}
        proc = subprocess.run(
            ["bash", str(EXAMPLES / "zero_code.sh"), "--steps", str(steps)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        spans = _job_spans(
            col, job, lambda s: sum(x.name == "optimizer.step" for x in s) >= 2 * steps, 20
        )
    names = collections.Counter(
        (s.name, int(s.resource[semconv.RANK])) for s in spans if semconv.RANK in s.resource
    )
    for rank in (0, 1):
        for name in ("train.step", "dataloader.fetch", "forward", "backward", "optimizer.step"):
            assert names[(name, rank)] >= steps - 1, (name, rank, names)
        assert names[("collective.all_reduce", rank)] >= steps, names
    ddp = [s for s in spans if s.attributes.get(semconv.COLLECTIVE_SOURCE) == semconv.SOURCE_DDP]
    assert ddp and all(semconv.BARRIER_SKEW in s.attributes for s in ddp)


# ------------------------------------------------------------------------ Slurm and NCCL


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.mark.parametrize("script", ["slurm/train.sbatch", "torchrun_nccl.sh", "zero_code.sh"])
def test_shell_examples_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(EXAMPLES / script)], check=True)


def test_sbatch_launches_torchrun_per_node_with_the_job_and_topology(tmp_path: Path) -> None:
    stubs, record = tmp_path / "bin", tmp_path / "calls"
    stubs.mkdir()
    record.mkdir()
    _stub(stubs, "scontrol", 'printf "gpu-a01\\ngpu-a02\\n"\n')
    _stub(
        stubs,
        "srun",
        f'env > {record}/env; printf "%s\\n" "$@" > {record}/args\n',
    )
    env = {
        "PATH": f"{stubs}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-a[01-02]",
        "SLURM_NNODES": "2",
        "SLURM_SUBMIT_DIR": str(REPO_ROOT),
        "SKEWTRACE_COLLECTOR": "collector.example:4317",
    }
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "slurm" / "train.sbatch"), "--steps", "7"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    seen = dict(
        line.split("=", 1) for line in (record / "env").read_text().splitlines() if "=" in line
    )
    assert seen["SKEWTRACE_JOB_ID"] == "slurm-4242"
    assert seen["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.example:4317"
    assert Path(seen["SKEWTRACE_TOPOLOGY"]) == EXAMPLES / "slurm" / "topology.conf"
    args = (record / "args").read_text().splitlines()
    assert "torchrun" in args and "--nnodes=2" in args
    assert "--rdzv-id=4242" in args and "--rdzv-endpoint=gpu-a01:29500" in args
    assert args[-3:] == [str(EXAMPLES / "train_ddp.py"), "--steps", "7"]


def test_slurm_topology_conf_parses_into_its_switches() -> None:
    from skewtrace.rank.topology.files import load_topology_file

    topology = load_topology_file(EXAMPLES / "slurm" / "topology.conf")
    leaves = {node: entry.switch for node, entry in topology.nodes.items()}
    assert leaves == {
        **{f"gpu-a{i:02d}": "leaf-a" for i in range(1, 5)},
        **{f"gpu-b{i:02d}": "leaf-b" for i in range(1, 5)},
    }
    assert topology.switch_path("leaf-a") == ("leaf-a", "spine")
    assert topology.switch_path("leaf-b") == ("leaf-b", "spine")


def test_nccl_script_runs_torchrun_with_nccl_timing(tmp_path: Path) -> None:
    """No GPU here: torchrun and nvidia-smi are stand-ins; the NCCL run itself is untested."""
    stubs, record = tmp_path / "bin", tmp_path / "calls"
    stubs.mkdir()
    record.mkdir()
    _stub(stubs, "nvidia-smi", 'printf "GPU 0: A\\nGPU 1: B\\n"\n')
    _stub(stubs, "torchrun", f'env > {record}/env; printf "%s\\n" "$@" > {record}/args\n')
    env = {
        "PATH": f"{stubs}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "torchrun_nccl.sh"), "--steps", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    seen = dict(
        line.split("=", 1) for line in (record / "env").read_text().splitlines() if "=" in line
    )
    assert seen["TORCH_NCCL_ENABLE_TIMING"] == "1"
    assert seen["SKEWTRACE_JOB_ID"].startswith("nccl-")
    args = (record / "args").read_text().splitlines()
    assert "--nproc-per-node=2" in args
    assert args[-5:] == [str(EXAMPLES / "train_ddp.py"), "--backend", "nccl", "--steps", "5"]


def test_examples_readme_lists_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    shipped = sorted(
        str(p.relative_to(EXAMPLES))
        for p in EXAMPLES.rglob("*")
        if p.is_file() and not p.name.startswith("_") and p.name != "README.md"
        and not any(part.startswith((".", "__")) for part in p.relative_to(EXAMPLES).parts)
    )  # fmt: skip
    missing = [name for name in shipped if name not in readme]
    assert not missing, missing
