"""Any OTLP backend: the annotated spans reach a real Jaeger v2, read back over its HTTP API.

Jaeger v2 is built from its Go module (``tools/jaeger``, ``make jaeger``) and runs with
``tools/jaeger/config.yaml`` (in-memory store) on free 127.0.0.1 ports. Three proofs:

1. Jaeger alone: OTLP/gRPC in, ``/api/traces`` and ``/api/v3/traces`` out (the build works).
2. Four ranks' spans of collectives, sent over OTLP to the built ``otelcol-skewtrace`` running
   ``collector-config/otelcol.yaml`` whose trace exporter is pointed at Jaeger by environment
   variables only: Jaeger returns them with the barrierskew annotations, and the values are
   the ones the durations imply (skew = max - min, lateness = max - own).
3. ``examples/train_ddp.py`` with four ranks and a compute straggler on rank 2, through
   the same Collector: Jaeger holds the step traces, and rank 2's collectives are the flagged
   ones.

All three start real processes, so they are marked slow (``make test-fast`` leaves them out).

Grafana Tempo cannot run here (AGPL Go module, no Docker); Jaeger stands in as "the OTLP backend
users already run", which is the claim docs/viewing.md makes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1 import trace_pb2

from conftest import free_port
from skewtrace import semconv

REPO_ROOT = Path(__file__).resolve().parent.parent
JAEGER_CONFIG = REPO_ROOT / "tools" / "jaeger" / "config.yaml"
COLLECTOR_CONFIG = REPO_ROOT / "collector-config" / "otelcol.yaml"

# ------------------------------------------------------------------------- processes


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited {process.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers: listening
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    raise RuntimeError(f"{url} not up after {timeout_s} s: {log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            # Jaeger's own shutdown takes 10 s and more; what it stored was read already.
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass
class Jaeger:
    otlp_grpc: str
    query_url: str
    log: Path

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = f"{self.query_url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def trace_v1(self, trace_id: str) -> dict[str, Any]:
        """GET /api/traces/{id}: Jaeger's own JSON (spans with tags, processes)."""
        (trace,) = self.get(f"/api/traces/{trace_id}")["data"]
        return dict(trace)

    def trace_v3(self, trace_id: str) -> list[dict[str, Any]]:
        """GET /api/v3/traces/{id}: OTLP JSON; the flattened spans with their resources."""
        body = self.get(f"/api/v3/traces/{trace_id}")
        return list(_flatten_otlp_json(body["result"]["resourceSpans"]))

    def find_traces(self, service: str, limit: int = 1000) -> list[dict[str, Any]]:
        """GET /api/traces?service=...: [] until the service has arrived."""
        try:
            body = self.get("/api/traces", {"service": service, "limit": str(limit),
                                             "lookback": "1h"})  # fmt: skip
        except urllib.error.HTTPError:
            return []
        return list(body.get("data") or [])


def _otlp_json_value(value: Mapping[str, Any]) -> Any:
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "stringValue" in value:
        return value["stringValue"]
    return value


def _flatten_otlp_json(resource_spans: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for resource_span in resource_spans:
        resource = {
            kv["key"]: _otlp_json_value(kv["value"])
            for kv in resource_span.get("resource", {}).get("attributes", [])
        }
        for scope_span in resource_span.get("scopeSpans", []):
            for span in scope_span.get("spans", []):
                yield {
                    "name": span["name"],
                    "resource": resource,
                    "attributes": {
                        kv["key"]: _otlp_json_value(kv["value"])
                        for kv in span.get("attributes", [])
                    },
                    "start_ns": int(span["startTimeUnixNano"]),
                    "end_ns": int(span["endTimeUnixNano"]),
                }


@pytest.fixture
def jaeger(jaeger_path: Path, tmp_path: Path) -> Iterator[Jaeger]:
    ports = {name: free_port() for name in ("grpc", "http", "query", "query_grpc", "health")}
    env = {
        **os.environ,
        "JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
        "JAEGER_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
        "JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{ports['query']}",
        "JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{ports['query_grpc']}",
        "JAEGER_HEALTH_ENDPOINT": f"127.0.0.1:{ports['health']}",
    }
    log = tmp_path / "jaeger.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(jaeger_path), "--config", str(JAEGER_CONFIG)], env=env, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        query_url = f"http://127.0.0.1:{ports['query']}"
        _wait_http(f"{query_url}/api/services", process, log, timeout_s=60)
        yield Jaeger(f"127.0.0.1:{ports['grpc']}", query_url, log)
    finally:
        _stop(process)


@dataclass
class Collector:
    otlp_grpc: str
    log: Path


def collector_env(traces_endpoint: str, ports: Mapping[str, int]) -> dict[str, str]:
    """The only settings the test changes: where the Collector listens, where traces go."""
    return {
        "SKEWTRACE_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
        "SKEWTRACE_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
        "SKEWTRACE_PROMETHEUS_ENDPOINT": f"127.0.0.1:{ports['prometheus']}",
        "SKEWTRACE_OTELCOL_METRICS_HOST": "127.0.0.1",
        "SKEWTRACE_OTELCOL_METRICS_PORT": str(ports["telemetry"]),
        "SKEWTRACE_HEALTH_ENDPOINT": f"127.0.0.1:{ports['health']}",
        "SKEWTRACE_PACER_OTLP_ENDPOINT": f"127.0.0.1:{ports['pacer']}",
        "SKEWTRACE_TRACES_BACKEND_ENDPOINT": traces_endpoint,
        "SKEWTRACE_TRACES_BACKEND_INSECURE": "true",
    }


def start_collector(
    otelcol_path: Path,
    traces_endpoint: str,
    tmp_path: Path,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], Collector, dict[str, int]]:
    names = ("grpc", "http", "prometheus", "telemetry", "health", "pacer")
    ports = {name: free_port() for name in names}
    env = {**os.environ, **collector_env(traces_endpoint, ports), **(extra_env or {})}
    log = tmp_path / "otelcol.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(otelcol_path), f"--config={COLLECTOR_CONFIG}"], env=env, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_http(f"http://127.0.0.1:{ports['prometheus']}/metrics", process, log, 60)
    except BaseException:
        _stop(process)
        raise
    return process, Collector(f"127.0.0.1:{ports['grpc']}", log), ports


# ------------------------------------------------------------------------- OTLP requests


def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def _kvs(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=key, value=_any(value)) for key, value in attributes.items()]


@dataclass(frozen=True)
class RankSpan:
    rank: int
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]


def export(
    endpoint: str, job_id: str, world_size: int, trace_id: bytes, spans: list[RankSpan]
) -> None:
    """One OTLP/gRPC Export with one resource per rank, as the ranks' exporters send them."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    for rank in sorted({s.rank for s in spans}):
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(
            Resource(
                attributes=_kvs({
                    "service.name": "skewtrace-test",
                    "service.instance.id": f"{job_id}/{rank}",
                    "training.job.id": job_id,
                    "training.rank": rank,
                    "training.local_rank": rank % 2,
                    "training.world_size": world_size,
                    "host.name": f"node-{rank // 2}",
                    "training.switch": f"leaf-{rank // 2}",
                    "training.nic": "eth0",
                })
            )
        )  # fmt: skip
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = "skewtrace"
        for span in (s for s in spans if s.rank == rank):
            scope_spans.spans.append(
                trace_pb2.Span(
                    trace_id=trace_id,
                    span_id=os.urandom(8),
                    name=span.name,
                    kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
                    start_time_unix_nano=span.start_ns,
                    end_time_unix_nano=span.end_ns,
                    attributes=_kvs(span.attributes),
                )
            )
    with grpc.insecure_channel(endpoint) as channel:
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)


def _tags(span: Mapping[str, Any]) -> dict[str, Any]:
    return {tag["key"]: tag["value"] for tag in span.get("tags", [])}


def _wait_for(predicate: Any, timeout_s: float, poll_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(poll_s)


# ------------------------------------------------------------------------- tests


@pytest.mark.slow
def test_jaeger_receives_otlp_and_serves_it_over_http(jaeger: Jaeger) -> None:
    """The Jaeger build works: OTLP/gRPC in, both HTTP query APIs out, attributes intact."""
    trace_id = os.urandom(16)
    now = time.time_ns()
    export(
        jaeger.otlp_grpc, "job-direct", 2, trace_id,
        [RankSpan(rank, "train.step", now, now + 1_000_000 * (rank + 1), {"training.step": 7})
         for rank in (0, 1)],
    )  # fmt: skip
    traces = _wait_for(lambda: jaeger.find_traces("skewtrace-test"), 20)
    assert [t["traceID"] for t in traces] == [trace_id.hex()]

    v1 = jaeger.trace_v1(trace_id.hex())
    ranks = sorted(
        _tags({"tags": v1["processes"][span["processID"]]["tags"]})["training.rank"]
        for span in v1["spans"]
    )
    assert ranks == [0, 1]
    assert {_tags(span)["training.step"] for span in v1["spans"]} == {7}

    v3 = jaeger.trace_v3(trace_id.hex())
    durations = sorted(span["end_ns"] - span["start_ns"] for span in v3)
    assert durations == [1_000_000, 2_000_000]
    assert {span["resource"]["training.job.id"] for span in v3} == {"job-direct"}


@pytest.mark.slow
@pytest.mark.collector
def test_collector_annotations_reach_jaeger(
    jaeger: Jaeger, otelcol_path: Path, tmp_path: Path
) -> None:
    """The Collector's trace exporter, aimed at Jaeger by env vars only, delivers annotated
    collective spans whose skew and lateness match the durations that were sent."""
    if not COLLECTOR_CONFIG.is_file():
        pytest.fail(f"{COLLECTOR_CONFIG} missing")
    process, collector, _ = start_collector(otelcol_path, jaeger.otlp_grpc, tmp_path)
    try:
        job_id = f"jaeger-{uuid.uuid4().hex[:8]}"
        trace_id = os.urandom(16)
        # Four ranks leave the same all-reduce at the same instant (a blocking collective
        # ends together); rank 2 arrived last, so its span is the shortest.
        end_ns = time.time_ns()
        durations_ms = {0: 40.0, 1: 35.0, 2: 10.0, 3: 38.0}
        spans = [
            RankSpan(rank, "collective.all_reduce", end_ns - int(ms * 1e6), end_ns, {
                "training.step": 3,
                "training.collective.op": "all_reduce",
                "training.collective.pg": "default",
                "training.collective.pg_size": 4,
                "training.collective.seq": 11,
                "training.collective.bytes": 4096,
                "training.collective.async": False,
            })
            for rank, ms in durations_ms.items()
        ]  # fmt: skip
        export(collector.otlp_grpc, job_id, 4, trace_id, spans)

        def annotated() -> list[dict[str, Any]]:
            try:
                found = jaeger.trace_v3(trace_id.hex())
            except urllib.error.HTTPError:
                return []
            with_skew = [s for s in found if "training.barrier.skew" in s["attributes"]]
            return with_skew if len(with_skew) == 4 else []

        received = _wait_for(annotated, 30)
        assert received, (
            f"no annotated spans in Jaeger; collector log: {collector.log.read_text()[-3000:]}"
        )
    finally:
        _stop(process)

    by_rank = {span["resource"]["training.rank"]: span["attributes"] for span in received}
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, attributes in by_rank.items():
        assert attributes["training.barrier.skew"] == pytest.approx(0.030, abs=1e-6)
        expected_lateness = (max(durations_ms.values()) - durations_ms[rank]) / 1000
        assert attributes["training.barrier.lateness"] == pytest.approx(expected_lateness, abs=1e-6)
        assert attributes["training.collective.seq"] == 11


@pytest.mark.slow
@pytest.mark.collector
def test_training_run_through_collector_to_jaeger(
    jaeger: Jaeger, otelcol_path: Path, tmp_path: Path
) -> None:
    """A real 4-rank gloo run with a compute straggler on rank 2: Jaeger holds step traces with
    every rank's spans, and the collectives flagged as stragglers are rank 2's."""
    process, collector, _ = start_collector(otelcol_path, jaeger.otlp_grpc, tmp_path)
    job_id = f"jaeger-ddp-{uuid.uuid4().hex[:8]}"
    try:
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.otlp_grpc}",
            "OTEL_SERVICE_NAME": "skewtrace-ddp",
            "SKEWTRACE_JOB_ID": job_id,
        }
        run = subprocess.run(
            [sys.executable, str(REPO_ROOT / "examples" / "train_ddp.py"), "--nprocs", "4",
             "--steps", "40", "--straggler", "2:compute:0.05", "--job-id", job_id],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]

        def flagged_traces() -> list[dict[str, Any]]:
            traces = jaeger.find_traces("skewtrace-ddp")
            return [
                t for t in traces if any(_tags(s).get("training.straggler") for s in t["spans"])
            ]

        traces = _wait_for(flagged_traces, 60, poll_s=2)
        assert traces, (
            f"no flagged spans in Jaeger; collector log: {collector.log.read_text()[-3000:]}"
        )
    finally:
        _stop(process)

    flagged_ranks: dict[int, int] = {}
    for trace in traces:
        for span in trace["spans"]:
            if _tags(span).get("training.straggler"):
                process_tags = _tags({"tags": trace["processes"][span["processID"]]["tags"]})
                rank = int(process_tags["training.rank"])
                flagged_ranks[rank] = flagged_ranks.get(rank, 0) + 1
    # Rank 2 is the one the processor flags (nearly always alone; a gloo hiccup may flag
    # another rank once).
    assert max(flagged_ranks, key=lambda r: flagged_ranks[r]) == 2, flagged_ranks
    processes = [_tags({"tags": p["tags"]}) for p in traces[0]["processes"].values()]
    ranks_in_a_trace = {int(p["training.rank"]) for p in processes if "training.rank" in p}
    assert ranks_in_a_trace == {0, 1, 2, 3}
    # The collector's analysis of the step is in the same trace, under its own service.
    assert any(p.get("service.name") == "skewtrace-collector" for p in processes) or any(
        s["operationName"] == semconv.SPAN_STEP_SUMMARY for t in traces for s in t["spans"]
    )
