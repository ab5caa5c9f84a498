"""`make bench` stopped at benchmarks/collector_e2e.py for a while: its processor-only config
(derived from otelcol.yaml) no longer loaded once otelcol.yaml fed traces/backend through the
forward connector, and its held-memory run set a wait_timeout above max_wait. A smoke run at
the smallest size keeps the benchmark loading the distribution's current config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.collector, pytest.mark.slow]


def test_collector_e2e_benchmark_runs(otelcol_path: Path, repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/collector_e2e.py", "--otelcol", str(otelcol_path),
         "--ranks", "64", "--steps", "4", "--rounds", "1"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(repo_root / "tests")},
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "barrierskew end to end:" in result.stdout
    assert "held by barrierskew:" in result.stdout
