"""The main job's pure parts: fault specs and their expected verdicts, the outcome of a run
against its faults, the summary's lines, and the live view's rendering (rich, recorded)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from skewtrace import semconv
from skewtrace.cluster import netns
from skewtrace.cluster.fabric import Fabric, FabricSpec
from skewtrace.cluster.job import JobPlan, JobResult, Observation, Tick
from skewtrace.cluster.live import LiveView, plain_line, render
from skewtrace.cluster.loopback import Loopback
from skewtrace.cluster.metrics import RankReport, window
from skewtrace.cluster.outcome import StepVerdict, evaluate
from skewtrace.cluster.scenarios import PRESETS, Expected, Fault, expected_at
from skewtrace.cluster.summary import conclusions

FABRIC = Fabric(FabricSpec())  # 3 leaves x 2 nodes x 1 rank; nothing is created


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("compute:4", "KIND:TARGET:AMOUNT"),
        ("cpu:4:0.1", "KIND must be one of"),
        ("compute:4:x", "is not a number"),
        ("compute:4:0", "must be > 0"),
        ("compute:4:0.1@5:3", "0 <= START < END"),
        ("compute:4:0.1@a", "must be step numbers"),
        ("hetero:node1:0.5", "factor is > 1"),
        ("hetero:node1:2@3", "whole run"),
        ("nic:2:100", "TARGET is a node"),
        ("uplink:node1:100", "TARGET is a switch"),
        ("jitter:1,x:0.1", "list of ranks"),
    ],
)
def test_bad_fault_specs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Fault.parse(text)


def test_presets_parse_and_fit_the_default_fabric() -> None:
    for name in PRESETS:
        fault = Fault.parse(name)
        fault.check(FABRIC)
        assert str(Fault.parse(str(fault))) == str(fault)


def test_expected_verdicts() -> None:
    nic = Fault.parse("nic:node2:100@5")
    assert nic.expected(FABRIC) == Expected({2: "network"}, frozenset({"nic:node2/eth0"}))
    rack = Fault.parse("rack:leaf1:0.05@5")
    assert rack.expected(FABRIC) == Expected(
        {2: "compute", 3: "compute"}, frozenset({"switch:leaf1"})
    )
    assert rack.train_args(FABRIC) == [
        "--straggler", "2:compute:0.05@5:", "--straggler", "3:compute:0.05@5:",
    ]  # fmt: skip
    assert Fault.parse("uplink:leaf0:50").expected(FABRIC).suspects == {"uplink:leaf0"}
    assert Fault.parse("jitter:0,2:0.04").expected(FABRIC).allowed == {0, 2}
    hetero = Fault.parse("hetero:node5:2")
    assert hetero.train_args(FABRIC) == ["--slow-rank", "5:2"]
    faults = [Fault.parse("compute:1:0.05@5:10"), nic]
    assert expected_at(faults, 4, FABRIC).quiet
    assert expected_at(faults, 7, FABRIC).flagged == {1: "compute", 2: "network"}
    assert expected_at(faults, 10, FABRIC).flagged == {2: "network"}


def test_loopback_refuses_network_faults_and_shares_one_host() -> None:
    lo = Loopback(FabricSpec(), host="box")
    with pytest.raises(ValueError, match="needs the emulated network fabric"):
        Fault.parse("nic:node2:100").check(lo)
    # Two flagged ranks on one host make the host a suspect, as the collector derives it.
    two = Fault.parse("hetero:node1:2")
    lo2 = Loopback(FabricSpec(ranks_per_node=2), host="box")
    assert two.expected(lo2).suspects == {"host:box"}


def _result(faults: list[Fault], steps: int) -> JobResult:
    plan = JobPlan(job_id="j", script=Path("x"), steps=steps, faults=tuple(faults))
    ends = {s: 100.0 + 0.1 * s for s in range(steps)}
    return JobResult(plan, started=99.9, ended=200.0, step_ends=ends)


def test_outcome_counts_steps_seconds_clearing_and_false_flags() -> None:
    fault = Fault.parse("compute:3:0.05@5:15")
    result = _result([fault], 25)
    verdicts = {s: StepVerdict(s) for s in range(25)}
    for s in range(8, 17):  # flagged 3 steps after onset, cleared 2 steps after the end
        verdicts[s].flagged = {3: "compute"}
    verdicts[20].flagged = {1: "data"}  # a false flag
    result.observations = [
        Observation(t=100.0 + 0.1 * 4 + 0.9, step=9, flagged={3: "compute"}, suspects=set())
    ]
    outcome = evaluate(result, verdicts, FABRIC)
    (phase,) = [p for p in outcome.phases if not p.expected.quiet]
    assert (phase.onset_step, phase.flag_step, phase.steps_to_flag) == (5, 8, 3)
    assert phase.flag_seconds == pytest.approx(0.9)
    assert phase.right and phase.held_share == 1.0
    (clearing,) = outcome.clearings
    assert clearing.steps_to_clear == 2
    assert outcome.false_flags == {1: 1}
    assert outcome.false_flag_steps == {1: [20]}
    assert not outcome.right
    lines = conclusions(outcome)
    assert any("3 steps, 0.9 s from onset (step 5)" in line for line in lines)
    assert "false flags: rank 1 at 1 steps" in lines


def test_a_flag_that_lingers_after_the_end_is_clearing_not_a_false_flag() -> None:
    fault = Fault.parse("compute:3:0.05@5:15")
    verdicts = {s: StepVerdict(s) for s in range(40)}
    for s in range(8, 25):  # still flagged 10 steps after the end: slow to clear
        verdicts[s].flagged = {3: "compute"}
    outcome = evaluate(_result([fault], 40), verdicts, FABRIC)
    (clearing,) = outcome.clearings
    assert clearing.steps_to_clear == 10
    assert outcome.false_flags == {}
    verdicts[30].flagged = {3: "compute"}  # flagged again after it cleared: nothing explains it
    outcome = evaluate(_result([fault], 40), verdicts, FABRIC)
    assert outcome.clearings[0].steps_to_clear == 10
    assert outcome.false_flags == {3: 1}
    assert outcome.false_flag_steps == {3: [30]}  # not its flags during or after the fault


def test_a_verdict_that_comes_and_goes_is_not_right() -> None:
    fault = Fault.parse("compute:3:0.05@5")
    verdicts = {s: StepVerdict(s) for s in range(20)}
    for s in range(8, 20, 2):
        verdicts[s].flagged = {3: "compute"}
    outcome = evaluate(_result([fault], 20), verdicts, FABRIC)
    (phase,) = [p for p in outcome.phases if not p.expected.quiet]
    assert phase.flag_step == 8 and phase.held_share == pytest.approx(6 / 12)
    assert not phase.right


def test_window_means_are_over_the_last_scrape() -> None:
    before = {2: RankReport(2, totals={"m": (1.0, 10.0)})}
    now = {2: RankReport(2, straggler=True, totals={"m": (1.5, 12.0)})}
    recent = window(before, now)
    assert recent[2].totals["m"] == (0.5, 2.0) and recent[2].straggler
    assert math.isnan(recent[2].lateness_mean)


def _tick() -> Tick:
    ranks = {
        r: RankReport(r, host=f"node{r}", switch="leaf0", nic="eth0", step_mean=0.1,
                      lateness_mean=0.02 if r == 1 else 0.0, wait_mean=0.0)
        for r in range(3)
    }  # fmt: skip
    ranks[1].straggler, ranks[1].cause, ranks[1].cost = True, "network", 0.0421
    return Tick(
        t=0.0, job_id="j", step=11, steps=40, steps_per_s=5.0, ranks=ranks,
        job={"suspect:nic:node1/eth0": 1.0, "slowdown": 1.25},
        pacing={"active": True, "version": 3, "delays": {"0": 0.004}},
        active=["nic:node1:100@5"],
    )  # fmt: skip


def test_live_view_shows_verdicts_costs_suspects_and_pacing() -> None:
    console = Console(record=True, width=140, force_terminal=False)
    console.print(render(_tick(), pacing_enabled=True))
    text = console.export_text()
    assert "step 12/40" in text and "5.0 steps/s" in text
    assert "STRAGGLER (network) costs 42.1 ms/step" in text
    assert "suspected fabric: nic:node1/eth0" in text
    assert "pacing ACTIVE v3: rank 0 +4.0 ms" in text
    assert "injected now: nic:node1:100@5" in text
    assert "20% shorter" in text
    assert "flagged: 1(network)" in plain_line(_tick())


def test_live_view_off_a_terminal_prints_lines() -> None:
    console = Console(record=True, width=200, force_terminal=False)
    with LiveView(console, pacing_enabled=False) as view:
        view.update(_tick())
        view.update(_tick())  # the same line is not printed twice
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    assert len(lines) == 1 and "suspects: nic:node1/eth0" in lines[0]


@pytest.mark.parametrize("rate_mbit", [1, 10, 100, 130, 200, 800, 10_000])
def test_a_tbf_burst_holds_any_queued_packet(rate_mbit: float) -> None:
    """A rate change keeps the tbf's queue; a queued GSO packet (up to 64 KiB on veth) larger
    than the new burst would never leave (800 to 100 Mbit/s wedged a job), so every burst,
    slow rates included, exceeds it; fast rates keep 4 ms worth."""
    args = netns.tbf_args(rate_mbit)
    burst = int(args[args.index("burst") + 1])
    assert burst > 65536
    assert burst >= rate_mbit * 1e6 / 8 * 0.004


def test_an_unknown_uplink_sharing_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="uplink sharing 'wfq': one of fifo, fair"):
        FabricSpec(uplink_sharing="wfq")
    assert "shared fairly by node" in Fabric(FabricSpec(uplink_sharing="fair")).describe()
    assert "fairly" not in FABRIC.describe()


def test_a_paced_runs_summary_says_what_delays_the_ranks_applied(tmp_path: Path) -> None:
    """The demo's comparison line beside what pacing did: the ranks' ``pacing.delay`` spans
    (of this job, above 0, well-typed) summed; a paced run that delayed nobody says that
    its difference to the unpaced run is noise."""
    from report_fixtures import line, span_json
    from skewtrace.cluster.outcome import Outcome
    from skewtrace.cluster.summary import Summary, summarize_run

    def delay(job: str, seconds: object) -> str:
        attrs = {semconv.STEP: 3, semconv.PACING_DELAY: seconds}
        span = span_json(semconv.SPAN_PACING_DELAY, 1.0, 1.1, attrs, trace_id="ab" * 16)
        return line({semconv.JOB_ID: job}, [span])

    spans = tmp_path / "spans.jsonl"
    spans.write_text(
        "\n".join(
            [
                *(delay("j-paced", seconds) for seconds in (0.012, 0.008, 0.0, "x")),
                delay("other", 0.5),
                "{not json",
            ]
        )
        + "\n"
    )
    stats = [{"rank": 0, "step_time_mean_s": 0.1, "step_time_cv": 0.1, "throughput_samples_s": 9}]
    runs = []
    for job, paced in (("j-unpaced", False), ("j-paced", True)):
        plan = JobPlan(job_id=job, script=Path("x"), steps=5, pacing=paced)
        result = JobResult(plan, started=0.0, ended=1.0, step_ends={}, stats=stats)
        runs.append(summarize_run(f"pacing {paced}", result, Outcome([], [], [], {}, 0), spans))
    assert "paced_steps" not in runs[0].figures
    assert runs[1].figures["paced_steps"] == 2
    assert runs[1].figures["pacing_delay_s"] == pytest.approx(0.02)
    lines = Summary("c", [], runs).lines()
    assert "  pacing on: 2 rank-steps delayed, 0.02 s of delay in all" in lines
    # Without a delay above 0 (or without the file): nobody was delayed, and it says so.
    for path in (tmp_path / "none.jsonl", spans):
        plan = JobPlan(job_id="quiet", script=Path("x"), steps=5, pacing=True)
        result = JobResult(plan, started=0.0, ended=1.0, step_ends={}, stats=stats)
        quiet = summarize_run("pacing on", result, Outcome([], [], [], {}, 0), path)
        assert quiet.figures["paced_steps"] == 0
        assert any("no rank was delayed" in text for text in Summary("c", [], [quiet]).lines())


def test_the_demos_comparison_pools_pairs_run_in_alternating_order() -> None:
    """Sequential runs carry the machine's drift: with step times rising by 2% a run and no
    effect of pacing, the first pair alone says -2%; pairs in order off, on, on, off pool to
    nothing. Each pair's own change is shown; an arm without a throughput gives no
    comparison; ``--pairs`` below 1 is refused at the command line."""
    from skewtrace.cluster.outcome import Outcome
    from skewtrace.cluster.summary import Summary, compare, pacing_order, summarize_run

    assert pacing_order(1) == [False, True]
    assert pacing_order(3) == [False, True, True, False, False, True]
    with pytest.raises(ValueError):
        pacing_order(0)

    def run(paced: bool, step_s: float | None, n: int) -> Any:
        stats = [{"rank": 0, "step_time_mean_s": step_s, "step_time_cv": 0.1 if paced else 0.2,
                  "throughput_samples_s": None if step_s is None else 32 / step_s}]  # fmt: skip
        plan = JobPlan(job_id=f"j-{paced}-{n}", script=Path("x"), steps=5, pacing=paced)
        result = JobResult(plan, started=0.0, ended=1.0, step_ends={}, stats=stats)
        return summarize_run(
            "pacing on" if paced else "pacing off", result, Outcome([], [], [], {}, 0)
        )

    drifting = [run(paced, 1.0 + 0.02 * i, i) for i, paced in enumerate(pacing_order(2))]
    first_pair = compare(drifting[:2])
    assert first_pair is not None and first_pair.change == pytest.approx(1 / 1.02 - 1)
    both = compare(drifting)
    assert both is not None
    assert both.change == pytest.approx(0.0, abs=1e-12)
    assert both.pairs == pytest.approx((1 / 1.02 - 1, 1.06 / 1.04 - 1))
    assert both.order == ("off", "on", "on", "off")
    assert (both.cv_off, both.cv_on) == pytest.approx((0.2, 0.1))
    line = next(t for t in Summary("c", [], drifting).lines() if "pacing on vs pacing off" in t)
    assert "throughput +0.0% over 2 pairs run off, on, on, off (-2.0%, +1.9%)" in line, line
    assert Summary("c", [], drifting).as_dict()["comparison"]["order"] == ["off", "on", "on", "off"]
    # A rank log's figure that is not a finite number reads as NaN, never raises.
    from skewtrace.cluster.job import job_figures

    odd = job_figures([{"rank": 0, "step_time_mean_s": 10**400, "step_time_cv": float("inf"),
                        "throughput_samples_s": True}])  # fmt: skip
    assert all(math.isnan(v) for v in odd.values()), odd
    # A paced arm whose runs have no throughput: nothing to compare.
    assert compare([drifting[0], run(True, None, 9)]) is None
    assert Summary("c", [], drifting[:1]).as_dict()["comparison"] is None
    refused = subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "demo", "--pairs", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "--pairs: at least 1, got 0" in refused.stderr
