"""The framework matrix (issue 22): unmodified training scripts under examples/frameworks/
(FSDP2, tensor parallel with DTensor, FSDP2 + tensor parallel on a 2-D mesh, pipelining with
1F1B), each run by torchrun on four gloo ranks against the built otelcol-skewtrace, under
zero-code (``opentelemetry-instrument``) and one call (``skewtrace.instrument(model=...,
optimizer=...)``).

The run and the checks are tests/_framework_matrix.py's (shared with
tests/test_frameworks_trainers.py): one run per case is healthy first and then slow (rank 2
sleeps in its forward from step 10 on); every collective the process groups ran (their own
counters) has its span, numbered 0..n-1 per group; forward and backward on every rank for
every step (one per microbatch under pipelining); every collective joined complete; the step
summaries out, and rank 2 flagged for ``compute`` at some point after its slowdown. Two cases
run in ``make test`` (one per instrumentation path), the rest under ``make eval``; every
case's verdicts, step by step, are tested on its recording (tests/test_recorded_verdicts.py).
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
)
from collector_harness import CollectorProcess
from skewtrace import semconv

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


# Two runs in `make test` prove the pipeline flows from both instrumentation paths; the rest
# of the matrix runs under `make eval`. Every case's verdicts, step by step, are tested on its
# recorded run (tests/test_recorded_verdicts.py).
_IN_MAKE_TEST = {("fsdp2_tp", "zero-code"), ("pipelining", "one-call")}


@pytest.mark.parametrize(
    ("script", "mode"),
    [
        pytest.param(
            script, mode, marks=() if (script, mode) in _IN_MAKE_TEST else pytest.mark.eval
        )
        for script in CASES
        for mode in MODES
    ],
)
def test_framework_traced_joined_and_diagnosed(
    collector: CollectorProcess, tmp_path: Path, script: str, mode: str
) -> None:
    run_and_check(collector, CASES[script], mode, tmp_path)


@pytest.mark.eval
def test_pipeline_stage_slow_from_the_start_is_a_stage_imbalance(
    collector: CollectorProcess, tmp_path: Path
) -> None:
    """torch.distributed.pipelining, 1F1B over 4 stages, the last stage's forward 80 ms longer
    per step from the first step: no rank is slower than it ever was (no history, no peers),
    but the stage is longer than the mean stage. Live, the summaries name ``stage_imbalance``
    of stage 3 with its rank, a cost and a fix in some step; per step, and that no rank is
    flagged, is tested on its recording (``frameworks/pipelining_stage``,
    tests/test_recorded_verdicts.py)."""
    case = Case(
        "pipelining", slow_rank=3, slow_from=0, slow_ms=80, forwards_per_step=4,
        point_to_point=True, steps=16,
    )  # fmt: skip
    job = f"fw-stage-{os.getpid()}"
    output = run(collector, case, "zero-code", job, tmp_path)
    spans = job_spans(collector, job, case.steps - 2)
    summaries = [s for s in spans if s.name == semconv.SPAN_STEP_SUMMARY]
    assert len(summaries) >= case.steps - 2, output[-2000:]
    stages = [
        e["attributes"]
        for s in summaries
        for e in s.events
        if e["name"] == semconv.EVENT_IMBALANCE
        and e["attributes"][semconv.STRAGGLER_CAUSE] == semconv.CAUSE_STAGE_IMBALANCE
        and e["attributes"][semconv.PIPELINE_STAGE] == 3
    ]
    assert stages, "stage 3's imbalance never named"
    assert all(a[semconv.IMBALANCE_RANKS] == "3" and "stage 3" in a[semconv.IMBALANCE_FIX]
               for a in stages), stages  # fmt: skip
