"""What the trace backend stores of a 4096-rank job (docs/architecture.md, "Trace shape").

tools/loadgen sends a synthetic 4096-rank job (8-rank tensor-parallel groups, 28 gradient
all-reduces: ~34 spans per rank and step, ~139k spans and ~40 MB per step) over OTLP/gRPC to
the built otelcol-skewtrace with collector-config/otelcol.yaml; a real OTLP/gRPC sink stands in
for the trace backend. Checked:

- every stored trace stays under Grafana Tempo's default max_bytes_per_trace (5 MB), counted
  in protobuf bytes as the sink received them;
- every step has its train.step.summary in the step's trace, and each of its span links
  leads to the train.step span of the rank it names, stored in that rank's (step, rank) trace;
- spans kept + spans dropped (the processor's own counters, by reason) = spans sent + the
  summaries, and the sink got exactly the kept ones: nothing is lost uncounted;
- the Prometheus metrics still come from every span: the straggler is flagged by the
  connector although most of the job's spans were not stored.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from collector_harness import (
    OTELCOL_YAML,
    CollectorProcess,
    find_samples,
    loadgen_for_tests,
    parse_prometheus,
    run_loadgen_send,
    scrape,
    sum_samples,
)
from otlp_sink import OtlpSink, ReceivedSpan, trace_bytes
from skewtrace import semconv

# A 4096-rank job through the binary, about a minute: under `make eval` (with the Go test of
# the same shape), not `make test`; the shape's rules are tested small in the Go tests.
pytestmark = [pytest.mark.collector, pytest.mark.slow, pytest.mark.eval]

TEMPO_MAX_BYTES_PER_TRACE = 5_000_000
RANKS, STEPS, STRAGGLER = 4096, 8, 1234


def test_4096_rank_job_is_stored_in_traces_tempo_accepts(
    otelcol_path: Path, tmp_path: Path
) -> None:
    loadgen = loadgen_for_tests()
    job = "shape-4096"
    with (
        OtlpSink() as backend,
        CollectorProcess(
            otelcol_path,
            [OTELCOL_YAML],
            tmp_path,
            env={"SKEWTRACE_TRACES_BACKEND_ENDPOINT": backend.endpoint.removeprefix("http://")},
        ) as collector,
    ):
        sent = run_loadgen_send(
            loadgen, collector.otlp_grpc_endpoint,
            "-job", job, "-ranks", str(RANKS), "-steps", str(STEPS), "-collectives", "28",
            "-tp", "8", "-straggler", f"{STRAGGLER}:compute:40ms", "-rate", "250000",
        )  # fmt: skip
        assert sent["failed_requests"] == 0

        # Wait until the processor's counters account for every span and all summaries.
        deadline = time.monotonic() + 120
        while True:
            telemetry = parse_prometheus(scrape(collector.telemetry_url))
            kept = sum_samples(telemetry, "otelcol_processor_traceshape_spans_kept_total")
            dropped = sum_samples(telemetry, "otelcol_processor_traceshape_spans_dropped_total")
            summaries = [s for s in backend.spans() if s.name == semconv.SPAN_STEP_SUMMARY]
            done = kept + dropped >= sent["spans"] + STEPS and len(summaries) >= STEPS
            if (done and len(backend.spans()) >= kept) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        flagged = {
            (s.labels["training_rank"], s.labels.get("training_straggler_cause"))
            for s in find_samples(
                parse_prometheus(collector.scrape_prometheus()),
                semconv.PROM_STRAGGLER,
                training_job_id=job,
            )
            if s.value == 1
        }

    stored = backend.spans()
    assert kept + dropped == sent["spans"] + STEPS, (kept, dropped, sent["spans"])
    assert len(stored) == kept
    assert dropped == sum_samples(
        telemetry, "otelcol_processor_traceshape_spans_dropped_total", reason="healthy_rank"
    )
    assert sum_samples(telemetry, "otelcol_processor_traceshape_jobs_split_total") == 1
    assert len(stored) < 0.05 * sent["spans"], "a split job stores a small part of its spans"

    by_trace: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for span in stored:
        by_trace[span.trace_id].append(span)
    sizes = trace_bytes(stored)
    assert max(sizes.values()) < TEMPO_MAX_BYTES_PER_TRACE, max(sizes.values())

    summaries = [s for s in stored if s.name == semconv.SPAN_STEP_SUMMARY]
    assert sorted(s.attributes[semconv.STEP] for s in summaries) == list(range(STEPS))
    spans_by_id = {(s.trace_id, s.span_id): s for s in stored}
    links = 0
    for summary in summaries:
        step = summary.attributes[semconv.STEP]
        assert all(s.attributes.get(semconv.STEP) == step for s in by_trace[summary.trace_id])
        for trace_id, span_id, attributes in summary.links:
            target = spans_by_id.get((trace_id, span_id))
            assert target is not None, f"step {step}: link to rank {attributes} leads nowhere"
            assert target.name == semconv.SPAN_STEP
            assert target.resource[semconv.RANK] == attributes[semconv.RANK]
            assert target.attributes[semconv.STEP] == step
            assert target.parent_span_id == "", "a (step, rank) trace is rooted at train.step"
            assert (summary.trace_id, summary.span_id) in {(t, s) for t, s, _ in target.links}
            links += 1
    assert links >= 1, "no summary named a rank"
    # The connector read every span before shaping: the straggler is flagged with its cause.
    assert flagged == {(str(STRAGGLER), "compute")}, flagged
