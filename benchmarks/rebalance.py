"""Rebalancing off vs on: 4 gloo ranks with one persistently slower, the real pipeline.

Every real run is ``examples/train_rebalance.py`` (4 gloo ranks; each rank's device time is
modelled as a sleep proportional to its local batch, so four ranks on two cores behave like
four accelerators) sending spans to the built ``otelcol-skewtrace``, whose connector pushes
metrics to ``skewtrace pacer --policy rebalance``. In one stack, for each slow speed (0.5,
0.75 on rank 0), one after another:

- ``homogeneous``: every rank at full speed, plain DDP (``DistributedSampler``): its
  throughput H gives the ideal of the mixed cluster, the sum of the ranks' individual speeds:
  ``H * sum(speeds) / 4`` (measured right before the two runs it is the ideal of, since the
  shared machine's load drifts);
- ``off``: plain DDP with the slow rank;
- ``on``: ``ShareSampler`` reading the pacer's shares.

Throughput is global samples per second of rank 0's steps (after ``--warmup``); "steady" is
the last ``--steady-fraction`` of the run, after the shares converged. Then, in a second
stack with ``--policy pacing,rebalance``: one slow rank plus arrival jitter on two others,
rebalancing alone vs both policies (whether either undoes the other). Last, "at scale": the
closed-loop model of ``tests/hetero_model.py`` driving the real policy object for 1 of 8 and
8 of 64 ranks at half speed. It is a model, not a measurement (the simulator of the scale
issue does not exist yet).

    python benchmarks/rebalance.py --steps 600
    python benchmarks/rebalance.py --sections model       # the model only (seconds)
    python benchmarks/rebalance.py --smoke                # every section at its smallest:
                                                          # --quick --nprocs 2 --speeds 0.5
                                                          # --steps 12 --warmup 2, the model
                                                          # at 4 and 64 ranks for 30 s

Figures are printed beside their targets: at least 80% of the ideal recovered where plain
DDP gets about half; LB-BSP reports up to 54% faster, Cannikin up to 52% less training time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import pacing as harness  # noqa: E402
from _smoke import SMOKE_DONE, SMOKE_HELP  # noqa: E402

TARGET_OF_IDEAL = 0.80
LB_BSP_SPEEDUP = 0.54  # "up to 54% faster"
CANNIKIN_LESS_TIME = 0.52  # "up to 52% less training time than the best adaptive system"


@dataclass
class RankStats:
    rank: int
    speed: float
    step_s: list[float]
    sizes: list[int]
    global_sizes: list[int]
    shares_version: list[int]
    loss: list[float]


@dataclass
class JobResult:
    name: str
    job_id: str
    ranks: dict[int, RankStats]
    wall_s: float
    decisions: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def throughput(self, start: int, end: int | None = None) -> float:
        """Global samples per second over rank 0's steps [start, end)."""
        rank0 = self.ranks[0]
        seconds = sum(rank0.step_s[start:end])
        return sum(rank0.global_sizes[start:end]) / seconds if seconds > 0 else 0.0

    def final_sizes(self) -> list[int]:
        return [self.ranks[r].sizes[-1] for r in sorted(self.ranks)]

    def change_steps(self) -> list[int]:
        """The steps at which new shares took effect."""
        versions = self.ranks[0].shares_version
        return [i for i in range(1, len(versions)) if versions[i] != versions[i - 1]]


def parse_stats(stdout: str) -> dict[int, RankStats]:
    decoder = json.JSONDecoder()
    found: dict[int, RankStats] = {}
    marker = '{"event": "rebalance_stats"'
    start = stdout.find(marker)
    while start != -1:
        record, _ = decoder.raw_decode(stdout, start)
        found[int(record["rank"])] = RankStats(
            rank=int(record["rank"]),
            speed=float(record["speed"]),
            step_s=record["step_s"],
            sizes=record["sizes"],
            global_sizes=record["global_sizes"],
            shares_version=record["shares_version"],
            loss=record["loss"],
        )
        start = stdout.find(marker, start + 1)
    return found


def launch(
    stack: harness.Stack,
    job_id: str,
    *,
    steps: int,
    slow: Sequence[str] = (),
    jitter: str | None = None,
    rebalance: bool,
    nprocs: int = 4,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "SKEWTRACE_JOB_ID": job_id,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{stack.collector_otlp}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "SKEWTRACE_PACER_POLL_INTERVAL_MILLIS": "500",
    }
    env.pop("SKEWTRACE_PACER_URL", None)
    if rebalance:
        env["SKEWTRACE_PACER_URL"] = stack.pacer_url
    args = [
        sys.executable,
        str(REPO_ROOT / "examples" / "train_rebalance.py"),
        "--nprocs",
        str(nprocs),
        "--steps",
        str(steps),
        "--job-id",
        job_id,
        "--sampler",
        "share" if rebalance else "distributed",
        *extra_args,
    ]
    for spec in slow:
        args += ["--slow", spec]
    if jitter:
        args += ["--jitter", jitter]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT
    )


def run_job(
    stack: harness.Stack,
    name: str,
    *,
    steps: int,
    slow: Sequence[str] = (),
    jitter: str | None = None,
    rebalance: bool,
    nprocs: int = 4,
    timeout_s: float = 900.0,
    extra_args: Sequence[str] = (),
) -> JobResult:
    job_id = f"rb-{name}-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    with harness.DecisionWatcher(stack, job_id, interval_s=0.5) as watcher:
        proc = launch(
            stack,
            job_id,
            steps=steps,
            slow=slow,
            jitter=jitter,
            rebalance=rebalance,
            nprocs=nprocs,
            extra_args=extra_args,
        )
        stdout, stderr = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} ({job_id}) failed:\n{stderr[-3000:]}\n{stack.log_tail()}")
    ranks = parse_stats(stdout)
    if sorted(ranks) != list(range(nprocs)):
        raise RuntimeError(f"{name}: stats of ranks {sorted(ranks)} only\n{stderr[-2000:]}")
    return JobResult(name, job_id, ranks, time.monotonic() - started, watcher.samples)


# ---------------------------------------------------------------------- the real runs


def real_section(args: argparse.Namespace) -> list[str]:
    lines: list[str] = []
    speeds = [float(s) for s in args.speeds.split(",")]
    job_args = ["--per-sample-millis", str(args.per_sample_millis)]
    n = args.nprocs
    rows = []
    with harness.running_stack(
        args.otelcol, args.workdir / "rebalance", pacer_args=["--policy", "rebalance"]
    ) as stack:
        for speed in speeds:
            # The shared machine's load drifts: each speed gets its own homogeneous run, right
            # before its two runs.
            homogeneous = run_job(
                stack, "homogeneous", steps=args.steps, rebalance=False, nprocs=n,
                extra_args=job_args,
            )  # fmt: skip
            h = homogeneous.throughput(args.warmup)
            slow = [f"0:{speed}"]
            off = run_job(
                stack, f"off-{speed}", steps=args.steps, slow=slow, rebalance=False, nprocs=n,
                extra_args=job_args,
            )  # fmt: skip
            on = run_job(
                stack, f"on-{speed}", steps=args.steps, slow=slow, rebalance=True, nprocs=n,
                extra_args=job_args,
            )  # fmt: skip
            steady_from = int(args.steps * (1 - args.steady_fraction))
            row = {
                "speed": speed,
                "homogeneous": h,
                "ideal": h * (n - 1 + speed) / n,
                "off": off.throughput(args.warmup),
                "on_steady": on.throughput(steady_from),
                "on_whole": on.throughput(args.warmup),
                "sizes": on.final_sizes(),
                "changes": on.change_steps(),
            }
            rows.append(row)
            print(
                f"speed {speed}: homogeneous {h:.0f}/s, off {row['off']:.0f}/s, on "
                f"{row['on_steady']:.0f}/s steady ({row['on_whole']:.0f}/s whole), final batch "
                f"sizes {row['sizes']}, shares changed at steps {row['changes']}",
                flush=True,
            )
    lines.append(
        f"{n} gloo ranks, rank 0 persistently slower, global batch 128, "
        f"{args.per_sample_millis} ms of modelled device time per sample at full speed, "
        f"{args.steps} steps per run ({args.warmup} warm-up; steady: the last "
        f"{args.steady_fraction:.0%})"
    )
    lines.append(
        f"{'slow speed':>10} {'ideal/s':>8} {'plain DDP':>16} {'rebalanced steady':>18} "
        f"{'(whole run)':>12} {'target':>7} {'speedup':>8} {'final sizes':>18} "
        f"{'shares changed at steps':>24}"
    )
    for row in rows:
        ideal = row["ideal"]
        lines.append(
            f"{row['speed']:>10} {ideal:>8.0f} {row['off']:>7.0f} ({row['off'] / ideal:>5.1%}) "
            f"{row['on_steady']:>8.0f} ({row['on_steady'] / ideal:>6.1%}) "
            f"{row['on_whole'] / ideal:>12.1%} {TARGET_OF_IDEAL:>7.0%} "
            f"{row['on_steady'] / row['off'] - 1:>+8.1%} {row['sizes']!s:>18} "
            f"{row['changes']!s:>24}"
        )
    lines.append(
        f"ideal = homogeneous throughput x sum(speeds) / {n} (the sum of the ranks' individual "
        f"speeds); target: >= {TARGET_OF_IDEAL:.0%} of it rebalanced, plain DDP about "
        f"speed x {n} / (speed + {n - 1}) of it; LB-BSP reports up to +{LB_BSP_SPEEDUP:.0%} on its "
        "own clusters"
    )
    return lines


def together_section(args: argparse.Namespace) -> list[str]:
    """One slow rank plus jitter on two others: rebalancing alone vs pacing and rebalancing.

    Runs in the order alone, both, both, alone (a fresh stack each, since the policy is the
    pacer's), so that a linear drift of the machine's load hits both alike; with --quick,
    alone and both once each.
    """
    speed, jitter = 0.5, "1,3:0.04"
    steady_from = int(args.steps * (1 - args.steady_fraction))
    results: dict[str, list[JobResult]] = {"rebalance": [], "pacing,rebalance": []}
    order = ("rebalance", "pacing,rebalance", "pacing,rebalance", "rebalance")
    if args.quick:
        order = order[:2]
    for index, policy in enumerate(order):
        name = f"{policy.replace(',', '-')}-{index}"
        with harness.running_stack(
            args.otelcol, args.workdir / name, pacer_args=["--policy", policy]
        ) as stack:
            result = run_job(
                stack,
                name,
                steps=args.steps,
                slow=[f"0:{speed}"],
                jitter=jitter,
                rebalance=True,
                nprocs=args.nprocs,
                extra_args=["--per-sample-millis", str(args.per_sample_millis)],
            )
        results[policy].append(result)
        print(
            f"{policy}: {result.throughput(steady_from):.0f}/s steady, final sizes "
            f"{result.final_sizes()}, shares changed at steps {result.change_steps()}",
            flush=True,
        )
    lines = [
        f"pacing and rebalancing together: rank 0 at {speed}, jitter 0..40 ms on ranks 1 and 3, "
        "runs " + ", ".join("both" if "pacing" in p else "alone" for p in order),
        f"{'policy':>17} {'steady samples/s':>17} {'final sizes':>36} {'share changes':>14} "
        f"{'pacing on':>10}",
    ]
    delays_on_slow, paced_while_settling, settling_count = 0, 0, 0
    mean: dict[str, float] = {}
    for name, runs in results.items():
        mean[name] = statistics.fmean(r.throughput(steady_from) for r in runs)
        decided = [d for r in runs for _, d in r.decisions if d.get("version", 0) > 0]
        active = sum(1 for d in decided if d.get("active")) / len(decided) if decided else 0.0
        changes = [len(r.change_steps()) for r in runs]
        sizes = " ".join(str(r.final_sizes()) for r in runs)
        lines.append(f"{name:>17} {mean[name]:>17.0f} {sizes:>36} {changes!s:>14} {active:>10.0%}")
        if name == "pacing,rebalance":
            delays_on_slow = sum(1 for d in decided if float(d["delays"].get("0", 0.0)) > 0)
            settling = [
                d
                for d in decided
                if d.get("rebalance", {}).get("reason") in ("rebalanced", "settling")
            ]
            settling_count = len(settling)
            paced_while_settling = sum(1 for d in settling if d.get("active") or d.get("delays"))
    ratio = mean["pacing,rebalance"] / mean["rebalance"]
    lines.append(
        f"both/alone steady throughput {ratio:.3f} (target >= 0.97: pacing does not undo "
        "rebalancing)"
    )
    lines.append(
        f"decisions pacing the slow rank: {delays_on_slow} (target 0); decisions with delays "
        f"while new shares settled: {paced_while_settling} of {settling_count} (target 0)"
    )
    return lines


# ---------------------------------------------------------------------- the model at scale


def model_section(smoke: bool = False) -> list[str]:
    import hetero_model as model
    from skewtrace.controller.policies import build_policy

    lines = [
        "at scale: a closed-loop MODEL (tests/hetero_model.py) driving the real policy object; "
        "not a measurement",
        f"{'ranks':>6} {'slow':>5} {'ideal/s':>9} {'plain':>7} {'rebalanced':>11} "
        f"{'speedup':>8} {'bound':>7} {'changes':>8} {'slow share':>11}",
    ]
    # A smoke run: the smallest and the largest, a quarter of the model's time each.
    sizes = ((4, 1), (64, 8)) if smoke else ((4, 1), (8, 1), (64, 8))
    seconds = 30.0 if smoke else 120.0
    for count, slow in sizes:
        speeds: Mapping[int, float] = {r: (0.5 if r < slow else 1.0) for r in range(count)}
        # Weak scaling, like the real runs: 32 samples and 100 ms of work per rank at equal
        # shares and full speed.
        job = model.HeteroJob(
            [speeds[r] for r in range(count)], batch_work_s=0.1 * count, global_batch=32 * count
        )
        on = model.run(job, build_policy("rebalance"), seconds)
        off = model.run(job, build_policy("pacing"), seconds)
        ideal = model.ideal_throughput(job)
        tp_on, tp_off = on.throughput(start=seconds / 2), off.throughput(start=seconds / 2)
        # The most rebalancing can gain: from everyone at the slowest speed to the ideal.
        bound = sum(job.speeds) / (count * min(job.speeds)) - 1
        lines.append(
            f"{count:>6} {slow:>5} {ideal:>9.0f} {tp_off / ideal:>7.1%} {tp_on / ideal:>11.1%} "
            f"{tp_on / tp_off - 1:>+8.1%} {bound:>+7.0%} {len(on.share_changes()):>8} "
            f"{on.final_shares()[0]:>11.4f}"
        )
    lines.append(
        "model: 32 samples and 100 ms of work per rank at equal shares and full speed, 4 ms "
        "fixed and 4 ms transfer per step, 2% noise; the pacer's 4 s window, 2 s metrics lag, "
        "0.5 s poll, sync every 8 steps; ideal = homogeneous x sum(speeds) / ranks; bound: "
        "the speedup from everyone at the slowest speed to the ideal"
    )
    lines.append(
        f"LB-BSP reports up to +{LB_BSP_SPEEDUP:.0%} and Cannikin up to "
        f"{CANNIKIN_LESS_TIME:.0%} less training time, on their own clusters and slowdowns"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--speeds", default="0.5,0.75")
    parser.add_argument("--steady-fraction", type=float, default=0.4)
    parser.add_argument(
        "--per-sample-millis",
        type=float,
        default=3.0,
        help="modelled device time per sample at full speed (train_rebalance.py)",
    )
    parser.add_argument("--sections", default="real,together,model")
    parser.add_argument("--nprocs", type=int, default=4, help="gloo ranks of every real run")
    parser.add_argument(
        "--quick", action="store_true", help="'together': alone and both once each (a smoke run)"
    )
    parser.add_argument(
        "--otelcol",
        type=Path,
        default=Path(
            os.environ.get("SKEWTRACE_OTELCOL", REPO_ROOT / "build" / "otelcol-skewtrace")
        ),
    )
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "build" / "bench-rebalance")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_HELP}: every section, 2 ranks, one slow speed, 12 steps, --quick",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.quick, args.nprocs, args.speeds, args.steps, args.warmup = True, 2, "0.5", 12, 2
    sections = set(args.sections.split(","))
    if sections & {"real", "together"} and not args.otelcol.is_file():
        print(f"{args.otelcol} is not built (make collector)", file=sys.stderr)
        return 2
    report: list[str] = []
    if "real" in sections:
        report += [*real_section(args), ""]
    if "together" in sections:
        report += [*together_section(args), ""]
    if "model" in sections:
        report += model_section(args.smoke)
    print()
    print("\n".join(report))
    if args.smoke:  # the figures beside their targets mean nothing at 12 steps
        print(SMOKE_DONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
