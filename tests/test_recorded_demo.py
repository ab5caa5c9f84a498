"""`skewtrace demo`'s recorded runs through the built Collector: no false flag, and the NIC
fault named exactly where it was (issue 45, "End the demo's false flags").

``tests/data/recorded/demo/`` holds jobs of ``skewtrace demo`` runs (``demo.json`` says how
each was made and why it is kept): the rank spans of six ranks of ``examples/train_2d.py`` on
the emulated fabric, node2's NIC throttled from the step the fault was switched at until it
was restored (or to the run's end). Six are 60-step runs with the defaults in which the
Collector of that run flagged a healthy rank (a few milliseconds of transfers and compute a
descheduled rank lost now and then, named four times in eight steps); one is the main job's
26-step ``nic:node2:200@8`` scenario whose fault that Collector never named after a slow
start. Played again (``tests/span_replay.py``; nothing timed decides), every step is
analysed with its six ranks; no rank but 2 is ever flagged and nothing but node2's NIC is
suspected; rank 2 is flagged for the network with ``nic:node2/eth0`` exactly in the steps
``demo.json`` records, which lie where the fault and the Collector's hysteresis put them:
from ``flag_k - 1`` steps after the switch (a step earlier where the pipeline's ranks
straddled it, or a few later where a noisy step or two did not show it) to ``clear_steps -
1`` steps after the restore (or one more), or to the run's end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skewtrace import semconv
from span_replay import collector_default, read_recording, replay

pytestmark = [pytest.mark.collector, pytest.mark.slow]

DEMO = Path(__file__).parent / "data" / "recorded" / "demo"
MANIFEST = json.loads((DEMO / "demo.json").read_text())


@pytest.mark.parametrize("job", sorted(MANIFEST["jobs"]))
def test_the_demo_names_its_nic_fault_and_nothing_else(
    job: str, otelcol_path: Path, tmp_path: Path
) -> None:
    want = MANIFEST["jobs"][job]
    summaries = replay(otelcol_path, read_recording(DEMO / f"{job}.jsonl.gz"), tmp_path)[job]
    steps = want.get("steps", 60)
    assert sorted(summaries) == list(range(steps))
    assert {s.ranks for s in summaries.values()} == {6}
    k, clear = int(collector_default("FlagK")), int(collector_default("ClearSteps"))
    first, last = want["flagged_from"], want["flagged_until"]
    # The demo switches the link when rank 0 reaches the step; a pipeline's other ranks are
    # a step behind or ahead then, so the fault shows from the step before it on.
    assert want["link_switched_at"] + k - 2 <= first <= want["link_switched_at"] + 2 * k
    if want["link_restored_at"] < steps:
        assert want["link_restored_at"] + clear - 2 <= last <= want["link_restored_at"] + clear - 1
    else:  # throttled to the run's end
        assert last == steps - 1
    wrong = []
    for step, summary in sorted(summaries.items()):
        flags = {f.rank: f.cause for f in summary.flags}
        suspects = {s.key for s in summary.suspects}
        expected = {2: semconv.CAUSE_NETWORK} if first <= step <= last else {}
        expected_suspects = {"nic:node2/eth0"} if expected else set()
        if flags != expected or suspects != expected_suspects:
            wrong.append(f"step {step}: flags {flags} suspects {sorted(suspects)}")
    assert not wrong, wrong
