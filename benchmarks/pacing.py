"""Pacing off vs on: the same jittered DDP job, interleaved runs, with the real pipeline.

Every run is ``examples/train_ddp.py`` (4 gloo ranks by default, random per-step jitter on
some ranks) sending spans to the built ``otelcol-skewtrace`` (``collector-config/otelcol.yaml``),
whose ``barrierskew`` connector pushes metrics to a ``skewtrace pacer``. The only difference
between the two modes is whether the ranks are given ``SKEWTRACE_PACER_URL``. Runs alternate
(off, on, on, off, ...) so that drift in the shared machine's load hits both modes alike.

"pacer on" is the share of the run during which the pacer's decision for the job was active;
it decides in both modes (the metrics flow either way), but only "on" ranks apply it.

Printed per mode (means over runs, rank 0): iteration-time CV, mean and p99 step time
(p99 from rank 0's ``train.step`` spans, which the collector forwards to an in-process OTLP
sink) and throughput (samples/s), then the on/off ratios beside the paper's figures: CV 0.22
-> 0.09 at 64 nodes (ratio 0.41) and throughput -0.6%..+0.8% at 4-8 nodes.

    python benchmarks/pacing.py --runs 3 --steps 300 --jitter 1,3:0.06
    python benchmarks/pacing.py --smoke    # one run per mode, 2 ranks, 12 steps

The harness here (collector + pacer + sink, launching a training run) is also what
``tests/test_pacer_e2e.py`` uses.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from _smoke import SMOKE_DONE, SMOKE_HELP  # noqa: E402
from otlp_sink import OtlpSink, ReceivedSpan  # noqa: E402
from skewtrace import semconv  # noqa: E402
from skewtrace._ports import free_port as free_port  # noqa: E402

PAPER_CV_BEFORE, PAPER_CV_AFTER = 0.22, 0.09
PAPER_THROUGHPUT_RANGE = (-0.006, 0.008)


def wait_http(url: str, timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _stop(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Stack:
    """A running collector, pacer and trace sink, on free 127.0.0.1 ports."""

    workdir: Path
    sink: OtlpSink
    collector: subprocess.Popen[Any]
    pacer: subprocess.Popen[Any] | None
    collector_otlp: str
    pacer_http: str
    pacer_otlp: str
    logs: list[Path] = field(default_factory=list)

    @property
    def pacer_url(self) -> str:
        return f"http://{self.pacer_http}"

    def decision(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = get_json(f"{self.pacer_url}/v1/pacing?job={job_id}")
        return result

    def kill_pacer(self) -> None:
        if self.pacer is not None and self.pacer.poll() is None:
            self.pacer.kill()
            self.pacer.wait()

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for path in self.logs:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)


def start_pacer(
    workdir: Path, http: str, otlp: str, args: Sequence[str] = ()
) -> subprocess.Popen[Any]:
    log = (workdir / "pacer.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skewtrace.cli",
            "pacer",
            "--otlp-grpc",
            otlp,
            "--http",
            http,
            *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )


@contextmanager
def running_stack(otelcol: Path, workdir: Path, pacer_args: Sequence[str] = ()) -> Iterator[Stack]:
    """Start sink, pacer and collector; stop all three on exit, whatever happened."""
    workdir.mkdir(parents=True, exist_ok=True)
    sink = OtlpSink().start()
    pacer_http, pacer_otlp = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    collector_otlp = f"127.0.0.1:{free_port()}"
    health = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "SKEWTRACE_OTLP_GRPC_ENDPOINT": collector_otlp,
        "SKEWTRACE_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
        "SKEWTRACE_TRACES_BACKEND_ENDPOINT": f"127.0.0.1:{sink.port}",
        "SKEWTRACE_PROMETHEUS_ENDPOINT": f"127.0.0.1:{free_port()}",
        "SKEWTRACE_PACER_OTLP_ENDPOINT": pacer_otlp,
        "SKEWTRACE_HEALTH_ENDPOINT": health,
        "SKEWTRACE_OTELCOL_METRICS_PORT": str(free_port()),
        "SKEWTRACE_METRICS_FLUSH_INTERVAL": "1s",
    }
    collector_log = workdir / "collector.log"
    pacer: subprocess.Popen[Any] | None = None
    collector: subprocess.Popen[Any] | None = None
    try:
        pacer = start_pacer(workdir, pacer_http, pacer_otlp, pacer_args)
        with collector_log.open("ab") as log:
            collector = subprocess.Popen(
                [str(otelcol), "--config", str(REPO_ROOT / "collector-config" / "otelcol.yaml")],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
            )
        stack = Stack(
            workdir,
            sink,
            collector,
            pacer,
            collector_otlp,
            pacer_http,
            pacer_otlp,
            logs=[collector_log, workdir / "pacer.log"],
        )
        wait_http(f"http://{health}/", 60, collector)
        wait_http(f"http://{pacer_http}/healthz", 60, pacer)
        yield stack
    finally:
        if collector is not None:
            _stop(collector)
        if pacer is not None:
            _stop(pacer)
        sink.stop()


def launch_training(
    stack: Stack,
    job_id: str,
    *,
    pacing: bool,
    nprocs: int,
    steps: int,
    jitter: str | None,
    jitter_steps: str | None = None,
    warmup: int = 5,
    extra_env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "SKEWTRACE_JOB_ID": job_id,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{stack.collector_otlp}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "SKEWTRACE_PACER_POLL_INTERVAL_MILLIS": "500",
        **(extra_env or {}),
    }
    env.pop("SKEWTRACE_PACER_URL", None)
    if pacing:
        env["SKEWTRACE_PACER_URL"] = stack.pacer_url
    args = [
        sys.executable,
        str(REPO_ROOT / "examples" / "train_ddp.py"),
        "--nprocs",
        str(nprocs),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--job-id",
        job_id,
        *extra_args,
    ]
    if jitter:
        args += ["--jitter", jitter]
    if jitter_steps:
        args += ["--jitter-steps", jitter_steps]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT
    )


def step_stats(stdout: str) -> dict[int, dict[str, Any]]:
    """The ``step_stats`` JSON object of every rank, by rank.

    The ranks share one stdout, so two objects can land on one line; each is decoded from
    where it starts.
    """
    decoder = json.JSONDecoder()
    stats: dict[int, dict[str, Any]] = {}
    marker = '{"event": "step_stats"'
    start = stdout.find(marker)
    while start != -1:
        try:
            record, _ = decoder.raw_decode(stdout, start)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            stats[int(record["rank"])] = record
        start = stdout.find(marker, start + 1)
    return stats


def rank_step_spans(spans: Sequence[ReceivedSpan], job_id: str, rank: int) -> list[ReceivedSpan]:
    return sorted(
        (
            s
            for s in spans
            if s.name == semconv.SPAN_STEP
            and s.resource.get(semconv.JOB_ID) == job_id
            and int(s.resource.get(semconv.RANK, -1)) == rank
        ),
        key=lambda s: int(s.attributes.get(semconv.STEP, 0)),
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


class DecisionWatcher:
    """Polls the pacer for one job in the background: how much of the run was paced."""

    def __init__(self, stack: Stack, job_id: str, interval_s: float = 0.25) -> None:
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stack, self._job_id, self._interval = stack, job_id, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DecisionWatcher:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.samples.append((time.monotonic(), self._stack.decision(self._job_id)))
            except (OSError, ValueError):
                self.samples.append((time.monotonic(), {"error": True}))

    def flips(self) -> int:
        states = [d["active"] for _, d in self.samples if "version" in d and d["version"] > 0]
        return sum(1 for a, b in itertools.pairwise(states) if a != b)

    def active_fraction(self) -> float:
        seen = [d for _, d in self.samples if "version" in d and d["version"] > 0]
        return sum(1 for d in seen if d["active"]) / len(seen) if seen else 0.0


# ---------------------------------------------------------------------- the benchmark


@dataclass
class RunResult:
    mode: str
    job_id: str
    cv: float
    mean_s: float
    p99_s: float
    throughput: float
    active_fraction: float
    wall_s: float
    delay_spans: int = 0
    delay_total_s: float = 0.0
    flips: int = 0


def _one_run(stack: Stack, args: argparse.Namespace, mode: str, index: int) -> RunResult:
    job_id = f"bench-{mode}-{index}-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    with DecisionWatcher(stack, job_id) as watcher:
        proc = launch_training(
            stack,
            job_id,
            pacing=(mode == "on"),
            nprocs=args.nprocs,
            steps=args.steps,
            jitter=args.jitter,
            warmup=args.warmup,
        )
        stdout, stderr = proc.communicate(timeout=args.run_timeout_s)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"training run {job_id} failed ({proc.returncode}):\n{stderr[-3000:]}")
    stats = step_stats(stdout)[0]
    # Spans reach the sink through the collector's batch; give the last ones a moment.
    spans = stack.sink.wait_for_spans(
        lambda s: len(rank_step_spans(s, job_id, 0)) >= args.steps - 1, timeout=15
    )
    durations = [
        s.duration_s
        for s in rank_step_spans(spans, job_id, 0)
        if int(s.attributes.get(semconv.STEP, 0)) >= args.warmup
    ]
    delays = [
        s
        for s in spans
        if s.name == semconv.SPAN_PACING_DELAY and s.resource.get(semconv.JOB_ID) == job_id
    ]
    per_step_samples = args.batch_size * args.nprocs
    return RunResult(
        mode=mode,
        job_id=job_id,
        cv=float(stats["step_time_cv"]),
        mean_s=float(stats["step_time_mean_s"]),
        p99_s=percentile(durations, 0.99),
        throughput=per_step_samples / float(stats["step_time_mean_s"]),
        active_fraction=watcher.active_fraction(),
        wall_s=wall,
        delay_spans=len(delays),
        delay_total_s=sum(s.duration_s for s in delays),
        flips=watcher.flips(),
    )


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def report(results: Sequence[RunResult]) -> str:
    lines = []
    header = (
        f"{'mode':<5} {'runs':>4} {'iter CV':>8} {'mean step ms':>13} {'p99 step ms':>12} "
        f"{'samples/s':>10} {'pacer on':>9}"
    )
    lines.append(header)
    by_mode: dict[str, list[RunResult]] = {}
    for result in results:
        by_mode.setdefault(result.mode, []).append(result)
    summary: dict[str, dict[str, float]] = {}
    for mode in ("off", "on"):
        runs = by_mode.get(mode, [])
        summary[mode] = {
            "cv": _mean([r.cv for r in runs]),
            "mean": _mean([r.mean_s for r in runs]),
            "p99": _mean([r.p99_s for r in runs]),
            "tp": _mean([r.throughput for r in runs]),
            "active": _mean([r.active_fraction for r in runs]),
        }
        s = summary[mode]
        lines.append(
            f"{mode:<5} {len(runs):>4} {s['cv']:>8.3f} {s['mean'] * 1e3:>13.1f} "
            f"{s['p99'] * 1e3:>12.1f} {s['tp']:>10.1f} {s['active'] * 100:>8.0f}%"
        )
    off, on = summary["off"], summary["on"]
    cv_ratio = on["cv"] / off["cv"] if off["cv"] else math.nan
    tp_change = on["tp"] / off["tp"] - 1 if off["tp"] else math.nan
    lines.append("")
    lines.append(
        f"iteration-time CV on/off: {off['cv']:.3f} -> {on['cv']:.3f} "
        f"(ratio {cv_ratio:.2f}); paper at 64 nodes: {PAPER_CV_BEFORE} -> "
        f"{PAPER_CV_AFTER} (ratio {PAPER_CV_AFTER / PAPER_CV_BEFORE:.2f})"
    )
    lines.append(
        f"throughput on vs off: {tp_change * 100:+.1f}%; paper at 4-8 nodes: "
        f"{PAPER_THROUGHPUT_RANGE[0] * 100:+.1f}%..{PAPER_THROUGHPUT_RANGE[1] * 100:+.1f}%"
    )
    lines.append(
        f"mean step on/off: {on['mean'] / off['mean']:.3f}; "
        f"p99 step on/off: {on['p99'] / off['p99']:.3f}"
    )
    lines.append(
        "per run: "
        + ", ".join(
            f"{r.mode}:cv={r.cv:.3f},mean={r.mean_s * 1e3:.0f}ms,p99={r.p99_s * 1e3:.0f}ms,"
            f"pacer on={r.active_fraction * 100:.0f}%"
            for r in results
        )
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per mode (default 3)")
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--warmup",
        type=int,
        default=60,
        help="steps left out of the figures; covers the pacer's activation",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="train_ddp.py's batch size")
    parser.add_argument("--jitter", default="1,3:0.06", help="train_ddp.py --jitter")
    parser.add_argument("--run-timeout-s", type=float, default=600)
    parser.add_argument(
        "--otelcol",
        type=Path,
        default=Path(
            os.environ.get("SKEWTRACE_OTELCOL", REPO_ROOT / "build" / "otelcol-skewtrace")
        ),
    )
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "build" / "bench-pacing")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_HELP}: one run per mode, 2 ranks, 12 steps, jitter on rank 1",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.nprocs, args.steps, args.warmup, args.jitter = 1, 2, 12, 4, "1:0.06"
    if not args.otelcol.is_file():
        print(f"{args.otelcol} is not built (make collector)", file=sys.stderr)
        return 2
    results: list[RunResult] = []
    with running_stack(args.otelcol, args.workdir) as stack:
        for index in range(args.runs):
            order = ("off", "on") if index % 2 == 0 else ("on", "off")
            for mode in order:
                result = _one_run(stack, args, mode, index)
                results.append(result)
                print(
                    f"run {index} {mode}: cv={result.cv:.3f} mean={result.mean_s * 1e3:.1f} ms "
                    f"p99={result.p99_s * 1e3:.1f} ms pacer on={result.active_fraction * 100:.0f}% "
                    f"flips={result.flips} delays applied={result.delay_spans} "
                    f"({result.delay_total_s:.2f} s) ({result.wall_s:.0f} s)",
                    flush=True,
                )
    print()
    print(
        f"pacing benchmark: {args.nprocs} gloo ranks on one machine, jitter {args.jitter}, "
        f"{args.steps} steps ({args.warmup} warm-up) per run"
    )
    print(report(results))
    if args.smoke:  # the figures beside the paper's mean nothing at 12 steps
        print(SMOKE_DONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
