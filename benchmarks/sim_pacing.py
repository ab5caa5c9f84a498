"""Pacing off vs on against the simulated job at 4 to 64 nodes, with the real pipeline.

``loadgen simulate`` (tools/loadgen/fabric.go, sim.go; the model is in docs/simulator.md)
plays nodes x 8 ranks on a leaf/spine fabric in real time and sends the instrumentation's
spans to the built ``otelcol-skewtrace`` (``collector-config/otelcol.yaml``), whose
``barrierskew`` connector pushes metrics to a real ``skewtrace pacer``; in "paced" runs every
simulated rank polls that pacer once a second and applies its delay before forward. The
collector's trace backend is ``loadgen sink``.

Both modes of one node count play the same seed, so they see the same node speeds, jitter
and stalls: the difference is the pacer's delays alone. Modes alternate (baseline first at
4, 16, 64 nodes, paced first at 8, 32) so that drift in the shared machine's load, which
only changes when a step's spans leave and which delays the ranks hold, hits both alike.

Printed per node count: iteration-time CV, mean iteration time and throughput (samples/s
of model time) for baseline and paced, the share of the run the pacer's decision was
active, the delays applied, and the paper's figures beside them: CV 0.22 -> 0.09 and
throughput up to +11% at 64 nodes, -0.6%..+0.8% at 4-8 nodes.

    python benchmarks/sim_pacing.py            # 4, 8, 16, 32, 64 nodes, ~8 min
    python benchmarks/sim_pacing.py --quick    # 4, 16, 64 nodes, shorter runs, ~3 min
    python benchmarks/sim_pacing.py --interleave-offline [--quick]   # seconds, no pipeline
    python benchmarks/sim_pacing.py --smoke [--interleave-offline]   # 4 nodes, a few steps

``--interleave-offline`` runs the model alone (``loadgen simulate -offline``) at each node
count and scenario (:data:`SCENARIOS`: phases that collide on the spine, and jitter, a slow
NIC, a healthy job where they do not): once without offsets, then with the offsets the
interleave policy (``skewtrace.controller.policies.interleave``, without its effect guard)
places from the first run's group phases (``group_phases`` in the summary: the phases, the
hosts and switches of each data-parallel group), applied by every member rank before forward
(``-group-offset``). It prints the change in throughput beside the targets: at least +15%
where phases collide, never worse than -1% elsewhere. Pacing needs the closed loop (the
default mode) and is not in this table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from _smoke import NOT_JUDGED, SMOKE_HELP  # noqa: E402
from collector_harness import OTELCOL_YAML, CollectorProcess, build_loadgen  # noqa: E402
from pacing import DecisionWatcher, Stack, free_port, get_json, start_pacer, wait_http  # noqa: E402

PAPER_CV = (0.22, 0.09)  # 64 nodes, baseline -> paced
PAPER_THROUGHPUT_64 = 0.11  # "up to +11%"
PAPER_THROUGHPUT_SMALL = (-0.006, 0.008)  # 4-8 nodes


@dataclass
class SimStack:
    """Collector, pacer and loadgen sink, on free 127.0.0.1 ports."""

    collector: CollectorProcess
    pacer: subprocess.Popen[Any]
    sink: subprocess.Popen[str]
    pacer_http: str

    @property
    def pacer_url(self) -> str:
        return f"http://{self.pacer_http}"

    def decision(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = get_json(f"{self.pacer_url}/v1/pacing?job={job_id}")
        return answer

    def watcher(self, job_id: str) -> DecisionWatcher:
        # DecisionWatcher only calls .decision(job_id) on the stack it is given.
        return DecisionWatcher(cast(Stack, self), job_id, interval_s=0.5)


@contextmanager
def sim_stack(otelcol: Path, loadgen: Path, workdir: Path) -> Iterator[SimStack]:
    workdir.mkdir(parents=True, exist_ok=True)
    sink = subprocess.Popen(
        [str(loadgen), "sink", "-listen", "127.0.0.1:0", "-report-interval", "60s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    pacer: subprocess.Popen[Any] | None = None
    collector: CollectorProcess | None = None
    try:
        assert sink.stdout is not None
        sink_addr = json.loads(sink.stdout.readline())["listen"]
        pacer_http, pacer_otlp = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        pacer = start_pacer(workdir, pacer_http, pacer_otlp)
        collector = CollectorProcess(
            otelcol,
            [OTELCOL_YAML],
            workdir,
            env={
                "SKEWTRACE_TRACES_BACKEND_ENDPOINT": sink_addr,
                "SKEWTRACE_PACER_OTLP_ENDPOINT": pacer_otlp,
                "SKEWTRACE_METRICS_FLUSH_INTERVAL": "1s",
            },
        ).start(timeout_s=60)
        wait_http(f"http://{pacer_http}/healthz", 60, pacer)
        yield SimStack(collector, pacer, sink, pacer_http)
    finally:
        if collector is not None:
            collector.stop()
        for proc in (pacer, sink):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@dataclass
class Run:
    nodes: int
    mode: str  # baseline | paced
    summary: dict[str, Any]
    active_share: float
    flips: int
    wall_s: float

    @property
    def cv(self) -> float:
        return float(self.summary["iteration_cv"])

    @property
    def throughput(self) -> float:
        return float(self.summary["throughput_samples_per_s"])


def run_sim(stack: SimStack, loadgen: Path, nodes: int, mode: str, args: argparse.Namespace) -> Run:
    job_id = f"sim-{nodes}n-{mode}-{uuid.uuid4().hex[:6]}"
    command = [
        str(loadgen),
        "simulate",
        "-endpoint",
        stack.collector.otlp_grpc_endpoint,
        "-job",
        job_id,
        "-nodes",
        str(nodes),
        "-steps",
        str(args.steps),
        "-measure-from",
        str(args.measure_from),
        "-seed",
        str(args.seed),
        *args.sim_args,
    ]
    if mode == "paced":
        command += ["-pacer-url", stack.pacer_url]
    started = time.monotonic()
    with stack.watcher(job_id) as watcher:
        result = subprocess.run(command, capture_output=True, text=True, timeout=args.run_timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return Run(
        nodes=nodes,
        mode=mode,
        summary=json.loads(result.stdout.strip().splitlines()[-1]),
        active_share=watcher.active_fraction(),
        flips=watcher.flips(),
        wall_s=time.monotonic() - started,
    )


def describe(run: Run) -> str:
    s = run.summary
    return (
        f"{run.nodes:>3} nodes {run.mode:<8}: CV {run.cv:.3f}, mean iteration "
        f"{s['iteration_mean_s'] * 1e3:.0f} ms, {run.throughput:,.0f} samples/s, pacer active "
        f"{run.active_share * 100:.0f}% ({run.flips} flips), delays applied "
        f"{s['delays_applied']} ({s['delay_total_s']:.2f} s, on {s['paced_step_share'] * 100:.0f}% "
        f"of steps), polls {s['polls_ok']} ok / {s['polls_failed']} failed, lag "
        f"{s['max_lag_s'] * 1e3:.0f} ms ({run.wall_s:.0f} s)"
    )


def paper_throughput(nodes: int) -> str:
    if nodes <= 8:
        low, high = PAPER_THROUGHPUT_SMALL
        return f"{low * 100:+.1f}%..{high * 100:+.1f}%"
    if nodes == 64:
        return f"up to {PAPER_THROUGHPUT_64 * 100:+.0f}%"
    return "-"


def delay_by_speed(summary: dict[str, Any]) -> tuple[float, float]:
    """Mean delay per rank and step on the fastest and on the slowest eighth of the nodes
    (by their drawn speed): where the pacer's delays went."""
    speeds, delays = summary.get("node_speed") or [], summary.get("node_delay_mean_s") or []
    if not speeds or len(delays) != len(speeds):
        return math.nan, math.nan
    order = sorted(range(len(speeds)), key=lambda n: speeds[n])
    share = max(1, len(order) // 8)
    fastest, slowest = order[:share], order[-share:]
    return (
        sum(delays[n] for n in fastest) / share,
        sum(delays[n] for n in slowest) / share,
    )


def report(runs: Sequence[Run]) -> str:
    by_nodes: dict[int, dict[str, Run]] = {}
    for run in runs:
        by_nodes.setdefault(run.nodes, {})[run.mode] = run
    lines = [
        f"{'nodes':>5} {'ranks':>5} | {'CV base':>7} {'CV paced':>8} {'paper CV':>11} | "
        f"{'samples/s base':>14} {'paced':>9} {'change':>7} {'paper':>13} | "
        f"{'active':>6} {'delay/step':>10} {'fast/slow nodes':>15} {'polls failed':>12} "
        f"{'lag':>6}"
    ]
    for nodes in sorted(by_nodes):
        base, paced = by_nodes[nodes].get("baseline"), by_nodes[nodes].get("paced")
        if base is None or paced is None:
            continue
        change = paced.throughput / base.throughput - 1
        paper_cv = f"{PAPER_CV[0]} -> {PAPER_CV[1]}" if nodes == 64 else "-"
        measured_steps = max(
            1, int(paced.summary["steps"]) - int(paced.summary["measured_from_step"])
        )
        delay_per_step = float(paced.summary["delay_total_s"]) / measured_steps
        polls = int(paced.summary["polls_ok"]) + int(paced.summary["polls_failed"])
        failed = int(paced.summary["polls_failed"]) / polls if polls else 0.0
        on_fast, on_slow = delay_by_speed(paced.summary)
        lines.append(
            f"{nodes:>5} {int(base.summary['ranks']):>5} | {base.cv:>7.3f} {paced.cv:>8.3f} "
            f"{paper_cv:>11} | {base.throughput:>14,.0f} {paced.throughput:>9,.0f} "
            f"{change * 100:>+6.2f}% {paper_throughput(nodes):>13} | "
            f"{paced.active_share * 100:>5.0f}% {delay_per_step * 1e3:>8.1f}ms "
            f"{on_fast * 1e3:>6.1f}/{on_slow * 1e3:<4.1f}ms "
            f"{failed * 100:>11.0f}% {float(paced.summary['max_lag_s']):>5.1f}s"
        )
    lines.append(
        "(paced run: active = share of the pacer's decisions that were active; delay/step = "
        "pacing delay summed over all ranks per measured step; fast/slow nodes = mean delay "
        "per rank and step on the fastest and the slowest eighth of the nodes; polls failed = "
        "the ranks' polls that got no answer, so those ranks held no delay; lag = how far "
        "sending fell behind "
        "the model's clock, so delays were read late)"
    )
    return "\n".join(lines)


TARGET_COLLISION = 0.15
TARGET_ELSEWHERE = -0.01

# Scenario -> `loadgen simulate` flags ({npl}: nodes per leaf, so that both sets of the
# collision scenario span the same leaves).
SCENARIOS: dict[str, list[str]] = {
    "collision": [
        "-dp-sets=2",
        "-spine-capacity=8",
        "-gather=100ms",
        "-buckets=1",
        "-transfer=100ms",
        "-forward=50ms",
        "-backward=100ms",
        "-nodes-per-leaf={npl}",
    ],
    "jitter": ["-jitter=0.1"],
    "slow_nic": ["-slow-nic=5:0.5"],
    "healthy": [],
}


def run_offline(loadgen: Path, nodes: int, flags: Sequence[str], args: argparse.Namespace) -> dict:
    command = [
        str(loadgen),
        "simulate",
        "-offline",
        "-nodes",
        str(nodes),
        "-steps",
        str(args.steps),
        "-measure-from",
        str(args.measure_from),
        "-seed",
        str(args.seed),
        *flags,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=args.run_timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary


def interleave_offsets(summary: dict[str, Any]) -> dict[str, float]:
    """The interleave policy's offsets for the groups of one simulated run."""
    from skewtrace.controller.policies.interleave import InterleaveParams, InterleavePolicy
    from skewtrace.controller.window import GroupPhases, JobWindow

    groups = tuple(
        GroupPhases(
            g["pg"],
            tuple((float(start), float(duration)) for start, duration in g["phases"]),
            tuple(g["switches"]),
            tuple(g["hosts"]),
        )
        for g in summary.get("group_phases") or []
    )
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    outcome = policy.decide(JobWindow(now=0.0, ranks={}, groups=groups), policy.initial_state())
    return dict(outcome.info.get("offsets") or {})


def interleave_offline(args: argparse.Namespace) -> int:
    loadgen = build_loadgen()
    node_counts = [int(n) for n in args.nodes.split(",")]
    print(
        f"interleave, offline model, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{args.steps} steps per run (figures from step {args.measure_from}), seed {args.seed}"
    )
    print(
        f"{'scenario':<10} {'nodes':>5} | {'samples/s off':>13} {'interleave':>10} "
        f"{'change':>7} {'target':>7} | {'stretch off':>11} {'with':>5} | offsets"
    )
    worst: dict[str, float] = {}
    for scenario, template in SCENARIOS.items():
        for nodes in node_counts:
            flags = [f.format(npl=max(2, nodes // 4)) for f in template] + list(args.sim_args)
            off = run_offline(loadgen, nodes, flags, args)
            offsets = interleave_offsets(off)
            on = off
            if offsets:
                text = ",".join(f"{pg}:{seconds}" for pg, seconds in offsets.items())
                on = run_offline(loadgen, nodes, [*flags, f"-group-offset={text}"], args)
            change = on["throughput_samples_per_s"] / off["throughput_samples_per_s"] - 1
            target = TARGET_COLLISION if scenario == "collision" else TARGET_ELSEWHERE
            worst[scenario] = min(worst.get(scenario, change), change)
            shown = sorted({round(v, 3) for v in offsets.values()})
            print(
                f"{scenario:<10} {nodes:>5} | {off['throughput_samples_per_s']:>13,.0f} "
                f"{on['throughput_samples_per_s']:>10,.0f} {change * 100:>+6.2f}% "
                f"{target * 100:>+6.0f}% | {off['transfer_stretch']:>11.2f} "
                f"{on['transfer_stretch']:>5.2f} | {len(offsets)} groups at {shown} s"
            )
    print(
        "(target: at least the figure where phases collide, never below it elsewhere; "
        "offsets: groups given one, and the offsets)"
    )
    for scenario, change in worst.items():
        target = TARGET_COLLISION if scenario == "collision" else TARGET_ELSEWHERE
        if args.smoke:
            print(
                f"{scenario}: worst change {change * 100:+.2f}%, target {target * 100:+.0f}%: "
                f"{NOT_JUDGED}"
            )
            continue
        word = "meets" if change >= target else "misses"
        print(f"{scenario}: worst change {change * 100:+.2f}%, {word} {target * 100:+.0f}%")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", default="4,8,16,32,64", help="node counts (8 GPUs each)")
    parser.add_argument("--steps", type=int, default=90, help="steps per run (default 90)")
    parser.add_argument(
        "--measure-from",
        type=int,
        default=30,
        help="first step in the figures; covers the pacer's activation (default 30)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--quick", action="store_true", help="4, 16 and 64 nodes, 60 steps from step 25"
    )
    parser.add_argument(
        "--sim-arg",
        dest="sim_args",
        action="append",
        default=[],
        help="extra `loadgen simulate` flag, e.g. --sim-arg=-parked-penalty=0 (repeatable)",
    )
    parser.add_argument(
        "--interleave-offline",
        action="store_true",
        help="the interleave policy's offsets against the model alone, per scenario",
    )
    parser.add_argument("--run-timeout-s", type=float, default=300)
    parser.add_argument("--json", type=Path, help="also write every run's summary here")
    parser.add_argument(
        "--otelcol",
        type=Path,
        default=Path(
            os.environ.get("SKEWTRACE_OTELCOL", REPO_ROOT / "build" / "otelcol-skewtrace")
        ),
    )
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "build" / "bench-sim-pacing")
    parser.add_argument(
        "--smoke", action="store_true", help=f"{SMOKE_HELP}; with --interleave-offline too"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.steps, args.measure_from = "4,16,64", 60, 25
    if args.smoke:  # 4 nodes, a few steps: both modes of one node count
        args.nodes, args.steps, args.measure_from = "4", 5, 1
    if args.interleave_offline:
        if args.smoke:  # every scenario at 4 nodes, long enough for the groups' phases
            args.steps, args.measure_from = 12, 2
        elif not args.quick and args.steps == 90:
            args.steps, args.measure_from = 300, 20
        return interleave_offline(args)
    if not args.otelcol.is_file():
        print(f"{args.otelcol} is not built (bash collector-config/build.sh)", file=sys.stderr)
        return 2
    node_counts = [int(n) for n in args.nodes.split(",")]
    loadgen = build_loadgen()
    runs: list[Run] = []
    started = time.monotonic()
    with sim_stack(args.otelcol, loadgen, args.workdir) as stack:
        for index, nodes in enumerate(node_counts):
            order = ("baseline", "paced") if index % 2 == 0 else ("paced", "baseline")
            for mode in order:
                run = run_sim(stack, loadgen, nodes, mode, args)
                runs.append(run)
                print(describe(run), flush=True)
    print()
    print(
        f"simulated pacing benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"nodes x 8 GPUs, {args.steps} steps per run (figures from step {args.measure_from}), "
        f"seed {args.seed}, extra flags {args.sim_args or 'none'}, "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(report(runs))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "nodes": r.nodes,
                        "mode": r.mode,
                        "active_share": r.active_share,
                        "flips": r.flips,
                        "summary": r.summary,
                    }
                    for r in runs
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
