"""Soak: otelcol-skewtrace under a hostile mix beside a real job, for several minutes.

    python benchmarks/soak.py [--seconds 180] [--memory-limit-mib 512]

The built collector runs collector-config/otelcol.yaml with its memory limiter at
--memory-limit-mib (spike limit a quarter of it); its trace backend and pacer exports go to
`loadgen sink` (a real OTLP/gRPC server that counts). Beside each other, over real OTLP/gRPC
and OTLP/HTTP sockets on 127.0.0.1:

- good traffic: tests/scenario_gen.py's `compute-2d` job (16 ranks, 3 groups, host clocks
  off by up to 2 s, batches out of order, rank 11 slow from step 8), paced at 8 steps/s for
  the whole run;
- oversized values: spans whose job id, host, group or op is 1 MiB (4 MiB about once a
  second);
- out-of-range ranks: rank 1048575 of an 8-rank job, negative ranks, a rank of 1048575 in a
  2-member group with no world size (the member set must stay small);
- 10,000 jobs: one member of one collective each, never completed;
- never-completing collectives of a 4096-member group;
- mistyped attributes, and garbage bodies POSTed to OTLP/HTTP.

Every second it reads the collector's RSS (/proc). At the end it reads the collector's own
telemetry (every rejected collective span by reason, evictions, refused data) and the good
job's verdict on /metrics. Printed against targets: peak RSS below the memory limit; the good
job's straggler flagged (rank 11, compute) and nobody else; every hostile span counted by
reason (malformed or evicted). Exit status 1 when a target is missed (the last line: FAIL).
``--smoke``: three seconds, the good job's flag not judged (tests/test_benchmark_smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _smoke import NOT_JUDGED, SMOKE_HELP
from collector_e2e import Sink
from collector_harness import (
    OTELCOL_YAML,
    REPO_ROOT,
    CollectorProcess,
    build_loadgen,
    find_samples,
    parse_prometheus,
    scrape,
)
from scenario_gen import SCENARIOS
from skewtrace import semconv

MIB = 1 << 20


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        v = AnyValue(bool_value=value)
    elif isinstance(value, int):
        v = AnyValue(int_value=value)
    elif isinstance(value, float):
        v = AnyValue(double_value=value)
    else:
        v = AnyValue(string_value=str(value))
    return KeyValue(key=key, value=v)


def _request(
    resource: dict[str, object], spans: list[dict[str, object]]
) -> ExportTraceServiceRequest:
    rs = ResourceSpans()
    rs.resource.attributes.extend(_kv(k, v) for k, v in resource.items())
    ss = ScopeSpans()
    now = time.time_ns()
    for attrs in spans:
        span = Span(
            trace_id=random.randbytes(16),
            span_id=random.randbytes(8),
            name=str(attrs.pop("name", "collective.all_reduce")),
            start_time_unix_nano=now - 5_000_000,
            end_time_unix_nano=now,
        )
        span.attributes.extend(_kv(k, v) for k, v in attrs.items())
        ss.spans.append(span)
    rs.scope_spans.append(ss)
    return ExportTraceServiceRequest(resource_spans=[rs])


def _collective(pg: str, seq: int, pg_size: int, **extra: object) -> dict[str, object]:
    return {
        semconv.STEP: 0,
        semconv.COLLECTIVE_OP: "all_reduce",
        semconv.COLLECTIVE_PG: pg,
        semconv.COLLECTIVE_PG_SIZE: pg_size,
        semconv.COLLECTIVE_SEQ: seq,
        semconv.COLLECTIVE_BYTES: 4,
        **extra,
    }


class Hostile:
    """The hostile senders; each counts the collective spans it sent."""

    def __init__(self, grpc_endpoint: str, http_endpoint: str, stop: threading.Event) -> None:
        channel = grpc.insecure_channel(
            grpc_endpoint, options=[("grpc.max_send_message_length", 64 * MIB)]
        )
        self.stub = TraceServiceStub(channel)
        self.http = f"http://{http_endpoint}/v1/traces"
        self.stop = stop
        self.sent: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.seq = 0

    def _send(self, kind: str, request: ExportTraceServiceRequest, spans: int) -> None:
        try:
            self.stub.Export(request, timeout=10)
            self.sent[kind] = self.sent.get(kind, 0) + spans
        except grpc.RpcError as exc:
            key = f"{kind}:{exc.code().name}"
            self.errors[key] = self.errors.get(key, 0) + 1

    def oversized(self) -> None:
        huge = "x" * MIB
        base = {semconv.JOB_ID: "hostile-big", semconv.RANK: 0, semconv.WORLD_SIZE: 2}
        for key in (semconv.JOB_ID, semconv.HOST_NAME):
            self._send("oversized", _request({**base, key: huge}, [_collective("g", 0, 2)]), 1)
        for key in (semconv.COLLECTIVE_PG, semconv.COLLECTIVE_OP):
            self._send("oversized", _request(base, [_collective("g", 1, 2, **{key: huge})]), 1)

    def out_of_range(self) -> None:
        self.seq += 1
        job = {semconv.JOB_ID: "hostile-ranks", semconv.WORLD_SIZE: 8}
        self._send("out_of_range", _request({**job, semconv.RANK: 1048575},
                                            [_collective("default", self.seq, 8)]), 1)  # fmt: skip
        self._send("out_of_range", _request({**job, semconv.RANK: -3},
                                            [_collective("default", self.seq, 8)]), 1)  # fmt: skip
        # No world size: a huge rank is accepted in a 2-member group, but costs one member.
        self._send("huge_rank_pending", _request(
            {semconv.JOB_ID: "hostile-ranks-2", semconv.RANK: 1048575},
            [_collective("pair", self.seq, 2)]), 1)  # fmt: skip

    def many_jobs(self) -> None:
        for _ in range(50):
            self.seq += 1
            job = f"hostile-job-{self.seq % 10000}"
            self._send("many_jobs", _request(
                {semconv.JOB_ID: job, semconv.RANK: 0, semconv.WORLD_SIZE: 4},
                [_collective("default", self.seq, 4)]), 1)  # fmt: skip

    def never_complete(self) -> None:
        self.seq += 1
        spans = [_collective("wide", self.seq, 4096) for _ in range(1)]
        self._send("never_complete", _request(
            {semconv.JOB_ID: "hostile-wide", semconv.RANK: random.randrange(4096),
             semconv.WORLD_SIZE: 4096}, spans), 1)  # fmt: skip

    def mistyped(self) -> None:
        self.seq += 1
        self._send("mistyped", _request(
            {semconv.JOB_ID: "hostile-types", semconv.RANK: "not-a-rank"},
            [_collective("g", self.seq, 2)]), 1)  # fmt: skip
        self._send("mistyped", _request(
            {semconv.JOB_ID: "hostile-types", semconv.RANK: 1},
            [_collective("g", self.seq, 2, **{semconv.COLLECTIVE_SEQ: "x"})]), 1)  # fmt: skip

    def garbage(self) -> None:
        body = random.randbytes(random.randrange(16, 64 * 1024))
        request = urllib.request.Request(
            self.http, data=body, headers={"Content-Type": "application/x-protobuf"}
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
            self.errors["garbage:accepted"] = self.errors.get("garbage:accepted", 0) + 1
        except urllib.error.HTTPError as exc:
            self.errors[f"garbage:{exc.code}"] = self.errors.get(f"garbage:{exc.code}", 0) + 1
        except OSError:
            self.errors["garbage:connection"] = self.errors.get("garbage:connection", 0) + 1

    def run(self) -> None:
        actions = [self.out_of_range, self.many_jobs, self.never_complete, self.mistyped,
                   self.garbage]  # fmt: skip
        rounds = 0
        while not self.stop.is_set():
            for action in actions:
                action()
            if rounds % 20 == 0:
                self.oversized()  # 4 MiB of 1 MiB values about once a second
            rounds += 1
            time.sleep(0.05)


def send_good(endpoint: str, stop: threading.Event, seconds: float) -> str:
    scenario = SCENARIOS["compute-2d"]
    scenario.steps = int(seconds * 8)
    scenario.job = "soak-good"
    stub = TraceServiceStub(grpc.insecure_channel(endpoint))
    start = time.monotonic()
    for i, wave in enumerate(scenario.requests()):
        if stop.is_set():
            break
        for request in wave:
            # A refused request is part of what is measured (the verdict suffers).
            with contextlib.suppress(grpc.RpcError):
                stub.Export(request, timeout=10)
        delay = start + (i + 1) / 8 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return scenario.job


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--memory-limit-mib", type=int, default=512)
    parser.add_argument("--otelcol", type=Path, default=REPO_ROOT / "build" / "otelcol-skewtrace")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    # Seconds for the good job's last steps to be analyzed and flushed after the run.
    drain_s = 4.0
    if args.smoke:  # too short for the good job's flag to be judged
        args.seconds, drain_s = 3.0, 2.0
    loadgen = build_loadgen()
    backend, pacer = Sink(loadgen), Sink(loadgen)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        col = CollectorProcess(
            args.otelcol,
            [OTELCOL_YAML],
            Path(tmp),
            env={
                "SKEWTRACE_TRACES_BACKEND_ENDPOINT": backend.address,
                "SKEWTRACE_PACER_OTLP_ENDPOINT": pacer.address,
                "SKEWTRACE_MEMORY_LIMIT_MIB": str(args.memory_limit_mib),
                "SKEWTRACE_MEMORY_SPIKE_MIB": str(args.memory_limit_mib // 4),
                # The Go runtime's soft limit, below the limiter's: the GC works harder before
                # the limiter has to refuse data (docs/deployment.md).
                "GOMEMLIMIT": f"{args.memory_limit_mib * 7 // 10}MiB",
            },
        )
        with col:
            stop = threading.Event()
            hostile = Hostile(col.otlp_grpc_endpoint, f"127.0.0.1:{col.ports.otlp_http}", stop)
            good_job: list[str] = []
            threads = [
                threading.Thread(target=hostile.run, daemon=True),
                threading.Thread(
                    target=lambda: good_job.append(
                        send_good(col.otlp_grpc_endpoint, stop, args.seconds)
                    ),
                    daemon=True,
                ),
            ]
            for t in threads:
                t.start()
            peak, samples = 0.0, []
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                rss = rss_mib(col.pid)
                peak = max(peak, rss)
                samples.append(rss)
                time.sleep(1)
            stop.set()
            for t in threads:
                t.join(30)
            time.sleep(drain_s)  # the good job's last steps are analyzed and flushed
            page = col.scrape_prometheus()
            metrics = parse_prometheus(page)
            telemetry = parse_prometheus(scrape(col.telemetry_url))
            alive = col.running()
    backend.close()
    pacer.close()

    malformed: dict[str, float] = {}
    # prometheus_client's parser names counter samples <name>_total.
    for s in find_samples(telemetry, "otelcol_processor_barrierskew_spans_malformed_total"):
        malformed[s.labels.get("reason", "?")] = s.value
    evicted = sum(s.value for s in find_samples(
        telemetry, "otelcol_processor_barrierskew_collectives_evicted_total"))  # fmt: skip
    refused = sum(s.value for s in telemetry if s.name.startswith("otelcol_receiver_refused"))
    flagged = {
        (s.labels.get(semconv.prometheus_label(semconv.RANK)),
         s.labels.get(semconv.prometheus_label(semconv.STRAGGLER_CAUSE)))
        for s in find_samples(metrics, semconv.PROM_STRAGGLER, training_job_id="soak-good")
        if s.value == 1
    }  # fmt: skip
    series = len(metrics)

    print(f"soak {args.seconds:.0f} s, memory limit {args.memory_limit_mib} MiB")
    print(f"peak RSS:           {peak:7.1f} MiB   target < {args.memory_limit_mib} MiB "
          f"(median {sorted(samples)[len(samples) // 2]:.1f} MiB)")  # fmt: skip
    print(f"collector alive:    {alive}")
    want = {("11", "compute")}
    print(
        f"good job verdict:   {sorted(flagged)}   target {sorted(want)}"
        + (f"   {NOT_JUDGED} (no other rank flagged: {flagged <= want})" if args.smoke else "")
    )
    print(f"hostile spans sent: {hostile.sent}")
    print(f"hostile refused:    {hostile.errors}")
    print(f"counted malformed:  {malformed}")
    print(f"counted evicted:    {evicted:.0f} collectives; receiver refused: {refused:.0f}")
    print(
        f"/metrics:           {series} samples, {len(page) / MIB:.1f} MiB "
        "(series per metric bounded by the connector's max_series)"
    )
    # In a smoke run the good job may end before its rank is flagged: only a wrong flag fails.
    ok = (
        alive
        and peak < args.memory_limit_mib
        and (flagged <= want if args.smoke else flagged == want)
    )
    oversized_counted = sum(v for k, v in malformed.items() if k.startswith("oversized:"))
    if hostile.sent.get("oversized", 0) and oversized_counted < hostile.sent["oversized"]:
        print(f"MISSED: {hostile.sent['oversized']} oversized spans sent, {oversized_counted:.0f} "
              "counted")  # fmt: skip
        ok = False
    print(("SMOKE (ran end to end; the good job's flag not judged)" if args.smoke else "PASS")
          if ok else "FAIL")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
