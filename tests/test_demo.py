"""`skewtrace demo`, the README's main job: the real collector, the real pacer and a 4-rank
gloo run with a compute straggler on rank 2, end to end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from skewtrace.demo import parse_prometheus_text, summarize


@pytest.mark.slow
@pytest.mark.collector
def test_demo_names_the_compute_straggler(otelcol_path: Path, repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "demo", "--otelcol", str(otelcol_path)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        int(m["rank"]): m["verdict"]
        for m in re.finditer(
            r"^\s+(?P<rank>\d)\s+.*\s(?P<verdict>ok|STRAGGLER \(\w+\))$",
            result.stdout,
            re.MULTILINE,
        )
    }
    assert sorted(rows) == [0, 1, 2, 3], result.stdout
    assert rows[2] == "STRAGGLER (compute)", result.stdout
    assert re.search(r"\d+ collectives joined across ranks", result.stdout), result.stdout


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
            'training_straggler_domain_ratio{training_job_id="j",training_switch="leaf1"} 1',
            'training_barrier_skew_seconds_sum{training_job_id="j"} 0.5',
            'training_barrier_skew_seconds_count{training_job_id="j"} 10',
            'training_barrier_skew_seconds_count{training_job_id="other"} 99',
        ]
    )
    ranks, job = summarize(parse_prometheus_text(text), "j")
    assert ranks[2].lateness_mean == pytest.approx(0.04)
    assert (ranks[2].host, ranks[2].switch, ranks[2].nic) == ("n1", "leaf1", "eth0")
    assert ranks[2].straggler and ranks[2].cause == "data"
    assert not ranks[1].straggler
    assert job["collectives"] == 10 and job["skew_sum"] == pytest.approx(0.5)
