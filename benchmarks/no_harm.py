"""The controller where a delay cannot pay: it must stay out of the way (issue 23: never worse
than -1% throughput where phases do not collide), on the emulated fabric with the loop closed.

The fabric of ``benchmarks/collision.py`` (2 leaves of 2 nodes, NICs and uplinks shaped to
``--mbit``), a real ``otelcol-skewtrace`` and one ``skewtrace pacer`` in the operations
namespace, each policy behind its effect guard at its defaults, as a user turns them on. Two
2-rank gloo DDP jobs (``examples/train_ddp.py``, instrumented, compute a sleep per sample) run
at the same time, each inside one leaf (node0 + node1, node2 + node3), so they share no shaped
link: one's ranks poll the pacer ("controlled"), the other's do not ("observed", the ``off``
arm), and the two swap leaves from round to round. Running them side by side gives both the
same load on the machine's two shared CPUs.

Arms (``--arm``, repeatable; default all three): the controlled job is decided for by
``pacing``, ``interleave`` or ``both`` (``pacing,interleave``), one run each, every run against
its own observed twin. One pacer serves them all: ``--policy pacing,interleave`` with
``--job-policy`` entries choosing the single policies by the controlled jobs' ids, and every
decision traced says which policy made it (a run whose decisions came from another policy
than its arm's fails the benchmark).

Scenarios, the same fault in both jobs:

- ``healthy``: nothing wrong;
- ``jitter``: rank 1 sleeps a uniform 0..``--jitter`` s per step inside forward: noise, no
  persistent early rank;
- ``slow-nic``: the second node's NIC at ``--slow-nic`` of its rate: a rank late for its
  network (the pacer declines a flagged NIC, ``fabric_fault``);
- ``slow-rank``: rank 1 sleeps ``--slow-rank`` s per step outside the traced phases: a
  persistently late rank, whose partner arrives early every step and would wait anyway;
- ``long-stage``: each job is ``examples/train_2d.py`` instead, 2 pipeline stages x 2
  replicas (a node holds one replica's two stages, so each stage's gradient all-reduce
  crosses the NICs; ``--pipeline-hidden`` wide, so that the stages' work, not the NICs, makes
  the step), and the second stage computes ``--long-stage`` s more per step on both
  replicas, from the first step. With one microbatch a step the stages run one after the
  other, so moving work between them would save nothing (the Collector names no
  ``stage_imbalance``; it would be declined if it did), and in each stage's all-reduce both
  replicas arrive together: a long stage leaves nothing for a delay to level.

Printed per scenario, arm and round: each job's mean step time (the slowest rank's, per step) over
the whole run after ``--warmup`` steps and over its last ``--tail`` of steps (after the effect
guard's measurement: six phases of 10 s), the controlled job's throughput change over the
observed one, the reasons the pacer gave for the controlled job in order and the share of its
decisions that published a delay or a schedule; then per scenario and arm the median and the
spread over rounds, beside the -1% target. The decision traces are in
``<logs>/no-harm-*.jsonl``.

    python benchmarks/no_harm.py               # 5 scenarios x 3 arms x 2 rounds, ~75 minutes
    python benchmarks/no_harm.py --arm both    # the composition alone, ~25 minutes here
    python benchmarks/no_harm.py --smoke       # the smoke run (--quick: the same)

Needs root and iproute2 (network namespaces).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _smoke import SMOKE_DONE, SMOKE_HELP, verdict
from collision import JobSpec, Telemetry, launch, rank_stats, start_services
from skewtrace.cluster.fabric import Fabric, FabricSpec

TARGET = -0.01
ARMS = {"pacing": "pacing", "interleave": "interleave", "both": "pacing,interleave"}
"""Each arm's policies (the controlled job's); the observed job is the ``off`` arm."""
PACER_ARGS = (
    "--policy",
    ARMS["both"],
    "--job-policy",
    ";".join(f"job-ctl-*-{arm}-*={ARMS[arm]}" for arm in ("pacing", "interleave")),
)
SCENARIOS = ("healthy", "jitter", "slow-nic", "slow-rank", "long-stage")
PIPELINE_STAGES = 2
LEAVES = (("node0", "node1"), ("node2", "node3"))


@dataclass(frozen=True)
class RunResult:
    scenario: str
    arm: str
    round: int
    observed: list[float]
    """The observed job's step times (the slowest rank's, per step)."""
    controlled: list[float]
    reasons: list[str]
    """The pacer's reasons for the controlled job, in order, repeats dropped."""
    published_share: float
    """Of the decisions read during the run, the share that delayed someone."""
    policies: list[str]
    """The policies the pacer's decisions for the controlled job named (its arm's, one)."""


def job_steps(procs: list[subprocess.Popen[str]], timeout: float) -> list[float]:
    """Per step, the slowest rank's step time (ranks wait for each other at the all-reduce)."""
    per_rank = [[float(t) for t in stats["step_times_s"]] for stats in rank_stats(procs, timeout)]
    return [max(times) for times in zip(*per_rank, strict=False)]


def scenario_jobs(scenario: str, args: argparse.Namespace, round_: int) -> tuple[JobSpec, JobSpec]:
    """The observed and the controlled job, on opposite leaves (swapped every round)."""
    extra: tuple[str, ...] = ()
    if scenario == "jitter":
        extra = ("--jitter", f"1:{args.jitter}")
    elif scenario == "slow-rank":
        extra = ("--straggler", f"1:sleep:{args.slow_rank}")
    stages = 1
    if scenario == "long-stage":  # the last stage's ranks, on both replicas
        stages, replicas = PIPELINE_STAGES, len(LEAVES[0])
        last = range((stages - 1) * replicas, stages * replicas)
        extra = tuple(
            arg for rank in last for arg in ("--straggler", f"{rank}:compute:{args.long_stage}")
        )
    first, second = LEAVES if round_ % 2 == 0 else LEAVES[::-1]
    return JobSpec("obs", first, extra, stages), JobSpec("ctl", second, extra, stages)


def _decisions(
    telemetry: Telemetry, job_id: str, path: Path, stop: threading.Event
) -> tuple[list[str], list[bool], list[str]]:
    reasons: list[str] = []
    published: list[bool] = []
    policies: list[str] = []
    with path.open("w") as out:
        while not stop.wait(1.0):
            body = telemetry.services.pacing(job_id)
            if not body.get("reason"):  # not a job the pacer knows yet
                continue
            out.write(json.dumps({"t": round(time.time(), 3), **body}) + "\n")
            reason = str(body["reason"])
            if not reasons or reasons[-1] != reason:
                reasons.append(reason)
            policy = str(body.get("policy"))
            if policy not in policies:
                policies.append(policy)
            delays = body.get("delays") or {}
            published.append(
                bool(body.get("active"))
                and (any(float(d) > 0 for d in delays.values()) or bool(body.get("schedule")))
            )
    return reasons, published, policies


def run_scenario(
    fabric: Fabric,
    telemetry: Telemetry,
    args: argparse.Namespace,
    scenario: str,
    arm: str,
    round_: int,
) -> RunResult:
    observed_job, controlled_job = scenario_jobs(scenario, args, round_)
    if scenario == "slow-nic":
        for _, node in (observed_job.nodes, controlled_job.nodes):
            fabric.set_nic_rate(node, args.mbit * args.slow_nic)
    label = f"-{scenario}-{arm}-{round_ + 1}"
    observed = replace(telemetry, pacer=None, label=label)
    controlled = replace(telemetry, label=label)
    stop = threading.Event()
    traced: dict[str, tuple[list[str], list[bool], list[str]]] = {}
    path = args.logs / f"no-harm-{scenario}-{arm}-{round_ + 1}.jsonl"
    job_id = controlled.job_id(controlled_job)
    tracer = threading.Thread(
        target=lambda: traced.setdefault("t", _decisions(controlled, job_id, path, stop)),
        name="decision-trace",
        daemon=True,
    )
    try:
        start = time.time() + args.start_delay
        job_args = args
        if observed_job.stages > 1:
            job_args = argparse.Namespace(**{**vars(args), "hidden": args.pipeline_hidden})
        obs = launch(fabric, observed_job, job_args, start, None, args.logs, observed)
        ctl = launch(fabric, controlled_job, job_args, start, None, args.logs, controlled)
        tracer.start()
        timeout = args.start_delay + 60 + args.steps * 2.0
        observed_steps = job_steps(obs, timeout)
        controlled_steps = job_steps(ctl, timeout)
    finally:
        stop.set()
        if tracer.is_alive():
            tracer.join(timeout=5)
        if scenario == "slow-nic":
            for _, node in (observed_job.nodes, controlled_job.nodes):
                fabric.set_nic_rate(node, None)
    reasons, published, policies = traced.get("t", ([], [], []))
    share = sum(published) / len(published) if published else 0.0
    return RunResult(
        scenario, arm, round_, observed_steps, controlled_steps, reasons, share, policies
    )


def window_means(steps: list[float], warmup: int, tail: float) -> tuple[float, float]:
    """The mean step time after ``warmup`` steps, and over the last ``tail`` of the steps."""
    whole = steps[warmup:] or steps
    last = steps[int(len(steps) * (1 - tail)) :] or steps
    return statistics.fmean(whole), statistics.fmean(last)


def change(observed_s: float, controlled_s: float) -> float:
    """The controlled job's throughput over the observed one's, minus one."""
    return observed_s / controlled_s - 1 if controlled_s > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--tail", type=float, default=1 / 3, help="share of steps at the end")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, default=[])
    parser.add_argument("--arm", action="append", choices=tuple(ARMS), default=[])
    parser.add_argument("--hidden", type=int, default=512, help="gradient size knob")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sample-time", type=float, default=0.002, help="seconds a sample")
    parser.add_argument("--mbit", type=float, default=400.0, help="NIC and uplink rate")
    parser.add_argument("--jitter", type=float, default=0.03, help="seconds, at most")
    parser.add_argument("--slow-nic", type=float, default=0.5, help="share of the NIC's rate")
    parser.add_argument("--slow-rank", type=float, default=0.03, help="seconds a step")
    parser.add_argument(
        "--long-stage", type=float, default=0.03, help="seconds more a step, the last stage"
    )
    parser.add_argument(
        "--pipeline-hidden", type=int, default=128, help="the long-stage jobs' stage width"
    )
    parser.add_argument("--start-delay", type=float, default=20.0, help="seconds to start")
    parser.add_argument(
        "--smoke",
        "--quick",
        dest="smoke",
        action="store_true",
        help=f"{SMOKE_HELP}: one short run of one scenario (slow-nic) and arm (pacing)",
    )
    parser.add_argument("--logs", type=Path, default=Path("/tmp/skewtrace-no-harm"))
    args = parser.parse_args(argv)
    scenarios = tuple(args.scenario) or SCENARIOS
    arms = tuple(dict.fromkeys(args.arm)) or tuple(ARMS)
    if args.smoke:  # runs, but too short for its figures to mean anything
        # No start delay: each job's ranks meet at a barrier and start when all are up.
        args.rounds, args.steps, args.warmup, args.start_delay = 1, 20, 5, 0.0
        scenarios = tuple(args.scenario) or ("slow-nic",)
        arms = tuple(dict.fromkeys(args.arm)) or ("pacing",)
    # collision.launch reads the instrumented runs' lengths from these.
    args.controlled_steps, args.controlled_warmup = args.steps, args.warmup
    if os.geteuid() != 0:
        print("no_harm: needs root (network namespaces)", file=sys.stderr)
        return 2
    args.logs.mkdir(parents=True, exist_ok=True)
    spec = FabricSpec(leaves=2, nodes_per_leaf=2, nic_mbit=args.mbit, uplink_mbit=args.mbit)
    results: list[RunResult] = []
    wrong_policy = []
    with contextlib.ExitStack() as stack:
        fabric = stack.enter_context(Fabric(spec))
        print(f"fabric: {fabric.describe()}; two jobs side by side, one per leaf")
        telemetry = start_services(stack, fabric, args.logs, PACER_ARGS)
        for round_ in range(args.rounds):
            for scenario in scenarios:
                for arm in arms:
                    r = run_scenario(fabric, telemetry, args, scenario, arm, round_)
                    results.append(r)
                    print(_run_line(r, args), flush=True)
                    if r.policies != [ARMS[arm]]:
                        wrong_policy.append((scenario, arm, round_ + 1, r.policies))
    summary = summarize(results, args.warmup, args.tail)
    for key, s in summary.items():
        print(
            f"{key}: controlled over observed throughput {s['whole']:+.1%} (spread "
            f"{s['whole_min']:+.1%}..{s['whole_max']:+.1%}), last {args.tail:.0%} "
            f"{s['tail']:+.1%} ({s['tail_min']:+.1%}..{s['tail_max']:+.1%}); target >= "
            f"{TARGET:+.0%}: {verdict(min(s['whole'], s['tail']) >= TARGET, args.smoke)}"
        )
    print("SUMMARY " + json.dumps(summary))
    if wrong_policy:
        print(f"FAIL: decisions from another policy than the arm's: {wrong_policy}")
        return 1
    if args.smoke:
        print(SMOKE_DONE)
    return 0


def _run_line(r: RunResult, args: argparse.Namespace) -> str:
    obs_whole, obs_tail = window_means(r.observed, args.warmup, args.tail)
    ctl_whole, ctl_tail = window_means(r.controlled, args.warmup, args.tail)
    return (
        f"round {r.round + 1} {r.scenario} {r.arm}: observed {obs_whole * 1e3:.1f} ms "
        f"(last {args.tail:.0%} {obs_tail * 1e3:.1f} ms), controlled "
        f"{ctl_whole * 1e3:.1f} ms ({ctl_tail * 1e3:.1f} ms): throughput "
        f"{change(obs_whole, ctl_whole):+.1%} (last {args.tail:.0%} "
        f"{change(obs_tail, ctl_tail):+.1%}); pacer ({', '.join(r.policies) or 'none'}): "
        f"{' -> '.join(r.reasons)}, published in {r.published_share:.0%} of decisions"
    )


def summarize(results: list[RunResult], warmup: int, tail: float) -> dict[str, dict[str, Any]]:
    """Per scenario and arm (``scenario arm``), the median and the spread over rounds of the
    throughput change, over the whole run and over its last ``tail``."""
    out: dict[str, dict[str, Any]] = {}
    for scenario, arm in dict.fromkeys((r.scenario, r.arm) for r in results):
        whole, last = [], []
        for r in results:
            if (r.scenario, r.arm) != (scenario, arm):
                continue
            obs = window_means(r.observed, warmup, tail)
            ctl = window_means(r.controlled, warmup, tail)
            whole.append(change(obs[0], ctl[0]))
            last.append(change(obs[1], ctl[1]))
        out[f"{scenario} {arm}"] = {
            "whole": statistics.median(whole),
            "whole_min": min(whole),
            "whole_max": max(whole),
            "tail": statistics.median(last),
            "tail_min": min(last),
            "tail_max": max(last),
            "rounds": len(whole),
            "target": TARGET,
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
