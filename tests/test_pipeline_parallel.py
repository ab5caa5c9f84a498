"""Pipeline parallelism end to end: three real gloo ranks as pipeline stages exchange
activations and gradients by send/recv, isend/irecv and batch_isend_irecv, export to the
real otelcol-skewtrace, and one stage is slow from a known step.

The sender's and the receiver's spans of every message must be joined (none released
incomplete after wait_timeout), and the step analysis must blame the slow stage's rank, and
only it, for its compute.
"""

from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path

import pytest

from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess
from skewtrace import semconv
from test_instrumentation_multiproc import PIPELINE_SLOW_FROM, PIPELINE_STEPS, launch
from verdict_checks import (
    FLAG_K,
    flagged_by_step,
    flags_follow_root_causes,
    long_own_time,
    long_work,
    min_savings,
    root_causes,
    unexplained_flags,
)

pytestmark = [pytest.mark.slow, pytest.mark.collector]


def test_messages_join_pairwise_and_the_slow_stage_is_blamed(
    otelcol_path: Path, tmp_path: Path
) -> None:
    job = f"pp-{uuid.uuid4().hex[:8]}"
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path) as col:
        launch(
            "pipeline",
            3,
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{col.otlp_grpc_endpoint}",
                "SKEWTRACE_JOB_ID": job,
                "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "100",
            },
        )
        deadline = time.monotonic() + 30
        while True:
            spans = [s for s in col.exported_spans() if s.resource.get(semconv.JOB_ID) == job]
            summaries = {
                int(s.attributes[semconv.STEP]): s
                for s in spans
                if s.name == semconv.SPAN_STEP_SUMMARY
            }
            if len(summaries) >= PIPELINE_STEPS or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert len(summaries) == PIPELINE_STEPS, sorted(summaries)

    messages = [s for s in spans if s.name in ("collective.send", "collective.recv")]
    # Per step: 2 activations and 2 gradients over each of the 2 links, both sides.
    assert len(messages) == PIPELINE_STEPS * 4 * 2 * 2, collections.Counter(
        s.name for s in messages
    )
    for span in messages:
        assert semconv.COLLECTIVE_PEER in span.attributes, span.attributes
        assert semconv.BARRIER_SKEW in span.attributes, ("not joined", span.attributes)
        assert semconv.BARRIER_MISSING_RANKS not in span.attributes, span.attributes

    # Per analyzed step, on the job's own evidence, not on the machine's speed. Every slow
    # step's replay names the slow stage's compute (its 100 ms are inside its forwards), and
    # no other rank unless that rank's own timings ran long in the step. A step in which a
    # peer's own work ran long as well (the machine descheduled it: a three-rank step's
    # candidates stand out from their peers' spread, and a peer tens of ms late widens it) is
    # not judged for naming the slow stage; under CI, beside another worker's multi-rank job,
    # the first slow step named nothing once, and alone or beside a CPU hog it always named it.
    named, flagged = root_causes(spans), flagged_by_step(spans)
    work, own = long_work(spans), long_own_time(spans)
    work_past_bar = long_work(spans, min_savings(spans))
    peers_long = {step: (work.get(step, set()) | own.get(step, set())) - {1} for step in named}
    judged, unnamed = 0, []
    for step in range(PIPELINE_SLOW_FROM, PIPELINE_STEPS):
        causes = named[step]
        assert set(causes) - {1} <= peers_long[step], (step, causes, peers_long[step])
        assert causes.get(1) in (None, semconv.CAUSE_COMPUTE), (step, causes)
        # Judged where the slow stage's work cleared the step's bar for naming (the job's step
        # jitter in it) and no peer's ran long.
        if 1 in work_past_bar.get(step, set()) and not peers_long[step]:
            judged += 1
            if 1 not in causes:
                unnamed.append(step)
    assert judged >= FLAG_K, (judged, named, peers_long)
    # Named in most of them, as the framework matrix asks: a make test run here (2026-12-07,
    # 05:14, beside the other worker's benchmark smoke runs) named nothing in step 7, with no
    # peer's own work or time long in it. Why is not known (left open, as tensor parallel's
    # unnamed steps 16 and 20 of an earlier run).
    assert len(unnamed) <= judged // 2, (unnamed, judged, named)
    # The flag follows the hysteresis of those namings, and no other rank is flagged without
    # its own timings to explain it.
    missed = flags_follow_root_causes(
        named, flagged, 1, range(PIPELINE_SLOW_FROM + 2, PIPELINE_STEPS)
    )
    assert not missed, (missed, named, flagged)
    if judged == PIPELINE_STEPS - PIPELINE_SLOW_FROM:  # every slow step named it
        assert flagged[PIPELINE_STEPS - 1].get(1) == semconv.CAUSE_COMPUTE, flagged
    others = {step: {r: c for r, c in f.items() if r != 1} for step, f in flagged.items()}
    assert not any(c not in (semconv.CAUSE_COMPUTE, semconv.CAUSE_NETWORK)
                   for f in others.values() for c in f.values()), others  # fmt: skip
    assert not unexplained_flags(spans, others, injected=None), others
