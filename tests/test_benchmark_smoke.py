"""Every script in benchmarks/ runs (issue 24, item 7), each at its smallest size.

`make bench` stopped at benchmarks/collector_e2e.py for a while: its processor-only config
(derived from otelcol.yaml) no longer loaded once otelcol.yaml fed traces/backend through the
forward connector, and its held-memory run set a wait_timeout above max_wait. A benchmark
nobody runs breaks like that unseen (stale config, a moved import, a changed API), so each
one runs here at the least ranks, steps, rounds and seconds it accepts, and must exit 0 and
print its headline figure beside its target. The figures themselves mean nothing at these
sizes: the benchmarks measure, these tests only keep them running.

Exit status: 0, except for the benchmarks that exit 1 when a target is missed, every figure
printed first (collector_e2e.py, scale.py, soak.py): there exit 1 is accepted only with the
script's own closing FAIL line. At these sizes and on a busy machine their targets are not
what is checked: scale.py at 64 ranks misses some by construction (the time to a verdict at
one step per second is above its 2 s target), collector_e2e.py's throughput ratio fell below
its target beside a CPU hog, and soak.py's five seconds may end before the good job's rank
is flagged.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300  # each takes about a minute at most here; this is for a loaded machine


@dataclass(frozen=True)
class Smoke:
    script: str
    args: str
    """Its command-line flags, split at spaces."""
    headlines: tuple[str, ...]
    """Regular expressions (multi-line) that stdout must match: the headline figure lines."""
    loadgen: bool = False
    """Needs tools/loadgen (built with Go)."""
    workdir: bool = False
    """Takes --workdir (default under build/): given a temporary directory instead."""
    missed_target: str | None = None
    """The last line of a run that exits 1 because a target was missed (exit 1 accepted)."""


def run_benchmark(
    repo_root: Path, script: str, args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The script to completion, in a session of its own so that a timeout ends its
    collectors, pacers and ranks too."""
    command = [sys.executable, f"benchmarks/{script}.py", *args]
    proc = subprocess.Popen(
        command,
        cwd=repo_root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo_root / "tests"), **(env or {})},
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{script}.py ran past {TIMEOUT_S} s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def check(result: subprocess.CompletedProcess[str], smoke: Smoke) -> None:
    output = result.stdout[-3000:] + "\n--- stderr\n" + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    missed = (
        smoke.missed_target is not None
        and result.returncode == 1
        and bool(lines)
        and lines[-1] == smoke.missed_target
    )
    assert result.returncode == 0 or missed, f"exit status {result.returncode}\n{output}"
    for headline in smoke.headlines:
        assert re.search(headline, result.stdout, re.MULTILINE), f"no {headline!r}\n{output}"


NUMBER = r"[\d,.]+"

# The benchmarks that run the built Collector, at their smallest sizes.
COLLECTOR_SMOKES = [
    Smoke(
        "collector_e2e",
        "--ranks 64 --steps 4 --rounds 1",
        (
            rf"^barrierskew end to end: +{NUMBER} spans/s +target >= {NUMBER}",
            rf"^ratio to baseline: +{NUMBER} +target >= 0\.5$",
            r"^held by barrierskew: ",
        ),
        loadgen=True,
        missed_target="FAIL: a target was missed",
    ),
    Smoke(
        "whatif_corpus",
        "--jobs slow-dataloader",
        (
            r"^\| job \| layout \| causes \| the oracle names \|.*\| steps named alike",
            r"^\| slow-dataloader \| 2x4 \(8\), 1f1b, batched, 8 mb \| .* \| rank 1 data \| "
            rf"{NUMBER}(-{NUMBER})? \| {NUMBER}(-{NUMBER})? \| {NUMBER} \| 10/10 \|",
            r"^SUMMARY: 1 of 1 jobs met both targets$",
        ),
    ),
    Smoke(
        "diagnosis_table",
        "--seeds 1",
        (
            r"^\| scenario \| layout \|.*\| right in every step \|$",
            r"^\| compute-2d \| 2d \| compute 11 \+25 ms, from step 8 \| ranks 11 compute \|"
            r".*\| [01]/1 \|$",
        ),
    ),
    Smoke(
        "pacing",
        "--runs 1 --nprocs 2 --steps 20 --warmup 5 --jitter 1:0.06",
        (
            rf"^iteration-time CV on/off: {NUMBER} -> {NUMBER} \(ratio {NUMBER}\); "
            r"paper at 64 nodes: 0\.22 -> 0\.09",
            rf"^throughput on vs off: [-+]{NUMBER}%; paper at 4-8 nodes: -0\.6%\.\.\+0\.8%$",
        ),
        workdir=True,
    ),
    # rebalance.py in two runs of about half a minute each: the real runs and the model, then
    # pacing and rebalancing together.
    Smoke(
        "rebalance",
        "--sections real,model --quick --nprocs 2 --speeds 0.5 --steps 12 --warmup 2",
        (
            rf"^ +0\.5 +{NUMBER} +{NUMBER} \( *{NUMBER}%\) +{NUMBER} \( *{NUMBER}%\) +{NUMBER}% "
            r"+80% ",
            rf"^ +64 +8 +{NUMBER} +{NUMBER}% +{NUMBER}% ",
        ),
        workdir=True,
    ),
    Smoke(
        "rebalance",
        "--sections together --quick --nprocs 2 --steps 12 --warmup 2",
        (
            rf"^both/alone steady throughput {NUMBER} \(target >= 0\.97",
            r"^decisions pacing the slow rank: \d+ \(target 0\)",
        ),
        workdir=True,
    ),
    Smoke(
        "scale",
        "--quick --ranks 64 --tier2 1 --verdict-pipelines single --step-rate 64:4",
        (
            rf"^single +{NUMBER} spans/s +ratio to pass-through {NUMBER} +target >= 0\.8",
            r"^ +accounting single +in [\d,]+ = out [\d,]+ \+ counted drops",
            r"^ +onset to flag: ",
        ),
        loadgen=True,
        missed_target="FAIL: a target was missed",
    ),
    Smoke(
        "sim_pacing",
        "--interleave-offline --nodes 4 --steps 30 --measure-from 5",
        (
            rf"^collision +4 \| +{NUMBER} +{NUMBER} +[-+]{NUMBER}% +\+15% \|",
            r"^healthy: worst change \+0\.00%, meets -1%",
        ),
        loadgen=True,
    ),
    Smoke(
        "sim_pacing",
        "--nodes 4 --steps 10 --measure-from 2",
        (rf"^ +4 +32 \| +{NUMBER} +{NUMBER} +- \| .*-0\.6%\.\.\+0\.8% \|",),
        loadgen=True,
        workdir=True,
    ),
    Smoke(
        "soak",
        "--seconds 5",
        (
            rf"^peak RSS: +{NUMBER} MiB +target < 512 MiB",
            r"^good job verdict: +.* +target \[\('11', 'compute'\)\]$",
        ),
        loadgen=True,
        missed_target="FAIL",
    ),
    Smoke(
        "trace_shape",
        "--ranks 256 --steps 1",
        (
            rf"^ +largest stored trace +{NUMBER} MB +{NUMBER} MB +< 5 MB .* ok$",
            r"^ +kept \+ dropped = in +\d+ \+ \d+ = \d+ +ok$",
        ),
        loadgen=True,
    ),
]

NAMESPACE_SMOKES = [
    Smoke(
        "collision",
        "--quick --controlled",
        (
            rf"^median step time: alone {NUMBER} ms, colliding {NUMBER} ms, scheduled {NUMBER} ms,"
            rf" interleaved {NUMBER} ms$",
            rf"^interleaved over colliding throughput: [-+]{NUMBER}% .* target >= \+15% ",
            rf"^median step time: observed {NUMBER} ms, interleave {NUMBER} ms ",
            rf"^interleave over observed throughput \(the loop closed\): [-+]{NUMBER}% ",
        ),
    ),
    Smoke(
        "collision",
        "--quick --layout sets",
        (
            # The loop closed on one job: the Collector's phases of its two sets, then an
            # offset for one set's group (not both, not the world's), which its ranks apply.
            rf"^  pacer for job-S-interleave1 \(interleave\): offsets in [1-9]\d* of \d+ "
            rf'decisions .* the last: reason interleaving, offsets \{{"\d+": {NUMBER}\}}, '
            rf'interleave \{{"units": 2',
            rf"^interleave over observed throughput \(one job, two sets\): [-+]{NUMBER}% ",
        ),
    ),
    Smoke(
        "no_harm",
        "--quick --scenario long-stage",
        (
            rf"^round 1 long-stage pacing: observed {NUMBER} ms .* controlled {NUMBER} ms .* "
            r"pacer \(pacing\): \w+",
            rf"^long-stage pacing: controlled over observed throughput [-+]{NUMBER}% .* "
            r"target >= -1%: ",
        ),
    ),
    Smoke(
        "scenarios",
        "--repeat 1 --scenario compute --steps 16",
        (
            r"^compute #1: (right|WRONG); ",
            r"^\| compute \| [01]/1 \| .* \| \d+ ms \|$",
        ),
    ),
]

PLAIN_SMOKES = [
    Smoke(
        "node_telemetry_overhead",
        "--passes 1 --rounds 1",
        (rf"^local rank 0, total +{NUMBER}us +{NUMBER}% +-?{NUMBER}% +< 1% (ok|OVER)$",),
    ),
    Smoke(
        "overhead",
        "--quick --blocks 2 --steps-per-block 3",
        (
            rf"^\[1\] record one event: +{NUMBER} us +\(target <= 2\.0 us\)",
            rf"^\[2\] endpoint up *:.* ratio {NUMBER} \(target <= 1\.01\)",
            rf"^\[2\] endpoint down:.* ratio {NUMBER} \(target <= 1\.01\)",
            r"^ +RSS growth from 1/4 to the end: ",
            r"^SUMMARY \{",
        ),
    ),
]


def _id(smoke: Smoke) -> str:
    if smoke.script == "collision" and "--layout sets" in smoke.args:
        return "collision-sets"
    if smoke.script == "rebalance":
        return f"rebalance-{smoke.args.split()[1].replace(',', '-')}"
    return smoke.script


def _needs_loadgen(smoke: Smoke) -> None:
    if smoke.loadgen:
        from collector_harness import loadgen_for_tests

        loadgen_for_tests()


def _workdir(smoke: Smoke, tmp_path: Path) -> list[str]:
    return ["--workdir", str(tmp_path / "work")] if smoke.workdir else []


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {path.stem for path in (REPO_ROOT / "benchmarks").glob("*.py")}
    covered = {s.script for s in COLLECTOR_SMOKES + NAMESPACE_SMOKES + PLAIN_SMOKES}
    assert scripts == covered


@pytest.mark.collector
@pytest.mark.parametrize("smoke", COLLECTOR_SMOKES, ids=_id)
def test_collector_benchmark_runs(
    smoke: Smoke, otelcol_path: Path, repo_root: Path, tmp_path: Path
) -> None:
    _needs_loadgen(smoke)
    args = [*smoke.args.split(), "--otelcol", str(otelcol_path), *_workdir(smoke, tmp_path)]
    check(run_benchmark(repo_root, smoke.script, args), smoke)


@pytest.mark.collector
@pytest.mark.netns
@pytest.mark.parametrize("smoke", NAMESPACE_SMOKES, ids=_id)
def test_namespace_benchmark_runs(
    smoke: Smoke, namespaces: None, otelcol_path: Path, repo_root: Path
) -> None:
    env = {"SKEWTRACE_OTELCOL": str(otelcol_path)}
    check(run_benchmark(repo_root, smoke.script, smoke.args.split(), env), smoke)


@pytest.mark.parametrize("smoke", PLAIN_SMOKES, ids=_id)
def test_benchmark_runs(smoke: Smoke, repo_root: Path) -> None:
    check(run_benchmark(repo_root, smoke.script, smoke.args.split()), smoke)
