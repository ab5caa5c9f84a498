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
- the replay's self-check (``training.replay.error``) within 2% in most analyzed steps;
- per analyzed step (the collector's ``train.step.summary``): before the slowdown nobody is
  flagged; from two steps after it on, the only rank ever flagged is the slow one, with cause
  ``compute``, and it is flagged in more than half of those steps. Judged per step, so a busy
  machine shifts no verdict between the two halves.
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
from skewtrace import semconv
from verdict_checks import (
    expected_flags,
    flagged_by_step,
    flags_follow_root_causes,
    long_own_time,
    long_work,
    min_savings,
    root_causes,
    step_variation,
    unexplained_flags,
)

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

    # The replay's self-check, per analyzed step: fed the measured durations, the replayed
    # step is the measured one within 2% in most steps, or within the job's own step-to-step
    # variation where the machine makes that larger (on 2 cores shared with other tests, a rank
    # descheduled between two collectives shifts its peers' alignment by as much).
    errors = [
        float(s.attributes[semconv.REPLAY_ERROR])
        for s in spans
        if s.name == semconv.SPAN_STEP_SUMMARY and semconv.REPLAY_ERROR in s.attributes
    ]
    bound = max(0.02, step_variation(spans))
    assert errors and sum(e <= bound for e in errors) > 0.5 * len(errors), (bound, sorted(errors))

    # The verdict, per analyzed step.
    flags = step_flags(spans)
    steps, slow_from = case.steps, case.slow_from
    healthy = {step: f for step, f in flags.items() if 1 <= step < slow_from}
    slow = {step: f for step, f in flags.items() if slow_from + 2 <= step < steps - 1}
    assert len(healthy) >= slow_from - 2 and len(slow) >= steps - slow_from - 5, sorted(flags)
    # No false flag: a rank flagged before the fault, or beside the slow rank, must be one the
    # job's own timings show running longer (a busy machine descheduled it), flagged for
    # compute, or for host_work (unknown before it had a name) where the time lay outside its
    # phases (make test: DeepSpeed ZeRO-3's rank 0 in steps 6-9); none on a quiet machine.
    expected_flag = (case.slow_rank, "compute")
    others = {step: dict(f - {expected_flag}) for step, f in flags.items() if 1 <= step < steps - 1}
    others.update({step: dict(f) for step, f in healthy.items()})
    own_time_causes = (semconv.CAUSE_COMPUTE, semconv.CAUSE_HOST_WORK, semconv.CAUSE_UNKNOWN)
    assert all(cause in own_time_causes for f in others.values() for cause in f.values()), {
        s: f for s, f in others.items() if f
    }
    false_flags = unexplained_flags(spans, others, injected=None)
    assert not false_flags, (false_flags, {s: f for s, f in others.items() if f})
    flagged = sum(1 for f in slow.values() if expected_flag in f)
    if case.gap is not None and flagged <= 0.5 * len(slow):
        pytest.xfail(case.gap)
    # Per analyzed step, on the job's own evidence (not a share of steps, which a busy machine
    # lowers): wherever the replay named the slow rank in flag_k of the last flag_window
    # steps, the Collector flagged it for compute.
    named = root_causes(spans)
    by_step = {step: dict(f) for step, f in flags.items()}
    judged = range(slow_from + 2, steps - 1)
    missed = flags_follow_root_causes(named, by_step, case.slow_rank, judged)
    assert not missed, (missed, slow, named)
    # The replay names the slow rank in most steps where the job's own timings single it out:
    # its own work long against its peers', and no peer's own work or time long (in a step of
    # four ranks, one peer the machine descheduled for tens of ms widens the spread the
    # Collector's candidates must stand out from: under CI, beside another worker's job, an
    # FSDP2 x TP run named the slow rank in 3 of its 11 slow steps), and the slow rank's long
    # enough to clear the step's bar for naming (``training.step.min_saving``: twice the job's
    # step jitter where that is more than the root-cause bound; under CI, beside another
    # worker's job, tensor parallel's steps moved by more than half the 100 ms for the first
    # six slow steps). And it was found wherever those steps alone would have flagged it.
    work, own = long_work(spans), long_own_time(spans)
    work_past_bar = long_work(spans, min_savings(spans))
    clean = [
        s for s in judged
        if case.slow_rank in work_past_bar.get(s, set())
        and not (work.get(s, set()) | own.get(s, set())) - {case.slow_rank}
    ]  # fmt: skip
    unnamed = [s for s in clean if case.slow_rank not in named.get(s, {})]
    print(f"{case.script}: the slow rank singled out in {len(clean)} of {len(judged)} steps")
    # (Not every one: beside a second worker, tensor parallel's one-call run named it in 5 of
    # the 7, while flagged throughout.)
    assert len(unnamed) <= len(clean) // 2, (unnamed, clean, named)
    alone = {s: ({case.slow_rank: "compute"} if s in clean else {}) for s in named}
    due = any(expected_flags(alone, case.slow_rank).get(s) for s in judged)
    assert flagged > 0 or not due, (len(slow), slow, named, clean)


def step_flags(spans: list[FileSpan]) -> dict[int, set[tuple[int, str]]]:
    """Per analyzed step (``train.step.summary``), the (rank, cause) pairs flagged."""
    return {step: set(flagged.items()) for step, flagged in flagged_by_step(spans).items()}
