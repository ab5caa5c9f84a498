"""``skewtrace demo``: the whole pipeline on one machine, end to end.

Starts ``otelcol-skewtrace`` with ``collector-config/otelcol.yaml`` and a ``skewtrace pacer``
on free local ports, runs ``examples/train_ddp.py`` (4 gloo ranks, one of them made late on
purpose) against them, then reads the Collector's Prometheus endpoint and prints what an
operator would look at: barrier skew, each rank's lateness and wait, the straggler verdict and
its cause. Every part is the real one; nothing is simulated but the straggler itself.

It runs the same from a checkout and from a ``pip install``: the config and the example come
with the package, and the collector binary is found or, with Go installed, built
(:mod:`skewtrace._resources` says where it looks and where it builds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from skewtrace import _resources, semconv
from skewtrace._options import warn_deprecated

COLLECTOR_CONFIG = "collector-config/otelcol.yaml"
FILE_EXPORT_CONFIG = "collector-config/file-export.yaml"
EXAMPLE = "examples/train_ddp.py"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse_prometheus_text(text: str) -> list[Sample]:
    """The samples of a Prometheus text or OpenMetrics page (``prometheus_client``'s parsers:
    label values unescaped, exemplars kept on the OpenMetrics samples)."""
    is_openmetrics = text.rstrip().endswith("# EOF")
    families = (openmetrics_families if is_openmetrics else text_string_to_metric_families)(text)
    return [sample for family in families for sample in family.samples]


@dataclass
class RankReport:
    rank: int
    host: str = ""
    switch: str = ""
    nic: str = ""
    lateness_mean: float = math.nan
    wait_mean: float = math.nan
    step_mean: float = math.nan
    straggler: bool = False
    cause: str = ""
    cost: float = 0.0
    """Seconds per step the flagged rank costs the job (what-if)."""


def summarize(samples: list[Sample], job_id: str) -> tuple[dict[int, RankReport], dict[str, float]]:
    """Per-rank lateness/wait/step means, verdicts and costs, plus job-wide figures: skew, the
    what-if slowdown, and ``suspect:<kind>:<name>`` = 1 for each suspected part of the fabric."""
    ranks: dict[int, RankReport] = {}
    sums: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, int], float] = {}
    job: dict[str, float] = {}
    label = semconv.prometheus_label
    rank_label, job_label = label(semconv.RANK), label(semconv.JOB_ID)
    per_rank = (semconv.PROM_RANK_LATENESS, semconv.PROM_RANK_WAIT, semconv.PROM_STEP_DURATION)
    for s in samples:
        if s.labels.get(job_label) not in (None, job_id):
            continue
        if s.name == semconv.PROM_BARRIER_SKEW + "_sum":
            job["skew_sum"] = job.get("skew_sum", 0.0) + s.value
        elif s.name == semconv.PROM_BARRIER_SKEW + "_count":
            job["collectives"] = job.get("collectives", 0.0) + s.value
        elif s.name == semconv.PROM_COLLECTIVE_INCOMPLETE:
            job["incomplete"] = job.get("incomplete", 0.0) + s.value
        elif s.name == semconv.PROM_JOB_SLOWDOWN:
            job["slowdown"] = s.value
        elif s.name == semconv.PROM_FABRIC_SUSPECT and s.value >= 1:
            kind = s.labels.get(label(semconv.SUSPECT_KIND), "")
            name = s.labels.get(label(semconv.SUSPECT_NAME), "")
            host = s.labels.get(label(semconv.HOST_NAME), "")
            job[f"suspect:{kind}:{host + '/' if host else ''}{name}"] = 1.0
        if rank_label not in s.labels:
            continue
        rank = int(s.labels[rank_label])
        report = ranks.setdefault(rank, RankReport(rank))
        report.host = s.labels.get(label(semconv.HOST_NAME), report.host)
        report.switch = s.labels.get(label(semconv.SWITCH), report.switch)
        report.nic = s.labels.get(label(semconv.NIC), report.nic)
        for metric in per_rank:
            if s.name == metric + "_sum":
                sums[(metric, rank)] = sums.get((metric, rank), 0.0) + s.value
            elif s.name == metric + "_count":
                counts[(metric, rank)] = counts.get((metric, rank), 0.0) + s.value
        if s.name == semconv.PROM_STRAGGLER and s.value >= 1:
            report.straggler = True
            report.cause = s.labels.get(label(semconv.STRAGGLER_CAUSE), "")
        elif s.name == semconv.PROM_RANK_COST:
            report.cost = s.value
    for (metric, rank), total in sums.items():
        n = counts.get((metric, rank), 0.0)
        mean = total / n if n else math.nan
        report = ranks[rank]
        if metric == semconv.PROM_RANK_LATENESS:
            report.lateness_mean = mean
        elif metric == semconv.PROM_RANK_WAIT:
            report.wait_mean = mean
        else:
            report.step_mean = mean
    return ranks, job


@contextmanager
def _process(
    cmd: list[str], env: Mapping[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_http_ok(url: str, timeout_s: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args!r} exited ({proc.returncode}); see {log}:\n"
                + log.read_text(errors="replace")[-3000:]
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s; see {log}")


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


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


def run_demo(args: argparse.Namespace) -> int:
    try:
        config = _input(args.collector_config, COLLECTOR_CONFIG, "the collector config")
        example = _input(args.example, EXAMPLE, "the example training script")
        otelcol = _otelcol(args, os.environ)
    except DemoError as exc:
        print(f"skewtrace demo: {exc}", file=sys.stderr)
        return 2
    ports = {
        name: _free_port()
        for name in ("otlp_grpc", "otlp_http", "prom", "health", "own", "pacer_grpc", "pacer_http")
    }
    job_id = args.job_id or f"demo-{os.getpid()}"
    workdir = Path(tempfile.mkdtemp(prefix="skewtrace-demo-"))
    env = dict(os.environ)
    env.update(
        {
            "SKEWTRACE_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['otlp_grpc']}",
            "SKEWTRACE_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['otlp_http']}",
            "SKEWTRACE_PROMETHEUS_ENDPOINT": f"127.0.0.1:{ports['prom']}",
            "SKEWTRACE_HEALTH_ENDPOINT": f"127.0.0.1:{ports['health']}",
            "SKEWTRACE_OTELCOL_METRICS_PORT": str(ports["own"]),
            "SKEWTRACE_PACER_OTLP_ENDPOINT": f"127.0.0.1:{ports['pacer_grpc']}",
            "SKEWTRACE_FILE_EXPORT_PATH": str(workdir / "spans.jsonl"),
        }
    )
    collector_cmd = [str(otelcol), "--config", str(config)]
    file_export = config.with_name(Path(FILE_EXPORT_CONFIG).name)
    if file_export.is_file():
        collector_cmd += ["--config", str(file_export)]
    pacer_cmd = [
        sys.executable,
        "-m",
        "skewtrace.cli",
        "pacer",
        "--otlp-grpc",
        f"127.0.0.1:{ports['pacer_grpc']}",
        "--http",
        f"127.0.0.1:{ports['pacer_http']}",
    ]
    train_env = dict(env)
    train_env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['otlp_grpc']}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "SKEWTRACE_JOB_ID": job_id,
        }
    )
    if args.pacing:
        train_env["SKEWTRACE_PACER_URL"] = f"http://127.0.0.1:{ports['pacer_http']}"
    train_cmd = [
        sys.executable,
        str(example),
        "--nprocs",
        str(args.nprocs),
        "--steps",
        str(args.steps),
        "--job-id",
        job_id,
        "--straggler",
        args.straggler,
    ]
    print(f"skewtrace demo: job {job_id}, logs and spans in {workdir}")
    print(f"  collector: {otelcol} --config {config}")
    with (
        _process(collector_cmd, env, workdir / "otelcol.log") as collector,
        _process(pacer_cmd, env, workdir / "pacer.log") as pacer,
    ):
        _wait_http_ok(
            f"http://127.0.0.1:{ports['health']}/", 60, collector, workdir / "otelcol.log"
        )
        _wait_http_ok(
            f"http://127.0.0.1:{ports['pacer_http']}/healthz", 30, pacer, workdir / "pacer.log"
        )
        print(
            f"  collector up (OTLP 127.0.0.1:{ports['otlp_grpc']}, "
            f"metrics http://127.0.0.1:{ports['prom']}/metrics); pacer up"
        )
        print(f"  training: {' '.join(train_cmd[1:])}")
        train = subprocess.run(
            train_cmd,
            env=train_env,
            capture_output=True,
            text=True,
            timeout=args.timeout_s,
            check=False,
        )
        (workdir / "train.log").write_text(train.stdout + train.stderr)
        if train.returncode != 0:
            print(
                f"skewtrace demo: training failed ({train.returncode}):\n{train.stderr[-3000:]}",
                file=sys.stderr,
            )
            return 1
        # The ranks flush at exit; the connector publishes every second.
        time.sleep(args.settle_s)
        samples = parse_prometheus_text(_scrape(f"http://127.0.0.1:{ports['prom']}/metrics"))
        pacing = (
            _scrape(f"http://127.0.0.1:{ports['pacer_http']}/v1/pacing?job={job_id}")
            if args.pacing
            else ""
        )
    ranks, job = summarize(samples, job_id)
    _print_report(job_id, ranks, job, train.stdout, pacing)
    if not ranks:
        print(
            f"skewtrace demo: the collector reported no ranks; see the logs in {workdir}",
            file=sys.stderr,
        )
        return 1
    return 0


def _print_report(
    job_id: str, ranks: dict[int, RankReport], job: dict[str, float], train_stdout: str, pacing: str
) -> None:
    collectives = job.get("collectives", 0.0)
    mean_skew = job.get("skew_sum", 0.0) / collectives if collectives else math.nan
    print(
        f"\njob {job_id}: {collectives:.0f} collectives joined across ranks, "
        f"mean barrier skew {mean_skew * 1e3:.1f} ms, "
        f"{job.get('incomplete', 0.0):.0f} released incomplete"
    )
    print(
        f"{'rank':>4}  {'host':<14} {'switch':<10} {'nic':<8} {'step ms':>8} "
        f"{'late ms':>8} {'wait ms':>8}  verdict"
    )
    for rank in sorted(ranks):
        r = ranks[rank]
        verdict = "ok"
        if r.straggler:
            verdict = f"STRAGGLER ({r.cause}), costs {r.cost * 1e3:.1f} ms per step"
        print(
            f"{rank:>4}  {r.host[:14]:<14} {r.switch[:10]:<10} {r.nic[:8]:<8} "
            f"{r.step_mean * 1e3:>8.1f} {r.lateness_mean * 1e3:>8.1f} "
            f"{r.wait_mean * 1e3:>8.1f}  {verdict}"
        )
    slowdown = job.get("slowdown")
    if slowdown and slowdown > 1:
        print(
            f"what-if: steps would be {(1 - 1 / slowdown) * 100:.0f}% shorter with the flagged "
            f"ranks' own work at their peers' median (slowdown {slowdown:.2f})"
        )
    for key in sorted(k for k in job if k.startswith("suspect:")):
        _, kind, name = key.split(":", 2)
        print(f"suspected {kind}: {name}")
    for line in train_stdout.splitlines():
        if '"step_stats"' in line:
            try:
                stats = json.loads(line)
            except ValueError:
                continue
            if stats.get("rank") == 0:
                print(f"training (rank 0, from the script itself): {line}")
    if pacing:
        print(f"pacer decision: {pacing}")


def add_parser(subparsers: Any) -> None:
    demo = subparsers.add_parser(
        "demo", help="run the collector, the pacer and a 4-rank job with a straggler, end to end"
    )
    demo.add_argument(
        "--otelcol",
        default=None,
        metavar="PATH",
        help="the otelcol-skewtrace binary (default: $SKEWTRACE_OTELCOL, a checkout's "
        "build/otelcol-skewtrace, otelcol-skewtrace on PATH, the cache; built there with Go "
        "when none exists)",
    )
    demo.add_argument(
        "--collector-config",
        default=None,
        metavar="PATH",
        help=f"the collector config (default: the package's {COLLECTOR_CONFIG})",
    )
    demo.add_argument(
        "--example",
        default=None,
        metavar="PATH",
        help=f"the training script (default: the package's {EXAMPLE})",
    )
    demo.add_argument("--nprocs", type=int, default=4)
    demo.add_argument("--steps", type=int, default=80)
    demo.add_argument(
        "--straggler",
        default="2:compute:0.04",
        help="RANK:KIND:AMOUNT, KIND compute|data|sleep (default 2:compute:0.04)",
    )
    demo.add_argument("--pacing", action="store_true", help="let the ranks poll the pacer")
    demo.add_argument("--job-id", default=None)
    _duration(demo, "--settle", 4.0, "wait after training for the last spans and metrics")
    _duration(demo, "--timeout", 600.0, "give up on the training run after this long")
    demo.set_defaults(run=run_demo)


def _duration(parser: argparse.ArgumentParser, stem: str, default_s: float, what: str) -> None:
    """``STEM-millis`` (and the deprecated ``STEM-s``, in seconds) into ``args.STEM_s``."""
    dest = stem.lstrip("-").replace("-", "_") + "_s"
    flag, old = f"{stem}-millis", f"{stem}-s"

    def millis(raw: str) -> float:
        return float(raw) / 1000.0

    def seconds(raw: str) -> float:
        warn_deprecated(old, flag, " (milliseconds; the old name took seconds)")
        return float(raw)

    parser.add_argument(
        flag,
        dest=dest,
        type=millis,
        default=default_s,
        metavar="MILLIS",
        help=f"{what} (default {default_s * 1000:g})",
    )
    parser.add_argument(old, dest=dest, type=seconds, help=argparse.SUPPRESS)
