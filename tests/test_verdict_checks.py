"""The flag hysteresis the end-to-end verdict tests hold the Collector to
(``verdict_checks``), on the steps of a recorded FSDP2 x TP run under a CPU hog: rank 2 named
a root cause in steps 10-15 and 20-23, rank 3 in steps 7 and 9."""

from __future__ import annotations

import verdict_checks as v

NAMED: dict[int, dict[int, str]] = {s: {} for s in range(24)}
NAMED |= {7: {3: "compute"}, 9: {3: "compute"}}
NAMED |= {s: {2: "compute"} for s in [*range(10, 16), *range(20, 24)]}
SEEN = {13, 14, 15, 16, 17, 20, 21, 22, 23}  # the steps whose summaries flagged rank 2


def test_the_collectors_flags_of_that_run_follow_the_hysteresis() -> None:
    expected = v.expected_flagged(NAMED, 2)
    assert {s for s, f in expected.items() if f} == SEEN
    assert not any(v.expected_flagged(NAMED, 3).values())  # 2 of 8: never flagged
    flags = {s: ({2: "compute"} if s in SEEN else {}) for s in range(24)}
    assert v.flags_follow_root_causes(NAMED, flags, 2, "compute", range(24)) == []


def test_a_flag_the_hysteresis_does_not_make_is_reported() -> None:
    early = {s: ({2: "compute"} if s in SEEN | {12} else {}) for s in range(24)}
    assert v.flags_follow_root_causes(NAMED, early, 2, "compute", range(24)) == [12]
    dropped = {s: ({2: "compute"} if s in SEEN - {16} else {}) for s in range(24)}
    assert v.flags_follow_root_causes(NAMED, dropped, 2, "compute", range(24)) == [16]
    wrong_cause = {s: ({2: "network"} if s in SEEN else {}) for s in range(24)}
    assert v.flags_follow_root_causes(NAMED, wrong_cause, 2, "compute", [13]) == [13]


def test_the_warm_up_votes_for_nothing() -> None:
    named = {s: {5: "compute"} for s in range(6)}
    assert [s for s, f in v.expected_flagged(named, 5).items() if f] == [5]
