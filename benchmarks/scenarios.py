"""Each fault scenario of the main job, several times, on the emulated leaf/spine fabric.

For every scenario and repetition: the real Collector and pacer (one pair for the whole
benchmark, a job id per run) and the 6-rank pipeline x data parallel job of
``examples/train_2d.py`` on 6 namespaced nodes behind 3 leaf switches. Per scenario it
prints whether the right root rank, cause and domain were named (the verdict at the end of
every fault phase), the steps and seconds from onset to the verdict (target: within 3 steps
and under 2 s at 10 steps/s), how many steps after a fault's end its flags cleared, and
the false flags. With ``--pacing`` it also runs the jitter and contention scenarios with
pacing off and on and prints iteration-time CV and throughput side by side.

    python benchmarks/scenarios.py --repeat 3 [--scenario nic --scenario rack] [--pacing]
    python benchmarks/scenarios.py --smoke    # one scenario, once, a few steps

Needs root and iproute2 (network namespaces, veth, bridges, tbf). The table it prints is in
docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _smoke import SMOKE_HELP
from skewtrace import _resources
from skewtrace.cluster import fabric as fabric_mod
from skewtrace.cluster import netns
from skewtrace.cluster.fabric import Fabric, FabricSpec
from skewtrace.cluster.job import JobPlan, finish, job_figures, run_job
from skewtrace.cluster.outcome import Outcome, evaluate, read_verdicts
from skewtrace.cluster.scenarios import Fault
from skewtrace.cluster.services import Services

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS: dict[str, list[str]] = {
    "compute": ["compute:4:0.05@8"],
    "data": ["data:1:0.05@8"],
    "nic": ["nic:node2:200@8"],
    "uplink": ["uplink:leaf0:200@8"],
    "rack": ["rack:leaf1:0.05@8"],
    "hetero": ["hetero:node5:12"],  # why 12: skewtrace.cluster.scenarios.PRESETS
    "jitter": ["jitter:0,2,4:0.04"],
    "mid-run, ends": ["compute:3:0.05@8:20"],
    "nic mid-run, ends": ["nic:node2:200@8:20"],
    "compute + nic": ["compute:0:0.05@8", "nic:node4:200@8"],
}
TRAIN_ARGS: list[str] = []
SMOKE_STEPS = 14
PACING_SCENARIOS = {
    "jitter": ["jitter:0,2,4:0.04"],
    "contention": ["uplink:leaf0:200@8"],
}


@dataclass
class Tally:
    runs: int = 0
    right: int = 0
    steps_to_flag: list[int] = field(default_factory=list)
    seconds_to_flag: list[float] = field(default_factory=list)
    steps_to_clear: list[int] = field(default_factory=list)
    false_flag_steps: int = 0
    step_time: list[float] = field(default_factory=list)

    def add(self, outcome: Outcome, step_time_s: float) -> None:
        self.runs += 1
        self.right += outcome.right
        for p in outcome.phases:
            if p.expected.quiet:
                continue
            if p.steps_to_flag is not None:
                self.steps_to_flag.append(p.steps_to_flag)
            if p.flag_seconds is not None:
                self.seconds_to_flag.append(p.flag_seconds)
        for c in outcome.clearings:
            if c.steps_to_clear is not None:
                self.steps_to_clear.append(c.steps_to_clear)
        self.false_flag_steps += sum(outcome.false_flags.values())
        if not math.isnan(step_time_s):
            self.step_time.append(step_time_s)


def _median(values: list[float] | list[int]) -> str:
    return "-" if not values else f"{statistics.median(values):g}"


def _run(
    cluster: Fabric,
    services: Services,
    workdir: Path,
    name: str,
    texts: list[str],
    steps: int,
    pacing: bool,
    example: Path,
    env: dict[str, str],
) -> tuple[Outcome, dict[str, float]]:
    faults = [Fault.parse(t) for t in texts]
    for f in faults:
        f.check(cluster)
    job = (
        f"bench-{name.replace(' ', '').replace(',', '').replace('+', '-')}-{time.time_ns() % 10**8}"
    )
    plan = JobPlan(
        job_id=job,
        script=example,
        steps=steps,
        faults=tuple(faults),
        pacing=pacing,
        script_args=("--pp", str(cluster.spec.leaves), *TRAIN_ARGS),
        env=tuple(env.items()),
    )
    result = run_job(cluster, services, plan, workdir / job, tick_s=0.5)
    finish(services, result, 3.0)
    outcome = evaluate(result, read_verdicts(services.spans_path, job), cluster)
    return outcome, job_figures(result.stats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--scenario", action="append", default=None, choices=list(SCENARIOS))
    parser.add_argument("--pacing", action="store_true", help="also pacing off vs on")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--train-args", default="", help="more flags for train_2d.py")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_HELP}: the compute scenario once, {SMOKE_STEPS} steps (fault from step 8)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.repeat, args.scenario, args.steps = 1, ["compute"], SMOKE_STEPS
    TRAIN_ARGS.extend(args.train_args.split())
    reason = netns.unavailable_reason()
    if reason is not None:
        print(f"scenarios.py: needs network namespaces: {reason}", file=sys.stderr)
        return 2
    fabric_mod.remove_stale()
    otelcol_lookup = _resources.find_otelcol(os.environ)
    otelcol = otelcol_lookup.found or _resources.build_otelcol(os.environ)
    configs = [ROOT / "collector-config/otelcol.yaml", ROOT / "collector-config/file-export.yaml"]
    example = ROOT / "examples/train_2d.py"
    workdir = Path(tempfile.mkdtemp(prefix="skewtrace-scenarios-"))
    chosen = {k: SCENARIOS[k] for k in (args.scenario or SCENARIOS)}
    tallies: dict[str, Tally] = {}
    pacing_rows: dict[str, dict[str, list[dict[str, float]]]] = {}
    with Fabric(FabricSpec()) as cluster:
        env = {"SKEWTRACE_TOPOLOGY": str(cluster.write_topology_conf(workdir / "topology.conf"))}
        with Services(cluster, otelcol, configs, workdir, env=dict(os.environ)) as services:
            for name, texts in chosen.items():
                tally = tallies.setdefault(name, Tally())
                for i in range(args.repeat):
                    outcome, figures = _run(
                        cluster, services, workdir, name, texts, args.steps, False, example, env
                    )
                    tally.add(outcome, figures.get("step_time_mean_s", math.nan))
                    print(
                        f"{name} #{i + 1}: {'right' if outcome.right else 'WRONG'}; "
                        + "; ".join(
                            f"{p.expected.describe()} -> {p.concluded} "
                            f"({p.steps_to_flag} steps, {p.flag_seconds or math.nan:.1f} s)"
                            for p in outcome.phases
                            if not p.expected.quiet
                        )
                        + (f"; false flags {outcome.false_flags}" if outcome.false_flags else ""),
                        flush=True,
                    )
            if args.pacing:
                for name, texts in PACING_SCENARIOS.items():
                    rows = pacing_rows.setdefault(name, {"off": [], "on": []})
                    for _ in range(args.repeat):
                        for label, paced in (("off", False), ("on", True)):
                            _, figures = _run(
                                cluster,
                                services,
                                workdir,
                                f"{name}-{label}",
                                texts,
                                args.steps * 2,
                                paced,
                                example,
                                env,
                            )
                            rows[label].append(figures)
    print("\n| scenario | right | steps to flag (median) | seconds to flag (median) | steps to "
          "clear | false-flag steps | step time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, t in tallies.items():
        step_ms = _median([round(s * 1e3) for s in t.step_time])
        print(
            f"| {name} | {t.right}/{t.runs} | {_median(t.steps_to_flag)} | "
            f"{_median([round(s, 1) for s in t.seconds_to_flag])} | {_median(t.steps_to_clear)} | "
            f"{t.false_flag_steps} | {step_ms} ms |"
        )
    if pacing_rows:
        print("\n| scenario | CV off | CV on | throughput off | throughput on | change |")
        print("|---|---|---|---|---|---|")
        for name, rows in pacing_rows.items():

            def mean(label: str, key: str, rows: dict[str, list[dict[str, float]]] = rows) -> float:
                vals = [r[key] for r in rows[label] if key in r]
                return statistics.mean(vals) if vals else math.nan

            off_t, on_t = mean("off", "throughput"), mean("on", "throughput")
            print(
                f"| {name} | {mean('off', 'step_time_cv'):.3f} | {mean('on', 'step_time_cv'):.3f} "
                f"| {off_t:.1f} | {on_t:.1f} | {(on_t / off_t - 1) * 100:+.1f}% |"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "scenarios": {k: vars(v) for k, v in tallies.items()},
                    "pacing": pacing_rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
