"""The work-balance loop, live, end to end: 4 gloo ranks of ``examples/train_tokens.py
--balance pacer`` -> otelcol-skewtrace (``otelcol.yaml`` + ``file-export.yaml``) -> ``skewtrace
pacer --policy balance`` -> ``balance`` back to rank 0 -> ``WorkBalancedSampler`` on every rank
-> the ``dataloader.fetch`` spans' ``training.balance.mode`` -> ``skewtrace report``.

Everything is real and runs as separate processes. What is checked is what connects, from
what each part wrote (the Collector's file export and the pacer's answers), never a timing
figure (a busy machine decides those):

- the Collector flags the job's ``data_imbalance`` (a ``training.imbalance`` event on a step
  summary) at a step its ranks split by count;
- the pacer's answer turns ``balance`` to ``work`` after its effect guard's first phase by
  count, and ``balance_version`` changes exactly when ``balance`` does;
- the ranks' fetch spans then carry ``work`` with that version (from a sync point on: every
  rank the same at every step), and ``count`` again, with a later version, in the guard's next
  withheld phase;
- the guard's ``effect`` block is on the answers, with the pairs it measured;
- ``skewtrace report`` on the export has the work-balanced section with both modes.

The guard's phases are short (4 s) and it judges after two pairs; the job stops (SIGTERM:
every rank after the same step) once it has.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess, FileSpan
from skewtrace import semconv
from skewtrace._ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import pacing as harness

pytestmark = [pytest.mark.slow, pytest.mark.collector]

REPO_ROOT = Path(__file__).resolve().parent.parent
PHASE_MS = 4000
PAIRS = 2
SYNC_EVERY = 2
# Deadlines for events, not figures: generous for a loaded 2-core machine.
JOB_DEADLINE_S = 240.0


def _watch(url: str, samples: list[tuple[float, dict[str, Any]]], stop: threading.Event) -> None:
    while not stop.wait(0.25):
        with contextlib.suppress(OSError, ValueError):
            samples.append((time.monotonic(), harness.get_json(url)))


def _timeline(samples: list[tuple[float, dict[str, Any]]]) -> str:
    """One line per change of the pacer's answer, for messages."""
    lines, last = [], None
    origin = samples[0][0] if samples else 0.0
    for t, d in samples:
        key = (d.get("balance"), d.get("balance_version"), d.get("reason"), str(d.get("effect")))
        if key != last:
            last = key
            lines.append(
                f"t={t - origin:6.1f}s balance={d.get('balance')} v={d.get('balance_version')} "
                f"reason={d.get('reason')} effect={d.get('effect')}"
            )
    return "\n".join(lines)


def _judged(samples: list[tuple[float, dict[str, Any]]]) -> bool:
    return any((d.get("effect") or {}).get("state") in ("kept", "no_gain") for _, d in samples)


def _modes_by_step(spans: list[FileSpan], job: str) -> dict[int, dict[int, tuple[str, int]]]:
    """Per step, each rank's fetch span's (mode, balance version)."""
    out: dict[int, dict[int, tuple[str, int]]] = defaultdict(dict)
    for s in spans:
        if s.name != semconv.SPAN_DATALOADER_FETCH or s.resource.get(semconv.JOB_ID) != job:
            continue
        mode = s.attributes.get(semconv.BALANCE_MODE)
        if mode is None:
            continue
        rank = int(s.resource[semconv.RANK])
        out[int(s.attributes[semconv.STEP])][rank] = (
            mode,
            int(s.attributes.get(semconv.BALANCE_VERSION, 0)),
        )
    return dict(out)


def _rank_stats(output: str) -> dict[int, dict[str, Any]]:
    """Each rank's ``tokens_stats`` line (the ranks share one stdout)."""
    decoder, out = json.JSONDecoder(), {}
    start = output.find('{"event": "tokens_stats"')
    while start != -1:
        record, _ = decoder.raw_decode(output, start)
        out[int(record["rank"])] = record
        start = output.find('{"event": "tokens_stats"', start + 1)
    return out


def _data_imbalance_steps(spans: list[FileSpan], job: str) -> list[int]:
    steps = []
    for s in spans:
        if s.name != semconv.SPAN_STEP_SUMMARY or s.resource.get(semconv.JOB_ID, job) != job:
            continue
        if any(
            e["name"] == semconv.EVENT_IMBALANCE
            and e["attributes"].get(semconv.STRAGGLER_CAUSE) == semconv.CAUSE_DATA_IMBALANCE
            for e in s.events
        ):
            steps.append(int(s.attributes[semconv.STEP]))
    return sorted(steps)


def test_the_collector_flags_the_imbalance_the_pacer_splits_by_work_and_the_spans_show_it(
    otelcol_path: Path, tmp_path: Path
) -> None:
    job = f"loop-{uuid.uuid4().hex[:8]}"
    pacer_http, pacer_otlp = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    pacer = harness.start_pacer(
        tmp_path,
        pacer_http,
        pacer_otlp,
        [
            "--policy", "balance",
            "--window-millis", "2000",
            "--balance-effect-phase-millis", str(PHASE_MS),
            "--balance-effect-pairs", str(PAIRS),
        ],
    )  # fmt: skip
    samples: list[tuple[float, dict[str, Any]]] = []
    watching = threading.Event()
    collector = CollectorProcess(
        otelcol_path,
        [OTELCOL_YAML, FILE_EXPORT_YAML],
        tmp_path,
        env={"SKEWTRACE_PACER_OTLP_ENDPOINT": pacer_otlp},
    )
    job_proc: subprocess.Popen[str] | None = None
    try:
        harness.wait_http(f"http://{pacer_http}/healthz", 60, pacer)
        collector.start()
        watcher = threading.Thread(
            target=_watch,
            args=(f"http://{pacer_http}/v1/pacing?job={job}", samples, watching),
            daemon=True,
        )
        watcher.start()
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.otlp_grpc_endpoint}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "SKEWTRACE_PACER_URL": f"http://{pacer_http}",
            "SKEWTRACE_PACER_POLL_INTERVAL_MILLIS": "250",
            "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
        }
        env.pop("SKEWTRACE_JOB_ID", None)
        job_proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "examples" / "train_tokens.py"), "--nprocs", "4",
             "--balance", "pacer", "--steps", "100000", "--sync-every", str(SYNC_EVERY),
             "--job-id", job],
            env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        output: list[str] = []
        reader = threading.Thread(
            target=lambda: output.extend(job_proc.stdout or ()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        deadline = time.monotonic() + JOB_DEADLINE_S
        while time.monotonic() < deadline and job_proc.poll() is None and not _judged(samples):
            time.sleep(0.5)
        assert job_proc.poll() is None, "the job ended early:\n" + "".join(output)[-4000:]
        judged = _judged(samples)
        # Stop the job either way (the parent passes SIGTERM on; every rank stops after the
        # same step and flushes its spans).
        job_proc.send_signal(signal.SIGTERM)
        job_proc.wait(timeout=120)
        reader.join(10)
        time.sleep(3)  # the Collector's analysis delay and file flush for the last steps
    finally:
        watching.set()
        if job_proc is not None and job_proc.poll() is None:
            job_proc.kill()
            job_proc.wait()
        collector.stop()
        harness._stop(pacer)
    pacer_log = (tmp_path / "pacer.log").read_text(errors="replace")
    log = f"{collector.log_tail(30)}\n--- pacer.log\n{pacer_log[-3000:]}"
    timeline = _timeline(samples)
    print(timeline)
    assert job_proc.returncode == 0, "".join(output)[-4000:]
    # Stopped by the signal, every rank after the same step, with the same splits.
    stats = _rank_stats("".join(output))
    assert sorted(stats) == [0, 1, 2, 3], "".join(output)[-4000:]
    assert len({(s["steps"], tuple(s["modes"])) for s in stats.values()}) == 1
    assert judged, f"the guard never judged within {JOB_DEADLINE_S:.0f} s\n{timeline}\n{log}"

    spans = collector.exported_spans()
    modes = _modes_by_step(spans, job)
    assert modes, f"no fetch span carries {semconv.BALANCE_MODE}\n{log}"
    # Every rank the same mode and version at every step (agreed at sync points).
    for step, by_rank in modes.items():
        assert len(set(by_rank.values())) == 1, (step, by_rank)
    per_step = {step: next(iter(by_rank.values())) for step, by_rank in sorted(modes.items())}
    runs: list[tuple[str, int, int, int]] = []  # (mode, version, first step, last step)
    for step, (mode, version) in per_step.items():
        if runs and runs[-1][:2] == (mode, version):
            runs[-1] = (mode, version, runs[-1][2], step)
        else:
            runs.append((mode, version, step, step))
    print("fetch spans:", runs)
    # The split changes only at sync points (every SYNC_EVERY steps; an epoch of the example is
    # 40 steps, so they fall on multiples of SYNC_EVERY).
    assert all(first % SYNC_EVERY == 0 for _, _, first, _ in runs), runs

    # The Collector flagged the job's data imbalance while the split was by count.
    flagged = _data_imbalance_steps(spans, job)
    print("data_imbalance flagged at steps", flagged)
    first_work = next((s for s, (m, _) in per_step.items() if m == "work"), None)
    assert first_work is not None, f"no step split by work: {runs}\n{timeline}\n{log}"
    by_count = [s for s in flagged if s < first_work and per_step.get(s, ("", 0))[0] == "count"]
    assert by_count, f"no data_imbalance flagged before step {first_work}: {flagged}\n{runs}"

    # The pacer: count first, then work (its version advanced), the effect block measured.
    answers = [d for _, d in samples if "balance" in d]
    assert answers and answers[0]["balance"] == "count", timeline
    work = [d for d in answers if d["balance"] == "work"]
    assert work, timeline
    assert work[0]["balance_version"] > answers[0]["balance_version"], timeline
    for a, b in itertools.pairwise(answers):
        same = a["balance_version"] == b["balance_version"]
        assert (a["balance"] == b["balance"]) == same, (a, b)
    assert f"job {job!r}: each global batch split by work" in pacer_log, pacer_log[-3000:]
    effects = [d["effect"] for d in answers if d.get("effect")]
    assert effects, timeline
    assert max(e["pairs"] for e in effects) >= 1, effects
    assert any(e["state"] in ("kept", "no_gain") and e["pairs"] == PAIRS for e in effects)

    # The spans: work with a version the pacer served as work; count again, with a later
    # version, in the guard's next withheld phase.
    served_work = {d["balance_version"] for d in work}
    work_runs = [r for r in runs if r[0] == "work"]
    assert all(r[1] in served_work for r in work_runs), (work_runs, served_work)
    later_count = [r for r in runs if r[0] == "count" and r[2] > work_runs[0][3]]
    assert later_count and later_count[0][1] > work_runs[0][1], runs

    # The report's before/after section, with both modes.
    out = tmp_path / "report.html"
    result = subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "report", str(collector.file_export_path),
         "--job", job, "-o", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    html = out.read_text()
    assert '<section id="balance">' in html
    assert 'data-mode="count"' in html and 'data-mode="work"' in html
    assert 'class="sub balance-change" data-ratio=' in html
