"""Stage partition advice for a heavy pipeline stage (issue 46, item 2).

- The partition rule is one in both languages: ``tests/data/partition/cases.json`` is read by
  this file and by the Collector's ``partition_test.go``: its ``cases`` by
  ``skewtrace.remedy.partition.best_partition`` and ``diagnosis.BestPartition``, its
  ``advice`` by ``advise_partition`` and ``replay_1f1b`` here and ``diagnosis.AdvisePartition``
  and ``Replay1F1B`` there. The Collector's advice on played spans is ``advise_partition`` of
  the profiles' per-layer forward and backward times (the median of each over a rank's last
  three profiles; here one), at the profiles' micro-batches, no transfer.
- The rank side: ``pipeline.layers`` times each layer of a stage's model on sampled steps
  only, and its arrays reach the wire.
- The verdict on spans: a generated 4-stage job whose last stage computes 1.5x/1.4x, with a
  layer profile from every rank, played through the built Collector
  (``tests/span_replay.py``): every flagged ``stage_imbalance`` carries exactly the advised
  partition, its fix the split points, and ``skewtrace advise`` prints them; without profiles
  the fix is as before and ``skewtrace advise`` exits 1 saying why.
- Live (slow): the pipelining example with a heavy head on 4 gloo ranks, advised and run again
  with the advised split points.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from skewtrace import semconv
from skewtrace.remedy.partition import (
    advise_partition,
    best_partition,
    replay_1f1b,
    stage_costs,
)
from whatif.generate import HeavyStage, JobSpec, generate, write_csv, write_metadata

REPO_ROOT = Path(__file__).resolve().parent.parent
CASES = REPO_ROOT / "tests" / "data" / "partition" / "cases.json"
JOB = "advise-heavy-last"


def _advise(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "advise", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


# ------------------------------------------------------------------ the rule, both languages


def test_best_partition_answers_the_shared_cases() -> None:
    cases = json.loads(CASES.read_text())["cases"]
    assert cases
    for case in cases:
        got = best_partition(case["costs"], case["stages"]).layers
        assert list(got) == case["layers"], case["name"]


def test_advise_partition_answers_the_shared_advice_cases() -> None:
    cases = json.loads(CASES.read_text())["advice"]
    assert cases
    for case in cases:
        forward, backward = case["forward"], case["backward"]
        stages, microbatches = case["stages"], case["microbatches"]
        got = advise_partition(forward, backward, stages, microbatches)
        assert list(got.layers) == case["layers"], case["name"]
        assert got.costs == pytest.approx(
            stage_costs([f + b for f, b in zip(forward, backward, strict=True)], got.layers)
        )
        replayed = replay_1f1b(
            [c / microbatches for c in stage_costs(forward, case["layers"])],
            [c / microbatches for c in stage_costs(backward, case["layers"])],
            microbatches,
        )
        assert replayed == pytest.approx(case["replay"], rel=1e-9), case["name"]


# ------------------------------------------------------------------ the rank side


def _profiler_run(steps: int, every: int, p2p: bool = True):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    from skewtrace.rank._events import LayersEvent, typed
    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.hooks._context import HookContext
    from skewtrace.rank.hooks.layers import LayerProfiler

    recorder = Recorder(10_000)
    ctx = HookContext(recorder)
    ctx.p2p_seen = p2p

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # An in-place ReLU after a Linear: full backward hooks would raise here.
            self.layers = nn.Sequential(
                nn.Linear(64, 64), nn.ReLU(inplace=True), nn.Linear(64, 256), nn.Linear(256, 64)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers(x)

    model = Stage()
    profiler = LayerProfiler(ctx, model, every, use_cuda=False)
    for _ in range(steps):
        for _ in range(3):  # micro-batches
            model(torch.randn(8, 64)).sum().backward()
        recorder.end_step(time.perf_counter_ns())
    profiler.remove()
    return [e for e in map(typed, recorder.events) if isinstance(e, LayersEvent)]


def test_layer_profile_times_each_layer_of_a_sampled_step_only() -> None:
    events = _profiler_run(steps=7, every=3)
    assert [e.step for e in events] == [3, 6]
    for e in events:
        assert e.names == ("layers.0", "layers.1", "layers.2", "layers.3")
        assert e.microbatches == 3
        assert all(f > 0 for f in e.forward_s) and all(b > 0 for b in e.backward_s)


def test_no_layer_profile_off_a_pipeline_or_when_off() -> None:
    assert _profiler_run(steps=4, every=1, p2p=False) == []
    from skewtrace.rank.config import Settings

    assert Settings.from_env({"SKEWTRACE_LAYER_PROFILE_EVERY": "0"}).layer_profile_every == 0
    assert Settings.from_env({}).layer_profile_every == 50


def test_layer_arrays_reach_the_wire() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from skewtrace.importer.model import RankInput
    from skewtrace.importer.spans import rank_resource
    from skewtrace.rank._events import LayersEvent
    from skewtrace.rank._export.materialize import Identity, SpanMaterializer
    from skewtrace.rank._export.otlp_wire import FastSpanEncoder

    rank = RankInput(job="j", rank=1, world_size=4)
    identity = Identity("j", 1, rank_resource(rank, 0))
    spans = SpanMaterializer(identity, epoch_anchor_ns=0).materialize(
        [LayersEvent(2, 10, 20, ("a", "b"), (0.5, 0.25), (1.0, 2.0), 4)], final=True
    )
    layers = [s for s in spans if s.name == semconv.SPAN_PIPELINE_LAYERS]
    assert len(layers) == 1
    message = ExportTraceServiceRequest()
    message.ParseFromString(FastSpanEncoder().encode(layers))
    span = message.resource_spans[0].scope_spans[0].spans[0]
    attrs = {a.key: a.value for a in span.attributes}
    assert [v.string_value for v in attrs[semconv.PIPELINE_LAYERS].array_value.values] == ["a", "b"]
    assert [v.double_value for v in attrs[semconv.PIPELINE_LAYER_FORWARD].array_value.values] == [
        0.5,
        0.25,
    ]
    assert [v.double_value for v in attrs[semconv.PIPELINE_LAYER_BACKWARD].array_value.values] == [
        1.0,
        2.0,
    ]
    assert attrs[semconv.PIPELINE_MICROBATCHES].int_value == 4
    assert attrs[semconv.STEP].int_value == 2


# ------------------------------------------------------------------ the verdict, on spans

# Layers of unequal cost per stage (arbitrary units), scaled below so that each stage's sum
# is its forward plus backward per step in the generated job.
_SHAPES = ((1.0, 2.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0, 2.0), (2.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0))


def _heavy_job(with_profiles: bool):  # type: ignore[no-untyped-def]
    """The generated heavy-last-stage job (dp 2, pp 4) read back as ``skewtrace import``
    reads it, each rank given a pipeline.layers event at step 1 when asked, and each layer's
    forward and backward seconds a step, the whole pipeline in stage order."""
    import tempfile

    from skewtrace.importer.whatif import read_whatif
    from skewtrace.rank._events import LayersEvent

    spec = JobSpec(
        JOB,
        dp=2,
        pp=4,
        microbatches=8,
        steps=12,
        seed=5,
        causes=(HeavyStage(stage=3, forward_factor=1.5, backward_factor=1.4),),
    )
    job = generate(spec)
    with tempfile.TemporaryDirectory() as tmp:
        csv_path, meta = Path(tmp) / "job.csv", Path(tmp) / "job.json"
        write_csv(job, csv_path)
        write_metadata(job, meta)
        imported = read_whatif([csv_path], job_id=spec.name, meta=meta, time_unit="us")
    forward: list[float] = []
    backward: list[float] = []
    per_stage: dict[int, tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]] = {}
    for stage, shape in enumerate(_SHAPES):
        fwd = spec.forward * (1.5 if stage == 3 else 1.0) * spec.microbatches
        bwd = spec.backward * (1.4 if stage == 3 else 1.0) * spec.microbatches
        total = sum(shape)
        names = tuple(f"stage{stage}.layer{i}" for i in range(len(shape)))
        f = tuple(fwd * c / total for c in shape)
        b = tuple(bwd * c / total for c in shape)
        per_stage[stage] = (names, f, b)
        forward += f
        backward += b
    if with_profiles:
        for rank in imported.ranks.values():
            stage = int(rank.attributes[semconv.PIPELINE_STAGE])
            names, f, b = per_stage[stage]
            start = min(e.start_ns for e in rank.events if getattr(e, "step", None) == 1)
            rank.events.append(LayersEvent(1, start, start + 1000, names, f, b, spec.microbatches))
    return imported, forward, backward


@pytest.mark.collector
@pytest.mark.slow
def test_collector_advises_the_partition_of_the_profiled_layers(
    otelcol_path: Path, tmp_path: Path
) -> None:
    from span_replay import replay, requests_of_job

    imported, forward, backward = _heavy_job(with_profiles=True)
    costs = [f + b for f, b in zip(forward, backward, strict=True)]
    want = advise_partition(forward, backward, 4, microbatches=8)  # the job's micro-batches
    # (6, 4, 3, 3): the replay decides among the ties; the most even is (5, 5, 3, 3)
    assert want.layers == (6, 4, 3, 3) != best_partition(costs, 4).layers
    summaries = replay(otelcol_path, requests_of_job(imported), tmp_path / "with")[JOB]
    stage_flags = [
        (step, im)
        for step, s in sorted(summaries.items())
        for im in s.imbalances
        if im.cause == semconv.CAUSE_STAGE_IMBALANCE
    ]
    assert stage_flags, {step: s.imbalances for step, s in summaries.items()}
    points = ",".join(map(str, want.split_points))
    for step, im in stage_flags:
        assert im.stage == 3, (step, im)
        assert im.partition is not None, (step, im)
        assert im.partition.layers == want.layers, (step, im.partition, want)
        assert im.partition.current == tuple(len(s) for s in _SHAPES)
        assert im.partition.after_s == pytest.approx(stage_costs(costs, want.layers))
        assert im.partition.before_s == pytest.approx(stage_costs(costs, [len(s) for s in _SHAPES]))
        assert im.partition.saving_s > 0
        assert f"split points {points})" in im.fix, im.fix
    # The command reads the same file.
    export = tmp_path / "with" / "otelcol-spans.jsonl"
    done = _advise(str(export), "--json")
    assert done.returncode == 0, done.stderr
    advice = json.loads(done.stdout)
    assert advice["layers_advised"] == list(want.layers)
    assert advice["split_points"] == list(want.split_points)
    # Its replayed saving reaches the step's naming bar: the fix above recommends it.
    assert advice["recommended"] is True and advice["saving_s"] >= advice["min_saving_s"] > 0
    assert advice["first_layer_advised"][1] == f"stage{_stage_of(want.split_points[0])}.layer" + (
        str(_index_in_stage(want.split_points[0]))
    )
    text = _advise(str(export)).stdout
    assert f"--split-points {points}\n" in text, text

    # Without profiles: the fix as before, and the command says why it has no advice.
    imported, _, _ = _heavy_job(with_profiles=False)
    summaries = replay(otelcol_path, requests_of_job(imported), tmp_path / "without")[JOB]
    flagged = [
        im
        for s in summaries.values()
        for im in s.imbalances
        if im.cause == semconv.CAUSE_STAGE_IMBALANCE
    ]
    assert flagged and all(im.partition is None and "split points" not in im.fix for im in flagged)
    done = _advise(str(tmp_path / "without" / "otelcol-spans.jsonl"))
    assert done.returncode == 1
    assert "no layer profile" in done.stderr, done.stderr


def _stage_of(layer: int) -> int:
    at = 0
    for stage, shape in enumerate(_SHAPES):
        if layer < at + len(shape):
            return stage
        at += len(shape)
    raise ValueError(layer)


def _index_in_stage(layer: int) -> int:
    return layer - sum(len(s) for s in _SHAPES[: _stage_of(layer)])


def test_advise_says_why_there_is_no_advice(tmp_path: Path) -> None:
    """A file whose job has no stage imbalance: exit 1 and the reason; a missing file too."""
    line = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": semconv.JOB_ID, "value": {"stringValue": "j"}}]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "0" * 31 + "1",
                                "spanId": "0" * 15 + "1",
                                "name": semconv.SPAN_STEP_SUMMARY,
                                "startTimeUnixNano": "1000",
                                "endTimeUnixNano": "2000",
                                "attributes": [
                                    {"key": semconv.STEP, "value": {"intValue": "3"}},
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(line) + "\n")
    done = _advise(str(path))
    assert done.returncode == 1
    assert "no stage_imbalance" in done.stderr, done.stderr
    done = _advise(str(tmp_path / "missing.jsonl"))
    assert done.returncode == 1 and "skewtrace advise:" in done.stderr


# ------------------------------------------------------------------ live: apply the advice

_PIPELINING = REPO_ROOT / "examples" / "frameworks" / "pipelining.py"
_LIVE_ARGS = ("--width", "256", "--rows", "64", "--microbatches", "4", "--heavy-head", "3.0")
_LIVE_STEPS = 10
_WARM_STEP = 4
"""Profiles of steps before it are left out of the comparison (first steps run slower)."""


def _run_example(collector, job: str, steps: int, *extra: str) -> None:  # type: ignore[no-untyped-def]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "src"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.otlp_grpc_endpoint}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "SKEWTRACE_JOB_ID": job,
        "SKEWTRACE_ONE_CALL": "1",
        "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
        "SKEWTRACE_LAYER_PROFILE_EVERY": "2",
        "SKEWTRACE_NODE_TELEMETRY": "false",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("SLOW_RANK", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=4", str(_PIPELINING), "--steps", str(steps),
               *_LIVE_ARGS, *extra]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def _stage_layer_times(collector, job: str) -> dict[int, tuple[int, float]]:  # type: ignore[no-untyped-def]
    """Each rank's (= stage's) layers and median layer seconds per step over its profiles
    from step _WARM_STEP on."""
    deadline = time.monotonic() + 60
    while True:
        spans = [
            s
            for s in collector.exported_spans()
            if s.resource.get(semconv.JOB_ID) == job and s.name == semconv.SPAN_PIPELINE_LAYERS
        ]
        by_rank: dict[int, list[float]] = defaultdict(list)
        count: dict[int, int] = {}
        for s in spans:
            rank = int(s.resource[semconv.RANK])
            f = s.attributes[semconv.PIPELINE_LAYER_FORWARD]
            b = s.attributes[semconv.PIPELINE_LAYER_BACKWARD]
            if int(s.attributes[semconv.STEP]) >= _WARM_STEP:
                by_rank[rank].append(sum(f) + sum(b))
            count[rank] = len(f)
        if sorted(by_rank) == [0, 1, 2, 3] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return {r: (count[r], statistics.median(v)) for r, v in by_rank.items()}


@pytest.mark.collector
@pytest.mark.slow
def test_applying_the_advice_moves_the_layers_and_shortens_the_slowest_stage(
    otelcol_path: Path, tmp_path: Path
) -> None:
    """Live, 4 gloo ranks, 16 blocks and a head worth a whole stage (the last stage 2x the
    others): the Collector's advice, printed by ``skewtrace advise``, run again with its
    split points, gives stages holding the advised layers, whose slowest stage's layer time
    is lower than before. (Which partition is advised is decided on spans above; here the
    parts connect.)"""
    from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess

    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path) as collector:
        job = f"advise-live-{os.getpid()}"
        _run_example(collector, job, _LIVE_STEPS)
        before = _stage_layer_times(collector, job)
        assert sorted(before) == [0, 1, 2, 3], before
        deadline = time.monotonic() + 60
        while True:
            done = _advise(str(collector.file_export_path), "--job", job, "--json")
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert done.returncode == 0, (done.stderr, before)
        advice = json.loads(done.stdout)
        assert advice["stage"] == 3, advice
        points = ",".join(map(str, advice["split_points"]))
        job2 = f"{job}-advised"
        _run_example(collector, job2, _LIVE_STEPS, "--split-points", points)
        after = _stage_layer_times(collector, job2)
    assert [after[r][0] for r in range(4)] == advice["layers_advised"], (after, advice)
    slowest_before = max(t for _, t in before.values())
    slowest_after = max(t for _, t in after.values())
    assert slowest_after < slowest_before, (before, after, advice)


def test_the_report_shows_the_advised_partition_beside_the_fix() -> None:
    from skewtrace.report.collect import _imbalance
    from skewtrace.report.model import StepSummary
    from skewtrace.report.page import _imbalances_html

    attrs = {
        semconv.STRAGGLER_CAUSE: semconv.CAUSE_STAGE_IMBALANCE,
        semconv.PIPELINE_STAGE: 3,
        semconv.IMBALANCE_RANKS: "3",
        semconv.IMBALANCE_EXCESS: 0.3,
        semconv.IMBALANCE_COST: 0.02,
        semconv.IMBALANCE_FIX: "stage 3 does 30% more work",
        semconv.IMBALANCE_PARTITION: [4, 4, 5, 4],
        semconv.IMBALANCE_PARTITION_CURRENT: [4, 4, 4, 5],
        semconv.IMBALANCE_PARTITION_BEFORE: [0.04, 0.04, 0.04, 0.056],
        semconv.IMBALANCE_PARTITION_AFTER: [0.04, 0.04, 0.05, 0.046],
        semconv.IMBALANCE_PARTITION_SAVING: 0.005,
    }
    summary = StepSummary(
        step=9, trace_id="t", duration_s=0.1, whatif_s=0.08, slowdown=1.2, ranks=4,
        slow_collectives=0,
    )  # fmt: skip
    summary.imbalances.append(_imbalance(attrs))
    html = _imbalances_html(summary)
    assert "--split-points 4,8,13" in html and "4/4/5/4 layers per stage" in html, html
    # A malformed partition is left out, the fix stays.
    attrs[semconv.IMBALANCE_PARTITION] = [4, 4, 5]
    assert _imbalance(attrs).partition is None
