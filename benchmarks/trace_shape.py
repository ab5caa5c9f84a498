"""What a trace backend stores of a large job, with the traceshape processor and without.

    python benchmarks/trace_shape.py [--ranks 1024 4096] [--steps 4] [--collectives 28] [--tp 8]

For each world size, tools/loadgen sends the same synthetic job (steps of ~34 spans per rank:
step, four phases, tensor-parallel all_gather, gradient all-reduces; one compute straggler)
to the built otelcol-skewtrace (collector-config/otelcol.yaml) twice in the same run:

- baseline: traceshape never splits (SKEWTRACE_MAX_TRACE_SPANS=1000000000): one trace per
  step, every span stored, as before the processor existed;
- shaped: the shipped defaults (max_trace_spans 6000, sample_ranks 32).

A real OTLP/gRPC sink stands in for the backend and measures what it received in protobuf
bytes. Printed beside each target: the largest stored trace (Grafana Tempo's default
max_bytes_per_trace, 5 MB), the bytes stored per step (a Tempo distributor ingests about
15 MB/s: one step per second must fit), the stored share of the baseline, and the
processor's accounting (kept + dropped = spans in + summaries). Exit status 1 when the shaped
run misses a target (the last line says FAIL). Results: docs/performance.md, "Trace shape".
``--smoke``: 256 ranks, one step (tests/test_benchmark_smoke.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _smoke import SMOKE_HELP
from collector_harness import (
    OTELCOL_YAML,
    REPO_ROOT,
    CollectorProcess,
    build_loadgen,
    parse_prometheus,
    run_loadgen_send,
    scrape,
    sum_samples,
)
from otlp_sink import OtlpSink, trace_bytes

TEMPO_MAX_BYTES_PER_TRACE = 5_000_000
DISTRIBUTOR_BYTES_PER_S = 15_000_000


@dataclass
class Run:
    spans_sent: int
    spans_stored: int
    kept: float
    dropped: float
    traces: int
    largest_trace: int
    bytes_per_step: float


def run(otelcol: Path, loadgen: Path, ranks: int, args: argparse.Namespace, shaped: bool) -> Run:
    env = {} if shaped else {"SKEWTRACE_MAX_TRACE_SPANS": "1000000000"}
    with tempfile.TemporaryDirectory() as tmp, OtlpSink(detail=False) as backend:
        env["SKEWTRACE_TRACES_BACKEND_ENDPOINT"] = backend.endpoint.removeprefix("http://")
        with CollectorProcess(otelcol, [OTELCOL_YAML], Path(tmp), env=env) as collector:
            sent = run_loadgen_send(
                loadgen, collector.otlp_grpc_endpoint,
                "-job", f"shape-{ranks}", "-ranks", str(ranks), "-steps", str(args.steps),
                "-collectives", str(args.collectives), "-tp", str(args.tp),
                "-straggler", f"{ranks // 3}:compute:40ms", "-rate", str(args.rate),
            )  # fmt: skip
            expected = sent["spans"] + args.steps  # and one summary per step
            deadline = time.monotonic() + 300
            while True:
                telemetry = parse_prometheus(scrape(collector.telemetry_url))
                kept = sum_samples(telemetry, "otelcol_processor_traceshape_spans_kept_total")
                dropped = sum_samples(telemetry, "otelcol_processor_traceshape_spans_dropped_total")
                if (kept + dropped >= expected and len(backend.spans()) >= kept) or (
                    time.monotonic() > deadline
                ):
                    break
                time.sleep(0.5)
        stored = backend.spans()
    sizes = trace_bytes(stored)
    return Run(
        spans_sent=sent["spans"],
        spans_stored=len(stored),
        kept=kept,
        dropped=dropped,
        traces=len(sizes),
        largest_trace=max(sizes.values(), default=0),
        bytes_per_step=sum(sizes.values()) / args.steps,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--collectives", type=int, default=28)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--rate", type=float, default=250_000, help="spans/s loadgen sends at")
    parser.add_argument("--otelcol", type=Path, default=REPO_ROOT / "build" / "otelcol-skewtrace")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        # 256 ranks still split a step (34 spans a rank, past max_trace_spans 6000). Every
        # target here is judged: none depends on the machine.
        args.ranks, args.steps = [256], 1
    loadgen = build_loadgen()
    ok = True
    for ranks in args.ranks:
        base = run(args.otelcol, loadgen, ranks, args, shaped=False)
        shaped = run(args.otelcol, loadgen, ranks, args, shaped=True)
        accounted = shaped.kept + shaped.dropped == shaped.spans_sent + args.steps
        fits = shaped.largest_trace < TEMPO_MAX_BYTES_PER_TRACE
        rate_ok = shaped.bytes_per_step < DISTRIBUTOR_BYTES_PER_S
        ok = ok and accounted and fits and rate_ok and shaped.spans_stored == shaped.kept
        print(f"\n{ranks} ranks, {args.steps} steps, {base.spans_sent // args.steps} spans a step")
        print(f"  {'':28s} {'baseline (one trace/step)':>26s} {'shaped':>14s}   target")
        print(f"  {'largest stored trace':28s} {base.largest_trace / 1e6:23.2f} MB "
              f"{shaped.largest_trace / 1e6:11.3f} MB   < 5 MB (Tempo max_bytes_per_trace)"
              f"  {'ok' if fits else 'MISSED'}")  # fmt: skip
        print(f"  {'stored per step':28s} {base.bytes_per_step / 1e6:23.2f} MB "
              f"{shaped.bytes_per_step / 1e6:11.3f} MB   < 15 MB at 1 step/s (distributor)"
              f"  {'ok' if rate_ok else 'MISSED'}")  # fmt: skip
        share = shaped.spans_stored / max(1, base.spans_stored)
        print(f"  {'spans stored':28s} {base.spans_stored:26d} {shaped.spans_stored:14d}"
              f"   ({share:.2%} of the baseline)")  # fmt: skip
        print(f"  {'traces stored':28s} {base.traces:26d} {shaped.traces:14d}")
        total = shaped.spans_sent + args.steps
        print(f"  {'kept + dropped = in':28s} {'':26s} {int(shaped.kept)} + "
              f"{int(shaped.dropped)} = {total}  {'ok' if accounted else 'MISSED'}")  # fmt: skip
    print("PASS" if ok else "FAIL: a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
