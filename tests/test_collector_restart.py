"""A collector restarted under a running job: the backlog is not a missing rank.

A real 4-rank gloo DDP job (examples/train_ddp.py, a compute straggler on rank 2) sends its
spans to the built otelcol-skewtrace. Mid-run the collector is killed (SIGKILL, or SIGTERM)
and started again on the same ports about 7 s later; the ranks' exporters retry and then
deliver their backlog, each on its own schedule, so some ranks' spans of a collective arrive
seconds after the others'. No rank was ever missing, so the restarted collector must count
no collective incomplete and no rank missing, and still name the straggler (and only it).

The straggler is 60 ms of extra compute a step: at 30 ms, four CPU ranks sharing two cores
jittered their backward passes by tens of ms (the busy rank takes CPU from the others), and
rank 2 was the root cause in only 37-45% of steps, with this commit and with the one CI
passed before it alike; the subject here is the restart, not the diagnosis' sensitivity.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector_harness import (
    FILE_EXPORT_YAML,
    OTELCOL_YAML,
    CollectorPorts,
    CollectorProcess,
    find_samples,
    parse_prometheus,
)
from live_checks import assert_flagged_at_some_point
from skewtrace import semconv

pytestmark = [pytest.mark.collector, pytest.mark.slow]

STEPS = 350  # the collector goes down after a few seconds; about 150 steps come after
DOWN_S = 7.0


# SIGKILL in `make test`; SIGTERM (the collector drains first) under `make eval`.
@pytest.mark.parametrize(
    "kill_signal",
    [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.eval)],
    ids=["kill", "term"],
)
def test_restart_mid_run_counts_no_rank_missing(
    otelcol_path: Path, repo_root: Path, tmp_path: Path, kill_signal: signal.Signals
) -> None:
    job = f"restart-{kill_signal.name.lower()}-{os.getpid()}"
    ports = CollectorPorts()
    first = CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path / "first",
                             ports=ports, name="first")  # fmt: skip
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{first.otlp_grpc_endpoint}",
        "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
        # Exports retry through the outage instead of giving up after the default 10 s.
        "OTEL_EXPORTER_OTLP_TIMEOUT": "30",
    }
    first.start()
    train = subprocess.Popen(
        [sys.executable, str(repo_root / "examples" / "train_ddp.py"), "--nprocs", "4",
         "--steps", str(STEPS), "--straggler", "2:compute:0.06", "--job-id", job],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    second = CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML],
                              tmp_path / "second", ports=ports, name="second")  # fmt: skip
    try:
        # Let the job get going and the first collector join some steps, then take it down.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(s.name == semconv.SPAN_STEP_SUMMARY for s in first.exported_spans()):
                break
            time.sleep(0.5)
        assert train.poll() is None, "the job ended before the collector went down"
        assert first.pid is not None
        os.kill(first.pid, kill_signal)
        first.stop()
        time.sleep(DOWN_S)
        second.start()
        output = train.communicate(timeout=600)[0]
        assert train.returncode == 0, output[-3000:]
        # The ranks' last spans, then the step analysis and a metrics flush.
        time.sleep(5)
        samples = parse_prometheus(second.scrape_prometheus())
        spans = second.exported_spans()
    finally:
        if train.poll() is None:
            train.kill()
            train.wait()
        second.stop()
        first.stop()

    def total(name: str) -> float:
        return sum(s.value for s in find_samples(samples, name, training_job_id=job))

    steps_after = {
        int(s.attributes[semconv.STEP])
        for s in spans
        if s.name == semconv.SPAN_STEP_SUMMARY and s.resource.get(semconv.JOB_ID) == job
    }
    assert len(steps_after) > 20, f"the restarted collector analyzed {len(steps_after)} steps"
    assert total(semconv.PROM_COLLECTIVE_INCOMPLETE) == 0
    assert total(semconv.PROM_RANK_MISSING) == 0
    # Live, the restarted collector flags the straggler at some point (how it decides per
    # step is tested on recorded spans: tests/test_recorded_verdicts.py).
    assert_flagged_at_some_point(
        [s for s in spans if s.resource.get(semconv.JOB_ID) == job], 2, semconv.CAUSE_COMPUTE
    )
