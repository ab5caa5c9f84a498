"""`skewtrace demo`, the README's main job, with its defaults: the real collector, the real
pacer and real gloo ranks, on the emulated fabric when this machine allows namespaces (the
default scenario throttles node2's NIC for steps 15-44) or on loopback otherwise (a compute
straggler on rank 2 from step 10), in two pairs of runs with pacing off and on, in alternating
order (under ``make eval``: four runs take minutes; ``make test`` runs one fault scenario of
the main job, tests/test_main_job.py). Every figure of its summary is recomputed from the
ranks' logs and the Collector's spans, the comparison of the arms too, and the report,
rendered in Chromium, marks the ranks the last verdict flags."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import needs
from collector_harness import read_file_export
from live_checks import assert_flagged_at_some_point
from skewtrace import _resources
from skewtrace.cluster.metrics import parse_prometheus_text, summarize
from skewtrace.cluster.outcome import read_verdicts
from skewtrace.semconv import JOB_ID


@pytest.mark.slow
@pytest.mark.collector
@pytest.mark.eval  # four runs, about 3.5 minutes: make test runs one scenario (test_main_job)
def test_demo_defaults_name_the_injected_fault(
    otelcol_path: Path, repo_root: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "demo", "--otelcol", str(otelcol_path),
         "--workdir", str(tmp_path)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    labels = [r["label"] for r in summary["runs"]]
    assert labels == ["pacing off", "pacing on", "pacing on", "pacing off"]
    assert summary["comparison"]["order"] == ["off", "on", "on", "off"]
    exported = read_file_export(tmp_path / "spans.jsonl")
    on_fabric = "network namespaces" in result.stdout
    expected = "rank 2 (network), nic:node2/eth0" if on_fabric else "rank 2 (compute)"
    faulty = {2: "network"} if on_fabric else {2: "compute"}
    for run in summary["runs"]:
        (phase,) = [p for p in run["phases"] if p["expected"] != "nothing flagged"]
        assert phase["expected"] == expected, phase
        spans = [s for s in exported if s.resource.get(JOB_ID) == run["job_id"]]
        # Live, the fault is named at some point (every step's verdict of the demo's runs
        # is decided on its recordings: tests/test_recorded_demo.py).
        rank, cause = next(iter(faulty.items()))
        assert_flagged_at_some_point(spans, rank, cause, phase["onset_step"])
        assert (tmp_path / f"report-{run['job_id']}.html").stat().st_size > 0
    assert re.search(r"concluded rank 2 (network|compute)", result.stdout), result.stdout
    assert re.search(
        r"pacing on vs pacing off: throughput [+-]\d+\.\d% over 2 pairs run off, on, on, off",
        result.stdout,
    ), result.stdout[-3000:]
    assert re.search(r"\d+ collectives joined across ranks", result.stdout), result.stdout
    ranks = re.findall(
        r"^\s+(\d+)(\s+\S+){3}(\s+\d+\.\d){3}\s+(ok|STRAGGLER)", result.stdout, re.MULTILINE
    )
    assert len(ranks) == (6 if on_fabric else 4), result.stdout[-3000:]
    _assert_figures_come_from_the_run(tmp_path, summary, on_fabric)
    _assert_report_marks_the_last_verdict(tmp_path, summary["runs"][0]["job_id"], len(ranks))


def _assert_figures_come_from_the_run(
    workdir: Path, summary: dict[str, Any], on_fabric: bool
) -> None:
    """Each run's step-time figures are rank 0's own, its first verdict step is the first step
    the Collector's verdict spans name the fault, and the comparison pools each arm's samples
    over its time (the runs have the same steps and batch), per pair and over both."""
    flagged = {2: "network"} if on_fabric else {2: "compute"}
    throughputs: list[tuple[str, float]] = []
    for run in summary["runs"]:
        job = run["job_id"]
        stats = [
            json.loads(line[line.index("{") :])
            for line in (workdir / job / "rank0.log").read_text().splitlines()
            if '"step_stats"' in line
        ]
        assert run["figures"]["step_time_mean_s"] == pytest.approx(stats[0]["step_time_mean_s"])
        assert run["figures"]["step_time_cv"] == pytest.approx(stats[0]["step_time_cv"])
        throughputs.append((run["label"], stats[0]["throughput_samples_s"]))
        verdicts = read_verdicts(workdir / "spans.jsonl", job)
        (phase,) = [p for p in run["phases"] if p["expected"] != "nothing flagged"]
        matches = [
            s for s, v in sorted(verdicts.items())
            if phase["onset_step"] <= s <= phase["steps"][1] and v.flagged == flagged
            and (not on_fabric or "nic:node2/eth0" in v.suspects)
        ]  # fmt: skip
        assert phase["flag_step"] == (matches[0] if matches else None), (phase, matches)
        if matches:
            assert phase["steps_to_flag"] == matches[0] - phase["onset_step"]

    def pooled(label: str, runs: list[tuple[str, float]]) -> float:
        arm = [x for name, x in runs if name == label]
        return len(arm) / sum(1 / x for x in arm)

    def change(runs: list[tuple[str, float]]) -> float:
        return pooled("pacing on", runs) / pooled("pacing off", runs) - 1

    comparison = summary["comparison"]
    assert comparison["throughput_change"] == pytest.approx(change(throughputs))
    assert comparison["pairs"] == [
        pytest.approx(change(throughputs[i : i + 2])) for i in range(0, len(throughputs), 2)
    ]


def _assert_report_marks_the_last_verdict(workdir: Path, job: str, rows: int) -> None:
    """The run's report, rendered in Chromium, draws a row per rank and marks as flagged
    exactly the ranks the Collector's verdict flags at the job's last analyzed step (the
    report's verdict; the default fault ends before the run does, so that is often none)."""
    verdicts = read_verdicts(workdir / "spans.jsonl", job)
    expected = sorted(str(rank) for rank in verdicts[max(verdicts)].flagged)
    report = workdir / f"report-{job}.html"
    assert report.is_file()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        needs.unavailable("chromium is not installed (apt-get install chromium)")
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
         report.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    drawn = re.findall(r'data-rank="(\d+)"[^>]*data-flagged="(true|false)"', dom)
    assert len(drawn) == rows, drawn
    assert [rank for rank, flagged in drawn if flagged == "true"] == expected, (drawn, expected)


def test_summary_reads_the_exporters_names() -> None:
    """The names as the Prometheus exporter writes them (unit suffixes, `_ratio` for unit 1),
    with an OpenMetrics exemplar on a bucket line."""
    text = "\n".join(
        [
            "# TYPE training_rank_lateness_seconds histogram",
            'training_rank_lateness_seconds_bucket{training_job_id="j",training_rank="2",le="0.1"}'
            ' 3 # {trace_id="ab"} 0.05 1.0',
            'training_rank_lateness_seconds_sum{training_job_id="j",training_rank="2",'
            'host_name="n1",training_switch="leaf1",training_nic="eth0"} 0.12',
            'training_rank_lateness_seconds_count{training_job_id="j",training_rank="2"} 3',
            'training_straggler_ratio{training_job_id="j",training_rank="2",'
            'training_straggler_cause="data"} 1',
            'training_straggler_ratio{training_job_id="j",training_rank="1"} 0',
            'training_fabric_suspect_ratio{training_job_id="j",training_fabric_suspect_kind="nic",'
            'training_fabric_suspect_name="eth0",host_name="n1"} 1',
            'training_fabric_suspect_ratio{training_job_id="j",training_fabric_suspect_kind="switch",'
            'training_fabric_suspect_name="leaf0",host_name=""} 0',
            'training_rank_cost_seconds{training_job_id="j",training_rank="2"} 0.025',
            'training_job_slowdown_ratio{training_job_id="j"} 1.25',
            'training_barrier_skew_seconds_sum{training_job_id="j"} 0.5',
            'training_barrier_skew_seconds_count{training_job_id="j"} 10',
            'training_barrier_skew_seconds_count{training_job_id="other"} 99',
        ]
    )
    ranks, job = summarize(parse_prometheus_text(text), "j")
    assert ranks[2].lateness_mean == pytest.approx(0.04)
    assert (ranks[2].host, ranks[2].switch, ranks[2].nic) == ("n1", "leaf1", "eth0")
    assert ranks[2].straggler and ranks[2].cause == "data"
    assert ranks[2].cost == pytest.approx(0.025)
    assert job["slowdown"] == pytest.approx(1.25)
    assert [k for k in job if k.startswith("suspect:")] == ["suspect:nic:n1/eth0"]
    assert not ranks[1].straggler
    assert job["collectives"] == 10 and job["skew_sum"] == pytest.approx(0.5)


def test_label_values_are_unescaped() -> None:
    text = (
        "# TYPE training_straggler_ratio gauge\n"
        'training_straggler_ratio{training_job_id="a\\\\b \\"q\\"\\n",training_rank="1"} 1\n'
    )
    (sample,) = parse_prometheus_text(text)
    assert sample.labels["training_job_id"] == 'a\\b "q"\n'
    assert sample.value == 1


def test_openmetrics_pages_keep_exemplars() -> None:
    text = "\n".join(
        [
            "# TYPE training_rank_wait_seconds histogram",
            'training_rank_wait_seconds_bucket{le="0.1"} 3 # {trace_id="ab"} 0.05',
            'training_rank_wait_seconds_bucket{le="+Inf"} 4',
            "training_rank_wait_seconds_count 4",
            "training_rank_wait_seconds_sum 0.2",
            "# TYPE training_collective_incomplete counter",
            'training_collective_incomplete_total{training_job_id="j"} 2',
            "# EOF",
        ]
    )
    samples = parse_prometheus_text(text)
    (bucket,) = [s for s in samples if s.labels.get("le") == "0.1"]
    assert bucket.exemplar is not None and bucket.exemplar.labels == {"trace_id": "ab"}
    _, job = summarize(samples, "j")
    assert job["incomplete"] == 2


# ---------------------------------------------------------------- finding the collector


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_otelcol_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$SKEWTRACE_OTELCOL, the checkout's build/, PATH, then the per-version cache."""
    checkout = tmp_path / "checkout"
    monkeypatch.setattr(_resources, "checkout", lambda: checkout)
    env = {"PATH": str(tmp_path / "bin"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert _resources.find_otelcol(env).found is None
    cached = _exe(_resources.cache_dir(env) / "otelcol-skewtrace")
    assert _resources.find_otelcol(env).found == cached
    on_path = _exe(tmp_path / "bin" / "otelcol-skewtrace")
    assert _resources.find_otelcol(env).found == on_path
    built = _exe(checkout / "build" / "otelcol-skewtrace")
    assert _resources.find_otelcol(env).found == built
    explicit = _exe(tmp_path / "elsewhere" / "otelcol")
    assert _resources.find_otelcol({**env, "SKEWTRACE_OTELCOL": str(explicit)}).found == explicit
    missing = _resources.find_otelcol({**env, "SKEWTRACE_OTELCOL": str(tmp_path / "nope")})
    assert missing.found is None, "a wrong SKEWTRACE_OTELCOL must not fall back to another binary"


def test_cache_is_per_version(tmp_path: Path) -> None:
    cache = _resources.cache_dir({"XDG_CACHE_HOME": str(tmp_path)})
    assert cache == tmp_path / "skewtrace" / "collector" / _resources.__version__


def test_without_collector_or_go_the_demo_says_how_to_get_one(
    tmp_path: Path,
    repo_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from skewtrace.cli import main

    # As installed: no checkout; the shipped files are the checkout's own.
    monkeypatch.setattr(_resources, "checkout", lambda: None)
    monkeypatch.setattr(_resources, "source_root", lambda: repo_root)
    monkeypatch.delenv("SKEWTRACE_OTELCOL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no otelcol-skewtrace, no go
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "otelcol-skewtrace not found" in err
    assert "Go is not installed" in err
    assert "--otelcol PATH or set SKEWTRACE_OTELCOL" in err
    assert str(_resources.cache_dir()) in err  # where it would build it


def test_shipped_files_are_found_from_the_checkout(tmp_path: Path) -> None:
    """From a checkout (an editable install) the demo reads the checkout's own files, whatever
    the working directory; tests/test_wheel.py checks the installed package."""
    for relative in ("collector-config/otelcol.yaml", "examples/train_ddp.py"):
        found = _resources.shipped(relative)
        assert found is not None and found.is_file(), relative
    result = subprocess.run(
        [sys.executable, "-c", "from skewtrace import _resources as r; print(r.source_root())"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert Path(result.stdout.strip()).is_dir()


def test_demo_durations_are_milliseconds_and_old_flags_still_work() -> None:
    from skewtrace.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["demo", "--settle-millis", "1500", "--timeout-s", "30"])
    assert (args.settle_s, args.timeout_s) == (1.5, 30.0)
    defaults = parser.parse_args(["demo"])
    assert (defaults.settle_s, defaults.timeout_s) == (4.0, 600.0)
