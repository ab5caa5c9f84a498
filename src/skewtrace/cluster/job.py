"""One run of the training job on a cluster: launch every rank, follow its progress, switch
network faults at their steps, and collect what the ranks and the services reported.

Each rank is its own process, started the way a launcher would (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``) inside its node. Rank 0 writes one line per
finished step to a progress file; :func:`run_job` polls it to switch ``nic``/``uplink``
faults at the job's own steps and to know when each step ended. Every second it calls
``on_tick`` with a :class:`Tick` (the live view draws it) after scraping the Collector and
the pacer. Whatever happens, the ranks are stopped and the links restored on the way out.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.samples import Sample

from skewtrace._options import finite_number
from skewtrace._ports import free_port
from skewtrace.cluster import metrics
from skewtrace.cluster.scenarios import Fault, Placement
from skewtrace.cluster.services import Services


class Cluster(Placement, Protocol):
    @property
    def master_addr(self) -> str: ...

    @property
    def driver_netns(self) -> str | None: ...

    def rank_argv(self, rank: int, argv: list[str]) -> list[str]: ...

    def rank_env(self, rank: int) -> dict[str, str]: ...

    def set_nic_rate(self, node_name: str, mbit: float | None) -> None: ...

    def set_uplink_rate(self, leaf: str, mbit: float | None) -> None: ...


class JobFailed(RuntimeError):
    """A rank failed or the job ran out of time; the message has the end of the rank's log."""


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    script: Path
    steps: int
    faults: tuple[Fault, ...] = ()
    pacing: bool = False
    script_args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class Tick:
    """What the orchestrator knows at one moment of a run (the live view's input)."""

    t: float
    job_id: str
    step: int
    steps: int
    steps_per_s: float
    ranks: dict[int, metrics.RankReport]
    """Means over the last few seconds; verdicts and costs as of now."""
    job: dict[str, float]
    pacing: dict[str, Any]
    active: list[str]
    """Faults active at ``step``."""


@dataclass
class Observation:
    """The verdicts the Collector's metrics showed at wall time ``t``."""

    t: float
    step: int
    flagged: dict[int, str]
    suspects: set[str]


@dataclass
class JobResult:
    plan: JobPlan
    started: float
    ended: float
    step_ends: dict[int, float]
    """Wall time each step ended on rank 0."""
    switched: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Network faults: ``"<fault> on"``/``"<fault> off"`` -> (first step affected, wall time)."""
    stats: list[dict[str, Any]] = field(default_factory=list)
    """Each rank's ``step_stats`` line."""
    observations: list[Observation] = field(default_factory=list)
    final: dict[int, metrics.RankReport] = field(default_factory=dict)
    final_job: dict[str, float] = field(default_factory=dict)
    pacing: dict[str, Any] = field(default_factory=dict)
    logs: Path | None = None

    def step_start(self, step: int) -> float:
        """Wall time ``step`` began on rank 0 (the previous step's end)."""
        if step <= 0 or step - 1 not in self.step_ends:
            return self.step_ends.get(0, self.started) if step <= 0 else math.nan
        return self.step_ends[step - 1]


class _Progress:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.ends: dict[int, float] = {}
        self._partial = ""

    def poll(self) -> int:
        """Read new lines; return the last finished step (-1 before the first)."""
        try:
            with self.path.open() as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            chunk = ""
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                entry = json.loads(line)
                self.ends[int(entry["step"])] = float(entry["t"])
            except (ValueError, KeyError, TypeError):
                continue
        return max(self.ends, default=-1)


def _switch(cluster: Cluster, fault: Fault, on: bool) -> None:
    rate = fault.amount if on else None
    if fault.kind == "nic":
        cluster.set_nic_rate(fault.target, rate)
    elif fault.kind == "uplink":
        cluster.set_uplink_rate(fault.target, rate)


def _observe(samples: list[Sample], job_id: str, step: int, t: float) -> Observation:
    ranks, job = metrics.summarize(samples, job_id)
    return Observation(
        t=t,
        step=step,
        flagged={r: rep.cause for r, rep in ranks.items() if rep.straggler},
        suspects={k.split(":", 1)[1] for k in job if k.startswith("suspect:")},
    )


def run_job(
    cluster: Cluster,
    services: Services,
    plan: JobPlan,
    workdir: Path,
    on_tick: Callable[[Tick], None] | None = None,
    tick_s: float = 1.0,
) -> JobResult:
    workdir.mkdir(parents=True, exist_ok=True)
    progress_path = workdir / "progress.jsonl"
    progress_path.unlink(missing_ok=True)
    progress = _Progress(progress_path)
    network = [f for f in plan.faults if f.needs_network]
    world = cluster.world_size
    port = "29500" if cluster.driver_netns is not None else str(free_port())
    argv = [
        sys.executable, str(plan.script),
        "--steps", str(plan.steps),
        "--job-id", plan.job_id,
        "--progress-file", str(progress_path),
        *plan.script_args,
        *(a for f in plan.faults for a in f.train_args(cluster)),
    ]  # fmt: skip
    base_env = dict(os.environ)
    base_env.setdefault("SKEWTRACE_EXPORT_INTERVAL_MILLIS", "200")
    base_env.update(dict(plan.env))
    base_env.update(
        {
            "WORLD_SIZE": str(world),
            "MASTER_PORT": port,
            "SKEWTRACE_JOB_ID": plan.job_id,
            "OTEL_EXPORTER_OTLP_ENDPOINT": services.otlp_for_ranks,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if plan.pacing:
        base_env["SKEWTRACE_PACER_URL"] = services.pacer_for_ranks
    else:
        base_env.pop("SKEWTRACE_PACER_URL", None)
    result = JobResult(plan, started=time.time(), ended=math.nan, step_ends=progress.ends)
    result.logs = workdir
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    switched_on: set[Fault] = set()
    try:
        for fault in network:
            if fault.start == 0:
                _switch(cluster, fault, True)
                switched_on.add(fault)
                result.switched[f"{fault} on"] = (0, time.time())
        for rank in range(world):
            env = dict(base_env)
            env.update(cluster.rank_env(rank))
            env.update({"RANK": str(rank), "LOCAL_RANK": str(rank % _per_node(cluster, rank))})
            log = (workdir / f"rank{rank}.log").open("wb")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    cluster.rank_argv(rank, argv), env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )
        deadline = time.monotonic() + plan.timeout_s
        before: dict[int, metrics.RankReport] = {}
        last_tick, last_tick_step = 0.0, -1
        while True:
            done = [p.poll() for p in procs]
            step = progress.poll()
            now = time.time()
            for fault in network:
                if (
                    fault not in switched_on
                    and step + 1 >= fault.start
                    and (fault.end is None or step + 1 < fault.end)
                ):
                    _switch(cluster, fault, True)
                    switched_on.add(fault)
                    result.switched[f"{fault} on"] = (step + 1, now)
                elif fault in switched_on and fault.end is not None and step + 1 >= fault.end:
                    _switch(cluster, fault, False)
                    switched_on.discard(fault)
                    result.switched[f"{fault} off"] = (step + 1, now)
            failed = [(r, c) for r, c in enumerate(done) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                raise JobFailed(
                    f"rank {rank} exited with {code}; {workdir / f'rank{rank}.log'}:\n"
                    + _tail(workdir / f"rank{rank}.log")
                )
            if all(c == 0 for c in done):
                break
            if time.monotonic() > deadline:
                raise JobFailed(
                    f"the job did not finish within {plan.timeout_s:.0f} s (at step {step}); "
                    f"rank 0's log:\n" + _tail(workdir / "rank0.log")
                )
            if now - last_tick >= tick_s:
                rate = (step - last_tick_step) / (now - last_tick) if last_tick else 0.0
                last_tick, last_tick_step = now, step
                before = _tick(services, plan, step, now, rate, before, result, on_tick)
            time.sleep(0.05)
        result.ended = time.time()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        for fault in switched_on:
            _switch(cluster, fault, False)
    progress.poll()
    result.stats = [s for rank in range(world) for s in _step_stats(workdir / f"rank{rank}.log")]
    return result


def _tick(
    services: Services,
    plan: JobPlan,
    step: int,
    now: float,
    rate: float,
    before: dict[int, metrics.RankReport],
    result: JobResult,
    on_tick: Callable[[Tick], None] | None,
) -> dict[int, metrics.RankReport]:
    try:
        samples = metrics.parse_prometheus_text(services.scrape())
    except (OSError, ValueError):
        return before
    ranks, job = metrics.summarize(samples, plan.job_id)
    result.observations.append(_observe(samples, plan.job_id, step, now))
    pacing = services.pacing(plan.job_id) if plan.pacing else {}
    if on_tick is not None:
        on_tick(
            Tick(
                t=now,
                job_id=plan.job_id,
                step=step,
                steps=plan.steps,
                steps_per_s=rate,
                ranks=metrics.window(before, ranks),
                job=job,
                pacing=pacing,
                active=[str(f) for f in plan.faults if f.active(max(step, 0))],
            )
        )
    return ranks


def finish(services: Services, result: JobResult, settle_s: float) -> None:
    """After the ranks exit: wait for the last spans and metrics, then record the final
    verdicts and the pacer's last decision."""
    time.sleep(settle_s)
    try:
        samples = metrics.parse_prometheus_text(services.scrape())
    except (OSError, ValueError):
        return
    result.final, result.final_job = metrics.summarize(samples, result.plan.job_id)
    if result.plan.pacing:
        result.pacing = services.pacing(result.plan.job_id)


def _per_node(cluster: Cluster, rank: int) -> int:
    spec = getattr(cluster, "spec", None)
    return int(getattr(spec, "ranks_per_node", 1) or 1)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _step_stats(log: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        if '"step_stats"' not in line:
            continue
        try:
            entry = json.loads(line[line.index("{") :])
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def job_figures(stats: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Iteration-time mean and CV and throughput from the ranks' own ``step_stats``
    (rank 0's iteration times: in synchronous training every rank runs at the same pace)."""
    rank0 = [s for s in stats if s.get("rank") == 0]
    if not rank0:
        return {}
    s = rank0[0]
    return {
        "step_time_mean_s": _number(s.get("step_time_mean_s")),
        "step_time_cv": _number(s.get("step_time_cv")),
        "throughput": _number(s.get("throughput_samples_s")),
    }


def _number(value: object) -> float:
    """A figure from a rank's log; NaN for one missing or not a finite number (a log is
    input)."""
    number = finite_number(value)
    return math.nan if number is None else number
