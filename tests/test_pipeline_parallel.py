"""Pipeline parallelism end to end: three real gloo ranks as pipeline stages exchange
activations and gradients by send/recv, isend/irecv and batch_isend_irecv, export to the
real otelcol-skewtrace, and one stage is slow from a known step.

The sender's and the receiver's spans of every message must be joined (none released
incomplete after wait_timeout), and the step analysis must flag the slow stage's rank for its
compute at some point (its verdict per step is tested on the scenario's recording).
"""

from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path

import pytest

from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess
from live_checks import assert_flagged_at_some_point
from skewtrace import semconv
from test_instrumentation_multiproc import PIPELINE_SLOW_FROM, PIPELINE_STEPS, launch

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

    # Live, the slow stage's rank is flagged for compute at some point; its verdict in every
    # step is tested on this scenario's recording (frameworks/pipelining_gloo_slow_stage:
    # tests/test_recorded_verdicts.py, TestRecordedLivePipelineEndsAndNamesTheSlowStage).
    assert_flagged_at_some_point(spans, 1, semconv.CAUSE_COMPUTE, PIPELINE_SLOW_FROM)
