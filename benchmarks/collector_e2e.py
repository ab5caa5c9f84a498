"""End-to-end throughput of otelcol-skewtrace: spans per second from OTLP in to OTLP out.

    python benchmarks/collector_e2e.py [--ranks 1024] [--steps 20] [--rounds 2]

Pipeline measured (collector-config/otelcol.yaml, the real built binary):

    loadgen send --OTLP/gRPC--> otelcol-skewtrace: memory_limiter -> barrierskew -> batch
        -> otlp_grpc/backend --OTLP/gRPC--> loadgen sink (counts spans and annotated spans)
        -> barrierskew connector -> prometheus (/metrics) and otlp_grpc/pacer -> loadgen sink

Baseline, in the same run and alternating with it: the same collector binary with
collector-config/passthrough.yaml (receiver, memory_limiter, batch, OTLP exporter; no
barrierskew). A third pipeline, otelcol.yaml without the connector, splits the cost between
the processor and the connector. The load generator pregenerates and encodes a synthetic
1024-rank job (13 spans per rank per step: step, phases and 8 gradient all-reduces) before
the clock starts, and sends it as fast as the collector accepts it; the figure is the spans
the sink received over the time from the first request sent to the last span received, so
it includes the processor's buffering and the batch timeout.

Printed per round and as the median: end-to-end spans/s, the collector's CPU seconds per
million spans (from /proc, so other users of the 2 shared cores do not count), its peak RSS,
and the ratio against the baseline. Targets: keep up with a 1024-rank job at one step per
second (ranks x 13 + 1 spans/s) and keep at least half the pass-through throughput. Exit
status 1 when a target is missed, or a span was lost or left unannotated (the last line says
FAIL). ``--smoke`` (tests/test_benchmark_smoke.py): 64 ranks, 4 steps, one round; the
throughput targets printed as not judged, lost and unannotated spans judged.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _smoke import SMOKE_DONE, SMOKE_HELP, verdict
from collector_harness import (
    OTELCOL_YAML,
    PASSTHROUGH_YAML,
    REPO_ROOT,
    CollectorProcess,
    build_loadgen,
    run_loadgen_send,
    scrape,
)

MIN_RATIO_TO_BASELINE = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class RoundResult:
    pipeline: str
    spans_sent: int
    spans_received: int
    annotated: int
    metric_points: int
    e2e_spans_per_s: float
    send_spans_per_s: float
    cpu_s_per_million: float
    peak_rss_mib: float
    failed_requests: int


class Sink:
    """`loadgen sink` on a free port; its stdout is one JSON line of counts per interval."""

    def __init__(self, loadgen: Path) -> None:
        self.proc = subprocess.Popen(
            [str(loadgen), "sink", "-listen", "127.0.0.1:0", "-report-interval", "200ms"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.last = json.loads(self.proc.stdout.readline())
        self.address = self.last["listen"]

    def wait_for(self, spans: int, timeout_s: float, settle_s: float = 2.0) -> dict:
        """Counts once `spans` arrived, or when the count stopped moving for 5 s."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        stalled_since, last_count = time.monotonic(), -1
        while time.monotonic() < deadline:
            self.last = json.loads(self.proc.stdout.readline())
            if self.last["spans"] >= spans:
                break
            if self.last["spans"] != last_count:
                stalled_since, last_count = time.monotonic(), self.last["spans"]
            elif time.monotonic() - stalled_since > 5:
                break
        # Two more seconds of reports, so that the metrics the connector flushes (every 1 s)
        # after the last spans are counted.
        settle_until = time.monotonic() + settle_s
        while time.monotonic() < settle_until:
            self.last = json.loads(self.proc.stdout.readline())
        return self.last

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def round_line(index: int, r: RoundResult) -> str:
    return (
        f"round {index} {r.pipeline:11s}: {r.e2e_spans_per_s:9,.0f} spans/s end to end "
        f"(sent {r.spans_sent:,}, received {r.spans_received:,}, annotated {r.annotated:,}, "
        f"metric points {r.metric_points:,}, failed requests {r.failed_requests}); "
        f"{r.cpu_s_per_million:.1f} CPU s per million spans; peak RSS {r.peak_rss_mib:.0f} MiB"
    )


def write_processor_only_config(directory: Path) -> Path:
    """otelcol.yaml without the connector and its metrics pipeline: splits the cost of the
    processor (join, annotation) from the connector's (metrics)."""
    config = yaml.safe_load(OTELCOL_YAML.read_text())
    # The forward connector stays: it feeds traces/backend (traceshape, then the backend).
    del config["connectors"]["barrierskew"]
    pipelines = config["service"]["pipelines"]
    del pipelines["metrics"]
    pipelines["traces"]["exporters"] = [
        e for e in pipelines["traces"]["exporters"] if e != "barrierskew"
    ]
    del config["exporters"]["otlp_grpc/pacer"]
    path = directory / "processor-only.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM from /proc), in MiB; NaN when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_round(
    otelcol: Path, loadgen: Path, config: Path, pipeline: str, args: argparse.Namespace,
    workdir: Path,
) -> RoundResult:  # fmt: skip
    sink = Sink(loadgen)
    try:
        collector = CollectorProcess(
            otelcol,
            [config],
            workdir,
            name=f"otelcol-{pipeline}",
            env={
                "SKEWTRACE_TRACES_BACKEND_ENDPOINT": sink.address,
                "SKEWTRACE_PACER_OTLP_ENDPOINT": sink.address,
                "SKEWTRACE_LOG_LEVEL": "warn",
                # Every step completes; the timeout only matters for lost ranks.
                "SKEWTRACE_MAX_PENDING": str(max(4096, 4 * args.collectives)),
            },
        )
        with collector:
            cpu_before = _cpu_seconds(collector.pid)
            sent = run_loadgen_send(
                loadgen, collector.otlp_grpc_endpoint,
                "-ranks", str(args.ranks), "-steps", str(args.steps),
                "-collectives", str(args.collectives), "-pregenerate",
                "-workers", str(args.workers), "-ranks-per-request", str(args.ranks_per_request),
                "-job", f"bench-{pipeline}-{time.monotonic_ns()}",
                timeout_s=600,
            )  # fmt: skip
            counts = sink.wait_for(sent["spans"], timeout_s=120, settle_s=args.settle_s)
            cpu = _cpu_seconds(collector.pid) - cpu_before
            rss = peak_rss_mib(collector.pid)
    finally:
        sink.close()
    received = counts["spans"]
    return RoundResult(
        pipeline=pipeline,
        spans_sent=sent["spans"],
        spans_received=received,
        annotated=counts["annotated_spans"],
        metric_points=counts["metric_data_points"],
        # From the first request sent to the last span out of the collector.
        e2e_spans_per_s=received
        / max((counts["last_span_unix_nano"] - sent["started_unix_nano"]) / 1e9, 1e-9),
        send_spans_per_s=sent["spans_per_second"],
        cpu_s_per_million=cpu / max(received, 1) * 1e6,
        peak_rss_mib=rss,
        failed_requests=sent["failed_requests"],
    )


def _telemetry(collector: CollectorProcess) -> dict[str, float]:
    """The collector's own metrics, unlabeled series only (heap, RSS, barrierskew gauges)."""
    out = {}
    for line in scrape(collector.telemetry_url).splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()[:2]
            out[name] = float(value)
    return out


def _settled_heap(collector: CollectorProcess, seconds: float = 3.0) -> float:
    """The lowest heap seen over a few seconds: garbage from the last export is collected."""
    low = float("inf")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        low = min(low, _telemetry(collector)["otelcol_process_runtime_heap_alloc_bytes"])
        time.sleep(0.25)
    return low


def measure_held_memory(
    otelcol: Path, loadgen: Path, args: argparse.Namespace, workdir: Path
) -> dict[str, float]:
    """Memory per span and per pending collective while barrierskew holds them.

    One rank of the job never sends, so no collective completes and the processor keeps every
    collective span until wait_timeout (set far beyond the measurement).
    """
    sink = Sink(loadgen)
    try:
        collector = CollectorProcess(
            otelcol,
            [OTELCOL_YAML],
            workdir,
            name="otelcol-held",
            env={
                "SKEWTRACE_TRACES_BACKEND_ENDPOINT": sink.address,
                "SKEWTRACE_PACER_OTLP_ENDPOINT": sink.address,
                "SKEWTRACE_LOG_LEVEL": "warn",
                "SKEWTRACE_WAIT_TIMEOUT": "10m",
                "SKEWTRACE_MAX_WAIT": "10m",
            },
        )
        with collector:
            heap_before = _settled_heap(collector, args.settle_s * 1.5)
            rss_before = _telemetry(collector)["otelcol_process_memory_rss"]
            run_loadgen_send(
                loadgen, collector.otlp_grpc_endpoint,
                "-ranks", str(args.ranks), "-steps", str(args.held_steps),
                "-collectives", str(args.collectives), "-missing-rank", str(args.ranks - 1),
                "-job", "bench-held", timeout_s=600,
            )  # fmt: skip
            time.sleep(args.settle_s)
            tel = _telemetry(collector)
            held = tel["otelcol_processor_barrierskew_buffered_spans"]
            pending = tel["otelcol_processor_barrierskew_pending_collectives"]
            heap_after = _settled_heap(collector, args.settle_s * 1.5)
            rss_after = _telemetry(collector)["otelcol_process_memory_rss"]
    finally:
        sink.close()
    return {
        "held_spans": held,
        "pending": pending,
        "heap_per_span": (heap_after - heap_before) / max(held, 1),
        "rss_per_span": (rss_after - rss_before) / max(held, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--collectives", type=int, default=8, help="all-reduces per step")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each pipeline")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ranks-per-request", type=int, default=16)
    parser.add_argument(
        "--held-steps", type=int, default=20,
        help="steps sent with one rank missing, for the memory held per pending collective",
    )  # fmt: skip
    parser.add_argument(
        "--otelcol",
        type=Path,
        default=Path(os.environ.get("SKEWTRACE_OTELCOL", REPO_ROOT / "build/otelcol-skewtrace")),
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    # Seconds to wait for what follows the last span: the connector's metrics (flushed every
    # second), the held spans' heap settling.
    args.settle_s = 2.0
    if args.smoke:  # 64 ranks, 4 steps, each pipeline once; no throughput target judged
        args.ranks, args.steps, args.rounds, args.held_steps, args.settle_s = 64, 4, 1, 4, 0.5
    # SIGTERM unwinds like an exception, so the collectors and sinks started below are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.otelcol.is_file():
        parser.error(f"{args.otelcol} is not built (run `make collector`)")
    loadgen = build_loadgen()
    spans_per_step = args.ranks * (5 + args.collectives) + 1
    target_rate = float(spans_per_step)  # one step per second of a job this size

    results: list[RoundResult] = []
    with tempfile.TemporaryDirectory(prefix="skewtrace-e2e-") as tmp:
        for round_index in range(args.rounds):
            processor_only = write_processor_only_config(Path(tmp))
            for pipeline, config in (
                ("passthrough", PASSTHROUGH_YAML),
                ("processor", processor_only),
                ("barrierskew", OTELCOL_YAML),
            ):
                r = run_round(args.otelcol, loadgen, config, pipeline, args, Path(tmp))
                results.append(r)
                print(round_line(round_index + 1, r), flush=True)
        held = measure_held_memory(args.otelcol, loadgen, args, Path(tmp))

    def median(pipeline: str, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in results if r.pipeline == pipeline)

    measured = median("barrierskew", "e2e_spans_per_s")
    baseline = median("passthrough", "e2e_spans_per_s")
    ratio = measured / baseline if baseline else float("nan")
    cpu_ratio = median("barrierskew", "cpu_s_per_million") / median(
        "passthrough", "cpu_s_per_million"
    )
    lost = [r for r in results if r.spans_received != r.spans_sent or r.failed_requests]
    unannotated = [r for r in results if r.pipeline == "barrierskew" and r.annotated == 0]
    print()
    print(f"job: {args.ranks} ranks x {args.steps} steps, {spans_per_step:,} spans per step")
    throughput_ok = measured >= target_rate
    print(
        f"barrierskew end to end: {measured:,.0f} spans/s   target >= {target_rate:,.0f} "
        f"(one {args.ranks}-rank step per second)   {verdict(throughput_ok, args.smoke)}"
    )
    print(f"pass-through baseline:  {baseline:,.0f} spans/s")
    print(
        f"processor only:         {median('processor', 'e2e_spans_per_s'):,.0f} spans/s, "
        f"{median('processor', 'cpu_s_per_million'):.1f} CPU s per million spans "
        "(barrierskew without the connector)"
    )
    ratio_ok = ratio >= MIN_RATIO_TO_BASELINE
    print(
        f"ratio to baseline:      {ratio:.2f}   target >= {MIN_RATIO_TO_BASELINE}   "
        f"{verdict(ratio_ok, args.smoke)}"
    )
    print(
        f"CPU per span:           {median('barrierskew', 'cpu_s_per_million'):.1f} vs "
        f"{median('passthrough', 'cpu_s_per_million'):.1f} CPU s per million spans "
        f"(x{cpu_ratio:.2f} the baseline)"
    )
    print(
        f"peak RSS:               {median('barrierskew', 'peak_rss_mib'):.0f} MiB vs "
        f"{median('passthrough', 'peak_rss_mib'):.0f} MiB"
    )
    per_collective = held["heap_per_span"] * (args.ranks - 1)
    print(
        f"held by barrierskew:    {held['held_spans']:,.0f} spans in {held['pending']:,.0f} "
        f"pending collectives: {held['heap_per_span']:,.0f} B heap per span "
        f"({held['rss_per_span']:,.0f} B RSS), {per_collective / 2**20:.2f} MiB per pending "
        f"{args.ranks}-rank collective"
    )
    # Spans lost and a processor that did not run are failures at any size; the throughput
    # targets are judged only in a full run.
    correct = not lost and not unannotated
    ok = correct and (args.smoke or (throughput_ok and ratio_ok))
    if lost:
        print(
            "LOST SPANS or failed requests in:",
            [(r.pipeline, r.spans_sent, r.spans_received, r.failed_requests) for r in lost],
        )
    if unannotated:
        print("barrierskew rounds with no annotated span: the processor did not run")
    if not ok:
        print("FAIL: a target was missed" if correct else "FAIL: spans lost or not annotated")
    else:
        print(SMOKE_DONE if args.smoke else "PASS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
