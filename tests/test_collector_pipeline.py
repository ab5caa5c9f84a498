"""The local pipeline (collector-config/otelcol.yaml + file-export.yaml) end to end, driven
by the synthetic job of tools/loadgen over real OTLP/gRPC sockets.

The backend and the pacer are real OTLP/gRPC servers (tests/otlp_sink.py); the collector is
the built otelcol-skewtrace. The synthetic job makes every blocking collective end at the
same true time on all members and shifts each host's clock by up to +-2 s, so skew has to
come from durations for the verdicts below to hold.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from collector_harness import (
    FILE_EXPORT_YAML,
    OTELCOL_YAML,
    CollectorProcess,
    FileSpan,
    find_samples,
    loadgen_for_tests,
    parse_prometheus,
    run_loadgen_send,
    scrape,
)
from otlp_sink import OtlpSink
from skewtrace import semconv

pytestmark = [pytest.mark.collector, pytest.mark.slow]
T = TypeVar("T")


@pytest.fixture(scope="module")
def loadgen() -> Path:
    return loadgen_for_tests()


COLLECTIVE_KEYS = (semconv.BARRIER_SKEW, semconv.BARRIER_LATENESS, semconv.BARRIER_WAIT)


def _wait(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.2) -> T:
    """predicate() once it is truthy, or its last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def _collectives(spans: list[FileSpan]) -> dict[tuple, list[FileSpan]]:
    by_key: dict[tuple, list[FileSpan]] = defaultdict(list)
    for span in spans:
        if span.name.startswith("collective."):
            key = (
                span.resource["training.job.id"],
                span.attributes["training.collective.pg"],
                span.attributes["training.collective.seq"],
            )
            by_key[key].append(span)
    return by_key


def _training_spans(spans: list[FileSpan]) -> list[FileSpan]:
    """The spans the job sent (without the collector's own step summaries)."""
    return [s for s in spans if s.name != semconv.SPAN_STEP_SUMMARY]


def _summaries(spans: list[FileSpan]) -> dict[int, FileSpan]:
    return {
        int(s.attributes[semconv.STEP]): s for s in spans if s.name == semconv.SPAN_STEP_SUMMARY
    }


def _flags_after(summary: FileSpan) -> set[tuple[int, str]]:
    """The flagged ranks and causes a step summary reports after its step."""
    return {
        (int(e["attributes"][semconv.RANK]), str(e["attributes"][semconv.STRAGGLER_CAUSE]))
        for e in summary.events
        if e["name"] == semconv.EVENT_STRAGGLER
    }


def _root_cause_ranks(summaries: dict[int, FileSpan]) -> set[int]:
    return {
        int(e["attributes"][semconv.RANK])
        for s in summaries.values()
        for e in s.events
        if e["name"] == semconv.EVENT_ROOT_CAUSE and semconv.RANK in e["attributes"]
    }


def test_pipeline_annotates_flags_and_exports_everywhere(
    otelcol_path: Path, loadgen: Path, tmp_path: Path
) -> None:
    ranks, steps, job = 16, 12, "pipeline-compute"
    with (
        OtlpSink() as backend,
        OtlpSink() as pacer,
        CollectorProcess(
            otelcol_path,
            [OTELCOL_YAML, FILE_EXPORT_YAML],
            tmp_path,
            env={
                "SKEWTRACE_TRACES_BACKEND_ENDPOINT": f"127.0.0.1:{backend.port}",
                "SKEWTRACE_PACER_OTLP_ENDPOINT": f"127.0.0.1:{pacer.port}",
            },
        ) as collector,
    ):
        sent = run_loadgen_send(
            loadgen, collector.otlp_grpc_endpoint,
            "-job", job, "-ranks", str(ranks), "-steps", str(steps), "-collectives", "4",
            "-tp", "4", "-clock-skew", "2s", "-straggler", "5:compute:40ms",
        )  # fmt: skip
        assert sent["spans"] > 0 and sent["failed_requests"] == 0

        # The file exporter and the backend each get every span, annotated, and the
        # collector's summary of every step.
        def exported() -> list[FileSpan]:
            spans = collector.exported_spans()
            done = len(_training_spans(spans)) >= sent["spans"] and len(_summaries(spans)) == steps
            return spans if done else []

        everything = _wait(exported, timeout_s=20)
        assert everything, f"file export has {len(collector.exported_spans())} of {sent['spans']}"
        spans = _training_spans(everything)
        assert len(spans) == sent["spans"]
        backend_spans = backend.wait_for_spans(
            lambda s: len([x for x in s if x.name != semconv.SPAN_STEP_SUMMARY]) >= sent["spans"],
            timeout=20,
        )
        assert (
            len([x for x in backend_spans if x.name != semconv.SPAN_STEP_SUMMARY]) == sent["spans"]
        )
        assert sum("training.barrier.skew" in s.attributes for s in backend_spans) == sum(
            "training.barrier.skew" in s.attributes for s in spans
        )

        # Every collective is joined complete: all members, one skew, nothing missing.
        collectives = _collectives(spans)
        assert len(collectives) == steps * (4 + ranks // 4)
        for key, members in collectives.items():
            pg_size = members[0].attributes["training.collective.pg_size"]
            assert len(members) == pg_size, key
            for span in members:
                assert all(k in span.attributes for k in COLLECTIVE_KEYS), (key, span.attributes)
                assert "training.barrier.missing_ranks" not in span.attributes, key
            skews = {round(s.attributes["training.barrier.skew"], 9) for s in members}
            assert len(skews) == 1, (key, skews)
            durations = [(s.end_ns - s.start_ns) / 1e9 for s in members]
            # Skew from durations, untouched by the +-2 s host clock offsets.
            assert abs(skews.pop() - (max(durations) - min(durations))) < 1e-6, key

        # Rank 5 is the one late rank in the all-reduces, flagged with cause compute.
        late_in_default = [
            max(members, key=lambda s: s.attributes["training.barrier.lateness"])
            for key, members in collectives.items()
            if key[1] == "default"
        ]
        assert {s.resource["training.rank"] for s in late_in_default} == {5}
        assert all(0.005 < s.attributes["training.barrier.lateness"] < 1.0 for s in late_in_default)
        # The step analysis: rank 5 the only root cause, flagged compute from its 4th step.
        summaries = _summaries(everything)
        assert _root_cause_ranks(summaries) == {5}
        assert _flags_after(summaries[steps - 1]) == {(5, "compute")}

        # Prometheus: rank 5 flagged with its cause; nobody else.
        def straggler_samples() -> list:
            return find_samples(
                parse_prometheus(collector.scrape_prometheus()),
                semconv.PROM_STRAGGLER,
                training_job_id=job,
            )

        samples = _wait(lambda: [s for s in straggler_samples() if s.value == 1], timeout_s=10)
        assert [(s.labels["training_rank"], s.labels.get("training_straggler_cause")) for s in
                samples] == [("5", "compute")], straggler_samples()  # fmt: skip

        # The pacer gets the same verdict by OTLP.
        def pacer_flags() -> set:
            return {
                (p.attributes.get("training.rank"), p.attributes.get("training.straggler.cause"))
                for p in pacer.metric_points()
                if p.name == "training.straggler" and p.value == 1
            }

        assert _wait(pacer_flags, timeout_s=10) == {(5, "compute")}


@pytest.mark.parametrize(("cause", "rank"), [("data", 1), ("compute", 3)])
def test_cause_follows_what_made_the_rank_late(
    otelcol_path: Path, loadgen: Path, tmp_path: Path, cause: str, rank: int
) -> None:
    job = f"pipeline-{cause}"
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path) as collector:
        steps = 16
        run_loadgen_send(
            loadgen, collector.otlp_grpc_endpoint,
            "-job", job, "-ranks", "8", "-steps", str(steps), "-collectives", "4",
            "-straggler", f"{rank}:{cause}:30ms", "-straggler-from", "6",
        )  # fmt: skip
        summaries = _wait(
            lambda: len(s := _summaries(collector.exported_spans())) == steps and s, timeout_s=20
        )
        assert summaries, "the collector did not write a summary of every step"
        assert _root_cause_ranks(summaries) == {rank}
        assert _flags_after(summaries[steps - 1]) == {(rank, cause)}
        samples = _wait(
            lambda: [
                s
                for s in find_samples(
                    parse_prometheus(collector.scrape_prometheus()), semconv.PROM_STRAGGLER,
                    training_job_id=job,
                )
                if s.value == 1
            ],
            timeout_s=10,
        )  # fmt: skip
        assert [(s.labels["training_rank"], s.labels.get("training_straggler_cause"))
                for s in samples] == [(str(rank), cause)]  # fmt: skip


def test_slow_link_of_a_one_group_job_blames_nobody(
    otelcol_path: Path, loadgen: Path, tmp_path: Path
) -> None:
    """A slow NIC in a data-parallel job whose only inter-host group is the world group: every
    transfer is slow and nobody arrives late. The collector sees the slow transfers but has
    no healthy inter-host group to tell the NICs apart, so it names no link and blames no
    rank (tests/test_diagnosis_scenarios.py locates NICs where the groups allow it)."""
    job, steps = "pipeline-network", 16
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path) as collector:
        run_loadgen_send(
            loadgen, collector.otlp_grpc_endpoint,
            "-job", job, "-ranks", "8", "-steps", str(steps), "-collectives", "4", "-tp", "4",
            "-straggler", "6:network:30ms", "-straggler-from", "6",
        )  # fmt: skip
        summaries = _wait(
            lambda: len(s := _summaries(collector.exported_spans())) == steps and s, timeout_s=20
        )
        assert summaries, "the collector did not write a summary of every step"
        slow = [
            int(s.attributes[semconv.STEP_SLOW_COLLECTIVES]) for _, s in sorted(summaries.items())
        ]
        assert all(n > 0 for n in slow[7:]), slow
        assert _root_cause_ranks(summaries) == set()
        assert not any(_flags_after(s) for s in summaries.values())


def test_exemplars_point_at_the_step_trace(
    otelcol_path: Path, loadgen: Path, tmp_path: Path
) -> None:
    job = "pipeline-exemplars"
    with CollectorProcess(otelcol_path, [OTELCOL_YAML], tmp_path) as collector:
        # Slow enough to last a few metric flushes: exemplars cover the last flush interval.
        sender = subprocess.Popen(
            [str(loadgen), "send", "-endpoint", collector.otlp_grpc_endpoint, "-job", job,
             "-ranks", "8", "-collectives", "2", "-steps", "400", "-rate", "1500"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            step_traces = {
                hashlib.sha256(f"skewtrace/trace/{job}/{step}".encode()).digest()[:16].hex()
                for step in range(400)
            }

            def exemplar_traces() -> set[str]:
                text = collector.scrape_prometheus(openmetrics=True)
                return {
                    line.split('trace_id="', 1)[1].split('"', 1)[0]
                    for line in text.splitlines()
                    if line.startswith("training_barrier_skew_seconds_bucket")
                    and "trace_id=" in line
                }

            found = _wait(exemplar_traces, timeout_s=15, interval_s=0.5)
            assert found, "no exemplar on training_barrier_skew_seconds_bucket"
            assert found <= step_traces, found - step_traces
        finally:
            sender.kill()
            sender.wait()


def test_ranks_own_metrics_get_rank_labels(otelcol_path: Path, tmp_path: Path) -> None:
    """A rank's skewtrace.events.dropped (rank only on the resource) is labelled by rank."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    with CollectorProcess(otelcol_path, [OTELCOL_YAML], tmp_path) as collector:
        for rank in (0, 1):
            exporter = OTLPMetricExporter(endpoint=collector.otlp_grpc_endpoint, insecure=True)
            reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
            resource = Resource.create(
                {"service.name": "skewtrace-training", "service.instance.id": f"labels/{rank}",
                 "training.job.id": "labels", "training.rank": rank, "host.name": "node-a"}
            )  # fmt: skip
            provider = MeterProvider(metric_readers=[reader], resource=resource)
            counter = provider.get_meter("skewtrace").create_counter(
                "skewtrace.events.dropped", unit="1"
            )
            counter.add(3 + rank, {"reason": "full"})
            provider.shutdown()  # exports once

        def dropped() -> dict[str, float]:
            samples = find_samples(
                parse_prometheus(collector.scrape_prometheus()),
                "skewtrace_events_dropped_total",
                training_job_id="labels",
            )
            return {s.labels.get("training_rank", "?"): s.value for s in samples}

        assert _wait(lambda: len(dropped()) == 2, timeout_s=10), dropped()
        assert dropped() == {"0": 3.0, "1": 4.0}


def test_dead_rank_releases_incomplete_collectives(
    otelcol_path: Path, loadgen: Path, tmp_path: Path
) -> None:
    """A rank that never sends: after wait_timeout every collective comes out with the rank
    named missing, and the incomplete counter on /metrics counts them. (Without the startup
    grace: within it, a rank that has not sent yet may be a slow start, and its collectives
    are released `partial` after max_wait instead; test_collector_restart.py covers that.)"""
    job, steps, buckets = "pipeline-dead-rank", 4, 2
    with CollectorProcess(
        otelcol_path,
        [OTELCOL_YAML, FILE_EXPORT_YAML],
        tmp_path,
        env={"SKEWTRACE_WAIT_TIMEOUT": "1s", "SKEWTRACE_STARTUP_GRACE": "0s"},
    ) as collector:
        sent = run_loadgen_send(
            loadgen, collector.otlp_grpc_endpoint,
            "-job", job, "-ranks", "8", "-steps", str(steps), "-collectives", str(buckets),
            "-missing-rank", "6",
        )  # fmt: skip
        spans = _wait(
            lambda: len(s := collector.exported_spans()) >= sent["spans"] and s, timeout_s=20
        )
        assert spans, "the held collectives were not released"
        collectives = _collectives(spans)
        assert len(collectives) == steps * buckets
        for key, members in collectives.items():
            assert len(members) == 7, key
            for span in members:
                assert span.attributes.get("training.barrier.missing_ranks") == 1, span.attributes
                assert span.attributes.get("training.barrier.missing") == "6", span.attributes

        def incomplete() -> float:
            samples = find_samples(
                parse_prometheus(collector.scrape_prometheus()),
                "training_collective_incomplete_total",
                training_job_id=job,
            )
            return sum(s.value for s in samples)

        assert _wait(lambda: incomplete() >= steps * buckets, timeout_s=10), incomplete()
        assert incomplete() == steps * buckets


def test_a_hung_pacer_holds_at_most_one_flush(
    otelcol_path: Path, loadgen: Path, tmp_path: Path
) -> None:
    """A pacer that accepts connections and never answers: the collector keeps one flush in
    flight and one queued, drops the rest and counts them, and its own /metrics stays live.
    (With the earlier queue of 10 and 10 s of retries, a flush at 4096 ranks being ~16 MB, a
    pacer that was down held ~170 MB in the collector; docs/performance.md.)"""
    job = "pipeline-hung-pacer"
    hung = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept_and_say_nothing() -> None:
        while True:
            try:
                conn, _ = hung.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=accept_and_say_nothing, daemon=True).start()
    try:
        with CollectorProcess(
            otelcol_path,
            [OTELCOL_YAML, FILE_EXPORT_YAML],
            tmp_path,
            env={
                "SKEWTRACE_PACER_OTLP_ENDPOINT": f"127.0.0.1:{hung.getsockname()[1]}",
                "SKEWTRACE_METRICS_FLUSH_INTERVAL": "200ms",
            },
        ) as collector:
            run_loadgen_send(
                loadgen, collector.otlp_grpc_endpoint,
                "-job", job, "-ranks", "8", "-steps", "6", "-collectives", "2",
            )  # fmt: skip

            def pacer_exporter(name: str) -> list[float]:
                samples = parse_prometheus(scrape(collector.telemetry_url))
                return [s.value for s in find_samples(samples, name, exporter="otlp_grpc/pacer")]

            dropped = _wait(
                lambda: sum(pacer_exporter("otelcol_exporter_enqueue_failed_metric_points_total")),
                timeout_s=15,
            )
            assert dropped > 0, collector.log_tail()
            assert pacer_exporter("otelcol_exporter_queue_capacity") == [1.0]
            for _ in range(5):
                assert max(pacer_exporter("otelcol_exporter_queue_size"), default=0) <= 1
                time.sleep(0.2)
            assert accepted, "the collector never connected to the pacer"
            wait = find_samples(
                parse_prometheus(collector.scrape_prometheus()),
                "training_rank_wait_seconds_count",
                training_job_id=job,
            )
            assert len(wait) == 8, "the Prometheus side stopped while the pacer hung"
    finally:
        hung.close()
        for conn in accepted:
            conn.close()
