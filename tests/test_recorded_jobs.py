"""Recorded jobs replayed into the built collector: the rank spans a real run sent (its
file export, the Collector's own summaries taken out), sent again over OTLP/HTTP to a fresh
otelcol-skewtrace, whose verdicts are then checked per analyzed step.

``data/recorded/fsdp2_tp_cpu_hog.jsonl.gz``: ``examples/frameworks/fsdp2_tp.py`` under
torchrun on four gloo ranks (a 2 x 2 mesh, zero-code instrumentation) during ``make test``
beside ``stress-ng --cpu 1`` (2026-12-06); rank 2 sleeps 100 ms in every forward from step
10. The hog descheduled the other ranks too: rank 1 launched its next collective 10 ms after
its tensor-parallel all-reduce (88 ms of waiting for the straggler) completed, and spent 50 ms
more than its peers on its own work in several steps. The collector of that run named rank 2
in 3 of the 11 slow steps it analyzed and flagged it in none before step 20; rank 1's
middling excess set the candidates' bar above the straggler, and its wait was read as its
own work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from span_replay import read_recording, replay

pytestmark = [pytest.mark.collector]

RECORDED = Path(__file__).parent / "data" / "recorded"


def test_fsdp2_tp_straggler_beside_a_cpu_hog_is_named_in_every_slow_step(
    otelcol_path: Path, tmp_path: Path
) -> None:
    """Per analyzed step from step 11 (the first whole slow step after its warm-up) to 22:
    the replay names rank 2 for compute, and no other rank; from step 13 (four namings in
    the window) the Collector flags rank 2 for compute and nobody else. Before the slowdown
    nobody is flagged."""
    (summaries,) = replay(
        otelcol_path, read_recording(RECORDED / "fsdp2_tp_cpu_hog.jsonl.gz"), tmp_path
    ).values()
    named = {step: {r.rank: r.cause for r in s.root_causes} for step, s in summaries.items()}
    flags = {step: {f.rank: f.cause for f in s.flags} for step, s in summaries.items()}
    assert set(range(1, 23)) <= set(named), sorted(named)
    slow = range(11, 23)
    assert [s for s in slow if named[s] != {2: "compute"}] == [], {s: named[s] for s in slow}
    assert [s for s in range(13, 23) if flags[s] != {2: "compute"}] == [], flags
    assert not any(flags[s] for s in range(1, 10)), flags
