"""CPU cost of node telemetry: one sampling pass, as a share of one core at the interval.

One pass is what the SDK's reader does every ``SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS``:
run every observable callback (each source read once: ``/sys/class/net``, RDMA ports,
``/proc/net/snmp``, the rtnetlink qdisc dump, ``/proc/diskstats``, ``/proc/self/io`` and the
workers') and aggregate the points. It is measured here through an ``InMemoryMetricReader``
``collect``, so the SDK's own work is in the figure; the OTLP encoding and send of the
periodic exporter are not (they run on the same reader thread, once per interval, and are
measured by the SDK's own benchmarks). Three configurations, interleaved in rounds so drift
in the shared machine hits them alike:

- ``baseline``: a MeterProvider and reader with one constant observable, no sources;
- ``other rank``: the rank's own sources (process I/O, data-loader counters);
- ``local rank 0``: those plus the node's (interfaces, RDMA, TCP, qdiscs, disks).

Local rank 0 also samples the qdisc backlog ten times an interval on a thread of its own
(``BacklogAverager``): one such sample (a netlink dump) is timed on the calling thread too,
and ``local rank 0, total`` adds ten of them to its pass.

CPU is the calling thread's (``time.thread_time_ns``): ``collect`` runs the callbacks on it.
Printed per configuration: CPU per pass (median of rounds), that as a share of one core at a
1 s interval beside the target (< 1 %), and the same net of the baseline. The GPU (NVML) is
not measured on a machine without one.

    python benchmarks/node_telemetry_overhead.py --passes 200 --rounds 5
    python benchmarks/node_telemetry_overhead.py --smoke   # one pass: it runs, nothing judged
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from _smoke import SMOKE_HELP, verdict
from skewtrace import semconv
from skewtrace.rank.telemetry import FetchCountingRecorder, NodeTelemetry
from skewtrace.rank.telemetry.qdisc import SUBSAMPLES, BacklogAverager, QdiscReader

TARGET_SHARE = 0.01
"""At most 1 % of one core at the default 1 s interval."""

INTERVAL_S = 1.0


def _baseline() -> tuple[InMemoryMetricReader, Callable[[], None]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    def constant(_options: CallbackOptions) -> list[Observation]:
        return [Observation(1)]

    provider.get_meter("baseline").create_observable_counter("baseline", [constant])
    return reader, lambda: provider.shutdown()


def _telemetry(local_rank: int) -> tuple[InMemoryMetricReader, Callable[[], None]]:
    reader = InMemoryMetricReader()
    telemetry = NodeTelemetry(
        interval_s=INTERVAL_S,
        reader=reader,
        fetches=FetchCountingRecorder(16),
        nvml_loader=lambda: None,
    )
    telemetry.start(Resource.create({semconv.LOCAL_RANK: local_rank, semconv.RANK: local_rank}))
    if telemetry.failures:
        print(f"  (sources failing on this machine: {telemetry.failures})")
    return reader, lambda: telemetry.shutdown(1000)


def _cpu_per_pass_ns(reader: InMemoryMetricReader, passes: int) -> float:
    start = time.thread_time_ns()
    for _ in range(passes):
        reader.get_metrics_data()
    return (time.thread_time_ns() - start) / passes


def _cpu_per_backlog_sample_ns(averager: BacklogAverager, samples: int) -> float:
    start = time.thread_time_ns()
    for _ in range(samples):
        averager.sample()
    return (time.thread_time_ns() - start) / samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=200, help="passes per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP}: one pass, one round")
    args = parser.parse_args()
    if args.smoke:
        args.passes, args.rounds = 1, 1

    configurations = {
        "baseline": _baseline(),
        "other rank": _telemetry(local_rank=1),
        "local rank 0": _telemetry(local_rank=0),
    }
    qdiscs = QdiscReader()
    averager = BacklogAverager(qdiscs.read, INTERVAL_S / SUBSAMPLES)  # its thread not started
    for reader, _ in configurations.values():
        _cpu_per_pass_ns(reader, 5)  # warm-up: first reads, socket, caches
    _cpu_per_backlog_sample_ns(averager, 5)
    rounds: dict[str, list[float]] = {name: [] for name in configurations}
    backlog_rounds: list[float] = []
    for _ in range(args.rounds):
        for name, (reader, _) in configurations.items():
            rounds[name].append(_cpu_per_pass_ns(reader, args.passes))
        backlog_rounds.append(_cpu_per_backlog_sample_ns(averager, args.passes))
    for _, close in configurations.values():
        close()
    qdiscs.close()
    backlog_ns = statistics.median(backlog_rounds)
    rounds["backlog, 1 of 10"] = backlog_rounds
    rounds["local rank 0, total"] = [ns + SUBSAMPLES * backlog_ns for ns in rounds["local rank 0"]]

    baseline_ns = statistics.median(rounds["baseline"])
    print(
        f"node telemetry, one sampling pass (SDK collect included), "
        f"median of {args.rounds} rounds x {args.passes} passes; "
        f"share of one core at a {INTERVAL_S:g} s interval, target < {TARGET_SHARE:.0%}"
    )
    print(f"{'':20} {'cpu/pass':>10} {'share':>8} {'net of baseline':>16}  target")
    for name, samples in rounds.items():
        cpu_ns = statistics.median(samples)
        share = cpu_ns / 1e9 / INTERVAL_S
        net = (cpu_ns - baseline_ns) / 1e9 / INTERVAL_S
        word = verdict(share < TARGET_SHARE, args.smoke, "ok", "OVER")
        print(
            f"{name:20} {cpu_ns / 1e3:8.0f}us {share:8.3%} {net:16.3%}  < {TARGET_SHARE:.0%} {word}"
        )


if __name__ == "__main__":
    main()
