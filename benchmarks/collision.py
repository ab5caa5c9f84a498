"""Communication phases that collide on a shared uplink, and what interleaving them is worth,
on the emulated fabric (issue 23: the emulation where the mechanism exists).

Two data-parallel jobs of two ranks each (``examples/train_ddp.py``, gloo, uninstrumented) on
the emulated leaf/spine fabric (:mod:`skewtrace.cluster.fabric`: network namespaces, veth
links shaped with tbf): job A on node0 (leaf0) and node2 (leaf1), job B on node1 (leaf0) and
node3 (leaf1). Each step's gradient all-reduce crosses both leaves' uplinks, shaped to one
NIC's rate: with two nodes a leaf they are 2:1 oversubscribed, so A's and B's all-reduces share
the uplink whenever they run at once (``--uplink-sharing``: ``fifo``, one tail-drop queue, the
default; ``fair``, an equal share per node, as a fabric whose congestion control gives each
flow its fair rate: :attr:`~skewtrace.cluster.fabric.FabricSpec.uplink_sharing`). Compute is
time on a simulated accelerator
(``--sample-time``: a sleep per sample), so the machine's two shared CPUs do not decide the
step time; the network does.

Scenarios, each run ``--rounds`` times in turn (so that load drift hits them alike):

- ``alone``: job A by itself: the step without contention, the bound;
- ``colliding``: A and B start at the same wall-clock moment and run free: their phases
  collide (what happens with no controller);
- ``scheduled``: both on a cadence (``--cadence``: step k starts no earlier than start + k
  periods, a period ``--margin`` above A's step alone), with the same slots: a bounded delay
  window without an ordering constraint;
- ``interleaved``: the same cadence, B's slots half a period after A's: the ordering
  constraint an interleaving controller sets, the two all-reduces taking turns on the uplinks.

With ``--controlled`` (the loop closed), more scenarios per round, both jobs instrumented
by skewtrace and a real ``otelcol-skewtrace`` and ``skewtrace pacer`` in the operations
namespace (:class:`skewtrace.cluster.services.Services`):

- ``observed`` (the ``off`` arm): A and B start together and run free, their spans and
  metrics flowing to the Collector; the ranks do not ask the pacer (the baseline the
  controller must beat, with the instrumentation's own cost in it);
- one controlled run per arm (``--arm``, repeatable; default all three, ``--smoke`` only
  ``interleave``), the same jobs with every rank polling the pacer, whose ``--job-policy``
  gives each arm's jobs (by their ids) the arm's policies:

  - ``interleave``: the controller reads the Collector's group phases, publishes one
    schedule both jobs agree on, and the ranks hold to their slots
    (:meth:`skewtrace.decision.DecisionBody.hold_for`);
  - ``pacing``: delays for early ranks, behind pacing's effect guard at its defaults (what a
    user turns on): it should pay nothing here and cost nothing;
  - ``both``: ``pacing,interleave``.

  Interleave runs without its effect guard by default (``--interleave-effect-pairs 0``), so
  the figure is the schedule's own and not half spent on measuring. With
  ``--interleave-effect-pairs N`` (3: what a user gets) the guard alternates spells with the
  schedule withheld and published in the same run, and the benchmark prints, per arm and
  round, what it judged (each experiment's gain, its 90% bounds, kept or ``no_gain``) and the
  jobs' mean step time in the spells the schedule was published against those it was
  withheld (``measuring``): a baseline of free-running spells from the same run, which the
  free-running jobs' chance of taking turns by themselves moves far less than it moves one
  observed run (``--interleave-effect-backoff-s`` shortens the time between experiments).
  A run whose decisions name another policy than its arm's fails the benchmark.
  Steps before ``--controlled-warmup`` (the time it takes the Collector and the pacer to see
  the collision, and the period's search) are left out of every arm and the observed run.

``--layout sets``: instead of two jobs, one job of four ranks (``JOB_SETS``:
``examples/train_ddp.py --sets 2 --gather-bytes N``), whose two sets (ranks on node0 and node2,
ranks on node1 and node3) each have a data-parallel group with two phases a step, a
parameter gather before forward and the gradient all-reduce after backward, both crossing
the uplinks; the world's loss all-reduce keeps the sets in one step, so their phases collide
every step, for as long as the job runs (the scenario where free-running jobs, which drift in
and out of their collision, cannot show what interleaving is worth). Per round: the job
uninstrumented (``colliding``), the same with set 1 offset by hand (``--set-offset``), then
instrumented and observed, and under each arm (the interleave policy publishes ``offsets``
here, not a schedule); each arm's throughput over the observed run's. The figures of
docs/evaluation.md ("A gather that fills the link"): ``--layout sets --arm interleave
--interleave-effect-pairs 3 --controlled-steps 600 --controlled-warmup 100 --sample-time 0.003
--set-offset 0.08`` (96 ms of compute, a window for the offset from the gather's 70 ms).

Started half a step apart and left to run free, the two jobs drift back into collisions
within tens of steps (measured: the offset alone gave -7% to +32% in three runs), so the
constraint must hold every step, as a schedule does. Printed: each job's mean step time after
``--warmup`` steps per scenario and round, the medians, and interleaved over colliding
throughput (both jobs' steps per second), beside the +15% target of issue 23 where phases
collide.

    python benchmarks/collision.py                  # ~4 minutes here
    python benchmarks/collision.py --smoke          # the smoke run, the loop closed
    python benchmarks/collision.py --controlled     # also the closed loop (~8 minutes)
    python benchmarks/collision.py --layout sets --arm interleave --interleave-effect-pairs 3

Needs root and iproute2 (network namespaces).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "train_ddp.py"
PIPELINE_SCRIPT = REPO / "examples" / "train_2d.py"

from _smoke import SMOKE_DONE, SMOKE_HELP, verdict  # noqa: E402
from skewtrace._ports import free_port  # noqa: E402
from skewtrace.cluster.fabric import NIC, UPLINK_SHARING, Fabric, FabricSpec  # noqa: E402

TARGET_GAIN = 0.15
NO_HARM = -0.01
ARMS = {"interleave": "interleave", "pacing": "pacing", "both": "pacing,interleave"}
"""Each controlled arm's policies; the observed run is the ``off`` arm."""
ARM_TARGETS = {"interleave": TARGET_GAIN, "pacing": NO_HARM, "both": TARGET_GAIN}
"""Where phases collide, interleaving must pay; pacing alone cannot level a collision (both
jobs' ranks arrive together) and must stay out of the way."""
# Process start (torch import, gloo rendezvous) of four ranks on two shared cores.
START_DELAY_S = 20.0


@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: tuple[str, ...]
    extra: tuple[str, ...] = ()
    """More flags of the job's script (a jitter, a straggler: ``benchmarks/no_harm.py``)."""
    stages: int = 1
    """1: ``train_ddp.py``, a rank per node. More: ``train_2d.py`` with that many pipeline
    stages, one replica per node (a node holds its replica's every stage; the stages'
    all-reduces cross the nodes' NICs)."""

    def placement(self) -> list[str]:
        """Each rank's node, by rank (``train_2d.py``: rank = stage x replicas + replica)."""
        return [self.nodes[rank % len(self.nodes)] for rank in range(self.stages * len(self.nodes))]


JOB_A = JobSpec("A", ("node0", "node2"))
JOB_B = JobSpec("B", ("node1", "node3"))
JOB_SETS = JobSpec("S", ("node0", "node1", "node2", "node3"), ("--sets", "2"))
"""``--layout sets``: one job of four ranks, a rank a node; set 0 (ranks 0 and 2) on node0
and node2, set 1 (ranks 1 and 3) on node1 and node3, each set's gather and all-reduce
crossing both uplinks, the world's loss all-reduce keeping the sets in one step."""


@dataclass(frozen=True)
class Telemetry:
    """How instrumented ranks reach the services (``--controlled``)."""

    otlp: str
    pacer: str | None
    topology: Path
    services: Any = None
    label: str = ""
    """Appended to the job ids: each run's jobs are new jobs to the pacer (a run's decisions,
    its period's search and raised floor, are not the next run's starting point)."""

    def job_id(self, job: JobSpec) -> str:
        return f"job-{job.name}{self.label}"


def launch(
    fabric: Fabric,
    job: JobSpec,
    args: argparse.Namespace,
    start_at: float,
    cadence: float | None,
    logs: Path,
    telemetry: Telemetry | None = None,
) -> list[subprocess.Popen[str]]:
    port = free_port()
    master = fabric.node(job.nodes[0]).data_ip
    procs = []
    steps, warmup = args.steps, args.warmup
    if telemetry is not None:
        steps, warmup = args.controlled_steps, args.controlled_warmup
    placement = job.placement()
    for rank, node in enumerate(placement):
        common = [
            "--steps", str(steps), "--warmup", str(warmup), "--hidden", str(args.hidden),
            "--batch-size", str(args.batch_size),
            *(["--no-instrument"] if telemetry is None else ["--job-id", telemetry.job_id(job)]),
        ]  # fmt: skip
        if job.stages > 1:  # no start time: both jobs are launched together
            argv = [sys.executable, str(PIPELINE_SCRIPT), *common, "--pp", str(job.stages)]
        else:
            argv = [
                sys.executable, str(SCRIPT), *common, "--sample-time", str(args.sample_time),
                "--start-at", f"{start_at:.3f}", "--backend", "gloo",
                *(["--cadence", f"{cadence:.4f}"] if cadence else []),
            ]  # fmt: skip
        argv += job.extra
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(placement[:rank].count(node)),
            "WORLD_SIZE": str(len(placement)),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": NIC,
            "OMP_NUM_THREADS": "1",
        }
        env.pop("SKEWTRACE_PACER_URL", None)
        if telemetry is not None:
            env.update(
                {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": telemetry.otlp,
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                    "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "200",
                    "SKEWTRACE_TOPOLOGY": str(telemetry.topology),
                    # A late step's next slot may be up to a period away (140-230 ms here).
                    "SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS": "200",
                    "SKEWTRACE_PACER_POLL_INTERVAL_MILLIS": "500",
                }
            )
            if telemetry.pacer is not None:
                env["SKEWTRACE_PACER_URL"] = telemetry.pacer
        log = (logs / f"{job.name}{rank}.log").open("w")
        command = fabric.exec_argv(node, argv)
        procs.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        )
    return procs


def rank_stats(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    """Each rank's ``step_stats`` line (``train_ddp.py``), once the rank has exited.

    Every rank's stdout is drained at once: a rank's stats line of a long run (its step
    times) outgrows the pipe, and read one rank after the other, a rank blocked writing it
    never reached the barrier that the rank being read waited in (3,600 steps hung so)."""
    with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
        outs = list(pool.map(lambda proc: proc.communicate(timeout=timeout)[0], procs))
    out_stats = []
    for proc, out in zip(procs, outs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"a rank exited with {proc.returncode}; see its log")
        stats = [json.loads(line) for line in out.splitlines() if '"step_stats"' in line]
        out_stats.append(stats[-1])
    return out_stats


def step_time(stats: list[dict[str, Any]]) -> float:
    """The job's mean step time after warm-up from its ranks' ``step_stats``: the slowest
    rank's (ranks wait for each other, so they agree to within a step's jitter)."""
    return max(float(rank["step_time_mean_s"]) for rank in stats)


def run(
    fabric: Fabric,
    args: argparse.Namespace,
    jobs: list[tuple[JobSpec, float]],
    logs: Path,
    cadence: float | None = None,
    telemetry: Telemetry | None = None,
    record: str | None = None,
) -> dict[str, float]:
    """Each job's mean step time after warm-up; with ``record``, every rank's ``step_stats``
    (each step's time) also to ``logs/steps-{record}.json``."""
    t0 = time.time() + args.start_delay
    running = {
        job.name: launch(fabric, job, args, t0 + offset, cadence, logs, telemetry)
        for job, offset in jobs
    }
    timeout = args.start_delay + 60 + max(args.steps, args.controlled_steps) * 2.0
    stats = {name: rank_stats(procs, timeout) for name, procs in running.items()}
    if record is not None:
        (logs / f"steps-{record}.json").write_text(json.dumps(stats))
    return {name: step_time(ranks) for name, ranks in stats.items()}


@contextlib.contextmanager
def _decision_trace(
    telemetry: Telemetry, path: Path, jobs: tuple[JobSpec, ...] = (JOB_A, JOB_B)
) -> Any:
    """Both jobs' decisions, read from the pacer once a second while the block runs, one JSON
    line each: the body with ``t`` and the benchmark's ``job_name`` (the period's search, for
    the evaluation). Yields the set of policies those decisions named (filled as they are
    read)."""
    stop = threading.Event()
    policies: set[str] = set()

    def poll() -> None:
        with path.open("w") as out:
            while not stop.wait(1.0):
                for job in jobs:
                    body = telemetry.services.pacing(telemetry.job_id(job))
                    if body.get("policy"):
                        policies.add(str(body["policy"]))
                    line = {"t": round(time.time(), 3), **body, "job_name": job.name}
                    out.write(json.dumps(line))
                    out.write("\n")
                out.flush()

    thread = threading.Thread(target=poll, name="decision-trace", daemon=True)
    thread.start()
    try:
        yield policies
    finally:
        stop.set()
        thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512, help="gradient size knob")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sample-time", type=float, default=0.002, help="seconds a sample")
    parser.add_argument("--mbit", type=float, default=400.0, help="NIC and uplink rate")
    parser.add_argument(
        "--uplink-sharing",
        choices=UPLINK_SHARING,
        default="fifo",
        help="how an uplink shares its rate among nodes (FabricSpec.uplink_sharing)",
    )
    parser.add_argument(
        "--margin", type=float, default=0.05, help="the cadence's period over A's step alone"
    )
    parser.add_argument(
        "--start-delay", type=float, default=START_DELAY_S, help="seconds to start the ranks"
    )
    parser.add_argument(
        "--controlled", action="store_true", help="also observed vs controlled (the loop)"
    )
    parser.add_argument(
        "--arm",
        action="append",
        choices=tuple(ARMS),
        default=[],
        help="a controlled arm (repeatable; default all three, --smoke only interleave)",
    )
    parser.add_argument(
        "--interleave-effect-pairs",
        type=int,
        default=0,
        help="the interleave policy's effect guard (0: off, the schedule's own effect)",
    )
    parser.add_argument(
        "--interleave-effect-backoff-s",
        type=float,
        default=None,
        help="the guard's back-off (measured again after half of it when kept; default the "
        "pacer's)",
    )
    parser.add_argument("--controlled-steps", type=int, default=200)
    parser.add_argument(
        "--controlled-warmup", type=int, default=80, help="steps before the controller is in"
    )
    parser.add_argument(
        "--layout",
        choices=("jobs", "sets"),
        default="jobs",
        help="jobs: two 2-rank jobs (default); sets: one 4-rank job of two sets whose "
        "gathers and all-reduces collide every step (JOB_SETS)",
    )
    parser.add_argument(
        "--gather-bytes",
        type=int,
        default=3_300_000,
        help="--layout sets: each forward's parameter gather, bytes a rank",
    )
    parser.add_argument(
        "--set-offset",
        type=float,
        default=0.08,
        help="--layout sets: the hand-set run's offset of set 1 (seconds; 0: no such run)",
    )
    parser.add_argument(
        "--smoke",
        "--quick",
        dest="smoke",
        action="store_true",
        help=f"{SMOKE_HELP}: one short round, the loop closed (--controlled), the interleave arm",
    )
    parser.add_argument("--logs", type=Path, default=Path("/tmp/skewtrace-collision"))
    args = parser.parse_args(argv)
    chosen = tuple(dict.fromkeys(args.arm))
    arms = chosen or tuple(ARMS)
    if args.smoke:  # runs, but too short for its figures to mean anything
        args.controlled = True
        args.rounds, args.steps, args.warmup, args.start_delay = 1, 10, 2, 8.0
        args.controlled_steps, args.controlled_warmup = 30, 10
        arms = chosen or ("interleave",)
        if args.layout == "sets":
            # The Collector's phases of a few steps, then offsets the ranks apply: what the
            # smoke run checks (the pacer's last decision names them). No hand-set run.
            args.controlled_steps, args.set_offset = 60, 0.0
    if os.geteuid() != 0:
        print("collision: needs root (network namespaces)", file=sys.stderr)
        return 2
    args.logs.mkdir(parents=True, exist_ok=True)
    spec = FabricSpec(
        leaves=2,
        nodes_per_leaf=2,
        nic_mbit=args.mbit,
        uplink_mbit=args.mbit,
        uplink_sharing=args.uplink_sharing,
    )
    names: tuple[str, ...] = ("colliding", "scheduled", "interleaved")
    if args.controlled:
        names = (*names, "observed", *arms)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in ("alone", *names)}
    wrong_policy: list[tuple[str, int, list[str]]] = []
    results_spells: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        fabric = stack.enter_context(Fabric(spec))
        if args.layout == "sets":
            print(f"fabric: {fabric.describe()}; one 4-rank job, two sets crossing both uplinks")
            services = start_services(stack, fabric, args.logs, pacer_args_for_arms(args))
            return run_sets(fabric, args, arms, services)
        print(f"fabric: {fabric.describe()}; two 2-rank jobs crossing both uplinks")
        telemetry = None
        if args.controlled:
            telemetry = start_services(stack, fabric, args.logs, pacer_args_for_arms(args))
        for round_ in range(args.rounds):
            alone = run(fabric, args, [(JOB_A, 0.0)], args.logs)
            results["alone"].append(alone)
            period = alone["A"] * (1 + args.margin)
            both = [(JOB_A, 0.0), (JOB_B, 0.0)]
            results["colliding"].append(run(fabric, args, both, args.logs))
            results["scheduled"].append(run(fabric, args, both, args.logs, period))
            apart = [(JOB_A, 0.0), (JOB_B, period / 2)]
            results["interleaved"].append(run(fabric, args, apart, args.logs, period))
            if telemetry is not None:
                # Controlled first, under job ids of their own (an arm's policies are chosen by
                # them): the pacer also decides for the observed jobs (their ranks just do not
                # ask), and those decisions must not be where a controlled run starts; the
                # last round's observed jobs are long forgotten (the pacer's job timeout)
                # after the runs between.
                for arm in arms:
                    controlled = replace(telemetry, label=f"-{arm}{round_ + 1}")
                    trace = args.logs / f"decisions-{arm}-{round_ + 1}.jsonl"
                    with _decision_trace(controlled, trace) as policies:
                        results[arm].append(
                            run(
                                fabric,
                                args,
                                both,
                                args.logs,
                                None,
                                controlled,
                                f"{arm}-{round_ + 1}",
                            )
                        )
                    if policies != {ARMS[arm]}:
                        wrong_policy.append((arm, round_ + 1, sorted(policies)))
                    spells = guard_spells(args.logs, f"{arm}-{round_ + 1}", trace)
                    results_spells.setdefault(arm, []).append(spells)
                    print_spells(arm, round_ + 1, spells)
                    for job in (JOB_A, JOB_B):
                        print_decisions_read(trace, controlled.job_id(job), job, "schedule")
                observed = replace(telemetry, pacer=None, label=f"-o{round_ + 1}")
                results["observed"].append(
                    run(fabric, args, both, args.logs, None, observed, f"observed-{round_ + 1}")
                )
            print(
                f"round {round_ + 1}: step time A alone {alone['A'] * 1e3:.1f} ms, period "
                f"{period * 1e3:.1f} ms; "
                + "; ".join(
                    f"{name} A {results[name][-1]['A'] * 1e3:.1f} ms B "
                    f"{results[name][-1]['B'] * 1e3:.1f} ms"
                    for name in names
                ),
                flush=True,
            )
    summary = summarize(results, arms if args.controlled else ())
    if results_spells:
        summary["spells"] = results_spells
    print(
        f"median step time: alone {summary['alone_ms']:.1f} ms, colliding "
        f"{summary['colliding_ms']:.1f} ms, scheduled {summary['scheduled_ms']:.1f} ms, "
        f"interleaved {summary['interleaved_ms']:.1f} ms"
    )
    print(f"scheduled over colliding throughput: {summary['scheduled_gain']:+.1%}")
    print(
        f"interleaved over scheduled throughput (phases held colliding): "
        f"{summary['held_gain']:+.1%} (spread over rounds {summary['held_gain_min']:+.1%}.."
        f"{summary['held_gain_max']:+.1%})"
    )
    print(
        f"interleaved over colliding throughput: {summary['gain']:+.1%} (spread over rounds "
        f"{summary['gain_min']:+.1%}..{summary['gain_max']:+.1%}); target >= +{TARGET_GAIN:.0%} "
        f"where phases collide: {verdict(summary['gain'] >= TARGET_GAIN, args.smoke)}"
    )
    if args.controlled:
        print(
            f"median step time: observed {summary['observed_ms']:.1f} ms, "
            + ", ".join(f"{arm} {summary['arms'][arm]['ms']:.1f} ms" for arm in arms)
            + f" (all instrumented, steps after {args.controlled_warmup})"
        )
        print_arm_gains(summary, arms, "the loop closed", args.smoke)
    return finish(summary, wrong_policy, args.smoke)


def run_sets(
    fabric: Fabric, args: argparse.Namespace, arms: tuple[str, ...], telemetry: Telemetry
) -> int:
    """``--layout sets``: per round, the job uninstrumented (``colliding``: its sets' phases
    collide every step, as nothing tells them apart; ``hand-set``: set 1 offset by
    ``--set-offset``), instrumented and observed (the ``off`` arm), and under each arm's
    policies; each controlled arm's throughput over the observed run's, beside its target.
    The loop is always closed here (``--controlled`` implied)."""
    job = replace(JOB_SETS, extra=(*JOB_SETS.extra, "--gather-bytes", str(args.gather_bytes)))
    hand_set = replace(job, extra=(*job.extra, "--set-offset", str(args.set_offset)))
    # Every run is measured after the same warm-up, the controlled runs' (the time it takes
    # the Collector and the pacer to see the collision).
    names = ("colliding", *(("hand-set",) if args.set_offset > 0 else ()), "observed", *arms)
    results: dict[str, list[float]] = {name: [] for name in names}
    wrong_policy: list[tuple[str, int, list[str]]] = []
    spells_by_arm: dict[str, list[dict[str, Any]]] = {}
    uninstrumented = argparse.Namespace(
        **{**vars(args), "steps": args.controlled_steps, "warmup": args.controlled_warmup}
    )
    for round_ in range(args.rounds):
        results["colliding"].append(run(fabric, uninstrumented, [(job, 0.0)], args.logs)["S"])
        if args.set_offset > 0:
            results["hand-set"].append(
                run(fabric, uninstrumented, [(hand_set, 0.0)], args.logs)["S"]
            )
        for arm in arms:
            controlled = replace(telemetry, label=f"-{arm}{round_ + 1}")
            record = f"sets-{arm}-{round_ + 1}"
            trace = args.logs / f"decisions-{record}.jsonl"
            with _decision_trace(controlled, trace, (job,)) as policies:
                step = run(fabric, args, [(job, 0.0)], args.logs, None, controlled, record)["S"]
            results[arm].append(step)
            if policies != {ARMS[arm]}:
                wrong_policy.append((arm, round_ + 1, sorted(policies)))
            spells = guard_spells(args.logs, record, trace)
            spells_by_arm.setdefault(arm, []).append(spells)
            print_spells(arm, round_ + 1, spells)
            print_decisions_read(trace, controlled.job_id(job), job, "offsets")
        observed = replace(telemetry, pacer=None, label=f"-o{round_ + 1}")
        record = f"sets-observed-{round_ + 1}"
        results["observed"].append(
            run(fabric, args, [(job, 0.0)], args.logs, None, observed, record)["S"]
        )
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{name} {values[-1] * 1e3:.1f} ms" for name, values in results.items()),
            flush=True,
        )
    summary: dict[str, Any] = {
        "layout": "sets",
        "colliding_ms": 1e3 * statistics.median(results["colliding"]),
        "observed_ms": 1e3 * statistics.median(results["observed"]),
        "arms": {},
        "spells": spells_by_arm,
    }
    for arm in arms:
        gains = [
            base / step - 1 for base, step in zip(results["observed"], results[arm], strict=True)
        ]
        summary["arms"][arm] = arm_summary(1e3 * statistics.median(results[arm]), gains)
    if args.set_offset > 0:
        hand = [c / h - 1 for c, h in zip(results["colliding"], results["hand-set"], strict=True)]
        summary["hand_set_ms"] = 1e3 * statistics.median(results["hand-set"])
        summary["hand_set_gain"] = statistics.median(hand)
        print(
            f"hand-set offset {args.set_offset * 1e3:.0f} ms over colliding (uninstrumented): "
            f"{summary['hand_set_gain']:+.1%} (spread over rounds {min(hand):+.1%}.."
            f"{max(hand):+.1%})"
        )
    print(
        f"median step time: uninstrumented {summary['colliding_ms']:.1f} ms, observed "
        f"{summary['observed_ms']:.1f} ms, "
        + ", ".join(f"{arm} {summary['arms'][arm]['ms']:.1f} ms" for arm in arms)
        + f" (steps after {args.controlled_warmup})"
    )
    print_arm_gains(summary, arms, "one job, two sets", args.smoke)
    return finish(summary, wrong_policy, args.smoke)


def finish(
    summary: dict[str, Any], wrong_policy: list[tuple[str, int, list[str]]], smoke: bool = False
) -> int:
    """Both layouts' end: the SUMMARY line, and 1 where an arm's decisions named another
    policy than the arm's (a failure at any size)."""
    print("SUMMARY " + json.dumps(summary))
    if wrong_policy:
        print(f"FAIL: decisions from another policy than the arm's: {wrong_policy}")
        return 1
    if smoke:
        print(SMOKE_DONE)
    return 0


def arm_summary(ms: float, gains: list[float]) -> dict[str, Any]:
    """A controlled arm's median step time (ms) and its throughput gains over the observed
    runs, per round: the median, the spread and each."""
    return {
        "ms": ms,
        "gain": statistics.median(gains),
        "gain_min": min(gains),
        "gain_max": max(gains),
        "per_round": gains,
    }


def print_decisions_read(trace: Path, job_id: str, job: JobSpec, field: str) -> None:
    """How many of the job's decisions read while it ran (``_decision_trace``) carried
    ``field`` (``schedule``, ``offsets``), and the last of those (or the last read). Read
    after the run, the pacer's window would be empty by then: ``no_phases``."""
    bodies = [json.loads(line) for line in trace.read_text().splitlines()]
    bodies = [b for b in bodies if b.get("job_name") == job.name]
    carrying = [b for b in bodies if b.get("active") and b.get(field)]
    last = carrying[-1] if carrying else (bodies[-1] if bodies else {})
    print(
        f"  pacer for {job_id} ({last.get('policy')}): {field} in {len(carrying)} of "
        f"{len(bodies)} decisions read while it ran; the last: reason {last.get('reason')}, "
        f"{field} {json.dumps(last.get(field))}, interleave {json.dumps(last.get('interleave'))}",
        flush=True,
    )


def print_arm_gains(
    summary: dict[str, Any], arms: tuple[str, ...], what: str, smoke: bool = False
) -> None:
    """Each controlled arm's throughput over the observed run's, beside its target."""
    for arm in arms:
        s, target = summary["arms"][arm], ARM_TARGETS[arm]
        print(
            f"{arm} over observed throughput ({what}): {s['gain']:+.1%} (spread over rounds "
            f"{s['gain_min']:+.1%}..{s['gain_max']:+.1%}); target >= {target:+.0%} where "
            f"phases collide: {verdict(s['gain'] >= target, smoke)}"
        )


def pacer_args_for_arms(args: argparse.Namespace) -> tuple[str, ...]:
    """One pacer for every arm: ``--policy interleave`` (its guard as asked), and by
    ``--job-policy`` the other arms' policies for their jobs' ids (``job-A-pacing1``, ...)."""
    backoff = args.interleave_effect_backoff_s
    return (
        "--policy",
        ARMS["interleave"],
        "--interleave-effect-pairs",
        str(args.interleave_effect_pairs),
        *(() if backoff is None else ("--interleave-effect-backoff-millis", f"{backoff * 1e3:g}")),
        "--job-policy",
        ";".join(f"job-*-{arm}[0-9]*={ARMS[arm]}" for arm in ("pacing", "both")),
    )


def _interleave_effect(body: dict[str, Any]) -> dict[str, Any] | None:
    """The interleave guard's ``effect`` on a decision body (``interleave.effect`` in the
    composition, where pacing's is ``effect``)."""
    if "interleave.effect" in body:
        return body["interleave.effect"]
    return body.get("effect") if body.get("policy") == ARMS["interleave"] else None


def guard_spells(logs: Path, record: str, trace: Path) -> dict[str, Any]:
    """What interleave's effect guard did in one controlled run, from its decision trace and
    the ranks' steps (``steps-{record}.json``): each experiment it judged (gain, bounds,
    state), and the jobs' mean step times in the spells the schedule was published
    (``scheduled``) and withheld to measure (``withheld``), each step by the decision in force
    for its job when it ended (the trace is read once a second; the ranks poll every 0.5 s)."""
    decisions: dict[str, list[tuple[float, str]]] = {}
    judged: list[dict[str, Any]] = []
    seen: set[tuple[str, str, float, int]] = set()
    first: float | None = None
    for line in trace.read_text().splitlines():
        body = json.loads(line)
        first = float(body["t"]) if first is None else first
        # The benchmark's name for the job (A, B): the body's ``job`` is the pacer's id.
        job = body.get("job_name") or str(body["job"]).removeprefix("job-").split("-")[0]
        effect = _interleave_effect(body)
        if body.get("active") and (body.get("schedule") or body.get("offsets")):
            spell = "scheduled"  # or offsets published (--layout sets)
        elif effect and effect.get("state") == "measuring":
            spell = "withheld"  # the guard's phase without the schedule
        elif body.get("reason"):
            spell = "free"  # no schedule, not measuring: no collision, or backed off
        else:
            spell = "other"
        decisions.setdefault(job, []).append((float(body["t"]), spell))
        if effect and effect.get("state") in ("kept", "no_gain"):
            key = (job, effect["state"], effect["gain"], effect["pairs"])
            if key not in seen:
                seen.add(key)
                judged.append({"job": job, "t": round(float(body["t"]) - first, 1), **effect})
    steps_file = logs / f"steps-{record}.json"
    times: dict[str, list[float]] = {"scheduled": [], "withheld": [], "free": []}
    if steps_file.exists():
        for job, ranks in json.loads(steps_file.read_text()).items():
            trace_of = decisions.get(job, [])
            read_at = [t for t, _ in trace_of]  # in time order, as the trace was written
            slowest = max(ranks, key=lambda r: float(r["step_time_mean_s"]))
            ends = slowest.get("step_ends_unix") or []
            for end, took in zip(ends, slowest["step_times_s"], strict=False):
                last = bisect.bisect_right(read_at, end) - 1  # the decision in force at its end
                spell = trace_of[last][1] if last >= 0 else "other"
                if spell in times:
                    times[spell].append(float(took))
    means = {k: statistics.fmean(v) if v else None for k, v in times.items()}
    gain = None
    if means["scheduled"] and means["withheld"]:
        gain = means["withheld"] / means["scheduled"] - 1
    return {
        "judged": judged,
        "scheduled_ms": None if means["scheduled"] is None else 1e3 * means["scheduled"],
        "withheld_ms": None if means["withheld"] is None else 1e3 * means["withheld"],
        "free_ms": None if means["free"] is None else 1e3 * means["free"],
        "steps": {k: len(v) for k, v in times.items()},
        "gain": gain,
    }


def print_spells(arm: str, round_: int, spells: dict[str, Any]) -> None:
    for found in spells["judged"]:
        print(
            f"  {arm} round {round_}: job {found['job']}'s guard judged the schedule "
            f"{found['state']} {found['t']:.0f} s into the run: gain {found['gain']:+.1%} "
            f"(90% bounds {found['low']}..{found['high']}, {found['pairs']} pairs)",
            flush=True,
        )
    if spells["gain"] is not None:
        print(
            f"  {arm} round {round_}: steps in spells scheduled {spells['scheduled_ms']:.1f} ms "
            f"({spells['steps']['scheduled']} steps), withheld {spells['withheld_ms']:.1f} ms "
            f"({spells['steps']['withheld']}): scheduled over withheld throughput "
            f"{spells['gain']:+.1%}",
            flush=True,
        )
    if spells.get("free_ms") is not None:
        print(
            f"  {arm} round {round_}: steps without a schedule outside the experiments "
            "(in turns, or backed off) "
            f"{spells['free_ms']:.1f} ms ({spells['steps']['free']} steps)",
            flush=True,
        )


def start_services(
    stack: contextlib.ExitStack,
    fabric: Fabric,
    logs: Path,
    pacer_args: tuple[str, ...],
) -> Telemetry:
    """The Collector and the pacer (started with ``pacer_args``) in the fabric's operations
    namespace; the ranks' way to them."""
    from skewtrace import _resources
    from skewtrace.cluster.services import Services

    found = _resources.find_otelcol(os.environ)
    otelcol = found.found or _resources.build_otelcol(os.environ)
    configs = [REPO / "collector-config" / "otelcol.yaml"]
    services = stack.enter_context(
        Services(
            fabric,
            otelcol,
            configs,
            logs,
            env=dict(os.environ),
            pacer_args=pacer_args,
        )
    )
    topology = fabric.write_topology_conf(logs / "topology.conf")
    print(f"services: Collector and pacer ({' '.join(pacer_args)}) in {fabric.ops_ns}")
    return Telemetry(services.otlp_for_ranks, services.pacer_for_ranks, topology, services)


def summarize(
    results: dict[str, list[dict[str, float]]], arms: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Medians over rounds of the jobs' mean step times, and the throughput gain of
    interleaving (both jobs' steps per second) over collision, per round and overall; with
    ``arms``, each controlled arm's gain over the observed run of its round."""

    def both(r: dict[str, float]) -> float:
        return 1 / r["A"] + 1 / r["B"]

    def gains(name: str, base_name: str = "colliding") -> list[float]:
        pairs = zip(results[base_name], results[name], strict=True)
        return [both(other) / both(base) - 1 for base, other in pairs]

    def median_ms(name: str) -> float:
        return 1e3 * statistics.median(v for r in results[name] for v in r.values())

    interleaved = gains("interleaved")
    held = gains("interleaved", "scheduled")
    closed: dict[str, Any] = {}
    if arms:
        closed = {"observed_ms": median_ms("observed"), "arms": {}}
        for arm in arms:
            closed["arms"][arm] = arm_summary(median_ms(arm), gains(arm, "observed"))
    return {
        **closed,
        "alone_ms": 1e3 * statistics.median(r["A"] for r in results["alone"]),
        "colliding_ms": median_ms("colliding"),
        "scheduled_ms": median_ms("scheduled"),
        "interleaved_ms": median_ms("interleaved"),
        "scheduled_gain": statistics.median(gains("scheduled")),
        "gain": statistics.median(interleaved),
        "gain_min": min(interleaved),
        "gain_max": max(interleaved),
        "held_gain": statistics.median(held),
        "held_gain_min": min(held),
        "held_gain_max": max(held),
        "target": TARGET_GAIN,
    }


if __name__ == "__main__":
    sys.exit(main())
