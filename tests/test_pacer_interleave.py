"""The interleave policy: offsets for groups whose communication phases collide on a shared
uplink (skewtrace.controller.policies.interleave), under the effect guard."""

from __future__ import annotations

from skewtrace.controller.policies import build_policy
from skewtrace.controller.policies.interleave import (
    REASON_INTERLEAVING,
    REASON_NO_COLLISION,
    REASON_NO_PHASES,
    InterleaveParams,
    InterleavePolicy,
)
from skewtrace.controller.window import GroupPhases, JobWindow

SPINE = ("leaf-00", "leaf-01")
# A gather of 0.2 s at the step's start and an all-reduce of 0.2 s after compute: two groups
# that share the spine and collide on both, each twice as long as alone.
GATHER, REDUCE = (0.02, 0.2), (0.374, 0.2)


def group(pg: str, *phases: tuple[float, float], hosts=(), switches=SPINE, applied=0.0):
    return GroupPhases(pg, tuple(phases), switches, tuple(hosts), applied)


def decide(*groups: GroupPhases, params: InterleaveParams | None = None):
    policy = InterleavePolicy(params or InterleaveParams(interleave_effect_pairs=0))
    return policy.decide(JobWindow(now=0.0, ranks={}, groups=groups), policy.initial_state())


def test_two_colliding_groups_interleave() -> None:
    out = decide(group("dp0", GATHER, REDUCE), group("dp1", GATHER, REDUCE))
    # Alone, each phase takes 0.1 s: the second group starts one phase later.
    assert out.reason == REASON_INTERLEAVING and out.active
    assert out.info["offsets"] == {"dp1": 0.1}
    assert out.info["interleave"]["overlap_after_s"] == 0
    assert out.info["interleave"]["overlap_s"] > 0.19


def test_interleaved_groups_keep_their_offset() -> None:
    # Once offset, the phases no longer overlap as observed (alone durations): the same
    # offset again, from the natural starts (observed minus the offset given).
    shifted = [(start + 0.1, 0.1) for start, _ in (GATHER, REDUCE)]
    out = decide(
        group("dp0", (0.02, 0.1), (0.274, 0.1)),
        group("dp1", *shifted, applied=0.1),
    )
    assert out.info["offsets"] == {"dp1": 0.1}


def test_disjoint_phases_get_no_offset() -> None:
    out = decide(group("dp0", (0.02, 0.1)), group("dp1", (0.2, 0.1)))
    assert out.reason == REASON_NO_COLLISION and not out.active and out.info["offsets"] == {}


def test_groups_behind_one_switch_or_without_phases_are_left_alone() -> None:
    one_leaf = ("leaf-00",)
    out = decide(group("dp0", GATHER, switches=one_leaf), group("dp1", GATHER, switches=one_leaf))
    assert out.reason == REASON_NO_PHASES and not out.active
    assert decide().reason == REASON_NO_PHASES


def test_groups_on_different_uplinks_do_not_collide() -> None:
    out = decide(
        group("dp0", GATHER, switches=("leaf-00", "leaf-01")),
        group("dp1", GATHER, switches=("leaf-02", "leaf-03")),
    )
    assert out.info["offsets"] == {}


def test_offsets_are_bounded() -> None:
    params = InterleaveParams(interleave_effect_pairs=0, interleave_max_offset_s=0.04)
    out = decide(group("dp0", GATHER), group("dp1", GATHER), params=params)
    assert out.info["offsets"] == {"dp1": 0.04}


def test_groups_sharing_a_host_get_one_offset() -> None:
    # Rails of one set share hosts (a node's tensor-parallel group ties them): one unit.
    out = decide(
        group("dp0.0", GATHER, REDUCE, hosts=["node-0", "node-2"]),
        group("dp0.1", GATHER, REDUCE, hosts=["node-0", "node-2"]),
        group("dp1.0", GATHER, REDUCE, hosts=["node-1", "node-3"]),
        group("dp1.1", GATHER, REDUCE, hosts=["node-1", "node-3"]),
    )
    assert out.info["offsets"] == {"dp1.0": 0.1, "dp1.1": 0.1}


def test_guarded_offsets_are_withheld_while_measuring() -> None:
    # Under the effect guard (the registry's entry) the offsets are measured like pacing's
    # delays: published in the first phase, withheld (no offsets, inactive) in the second.
    params = InterleaveParams(interleave_effect_pairs=2, interleave_effect_phase_s=5.0)
    policy = build_policy("interleave", [params])
    groups = (group("dp0", GATHER, REDUCE), group("dp1", GATHER, REDUCE))
    state = policy.initial_state()
    seen = []
    for now in (0.0, 1.0, 6.0, 7.0):
        out = policy.decide(JobWindow(now=now, ranks={}, groups=groups), state)
        state = out.state
        seen.append((out.active, dict(out.info["offsets"]), out.reason))
    assert seen[0] == (True, {"dp1": 0.1}, REASON_INTERLEAVING)
    assert seen[2] == (False, {}, "measuring")


def test_composes_with_pacing() -> None:
    policy = build_policy("pacing,interleave", [InterleaveParams(interleave_effect_pairs=0)])
    groups = (group("dp0", GATHER, REDUCE), group("dp1", GATHER, REDUCE))
    out = policy.decide(JobWindow(now=0.0, ranks={}, groups=groups), policy.initial_state())
    # Pacing has no ranks to judge; interleave's offsets are on the composed outcome.
    assert out.active and out.info["offsets"] == {"dp1": 0.1}
