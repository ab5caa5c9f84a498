"""``skewtrace demo``: the main job. A multi-node training job on an emulated leaf/spine
fabric, with faults injected, diagnosed and paced live by the real Collector and pacer.

1. Builds the cluster (:mod:`skewtrace.cluster.fabric`): a network namespace per node behind
   leaf switches and a rate-limited spine, a Slurm ``topology.conf`` for it, and an
   operations namespace for the Collector and the pacer. Without root or namespaces it runs
   the same job over loopback (:mod:`skewtrace.cluster.loopback`) and says so.
2. Runs ``examples/train_2d.py`` (pipeline x data parallel, gloo over TCP between the nodes:
   several process groups) with the chosen faults (:mod:`skewtrace.cluster.scenarios`), with
   pacing off and on, in pairs of runs in alternating order (off, on, on, off: the machine's
   drift over the runs favours neither), showing a live view (:mod:`skewtrace.cluster.live`).
3. Prints what was injected, what skewtrace concluded and how fast, iteration-time CV and
   throughput with pacing off and on; writes an HTML report and a JSON summary; says where
   the traces and metrics are and what to query.

Everything it creates (namespaces, links, qdiscs, processes) is removed on the way out, also
on Ctrl-C or a failure; a run after a killed one first removes what that one left.

It runs the same from a checkout and from a ``pip install``: the configs and the example come
with the package, and the collector binary is found or, with Go installed, built
(:mod:`skewtrace._resources` says where it looks and where it builds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from rich.console import Console

from skewtrace import _resources, semconv
from skewtrace.cluster import fabric as fabric_mod
from skewtrace.cluster import netns
from skewtrace.cluster.defaults import (
    COLLECTOR_CONFIG,
    DEFAULT_FABRIC_SCENARIO,
    DEFAULT_LOOPBACK_SCENARIO,
    EXAMPLE,
    FILE_EXPORT_CONFIG,
)
from skewtrace.cluster.fabric import Fabric, FabricSpec
from skewtrace.cluster.job import JobFailed, JobPlan, finish, run_job
from skewtrace.cluster.live import LiveView
from skewtrace.cluster.loopback import Loopback
from skewtrace.cluster.metrics import RankReport, parse_prometheus_text, summarize
from skewtrace.cluster.outcome import evaluate, read_verdicts
from skewtrace.cluster.scenarios import Fault
from skewtrace.cluster.services import ServiceError, Services
from skewtrace.cluster.summary import (
    RunSummary,
    Summary,
    conclusions,
    injected,
    pacing_order,
    summarize_run,
)
from skewtrace.report import InfoTable, ReportError, RunInfo, write_report

__all__ = ["RankReport", "parse_prometheus_text", "run_demo", "summarize"]


class DemoError(Exception):
    """The demo cannot start; the message says why and what to do."""


def _otelcol(args: argparse.Namespace, env: Mapping[str, str]) -> Path:
    if args.otelcol:
        path = Path(args.otelcol)
        if not path.is_file():
            raise DemoError(f"--otelcol {path}: not a file")
        return path
    lookup = _resources.find_otelcol(env)
    if lookup.found is not None:
        return lookup.found
    if env.get(_resources.SKEWTRACE_OTELCOL, "").strip():
        raise DemoError(f"{lookup.tried[0]}: not a file")
    try:
        return _resources.build_otelcol(env)
    except _resources.BuildError as exc:
        raise DemoError(_resources.how_to_get_otelcol(lookup, str(exc), env)) from None


def _input(given: str | None, shipped: str, what: str) -> Path:
    if given:
        path = Path(given)
        if not path.is_file():
            raise DemoError(f"{path} not found: {what}")
        return path
    found = _resources.shipped(shipped)
    if found is None:
        raise DemoError(f"{shipped} ({what}) is missing from this installation of skewtrace")
    return found


def _cluster(args: argparse.Namespace, spec: FabricSpec, console: Console) -> Fabric | Loopback:
    if args.fabric == "loopback":
        return Loopback(spec)
    reason = netns.unavailable_reason()
    if reason is None:
        removed = fabric_mod.remove_stale()
        if removed:
            console.print(f"removed {len(removed)} namespaces an earlier, killed run left")
        return Fabric(spec)
    if args.fabric == "netns":
        raise DemoError(f"--fabric netns: network namespaces cannot be used here: {reason}")
    console.print(
        f"[yellow]No emulated fabric ({reason}): running the job on loopback, on one host; "
        "only faults of the ranks' own work (compute, data, jitter, hetero) can be shown."
        "[/yellow]"
    )
    return Loopback(spec)


def _faults(args: argparse.Namespace, cluster: Fabric | Loopback) -> list[Fault]:
    texts = args.scenario or [
        DEFAULT_FABRIC_SCENARIO if cluster.emulates_network else DEFAULT_LOOPBACK_SCENARIO
    ]
    faults = []
    for text in texts:
        try:
            fault = Fault.parse(text)
            fault.check(cluster)
        except ValueError as exc:
            raise DemoError(f"--scenario {exc}") from None
        if fault.end is not None and fault.end > args.steps:
            raise DemoError(f"--scenario {fault}: ends after the last step ({args.steps})")
        faults.append(fault)
    return faults


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_demo(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    try:
        spec = FabricSpec(
            leaves=args.leaves,
            nodes_per_leaf=args.nodes_per_leaf,
            ranks_per_node=args.ranks_per_node,
            nic_mbit=args.nic_mbit,
            uplink_mbit=args.uplink_mbit,
        )
        configs = [_input(args.collector_config, COLLECTOR_CONFIG, "the collector config")]
        file_export = configs[0].with_name(Path(FILE_EXPORT_CONFIG).name)
        if not file_export.is_file():
            raise DemoError(f"{file_export} (the file export overlay) is missing")
        configs.append(file_export)
        example = _input(args.example, EXAMPLE, "the example training script")
        otelcol = _otelcol(args, os.environ)
        cluster = _cluster(args, spec, console)
        faults = _faults(args, cluster)
    except (DemoError, ValueError) as exc:
        print(f"skewtrace demo: {exc}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="skewtrace-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    base = args.job_id or f"demo-{os.getpid()}"
    pacing = [args.pacing == "on"] if args.pacing != "both" else pacing_order(args.pairs)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(
            args, console, cluster, faults, example, otelcol, configs, workdir, base, pacing
        )
    except KeyboardInterrupt:
        print(
            "skewtrace demo: interrupted; everything it started is being removed", file=sys.stderr
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(
    args: argparse.Namespace,
    console: Console,
    cluster: Fabric | Loopback,
    faults: list[Fault],
    example: Path,
    otelcol: Path,
    configs: list[Path],
    workdir: Path,
    base: str,
    pacing: list[bool],
) -> int:
    console.print(f"skewtrace demo: {cluster.describe()}")
    console.print(f"  logs, spans and the report in {workdir}")
    for fault in faults:
        console.print(f"  injecting {fault}: {fault.describe(cluster)}")
    env: dict[str, str] = {}
    script_args = ["--pp", str(args.leaves)]
    with cluster:
        if isinstance(cluster, Fabric):
            topology = cluster.write_topology_conf(workdir / "topology.conf")
            env["SKEWTRACE_TOPOLOGY"] = str(topology)
            console.print(f"  Slurm topology for the ranks: {topology}")
        try:
            services_cm = Services(cluster, otelcol, configs, workdir, env=dict(os.environ))
            with services_cm as services:
                where = (
                    f"operations namespace {cluster.driver_netns}"
                    if cluster.driver_netns
                    else "loopback"
                )
                console.print(f"  collector and pacer up ({where})")
                runs: list[RunSummary] = []
                for paced in pacing:
                    label = "pacing on" if paced else "pacing off"
                    again = sum(r.result.plan.pacing is paced for r in runs)
                    plan = JobPlan(
                        job_id=f"{base}-{'paced' if paced else 'unpaced'}"
                        + (f"-{again + 1}" if again else ""),
                        script=example,
                        steps=args.steps,
                        faults=tuple(faults),
                        pacing=paced,
                        script_args=tuple(script_args),
                        timeout_s=args.timeout_s,
                        env=tuple(env.items()),
                    )
                    console.print(f"\n[bold]{label}[/bold]: job {plan.job_id}, {args.steps} steps")
                    with LiveView(console, paced, title=f"{plan.job_id} ({label})") as view:
                        result = run_job(
                            cluster, services, plan, workdir / plan.job_id,
                            on_tick=None if args.quiet else view.update,
                            tick_s=0.5,
                        )  # fmt: skip
                    finish(services, result, args.settle_s)
                    verdicts = read_verdicts(services.spans_path, plan.job_id)
                    outcome = evaluate(result, verdicts, cluster)
                    runs.append(summarize_run(label, result, outcome, services.spans_path))
        except (ServiceError, JobFailed) as exc:
            print(f"skewtrace demo: {exc}", file=sys.stderr)
            return 1
        summary = Summary(
            cluster.describe(), injected(faults, cluster, [r.result for r in runs]), runs
        )
    console.print("\n[bold]summary[/bold]")
    for line in summary.lines():  # not wrapped: a line is one figure, copied whole
        console.print(line, highlight=False, soft_wrap=True)
    _print_final(console, runs[-1].result.final, runs[-1].result.final_job)
    (workdir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    reports = _write_reports(workdir, summary, services_cm.spans_path)
    console.print("")
    for line in _where(workdir, reports, [r.result.plan.job_id for r in runs]):
        console.print(line, highlight=False, soft_wrap=True)
    if not any(r.result.final for r in runs):
        print(f"skewtrace demo: the collector reported no ranks; see {workdir}", file=sys.stderr)
        return 1
    return 0


def _print_final(console: Console, ranks: dict[int, RankReport], job: dict[str, float]) -> None:
    collectives = job.get("collectives", 0.0)
    mean_skew = job.get("skew_sum", 0.0) / collectives if collectives else float("nan")
    console.print(
        f"\nlast run, whole job: {collectives:.0f} collectives joined across ranks, "
        f"mean barrier skew {mean_skew * 1e3:.1f} ms, "
        f"{job.get('incomplete', 0.0):.0f} released incomplete"
    )
    console.print(
        f"{'rank':>4}  {'host':<10} {'switch':<8} {'nic':<6} {'step ms':>8} "
        f"{'late ms':>8} {'wait ms':>8}  verdict"
    )
    for rank in sorted(ranks):
        r = ranks[rank]
        verdict = "ok"
        if r.straggler:
            verdict = f"STRAGGLER ({r.cause}), costs {r.cost * 1e3:.1f} ms per step"
        console.print(
            f"{rank:>4}  {r.host[:10]:<10} {r.switch[:8]:<8} {r.nic[:6]:<6} "
            f"{r.step_mean * 1e3:>8.1f} {r.lateness_mean * 1e3:>8.1f} "
            f"{r.wait_mean * 1e3:>8.1f}  {verdict}",
            highlight=False,
        )
    for key in sorted(k for k in job if k.startswith("suspect:")):
        _, kind, name = key.split(":", 2)
        console.print(f"suspected {kind}: {name}")


def _write_reports(workdir: Path, summary: Summary, spans: Path) -> list[Path]:
    """One HTML report per run, with the summary's figures beside the charts."""
    figures = [
        (
            f"{run.label}: iteration time / CV / throughput",
            f"{run.figures.get('step_time_mean_s', float('nan')) * 1e3:.1f} ms / "
            f"{run.figures.get('step_time_cv', float('nan')):.3f} / "
            f"{run.figures.get('throughput', float('nan')):.1f} samples/s",
        )
        for run in summary.runs
        if run.figures
    ]
    out = []
    for run in summary.runs:
        info = RunInfo(
            title=f"{run.label}: {summary.cluster}",
            injected=summary.injected,
            concluded=conclusions(run.outcome),
            figures=figures,
            tables=[_phase_table(run)],
            notes=[f"job {run.result.plan.job_id}; logs in {run.result.logs}"],
        )
        path = workdir / f"report-{run.result.plan.job_id}.html"
        try:
            write_report(spans, path, job_id=run.result.plan.job_id, run_info=info)
        except ReportError as exc:
            print(f"skewtrace demo: no report for {run.label}: {exc}", file=sys.stderr)
            continue
        out.append(path)
    return out


def _phase_table(run: RunSummary) -> InfoTable:
    rows = []
    for p in run.outcome.phases:
        if p.expected.quiet and not p.expected.allowed:
            continue
        rows.append(
            [
                f"{p.first}-{p.last}",
                p.expected.describe(),
                p.concluded or "nothing flagged",
                "yes" if p.right or p.expected.quiet else "no",
                "-" if p.steps_to_flag is None else str(p.steps_to_flag),
                "-" if p.flag_seconds is None else f"{p.flag_seconds:.1f}",
            ]
        )
    return InfoTable(
        title="Expected and concluded",
        columns=["steps", "expected", "concluded", "right", "steps to flag", "seconds to flag"],
        rows=rows,
    )


def _where(workdir: Path, reports: list[Path], jobs: list[str]) -> list[str]:
    job = jobs[-1]
    sel = f'{semconv.prometheus_label(semconv.JOB_ID)}="{job}"'
    job_attr, summary = semconv.JOB_ID, semconv.SPAN_STEP_SUMMARY
    skew = semconv.PROM_BARRIER_SKEW
    lines = [
        f"spans (OTLP JSON, every rank's and the step summaries): {workdir / 'spans.jsonl'}",
        f"summary: {workdir / 'summary.json'}",
    ]
    lines += [f"report: {report}  (open it in a browser)" for report in reports]
    lines += [
        "in Grafana/Tempo and Prometheus (docs/viewing.md; `docker compose up` in grafana/):",
        f'  TraceQL, the verdicts:   {{ resource.{job_attr} = "{job}" && name = "{summary}" }}',
        f'  TraceQL, late ranks:     {{ resource.{job_attr} = "{job}" && '
        f"span.{semconv.STRAGGLER} = true }}",
        f"  PromQL, who is flagged:  {semconv.PROM_STRAGGLER}{{{sel}}} == 1",
        f"  PromQL, what it costs:   {semconv.PROM_RANK_COST}{{{sel}}}",
        f"  PromQL, fabric suspects: {semconv.PROM_FABRIC_SUSPECT}{{{sel}}} == 1",
        f"  PromQL, skew p90:        histogram_quantile(0.9, sum by (le) "
        f"(rate({skew}_bucket{{{sel}}}[1m])))",
    ]
    return lines
