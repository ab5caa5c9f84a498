"""Every script in benchmarks/ runs end to end (issue 24, item 7; issue 47, item 7), each in its
``--smoke`` mode.

`make bench` stopped at benchmarks/collector_e2e.py for a while: its processor-only config
(derived from otelcol.yaml) no longer loaded once otelcol.yaml fed traces/backend through the
forward connector, and its held-memory run set a wait_timeout above max_wait. A benchmark
nobody runs breaks like that unseen (stale config, a moved import, a changed API), so each
one runs here in its ``--smoke`` mode: its smallest parameters that still take every code path
(one round, the fewest steps, ranks and arms; each script's ``--help`` says what). The figures
mean nothing at that size: the benchmarks measure, these tests keep them running.

What fails a smoke run (benchmarks/_smoke.py): a target that depends on the machine or the
size (a throughput, a latency, a gain, a share of a core) is printed beside ``SMOKE (target
not judged)``, never met or missed; what holds at any size (spans lost uncounted, a wrong rank
flagged, decisions from another policy than the arm's, a bound broken) is judged as in a full
run, and a benchmark that finds it broken prints a ``FAIL`` line and exits 1. So a test here
fails on a non-zero exit status, on any line that starts with ``FAIL``, and on a headline
figure missing from the output.

The smoke runs that take well over 25 s even at their smallest carry the ``eval`` marker:
``pytest -m eval`` runs them (`make eval`'s share), `make test` does not (tests/conftest.py
leaves them out of any run whose ``-m`` does not name ``eval``). They are collision.py in
both layouts (six or more runs of up to four ranks each on the fabric), scenarios.py (one
six-rank job on the fabric) and rebalance.py's real sections (five training runs and three
stacks), and work_balance.py (four runs of four gloo ranks, mostly their start-up);
rebalance.py's model runs in `make test`. pacing.py's smoke run (20 s) is marked
too, to keep this file near 90 s in `make test`: tests/test_pacer_e2e.py runs its harness.
no_harm.py, one run of two two-rank jobs with the loop closed, is the fabric benchmark
`make test` runs.
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
TIMEOUT_S = 300  # each takes seconds to half a minute here; this is for a loaded machine

NOT_JUDGED = re.escape("SMOKE (target not judged)")
SMOKE_DONE = r"^SMOKE \(ran end to end; .*\)$"
FAIL_LINE = re.compile(r"^\s*FAIL\b.*$", re.MULTILINE)


@dataclass(frozen=True)
class Smoke:
    script: str
    headlines: tuple[str, ...]
    """Regular expressions (multi-line) that stdout must match: the headline figure lines."""
    args: str = ""
    """Flags besides ``--smoke``, split at spaces."""
    name: str = ""
    """The test id, where one script has several smoke runs."""
    loadgen: bool = False
    """Needs tools/loadgen (built with Go)."""
    workdir: bool = False
    """Takes --workdir (default under build/): given a temporary directory instead."""
    logs: bool = False
    """Takes --logs (default under /tmp): given a temporary directory instead."""


def _pythonpath(repo_root: Path) -> str:
    """tests/ (the harnesses the benchmarks import), then this checkout's src/, then whatever
    PYTHONPATH already held: the scripts run this checkout's skewtrace, not the one the
    shared venv's editable install points at."""
    inherited = os.environ.get("PYTHONPATH", "")
    paths = [str(repo_root / "tests"), str(repo_root / "src"), *inherited.split(os.pathsep)]
    return os.pathsep.join(p for p in paths if p)


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
        env={**os.environ, "PYTHONPATH": _pythonpath(repo_root), **(env or {})},
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
    failed = FAIL_LINE.findall(result.stdout)
    assert not failed, f"{failed}\n{output}"
    assert result.returncode == 0, f"exit status {result.returncode}\n{output}"
    for headline in smoke.headlines:
        assert re.search(headline, result.stdout, re.MULTILINE), f"no {headline!r}\n{output}"


NUMBER = r"[\d,.]+"

# The benchmarks that run the built Collector.
COLLECTOR_SMOKES = [
    Smoke(
        "collector_e2e",
        (
            rf"^barrierskew end to end: +{NUMBER} spans/s +target >= {NUMBER} .* {NOT_JUDGED}$",
            rf"^ratio to baseline: +{NUMBER} +target >= 0\.5 +{NOT_JUDGED}$",
            r"^held by barrierskew: ",
            SMOKE_DONE,
        ),
        loadgen=True,
    ),
    Smoke(
        "whatif_corpus",
        (
            r"^\| job \| layout \| causes \| the oracle names \|.*\| steps named alike",
            r"^\| slow-dataloader \| 2x4 \(8\), 1f1b, batched, 8 mb \| .* \| rank 1 data \| "
            rf"{NUMBER}(-{NUMBER})? \| {NUMBER}(-{NUMBER})? \| {NUMBER} \| 10/10 \|",
            r"^SUMMARY: 1 of 1 jobs met both targets$",
        ),
    ),
    Smoke(
        "remedies",
        (
            rf"^data: split_by_work over equal counts [-+]{NUMBER}% \(.*\)  target >= \+20% "
            rf".*{NOT_JUDGED}$",
            r"^advice against an exhaustive search of all 560 contiguous partitions: .*: equal$",
            rf"^stage: the advice over as-is, 8 micro-batches, stated timings .* target >= \+10% "
            rf".*{NOT_JUDGED}$",
            r"^  sensitivity \(8 micro-batches\): at the generator's default timings .* the target "
            r"depends on the ratio of compute",
            r"^  the advice is the fastest of the ties on 1 of 1 seeds$",
            r"^balanced \(equal lengths\): change .* met$",
            r"^balanced \(equal layers\): change .* met$",
            r"^\| layers-heavy-2stage \| 2x4, 8 mb \| .* \| advise_partition \| stage 1: 10/10 \|",
            SMOKE_DONE,
        ),
    ),
    Smoke(
        "diagnosis_table",
        (
            r"^\| scenario \| layout \|.*\| right in every step \|$",
            r"^\| healthy-2d \| 2d \| none .* \| nothing flagged \| .* \| [01]/1 \|$",
            r"^\| compute-ends-2d \| 2d \| compute 2 \+30 ms, steps 8-23 \| ranks 2 compute \| "
            r".* \| \d+ steps \| \d+ steps \| [01]/1 \|$",
        ),
    ),
    Smoke(
        "pacing",
        (
            rf"^iteration-time CV on/off: {NUMBER} -> {NUMBER} \(ratio {NUMBER}\); "
            r"paper at 64 nodes: 0\.22 -> 0\.09",
            rf"^throughput on vs off: [-+]{NUMBER}%; paper at 4-8 nodes: -0\.6%\.\.\+0\.8%$",
            SMOKE_DONE,
        ),
        workdir=True,
    ),
    # The real runs, then pacing and rebalancing together (the model: PLAIN_SMOKES).
    Smoke(
        "rebalance",
        (
            rf"^ +0\.5 +{NUMBER} +{NUMBER} \( *{NUMBER}%\) +{NUMBER} \( *{NUMBER}%\) +{NUMBER}% "
            r"+80% ",
            rf"^both/alone steady throughput {NUMBER} \(target >= 0\.97",
            r"^decisions pacing the slow rank: \d+ \(target 0\)",
            SMOKE_DONE,
        ),
        args="--sections real,together",
        workdir=True,
    ),
    Smoke(
        "scale",
        (
            rf"^single +{NUMBER} spans/s +ratio to pass-through {NUMBER} +target >= 0\.8 "
            rf"+{NOT_JUDGED}$",
            r"^ +accounting single +in [\d,]+ = out [\d,]+ \+ counted drops .*"
            r"lost uncounted 0 \(target 0: met\)",
            rf"^ +onset to flag: .*({NOT_JUDGED})",
            SMOKE_DONE,
        ),
        loadgen=True,
    ),
    Smoke(
        "sim_pacing",
        (
            rf"^collision +4 \| +{NUMBER} +{NUMBER} +[-+]{NUMBER}% +\+15% \|",
            rf"^collision: worst change [-+]{NUMBER}%, target \+15%: {NOT_JUDGED}$",
            # No group collides in the healthy job: no offsets, nothing changed.
            rf"^healthy: worst change \+0\.00%, target -1%: {NOT_JUDGED}$",
        ),
        args="--interleave-offline",
        name="sim_pacing-offline",
        loadgen=True,
    ),
    Smoke(
        "sim_pacing",
        (rf"^ +4 +32 \| +{NUMBER} +{NUMBER} +- \| .*-0\.6%\.\.\+0\.8% \|",),
        name="sim_pacing-loop",
        loadgen=True,
        workdir=True,
    ),
    Smoke(
        "soak",
        (
            rf"^peak RSS: +{NUMBER} MiB +target < 512 MiB",
            rf"^good job verdict: +.* +target \[\('11', 'compute'\)\] +{NOT_JUDGED} "
            r"\(no other rank flagged: True\)$",
            SMOKE_DONE,
        ),
        loadgen=True,
    ),
    Smoke(
        "trace_shape",
        (
            rf"^ +largest stored trace +{NUMBER} MB +{NUMBER} MB +< 5 MB .* ok$",
            r"^ +kept \+ dropped = in +\d+ \+ \d+ = \d+ +ok$",
            r"^PASS$",
        ),
        loadgen=True,
    ),
]

# The benchmarks on the emulated fabric (network namespaces), with the built Collector.
NAMESPACE_SMOKES = [
    Smoke(
        "collision",
        (
            rf"^median step time: alone {NUMBER} ms, colliding {NUMBER} ms, scheduled "
            rf"{NUMBER} ms, interleaved {NUMBER} ms$",
            rf"^interleaved over colliding throughput: [-+]{NUMBER}% .* target >= \+15% "
            rf".*{NOT_JUDGED}$",
            rf"^median step time: observed {NUMBER} ms, interleave {NUMBER} ms ",
            rf"^interleave over observed throughput \(the loop closed\): [-+]{NUMBER}% .*"
            rf"{NOT_JUDGED}$",
            SMOKE_DONE,
        ),
        logs=True,
    ),
    Smoke(
        "collision",
        (
            # The loop closed on one job: the Collector's phases of its two sets, then an
            # offset for one set's group (not both, not the world's), which its ranks apply.
            rf"^  pacer for job-S-interleave1 \(interleave\): offsets in [1-9]\d* of \d+ "
            rf'decisions .* the last: reason interleaving, offsets \{{"\d+": {NUMBER}\}}, '
            rf'interleave \{{"units": 2',
            rf"^interleave over observed throughput \(one job, two sets\): [-+]{NUMBER}% .*"
            rf"{NOT_JUDGED}$",
            SMOKE_DONE,
        ),
        args="--layout sets",
        name="collision-sets",
        logs=True,
    ),
    Smoke(
        "no_harm",
        (
            rf"^round 1 slow-nic pacing: observed {NUMBER} ms .* controlled {NUMBER} ms .* "
            r"pacer \(pacing\): \w+",
            rf"^slow-nic pacing: controlled over observed throughput [-+]{NUMBER}% .* "
            rf"target >= -1%: {NOT_JUDGED}$",
            SMOKE_DONE,
        ),
        logs=True,
    ),
    Smoke(
        "scenarios",
        (
            r"^compute #1: (right|WRONG); ",
            r"^\| compute \| [01]/1 \| .* \| \d+ ms \|$",
        ),
    ),
]
EVAL_ONLY = {"pacing", "rebalance", "collision", "collision-sets", "scenarios", "work_balance"}
"""Smoke runs marked ``eval``: `make eval`'s, not `make test`'s. All but pacing take well
over 25 s at their smallest; pacing's 20 s (two 2-rank training runs, mostly their start-up)
would put this file 20 s past its 90 s in `make test`, where tests/test_pacer_e2e.py runs its
harness (the stack, the launch, the decision watcher) end to end."""

PLAIN_SMOKES = [
    # rebalance.py's model at scale, which needs no Collector: seconds.
    Smoke(
        "rebalance",
        (
            rf"^ +4 +1 +{NUMBER} +{NUMBER}% +{NUMBER}% ",
            rf"^ +64 +8 +{NUMBER} +{NUMBER}% +{NUMBER}% ",
        ),
        args="--sections model",
        name="rebalance-model",
    ),
    # Four runs of four gloo ranks (equal counts and balanced, twice): about 50 s.
    Smoke(
        "work_balance",
        (
            r"^loss curves, balanced vs equal: max abs diff \S+, max rel diff \S+ "
            r"\(target <= 0\.0001\): met$",
            rf"^ +0 +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}$",
            rf"^balanced over equal throughput: mean {NUMBER} .* {NOT_JUDGED}",
            SMOKE_DONE,
        ),
        args="--median 32 --max-len 256",
    ),
    Smoke(
        "node_telemetry_overhead",
        (rf"^local rank 0, total +{NUMBER}us +{NUMBER}% +-?{NUMBER}% +< 1% {NOT_JUDGED}$",),
    ),
    # One gloo rank, the Flight Recorder path: seconds.
    Smoke(
        "overhead_flight_recorder",
        (
            rf"^ +all_reduce +\+ *-?{NUMBER} us +bare +{NUMBER} us +\(target <= 1\.0 us\) +"
            rf"{NOT_JUDGED}$",
            rf"^ +reader, amortized per collective read: {NUMBER} us .*{NOT_JUDGED}",
            r"^SUMMARY \{",
            SMOKE_DONE,
        ),
    ),
    Smoke(
        "overhead",
        (
            rf"^\[1\] record one event: +{NUMBER} us +\(target <= 2\.0 us\) +{NOT_JUDGED}$",
            rf"^\[2\] endpoint up *:.* ratio {NUMBER} \(target <= 1\.01\) {NOT_JUDGED}",
            rf"^\[2\] endpoint down:.* ratio {NUMBER} \(target <= 1\.01\) {NOT_JUDGED}",
            r"^ +RSS growth from 1/4 to the end: .*buffered <= capacity: OK$",
            r"^SUMMARY \{",
            SMOKE_DONE,
        ),
    ),
    Smoke(
        "layer_profile",
        (
            r"^unsampled: median step +[\d.]+ ms, added",
            r"^ +sampled: median step +[\d.]+ ms, added",
            r"^averaged over layer_profile_every=50: .* target <= 1%: SMOKE \(target not judged\)$",
            SMOKE_DONE,
        ),
    ),
    Smoke(
        "hook_breakdown",
        (
            r"^\[a\] c10d calling Python: two empty group hooks",
            r"^ +PreHookArgs\.name +[\d.]+ us$",
            r"^ +async collective: pre \+ post .* [\d.]+ us$",
            r"^\[e\] backward, median of",
            r"^SUMMARY \{",
            SMOKE_DONE,
        ),
    ),
    Smoke(
        "thread_cpu",
        (
            rf"^ +training-thread CPU added per step: .* \(target <= 1%\) {NOT_JUDGED}",
            r"^ +export thread: .* of a core",
            rf"^\[projection, fastest rounds\] .* \(target <= 1%\) {NOT_JUDGED}$",
            r"^\[projection, medians\] .*not judged\)$",
            r"^SUMMARY \{",
            SMOKE_DONE,
        ),
    ),
]


def _id(smoke: Smoke) -> str:
    return smoke.name or smoke.script


def _params(smokes: list[Smoke]) -> list[object]:
    """Each smoke a test, those in EVAL_ONLY marked ``eval``."""
    return [
        pytest.param(s, id=_id(s), marks=[pytest.mark.eval] if _id(s) in EVAL_ONLY else [])
        for s in smokes
    ]


def _needs_loadgen(smoke: Smoke) -> None:
    if smoke.loadgen:
        from collector_harness import loadgen_for_tests

        loadgen_for_tests()


def _args(smoke: Smoke, tmp_path: Path) -> list[str]:
    """--smoke, the smoke's own flags, and temporary directories for what it writes."""
    args = ["--smoke", *smoke.args.split()]
    if smoke.workdir:
        args += ["--workdir", str(tmp_path / "work")]
    if smoke.logs:
        args += ["--logs", str(tmp_path / "logs")]
    return args


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {path.stem for path in (REPO_ROOT / "benchmarks").glob("*.py") if path.stem[0] != "_"}
    covered = {s.script for s in COLLECTOR_SMOKES + NAMESPACE_SMOKES + PLAIN_SMOKES}
    assert scripts == covered


def test_a_fail_line_a_failed_exit_or_a_missing_headline_fails_a_smoke_run() -> None:
    smoke = Smoke("x", (r"^figure \d+$",))
    check(subprocess.CompletedProcess([], 0, "figure 1\nSMOKE (ran end to end)\n", ""), smoke)
    for exit_status, stdout in (
        (0, "figure 1\nFAIL: spans lost\n"),
        (0, "figure 1\n  FAIL\n"),
        (1, "figure 1\n"),
        (0, "figure one\n"),
    ):
        with pytest.raises(AssertionError):
            check(subprocess.CompletedProcess([], exit_status, stdout, ""), smoke)


@pytest.mark.collector
@pytest.mark.parametrize("smoke", _params(COLLECTOR_SMOKES))
def test_collector_benchmark_runs(
    smoke: Smoke, otelcol_path: Path, repo_root: Path, tmp_path: Path
) -> None:
    _needs_loadgen(smoke)
    args = [*_args(smoke, tmp_path), "--otelcol", str(otelcol_path)]
    check(run_benchmark(repo_root, smoke.script, args), smoke)


@pytest.mark.collector
@pytest.mark.netns
@pytest.mark.parametrize("smoke", _params(NAMESPACE_SMOKES))
def test_namespace_benchmark_runs(
    smoke: Smoke, namespaces: None, otelcol_path: Path, repo_root: Path, tmp_path: Path
) -> None:
    env = {"SKEWTRACE_OTELCOL": str(otelcol_path)}
    check(run_benchmark(repo_root, smoke.script, _args(smoke, tmp_path), env), smoke)


@pytest.mark.parametrize("smoke", _params(PLAIN_SMOKES))
def test_benchmark_runs(smoke: Smoke, repo_root: Path, tmp_path: Path) -> None:
    check(run_benchmark(repo_root, smoke.script, _args(smoke, tmp_path)), smoke)
