"""Rebalancing end to end: 4 gloo ranks, one at half speed -> otelcol-skewtrace -> skewtrace
pacer --policy rebalance -> shares back to rank 0 -> ShareSampler on every rank.

Everything is real and runs as separate processes (``examples/train_rebalance.py``, the built
collector, the ``skewtrace pacer`` console script, an OTLP sink standing in for the trace
backend); the harness is ``benchmarks/rebalance.py``'s. Takes a few minutes on the shared
2-core machine.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import rebalance as bench

# A policy's arm, measured live (a minute and a half): under `make eval`, not `make test`;
# tests/test_rebalance_equivalence.py and tests/test_pacer_rebalance.py hold the mechanism.
pytestmark = [pytest.mark.slow, pytest.mark.collector, pytest.mark.eval]

STEPS = 450
GLOBAL_BATCH = 128


def test_half_speed_rank_gets_a_smaller_share_and_the_step_time_drops(
    otelcol_path: Path, tmp_path: Path
) -> None:
    with bench.harness.running_stack(
        otelcol_path, tmp_path, pacer_args=["--policy", "rebalance"]
    ) as stack:
        result = bench.run_job(stack, "e2e", steps=STEPS, slow=["0:0.5"], rebalance=True)
        log = stack.log_tail()

    ranks = result.ranks
    # Every rank ran every step with the same sizes, summing to the global batch.
    assert all(len(ranks[r].sizes) == STEPS for r in ranks)
    for step in range(STEPS):
        sizes = [ranks[r].sizes[step] for r in range(4)]
        assert sum(sizes) == ranks[0].global_sizes[step], (step, sizes)
        assert {ranks[r].shares_version[step] for r in range(4)} == {ranks[0].shares_version[step]}

    decisions = [d for _, d in result.decisions if d.get("shares")]
    assert decisions, f"the pacer never published shares\n{log}"
    final = decisions[-1]
    assert final["policy"] == "rebalance"
    assert sum(final["shares"].values()) == pytest.approx(1.0, abs=1e-5)
    assert final["shares"]["0"] == min(final["shares"].values())
    assert final["shares"]["0"] < 0.2, final  # equal is 0.25; speed-proportional 0.143

    changed = next(i for i, v in enumerate(ranks[0].shares_version) if v > 0)
    sizes = result.final_sizes()
    print(f"shares from step {changed}; final sizes {sizes}; decision {final}")
    assert sizes[0] < 0.8 * GLOBAL_BATCH / 4 and min(sizes[1:]) > GLOBAL_BATCH / 4
    before = statistics.fmean(ranks[0].step_s[10:changed])
    after = statistics.fmean(ranks[0].step_s[-100:])
    print(f"rank 0 step time {before * 1e3:.1f} ms before, {after * 1e3:.1f} ms after")
    assert after < 0.85 * before
