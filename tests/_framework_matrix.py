"""The framework matrix's run and checks, shared by tests/test_frameworks.py (FSDP2, tensor
parallel, FSDP2 + TP, pipelining) and tests/test_frameworks_trainers.py (Lightning,
Accelerate, transformers.Trainer, DeepSpeed).

A case is an unmodified script under examples/frameworks/ run by torchrun on gloo ranks
against the built otelcol-skewtrace, under zero-code (``opentelemetry-instrument``) or one call
(``SKEWTRACE_ONE_CALL=1``: the script calls ``skewtrace.instrument(model=...,
optimizer=...)``). One run is healthy first and then slow: ``slow_rank`` sleeps ``slow_ms`` in
its forward from step ``slow_from`` on. ``check`` asserts:
- every collective the process groups ran, by the groups' own counters
  (``_get_sequence_number_for_group``, written by the script, independent of skewtrace), has
  a span on that rank, and each group's spans are numbered 0..n-1 with no gap;
- the phase spans on every rank for every step (forward at least ``forwards_per_step``: one
  per microbatch under pipelining), and every collective joined complete by the collector;
- the Collector's step summaries came out, and the slow rank was flagged for ``compute`` at
  some point after its slowdown (tests/live_checks.py: what a live run proves). The verdict of
  every step is tested on the recorded runs (tests/test_recorded_verdicts.py).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess, FileSpan
from live_checks import assert_flagged_at_some_point, flagged_by_step
from skewtrace import semconv

_RUNS = itertools.count()  # a job id per run, also for two cases of one script
FRAMEWORKS = Path(__file__).resolve().parent.parent / "examples" / "frameworks"
RUN_TIMEOUT_S = 300
MODES = ("zero-code", "one-call")
PHASES = (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD)
ALL_PHASES = (
    semconv.SPAN_STEP,
    semconv.SPAN_FORWARD,
    semconv.SPAN_BACKWARD,
    semconv.SPAN_OPTIMIZER_STEP,
)


@dataclass(frozen=True)
class Case:
    script: str  # the file under examples/frameworks/, without ".py"
    ranks: int = 4
    steps: int = 24
    slow_rank: int = 2
    slow_from: int = 10
    slow_ms: int = 100
    forwards_per_step: int = 1  # forward spans per rank and step, at least
    phases: Sequence[str] = PHASES  # spans wanted on every rank for every step
    point_to_point: bool = False  # messages are numbered per (sender, receiver), not per group
    gap: str | None = None  # why the slow rank is not flagged yet (an expected failure)
    args: tuple[str, ...] = ()  # the script's arguments besides --steps
    env: tuple[tuple[str, str], ...] = ()  # variables besides the matrix's


def collector_process(otelcol_path: Path, workdir: Path) -> Iterator[CollectorProcess]:
    """The body of a module-scoped ``collector`` fixture: the built collector with the file
    export, running for the module."""
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], workdir) as process:
        yield process


def run(collector: CollectorProcess, case: Case, mode: str, job: str, counts: Path) -> str:
    """Runs the case's script under torchrun in ``mode``; returns its output."""
    python = sys.executable
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.otlp_grpc_endpoint}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "SKEWTRACE_JOB_ID": job,
        "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
        "COLLECTIVE_COUNTS_DIR": str(counts),
        "SLOW_RANK": str(case.slow_rank),
        "SLOW_MS": str(case.slow_ms),
        "SLOW_FROM_STEP": str(case.slow_from),
        "OMP_NUM_THREADS": "1",
        **dict(case.env),
    }
    launcher = [python, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={case.ranks}"]  # fmt: skip
    script_path = str(FRAMEWORKS / f"{case.script}.py")
    if mode == "zero-code":
        instrument = str(Path(python).parent / "opentelemetry-instrument")
        command = [*launcher, "--no-python", instrument, python, script_path]
    else:
        env["SKEWTRACE_ONE_CALL"] = "1"
        command = [*launcher, script_path]
    result = subprocess.run(
        [*command, "--steps", str(case.steps), *case.args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"{case.script} ({mode}) exited {result.returncode}:\n{output[-4000:]}"
    )
    return output


def job_spans(collector: CollectorProcess, job: str, summaries_wanted: int) -> list[FileSpan]:
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


def run_and_check(
    collector: CollectorProcess, case: Case, mode: str, counts: Path
) -> list[FileSpan]:
    """One case end to end: run, collect the job's spans, ``check``. Returns the spans."""
    job = f"fw-{case.script}-{mode}-{os.getpid()}-{next(_RUNS)}"
    output = run(collector, case, mode, job, counts)
    spans = job_spans(collector, job, case.steps - 2)
    check(case, spans, counts, output)
    return spans


def check(case: Case, spans: list[FileSpan], counts: Path, output: str = "") -> None:
    by_rank: dict[int, list[FileSpan]] = defaultdict(list)
    for span in spans:
        if semconv.RANK in span.resource:  # the collector's step summaries have no rank
            by_rank[int(span.resource[semconv.RANK])].append(span)
    assert sorted(by_rank) == list(range(case.ranks)), (sorted(by_rank), output[-2000:])

    # Every collective each group ran, counted by the group itself, has its span.
    for rank in range(case.ranks):
        ran = json.loads((counts / f"counts-{rank}.json").read_text())
        seqs: dict[str, list[int]] = defaultdict(list)
        for span in by_rank[rank]:
            if span.name.startswith(semconv.SPAN_COLLECTIVE_PREFIX):
                seqs[str(span.attributes[semconv.COLLECTIVE_PG])].append(
                    int(span.attributes[semconv.COLLECTIVE_SEQ])
                )
        traced = {pg: len(s) for pg, s in seqs.items()}
        expected = {pg: n for pg, n in ran.items() if n}
        missing = {pg: sorted(set(range(n)) - set(seqs[pg])) for pg, n in expected.items()}
        assert traced == expected, (rank, traced, expected, "missing:", missing, output[-2000:])
        names = Counter(span.name for span in by_rank[rank])
        if not case.point_to_point:
            for pg, numbers in seqs.items():
                assert sorted(numbers) == list(range(len(numbers))), (rank, pg)
        for phase in case.phases:
            wanted = case.forwards_per_step if phase == semconv.SPAN_FORWARD else 1
            steps = Counter(
                int(s.attributes[semconv.STEP]) for s in by_rank[rank] if s.name == phase
            )
            short = {step: steps[step] for step in range(case.steps) if steps[step] < wanted}
            assert not short, (rank, phase, short, names)

    # Every collective joined complete: all pg_size members there, each marked by the
    # collector with the barrier's skew. (Messages are pairs, joined by their own key.)
    members: dict[tuple[str, int], list[FileSpan]] = defaultdict(list)
    for span in spans:
        attributes = span.attributes
        if (
            span.name.startswith(semconv.SPAN_COLLECTIVE_PREFIX)
            and semconv.COLLECTIVE_PEER not in attributes
        ):
            key = (str(attributes[semconv.COLLECTIVE_PG]), int(attributes[semconv.COLLECTIVE_SEQ]))
            members[key].append(span)
    assert members
    for key, group in members.items():
        assert len(group) == int(group[0].attributes[semconv.COLLECTIVE_PG_SIZE]), key
        assert all("training.barrier.skew" in s.attributes for s in group), key

    # The verdict, live: the Collector analysed the steps, and flagged the slow rank for
    # compute at some point after its slowdown. Which steps, and that nothing else was
    # flagged, is decided on recorded spans (tests/test_recorded_verdicts.py: the
    # frameworks' recordings, tests/record_frameworks.py), not on a run a busy machine
    # shapes.
    summaries = sum(1 for s in spans if s.name == semconv.SPAN_STEP_SUMMARY)
    assert summaries >= case.steps - 2, (summaries, output[-2000:])
    if case.gap is not None and not any(
        f.get(case.slow_rank) == semconv.CAUSE_COMPUTE for f in flagged_by_step(spans).values()
    ):
        pytest.xfail(case.gap)
    assert_flagged_at_some_point(spans, case.slow_rank, semconv.CAUSE_COMPUTE, case.slow_from)
