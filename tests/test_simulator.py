"""The simulator's closed loop with the real pacer, on a small N.

``loadgen simulate`` (2 nodes x 4 ranks, node 1 30% slower, each node behind its own leaf)
sends its spans to the built collector, whose metrics reach a real ``skewtrace pacer``; every
simulated rank polls the pacer. The loop is closed when the pacer names the early node's
ranks, the simulator applies those delays (``pacing.delay`` spans reach the trace backend
through the collector and its summary counts them) and never delays the slow node; killed
mid-run, the pacer costs no step (the simulator fails open). The model's own behaviour is
tested in tools/loadgen/sim_test.go. About 45 s on the shared 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from collector_harness import build_loadgen
from skewtrace import semconv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import pacing as harness

pytestmark = [pytest.mark.slow, pytest.mark.collector]

SMALL_JOB = ["-nodes", "2", "-gpus-per-node", "4", "-nodes-per-leaf", "1", "-slow-node", "1:1.3"]
EARLY_RANKS = {0, 1, 2, 3}  # node 0; node 1 (ranks 4-7) is the slow one


def _simulate(loadgen: Path, endpoint: str, job_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(loadgen), "simulate", "-endpoint", endpoint, "-job", job_id, *SMALL_JOB, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _summary(proc: subprocess.Popen[str], timeout_s: float = 120) -> dict[str, Any]:
    stdout, stderr = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, stderr[-3000:]
    summary: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return summary


def _delay_spans(stack: harness.Stack, job_id: str) -> list[Any]:
    return [
        s
        for s in stack.sink.spans()
        if s.name == semconv.SPAN_PACING_DELAY and s.resource.get(semconv.JOB_ID) == job_id
    ]


def test_simulator_closes_the_loop_with_the_real_pacer_and_fails_open(
    otelcol_path: Path, tmp_path: Path
) -> None:
    loadgen = build_loadgen()
    job_id = f"sim-loop-{uuid.uuid4().hex[:8]}"
    with harness.running_stack(otelcol_path, tmp_path) as stack:
        proc = _simulate(
            loadgen,
            stack.collector_otlp,
            job_id,
            "-pacer-url",
            stack.pacer_url,
            "-steps",
            "70",
            "-measure-from",
            "0",
        )
        published: dict[int, float] = {}
        killed_at = None
        deadline = time.monotonic() + 90
        # Watch the pacer until its delays have been applied for a while, then kill it.
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                decision = stack.decision(job_id)
            except OSError:
                decision = {}
            if decision.get("active"):
                for rank, delay in decision["delays"].items():
                    published[int(rank)] = max(published.get(int(rank), 0.0), delay)
            if len(_delay_spans(stack, job_id)) >= 12:
                stack.kill_pacer()
                killed_at = time.time()
                break
            time.sleep(0.25)
        summary = _summary(proc)
        stack.sink.wait_for_spans(
            lambda spans: any(
                s.name == semconv.SPAN_STEP
                and s.resource.get(semconv.JOB_ID) == job_id
                and int(s.attributes.get(semconv.STEP, -1)) == 69
                for s in spans
            ),
            timeout=15,
        )
        delays = _delay_spans(stack, job_id)
        log = stack.log_tail()

    # The pacer saw the simulated job through the collector and named the early node only.
    assert published, f"the pacer never published a delay for {job_id}\n{log}"
    assert set(published) <= EARLY_RANKS, published
    assert all(0 < d <= 0.05 for d in published.values()), published
    # The simulator applied them: counted in its summary and in the traces, early node only.
    assert killed_at is not None, f"fewer than 12 pacing.delay spans arrived\n{summary}\n{log}"
    assert summary["delays_applied"] >= 12 and summary["delay_spans"] >= 12, summary
    assert summary["node_delay_mean_s"][0] > 0 and summary["node_delay_mean_s"][1] == 0, summary
    ranks = {int(s.resource[semconv.RANK]) for s in delays}
    assert ranks and ranks <= EARLY_RANKS, ranks
    for span in delays:
        value = span.attributes[semconv.PACING_DELAY]
        assert 0 < value <= 0.05
        assert span.attributes[semconv.PACING_VERSION] >= 1
        assert span.duration_s == pytest.approx(value, abs=1e-6)
    # Fail open: every step ran after the kill, and no delay was applied a few seconds on
    # (one failed poll, plus a step computed before it).
    assert summary["steps"] == 70 and summary["polls_failed"] > 0, summary
    late = [s for s in delays if s.start_ns / 1e9 > killed_at + 3.0]
    assert not late, f"{len(late)} delays applied more than 3 s after the pacer was killed"
    assert summary["failed_requests"] == 0, summary


def test_simulator_without_a_pacer_sends_every_step(otelcol_path: Path, tmp_path: Path) -> None:
    loadgen = build_loadgen()
    job_id = f"sim-nopacer-{uuid.uuid4().hex[:8]}"
    with harness.running_stack(otelcol_path, tmp_path) as stack:
        stack.kill_pacer()
        proc = _simulate(
            loadgen,
            stack.collector_otlp,
            job_id,
            "-pacer-url",
            stack.pacer_url,
            "-steps",
            "8",
            "-measure-from",
            "2",
        )
        summary = _summary(proc)
    assert summary["steps"] == 8 and summary["polls_failed"] > 0, summary
    assert summary["polls_ok"] == 0 and summary["delays_applied"] == 0, summary
    assert summary["spans"] > 0 and summary["failed_requests"] == 0, summary
