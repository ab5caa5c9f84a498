"""`skewtrace demo`'s recorded runs: no false flag, and the NIC fault named exactly where it
was (issue 45, "End the demo's false flags").

``tests/data/recorded/demo/`` holds jobs of ``skewtrace demo`` runs (``jobs.json`` says how
each was made and why it is kept): the rank spans of six ranks of ``examples/train_2d.py`` on
the emulated fabric, node2's NIC throttled from the step the fault was switched at until it
was restored (or to the run's end). Six are 60-step runs with the defaults in which the
Collector of that run flagged a healthy rank (a few milliseconds of transfers and compute a
descheduled rank lost now and then, named four times in eight steps); one is the main job's
26-step ``nic:node2:200@8`` scenario whose fault that Collector never named after a slow
start. Played again (``tests/test_recorded_verdicts.py``; nothing timed decides), every step is
analysed with its six ranks; no rank but 2 is ever flagged and nothing but node2's NIC is
suspected; rank 2 is flagged for the network with ``nic:node2/eth0`` exactly in the steps
``expected.json`` records, which lie where the fault and the Collector's hysteresis put them:
from ``flag_k - 1`` steps after the switch (a step earlier where the pipeline's ranks
straddled it, or a few later where a noisy step or two did not show it) to ``clear_steps -
1`` steps after the restore (or one more), or to the run's end.
"""

from __future__ import annotations

import pytest

from expected_verdicts import expected, jobs
from span_replay import collector_default

DEMO = jobs("demo")
EXPECTED = expected("demo")


@pytest.mark.parametrize("job", sorted(DEMO))
def test_the_demo_flags_its_nic_fault_where_the_fault_and_the_hysteresis_put_it(job: str) -> None:
    """Every step's verdict is held to ``demo/expected.json`` by
    tests/test_recorded_verdicts.py (through the built Collector) and ``TestRecordedVerdicts``
    (Go). Here: those expectations flag rank 2 for the network with node2's NIC in one stretch
    of steps, and nothing else, and that stretch lies where the fault and the Collector's
    hysteresis put it (read from its Go config, so a new default changes only the
    expectations, which tests/expected_verdicts.py rewrites)."""
    want = DEMO[job]
    segments = EXPECTED[job]["segments"]
    flagged = [seg for seg in segments if seg["flags"]]
    assert [(seg["flags"], seg["suspects"]) for seg in flagged] == [
        ({"2": "network"}, ["nic:node2/eth0"])
    ], segments
    quiet = [seg for seg in segments if not seg["flags"]]
    assert all(not seg["suspects"] and not seg["imbalances"] for seg in quiet), segments
    ((first, last),) = [seg["steps"] for seg in flagged]
    steps = want["steps"]
    k, clear = int(collector_default("FlagK")), int(collector_default("ClearSteps"))
    # The demo switches the link when rank 0 reaches the step; a pipeline's other ranks are
    # a step behind or ahead then, so the fault shows from the step before it on.
    assert want["link_switched_at"] + k - 2 <= first <= want["link_switched_at"] + 2 * k
    if want["link_restored_at"] < steps:
        assert want["link_restored_at"] + clear - 2 <= last <= want["link_restored_at"] + clear - 1
    else:  # throttled to the run's end
        assert last == steps - 1
