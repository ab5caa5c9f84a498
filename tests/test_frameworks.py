"""The framework matrix (issue 22): unmodified training scripts under examples/frameworks/
(FSDP2, tensor parallel with DTensor, FSDP2 + tensor parallel on a 2-D mesh, pipelining with
1F1B), each run by torchrun on four gloo ranks against the built otelcol-skewtrace, under
zero-code (``opentelemetry-instrument``) and one call (``skewtrace.instrument(model=...,
optimizer=...)``).

The run and the checks are tests/_framework_matrix.py's (shared with
tests/test_frameworks_trainers.py): one run per case is healthy first and then slow (rank 2
sleeps in its forward from step 10 on); every collective the process groups ran (their own
counters) has its span, numbered 0..n-1 per group; forward and backward on every rank for
every step (one per microbatch under pipelining); every collective joined complete; per
analyzed step nobody is flagged before the slowdown, and from two steps after it only rank 2,
for ``compute``, in more than half of those steps.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _framework_matrix import (
    MODES,
    Case,
    collector_process,
    job_spans,
    run,
    run_and_check,
    step_flags,
)
from collector_harness import CollectorProcess
from skewtrace import semconv
from verdict_checks import step_variation

pytestmark = [pytest.mark.collector, pytest.mark.slow]

CASES: dict[str, Case] = {
    "fsdp2": Case("fsdp2"),
    "tensor_parallel": Case("tensor_parallel"),
    "fsdp2_tp": Case("fsdp2_tp"),
    # Point-to-point messages are numbered per (sender, receiver), not per group.
    "pipelining": Case(
        "pipelining",
        forwards_per_step=4,
        point_to_point=True,
    ),
}


@pytest.fixture(scope="module")
def collector(otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    yield from collector_process(otelcol_path, tmp_path_factory.mktemp("frameworks"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("script", list(CASES))
def test_framework_traced_joined_and_diagnosed(
    collector: CollectorProcess, tmp_path: Path, script: str, mode: str
) -> None:
    run_and_check(collector, CASES[script], mode, tmp_path)


def test_pipeline_stage_slow_from_the_start_is_a_stage_imbalance(
    collector: CollectorProcess, tmp_path: Path
) -> None:
    """torch.distributed.pipelining, 1F1B over 4 stages, the last stage's forward 80 ms longer
    per step from the first step: no rank is slower than it ever was (no history, no peers),
    but the stage is longer than the mean stage. Per analyzed step past the warm-up, the
    summary flags ``stage_imbalance`` of stage 3 with its rank, a cost and a fix, and never a
    rank; the step is replayed within 2% of the measured one on most steps (or within the
    job's own step-to-step variation, on a busy machine)."""
    case = Case(
        "pipelining", slow_rank=3, slow_from=0, slow_ms=80, forwards_per_step=4,
        point_to_point=True, steps=16,
    )  # fmt: skip
    job = f"fw-stage-{os.getpid()}"
    output = run(collector, case, "zero-code", job, tmp_path)
    spans = job_spans(collector, job, case.steps - 2)
    summaries = {
        int(s.attributes[semconv.STEP]): s for s in spans if s.name == semconv.SPAN_STEP_SUMMARY
    }
    assert len(summaries) >= case.steps - 2, (sorted(summaries), output[-2000:])
    judged = [step for step in summaries if 6 <= step < case.steps - 1]
    imbalanced, checked, replayed = 0, 0, 0
    # Within 2%, or the job's own step-to-step variation where a busy machine makes it larger.
    bound = max(0.02, step_variation(spans))
    for step in judged:
        events = summaries[step].events
        stages = [
            e["attributes"]
            for e in events
            if e["name"] == semconv.EVENT_IMBALANCE
            and e["attributes"][semconv.STRAGGLER_CAUSE] == semconv.CAUSE_STAGE_IMBALANCE
        ]
        if stages and stages[0][semconv.PIPELINE_STAGE] == 3:
            imbalanced += 1
            assert stages[0][semconv.IMBALANCE_RANKS] == "3", stages
            assert stages[0][semconv.IMBALANCE_COST] > 0.02, stages
            assert "stage 3" in stages[0][semconv.IMBALANCE_FIX], stages
        error = summaries[step].attributes.get(semconv.REPLAY_ERROR)
        if error is not None:
            checked += 1
            replayed += error < bound
    flagged = {step: f for step, f in step_flags(spans).items() if step in judged and f}
    assert not flagged, flagged
    # Most steps: on 2 shared cores a step now and then is judged too close to call.
    assert imbalanced > 0.5 * len(judged), (imbalanced, len(judged))
    assert checked and replayed > 0.5 * checked, (replayed, checked, bound)
