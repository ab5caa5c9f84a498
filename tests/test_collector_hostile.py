"""Hostile spans against the real otelcol-skewtrace (collector-config/otelcol.yaml).

- 1 MiB attribute values that would become metric labels: 8 such spans once made a 277 MB
  /metrics page; now they are malformed (`oversized:<key>`), counted, and /metrics stays
  small.
- Rank numbers that size memory: 8192 spans of rank 1048575 in a 2-member group (no world
  size on the resource) once took the collector from 181 MiB to 1.16 GiB in a second; now
  a member costs what any member costs.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from collector_harness import OTELCOL_YAML, CollectorProcess, find_samples, parse_prometheus, scrape
from skewtrace import semconv

pytestmark = [pytest.mark.collector, pytest.mark.slow]

MIB = 1 << 20


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _request(
    resource: dict[str, object], spans: list[dict[str, object]]
) -> ExportTraceServiceRequest:
    rs = ResourceSpans()
    rs.resource.attributes.extend(_kv(k, v) for k, v in resource.items())
    ss = ScopeSpans()
    now = time.time_ns()
    for i, attrs in enumerate(spans):
        span = Span(trace_id=(i + 1).to_bytes(16, "big"),
                    span_id=(i + 1).to_bytes(8, "big"), name="collective.all_reduce",
                    start_time_unix_nano=now - 1_000_000, end_time_unix_nano=now)  # fmt: skip
        span.attributes.extend(_kv(k, v) for k, v in attrs.items())
        ss.spans.append(span)
    rs.scope_spans.append(ss)
    return ExportTraceServiceRequest(resource_spans=[rs])


def _collective(seq: int, pg: str = "g", pg_size: int = 2) -> dict[str, object]:
    return {
        semconv.STEP: 0,
        semconv.COLLECTIVE_PG: pg,
        semconv.COLLECTIVE_PG_SIZE: pg_size,
        semconv.COLLECTIVE_SEQ: seq,
        semconv.COLLECTIVE_OP: "all_reduce",
    }


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _stub(col: CollectorProcess) -> TraceServiceStub:
    return TraceServiceStub(
        grpc.insecure_channel(
            col.otlp_grpc_endpoint, options=[("grpc.max_send_message_length", 16 * MIB)]
        )
    )


def test_megabyte_attribute_values_do_not_become_labels(otelcol_path: Path, tmp_path: Path) -> None:
    huge = "x" * MIB
    with CollectorProcess(otelcol_path, [OTELCOL_YAML], tmp_path) as col:
        stub = _stub(col)
        for key in (semconv.JOB_ID, semconv.HOST_NAME, semconv.SWITCH, semconv.NIC):
            for rank in range(2):
                resource = {semconv.JOB_ID: "j", semconv.RANK: rank, key: huge}
                stub.Export(_request(resource, [_collective(0)]), timeout=30)
        time.sleep(2.5)  # a metrics flush, then the scrape
        page = col.scrape_prometheus()
        telemetry = parse_prometheus(scrape(col.telemetry_url))
    assert len(page) < MIB, f"/metrics is {len(page) / MIB:.1f} MiB"
    counted = {
        s.labels["reason"]: s.value
        for s in find_samples(telemetry, "otelcol_processor_barrierskew_spans_malformed_total")
    }
    for key in (semconv.JOB_ID, semconv.HOST_NAME, semconv.SWITCH, semconv.NIC):
        assert counted.get(f"oversized:{key}") == 2, counted


def test_huge_rank_numbers_do_not_size_memory(otelcol_path: Path, tmp_path: Path) -> None:
    with CollectorProcess(otelcol_path, [OTELCOL_YAML], tmp_path) as col:
        stub = _stub(col)
        stub.Export(_request({semconv.JOB_ID: "warm", semconv.RANK: 0}, [_collective(0)]))
        time.sleep(1)
        before = _rss_mib(col.pid)
        # 8192 collectives of a 2-member group, each with one member claiming rank 1048575.
        for batch in range(8):
            spans = [_collective(batch * 1024 + i) for i in range(1024)]
            stub.Export(_request({semconv.JOB_ID: "big-ranks", semconv.RANK: 1048575}, spans),
                        timeout=30)  # fmt: skip
        time.sleep(1)
        after = _rss_mib(col.pid)
    # 8192 held members cost a few MiB whatever their rank numbers (a bitset indexed by rank
    # cost ~128 KiB each: about 1 GiB).
    assert after - before < 100, f"RSS {before:.0f} -> {after:.0f} MiB"
