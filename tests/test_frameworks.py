"""The framework matrix (issue 22): unmodified training scripts under examples/frameworks/
(FSDP2, tensor parallel with DTensor, FSDP2 + tensor parallel on a 2-D mesh, pipelining with
1F1B), each run by torchrun on four gloo ranks against the built otelcol-skewtrace, under
zero-code (``opentelemetry-instrument``) and one call (``skewtrace.instrument(model=...,
optimizer=...)``).

One run per case is healthy first and then slow: rank 2 sleeps in its forward from step
``SLOW_FROM`` on. Checked:
- every collective the process groups ran, by the groups' own counters
  (``_get_sequence_number_for_group``, written by the script, independent of skewtrace), has
  a span on that rank, and each group's spans are numbered 0..n-1 with no gap;
- forward and backward spans on every rank for every step (one per microbatch under
  pipelining), and every collective joined complete by the collector;
- per analyzed step (the collector's ``train.step.summary``): before the slowdown nobody is
  flagged; from two steps after it on, the only rank ever flagged is rank 2, with cause
  ``compute``, and it is flagged in more than half of those steps. Judged per step, so a busy
  machine shifts no verdict between the two halves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess, FileSpan
from skewtrace import semconv

pytestmark = [pytest.mark.collector, pytest.mark.slow]

RANKS = 4
STEPS = 24
SLOW_RANK = 2
SLOW_FROM = 10
SLOW_MS = 100
RUN_TIMEOUT_S = 300
FRAMEWORKS = Path(__file__).resolve().parent.parent / "examples" / "frameworks"

# script -> (forward spans per rank and step at least, why the slow rank is not flagged yet)
CASES: dict[str, tuple[int, str | None]] = {
    "fsdp2": (1, None),
    "tensor_parallel": (
        1,
        (
            "the step analysis finds rank 2 late at the first forward all-reduce (lateness ~0.1 s "
            "on the collective spans) but its replay does not make it a candidate: issue 21"
        ),
    ),
    "fsdp2_tp": (1, None),
    "pipelining": (4, "a slow pipeline stage is not attributed by the step analysis: issue 21"),
}


@pytest.fixture(scope="module")
def collector(otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("frameworks")
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], workdir) as process:
        yield process


def _run(collector: CollectorProcess, script: str, mode: str, job: str, counts: Path) -> str:
    python = sys.executable
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.otlp_grpc_endpoint}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "SKEWTRACE_JOB_ID": job,
        "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
        "COLLECTIVE_COUNTS_DIR": str(counts),
        "SLOW_RANK": str(SLOW_RANK),
        "SLOW_MS": str(SLOW_MS),
        "SLOW_FROM_STEP": str(SLOW_FROM),
        "OMP_NUM_THREADS": "1",
    }
    launcher = [python, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={RANKS}"]  # fmt: skip
    script_path = str(FRAMEWORKS / f"{script}.py")
    if mode == "zero-code":
        instrument = str(Path(python).parent / "opentelemetry-instrument")
        command = [*launcher, "--no-python", instrument, python, script_path]
    else:
        env["SKEWTRACE_ONE_CALL"] = "1"
        command = [*launcher, script_path]
    result = subprocess.run(
        [*command, "--steps", str(STEPS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"{script} ({mode}) exited {result.returncode}:\n{output[-4000:]}"
    )
    return output


def _job_spans(collector: CollectorProcess, job: str, summaries_wanted: int) -> list[FileSpan]:
    """The job's spans once its step summaries are out and the file stops growing."""
    deadline = time.monotonic() + 60
    last, stable_since = -1, time.monotonic()
    spans: list[FileSpan] = []
    while time.monotonic() < deadline:
        spans = [s for s in collector.exported_spans() if s.resource.get(semconv.JOB_ID) == job]
        summaries = sum(1 for s in spans if s.name == semconv.SPAN_STEP_SUMMARY)
        if len(spans) != last:
            last, stable_since = len(spans), time.monotonic()
        elif summaries >= summaries_wanted and time.monotonic() - stable_since > 2:
            break
        time.sleep(0.3)
    return spans


@pytest.mark.parametrize("mode", ["zero-code", "one-call"])
@pytest.mark.parametrize("script", list(CASES))
def test_framework_traced_joined_and_diagnosed(
    collector: CollectorProcess, tmp_path: Path, script: str, mode: str
) -> None:
    job = f"fw-{script}-{mode}-{os.getpid()}"
    output = _run(collector, script, mode, job, tmp_path)
    spans = _job_spans(collector, job, STEPS - 2)
    by_rank: dict[int, list[FileSpan]] = defaultdict(list)
    for span in spans:
        if semconv.RANK in span.resource:  # the collector's step summaries have no rank
            by_rank[int(span.resource[semconv.RANK])].append(span)
    assert sorted(by_rank) == list(range(RANKS)), (sorted(by_rank), output[-2000:])

    # Every collective each group ran, counted by the group itself, has its span.
    for rank in range(RANKS):
        ran = json.loads((tmp_path / f"counts-{rank}.json").read_text())
        seqs: dict[str, list[int]] = defaultdict(list)
        for span in by_rank[rank]:
            if span.name.startswith("collective."):
                seqs[str(span.attributes[semconv.COLLECTIVE_PG])].append(
                    int(span.attributes[semconv.COLLECTIVE_SEQ])
                )
        traced = {pg: len(s) for pg, s in seqs.items()}
        expected = {pg: n for pg, n in ran.items() if n}
        assert traced == expected, (rank, traced, expected)
        names = Counter(span.name for span in by_rank[rank])
        if script != "pipelining":
            # Point-to-point messages are numbered per (sender, receiver), not per group.
            for pg, numbers in seqs.items():
                assert sorted(numbers) == list(range(len(numbers))), (rank, pg)
        for phase in (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD):
            steps = Counter(
                int(s.attributes[semconv.STEP]) for s in by_rank[rank] if s.name == phase
            )
            short = {step: steps[step] for step in range(STEPS) if steps[step] < CASES[script][0]}
            assert not short, (rank, phase, short, names)

    # Every collective joined complete: all pg_size members there, each marked by the
    # collector with the barrier's skew. (Messages are pairs, joined by their own key.)
    members: dict[tuple[str, int], list[FileSpan]] = defaultdict(list)
    for span in spans:
        attributes = span.attributes
        if span.name.startswith("collective.") and semconv.COLLECTIVE_PEER not in attributes:
            key = (str(attributes[semconv.COLLECTIVE_PG]), int(attributes[semconv.COLLECTIVE_SEQ]))
            members[key].append(span)
    assert members
    for key, group in members.items():
        assert len(group) == int(group[0].attributes[semconv.COLLECTIVE_PG_SIZE]), key
        assert all("training.barrier.skew" in s.attributes for s in group), key

    # The verdict, per analyzed step.
    flags: dict[int, set[tuple[int, str]]] = {}
    for span in spans:
        if span.name != semconv.SPAN_STEP_SUMMARY:
            continue
        step = int(span.attributes[semconv.STEP])
        flags[step] = {
            (int(e["attributes"][semconv.RANK]), str(e["attributes"][semconv.STRAGGLER_CAUSE]))
            for e in span.events
            if e["name"] == semconv.EVENT_STRAGGLER
        }
    healthy = {step: f for step, f in flags.items() if 1 <= step < SLOW_FROM}
    slow = {step: f for step, f in flags.items() if SLOW_FROM + 2 <= step < STEPS - 1}
    assert len(healthy) >= SLOW_FROM - 2 and len(slow) >= STEPS - SLOW_FROM - 5, sorted(flags)
    assert all(not f for f in healthy.values()), {s: f for s, f in healthy.items() if f}
    wrong = {step: f for step, f in slow.items() if f - {(SLOW_RANK, "compute")}}
    assert not wrong, wrong
    flagged = sum(1 for f in slow.values() if (SLOW_RANK, "compute") in f)
    gap = CASES[script][1]
    if gap is not None and flagged <= 0.5 * len(slow):
        pytest.xfail(gap)
    # Most of them: on 2 shared cores a step now and then is judged too close to call.
    assert flagged > 0.5 * len(slow), (flagged, len(slow), slow)
