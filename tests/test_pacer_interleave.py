"""The interleave policy: offsets for groups whose communication phases collide on a shared
uplink (skewtrace.controller.policies.interleave), under the effect guard."""

from __future__ import annotations

from dataclasses import replace

import pytest

from skewtrace.controller.policies import build_policy
from skewtrace.controller.policies.interleave import (
    REASON_INTERLEAVING,
    REASON_NO_COLLISION,
    REASON_NO_PHASES,
    InterleaveParams,
    InterleavePolicy,
    aligned_overlap,
    units,
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


def test_a_world_group_does_not_tie_the_sets_it_keeps_in_step() -> None:
    # examples/train_ddp.py --sets 2: two sets' data-parallel groups on nodes of alternating
    # parity, and the loss all-reduce over the world (every host) at the step's end. Tied
    # through the world group the sets would be one unit with nothing to interleave; every
    # rank waits for it whatever the offsets, so it ties nothing and gets no offset.
    world = ["node-0", "node-1", "node-2", "node-3"]
    loss = (0.6, 0.002)
    sets = (
        group("1", GATHER, REDUCE, hosts=["node-0", "node-2"]),
        group("2", GATHER, REDUCE, hosts=["node-1", "node-3"]),
    )
    out = decide(*sets, group("0", loss, hosts=world))
    assert out.info["offsets"] == {"2": 0.1}
    assert [u.pgs for u in units((*sets, group("0", loss, hosts=world)))] == [("1",), ("2",)]
    # A plain DDP job's world is its only crossing group: it stays (the two-job schedule
    # reads it), as do groups over all hosts where the rest is one unit.
    assert [u.pgs for u in units([group("0", REDUCE, hosts=world)])] == [("0",)]
    one_set = group("1", GATHER, hosts=["node-0", "node-2"])
    tp = group("tp", (0.1, 0.01), hosts=["node-0"], switches=("leaf-00",))
    assert [u.pgs for u in units([one_set, tp, group("0", loss, hosts=world)])] == [
        ("0", "1", "tp")
    ]
    # Two jobs: each job's own world counts, not the other's hosts.
    other = replace(group("0", REDUCE, hosts=["node-4", "node-5"]), job="B")
    assert ("0",) in [
        u.pgs for u in units([other, *sets, group("0", loss, hosts=world)]) if u.job == "B"
    ]


def test_offsets_of_sets_that_wait_for_each_other_at_the_step_start_hold() -> None:
    # The same job interleaved: set "1" holds 0.1 s before its gather. The loss all-reduce
    # over the world runs after the optimizer, at the start of the next train.step, and set
    # "2" waits there for set "1" 0.1 s: after their own step starts, both sets' phases start
    # at 0.11 s. Read as if each started its step at that wait's end, set "1" would seem to
    # start 0.1 s earlier than set "2", the overlap gone, and the offset went to set "2" (a
    # run on the emulated fabric handed it from one set to the other every few seconds).
    world = ["node-0", "node-1", "node-2", "node-3"]
    held = group("1", (0.11, 0.1), (0.374, 0.1), hosts=["node-0", "node-2"], applied=0.1)
    waiting = group("2", (0.11, 0.1), (0.374, 0.1), hosts=["node-1", "node-3"])
    out = decide(held, waiting, group("0", (0.0, 0.1), hosts=world))
    assert out.info["offsets"] == {"1": 0.1}
    # Where the world's phase comes after the sets' (a gradient-norm all-reduce before the
    # optimizer), the step starts after the wait and the offset shows as it is: set "1"
    # observed 0.1 s later than set "2", naturally together, holds its offset too.
    late_world = group("0", (0.6, 0.05), hosts=world)
    shifted = group("1", (0.11, 0.1), (0.374, 0.1), hosts=["node-0", "node-2"], applied=0.1)
    alone = group("2", (0.01, 0.1), (0.274, 0.1), hosts=["node-1", "node-3"])
    assert decide(shifted, alone, late_world).info["offsets"] == {"1": 0.1}


def test_guarded_offsets_are_withheld_while_measuring() -> None:
    # Under the effect guard (the registry's entry) the offsets are measured like pacing's
    # delays: withheld (no offsets, inactive) in the first phase, published in the second.
    params = InterleaveParams(interleave_effect_pairs=2, interleave_effect_phase_s=5.0)
    policy = build_policy("interleave", [params])
    groups = (group("dp0", GATHER, REDUCE), group("dp1", GATHER, REDUCE))
    state = policy.initial_state()
    seen = []
    for now in (0.0, 1.0, 6.0, 7.0):
        out = policy.decide(JobWindow(now=now, ranks={}, groups=groups), state)
        state = out.state
        seen.append((out.active, dict(out.info["offsets"]), out.reason))
    assert seen[0] == seen[1] == (False, {}, "measuring")
    assert seen[2] == (True, {"dp1": 0.1}, REASON_INTERLEAVING)


def test_composes_with_pacing() -> None:
    policy = build_policy("pacing,interleave", [InterleaveParams(interleave_effect_pairs=0)])
    groups = (group("dp0", GATHER, REDUCE), group("dp1", GATHER, REDUCE))
    out = policy.decide(JobWindow(now=0.0, ranks={}, groups=groups), policy.initial_state())
    # Pacing has no ranks to judge; interleave's offsets are on the composed outcome.
    assert out.active and out.info["offsets"] == {"dp1": 0.1}


# Two jobs on one fabric, as in benchmarks/collision.py: a 0.1 s compute, then the gradient
# all-reduce of 0.0525 s alone, 0.105 s while the other job's runs over the same uplinks.
COLLIDING = (0.1, 0.105)


def job_group(job: str, pg: str = "0", *, step_s: float = 0.205, phase=COLLIDING):
    return GroupPhases(pg, (phase,), SPINE, (f"{job}-n0", f"{job}-n1"), 0.0, job, step_s)


def decide_jobs(policy, job: str, groups, state=None, scheduled=0.0):
    window = JobWindow(
        now=0.0,
        ranks={},
        job=job,
        groups=tuple(g for g in groups if g.job == job),
        fabric=tuple(g for g in groups if g.job != job),
        scheduled=scheduled,
    )
    return policy.decide(window, policy.initial_state() if state is None else state)


def test_groups_of_two_jobs_get_one_schedule_both_jobs_agree_on() -> None:
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    # Both jobs' process groups have the same name (each job's world group).
    groups = (job_group("A"), job_group("B"))
    a, b = decide_jobs(policy, "A", groups), decide_jobs(policy, "B", groups)
    assert a.reason == b.reason == REASON_INTERLEAVING and a.active and b.active
    # The period starts at the steps as they are plus the margin (5%); the floor it is
    # searched down to is the step without the collision: 0.205 - 0.0525 = 0.1525 s.
    assert a.info["schedule"]["period_s"] == b.info["schedule"]["period_s"] == 0.215
    assert a.info["interleave"]["floor_s"] == 0.152
    # One slot at 0, the other half a period later (their phases are as long): the phases
    # take turns around the period.
    assert a.info["schedule"]["slots"] == {"0": 0.0}
    assert b.info["schedule"]["slots"] == {"0": 0.1075}
    assert a.info["interleave"]["overlap_after_s"] == 0 < a.info["interleave"]["overlap_s"]
    # A step runs at once while its phase still ends within its turn: half the period less
    # the phase alone (0.1075 - 0.0525 s); a later one waits for its next slot.
    assert a.info["schedule"]["late_s"] == b.info["schedule"]["late_s"] == 0.055


def test_how_late_a_step_runs_at_once_is_its_turns_slack_within_bounds() -> None:
    from skewtrace.controller.policies.interleave import Schedule

    turns = {("A", "0"): (0.0, 0.0), ("B", "0"): (0.25, 0.0)}  # shares 1/4 and 3/4
    # The least slack: a quarter of the period less a quarter of the phases (the shares are
    # in proportion to the phases).
    assert Schedule(0.2, turns, busy_s=0.04).late_s == pytest.approx(0.04)
    # At or below the phases' sum, no slack: 10% of the period (a step's own jitter).
    assert Schedule(0.2, turns, busy_s=0.25).late_s == pytest.approx(0.02)
    assert Schedule(0.2, turns, busy_s=0.19).late_s == pytest.approx(0.02)
    # Never more than half the period (body version 2's rule).
    one = {("A", "0"): (0.0, 0.0)}
    assert Schedule(0.2, one, busy_s=0.0).late_s == pytest.approx(0.1)


def test_jobs_whose_phases_do_not_meet_on_the_controllers_clock_get_no_schedule() -> None:
    """Free-running jobs can take turns by themselves (issue 23's emulation: instrumented,
    they settled 161 ms apart-in-phase where uninstrumented they collided at 198 ms). Phases
    are measured from each job's own step start, so only the step starts the ranks report
    with their polls say whether the jobs' phases meet now."""
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    step = 0.205

    phase = (0.1, 0.05)

    def at(start_a: float, start_b: float, step_b: float = step):
        return (
            replace(job_group("A", phase=phase), step_start_unix=start_a),
            replace(job_group("B", step_s=step_b, phase=phase), step_start_unix=start_b),
        )

    # B's steps start half a step after A's (many steps later: modulo the step): the
    # phases (0.1 s to 0.15 s into each step) never meet. No schedule, for either job.
    apart = at(1000.0, 1000.0 + 40 * step + step / 2)
    for job in ("A", "B"):
        out = decide_jobs(policy, job, apart)
        assert out.reason == REASON_NO_COLLISION and not out.active
        assert out.info["interleave"]["aligned_overlap_s"] == 0
        assert "schedule" not in out.info
    # Steps that start together (modulo the step) collide: a schedule, as without starts.
    together = at(1000.0, 1000.0 + 7 * step + 0.01)
    a, b = decide_jobs(policy, "A", together), decide_jobs(policy, "B", together)
    assert a.reason == b.reason == REASON_INTERLEAVING
    assert a.info["schedule"]["period_s"] == b.info["schedule"]["period_s"] == 0.215
    assert aligned_overlap(units(together)) == pytest.approx(0.05 - 0.01, abs=1e-9)
    # Not told: a job that reported no start, or step times 10% apart (the phases drift
    # through each other): placed as if the steps started together.
    for groups in (at(1000.0, 0.0), at(1000.0, 1000.0 + step / 2, step_b=step * 1.1)):
        assert aligned_overlap(units(groups)) is None
        assert decide_jobs(policy, "A", groups).reason == REASON_INTERLEAVING


def _window(job: str, groups, now: float, scheduled: float) -> JobWindow:
    return JobWindow(
        now=now,
        ranks={},
        job=job,
        groups=tuple(g for g in groups if g.job == job),
        fabric=tuple(g for g in groups if g.job != job),
        scheduled=scheduled,
    )


def window(now: float, phase, step_s: float, scheduled: float = 0.0) -> JobWindow:
    """Job B's window of jobs A and B with one group each, alike: ``phase`` and ``step_s``."""
    both = (
        job_group("A", step_s=step_s, phase=phase),
        job_group("B", step_s=step_s, phase=phase),
    )
    return _window("B", both, now, scheduled)


def test_the_period_comes_down_while_steps_keep_up_and_goes_up_when_they_do_not() -> None:
    params = InterleaveParams(interleave_effect_pairs=0, interleave_settle_s=6.0)
    policy = InterleavePolicy(params)
    out = policy.decide(
        _window("B", (job_group("A"), job_group("B")), 0.0, 0.0), policy.initial_state()
    )
    periods = [out.info["schedule"]["period_s"]]
    now = 0.0

    def step(step_a: float, step_b: float, scheduled: float = 1.0, dt: float = 6.0) -> float:
        nonlocal out, now
        now += dt
        held = (
            job_group("A", step_s=step_a, phase=(0.1, 0.0525)),
            job_group("B", step_s=step_b, phase=(0.153, 0.0525)),
        )
        out = policy.decide(_window("B", held, now, scheduled), out.state)
        period = float(out.info["schedule"]["period_s"])
        # The slots keep their fraction of the period (half of it).
        assert out.info["schedule"]["slots"]["0"] == pytest.approx(period / 2, abs=2e-6)
        return period

    # Locked (every step waits for its slot, steps = the period): 4% shorter each settle.
    periods.append(step(0.215, 0.215))
    assert periods[-1] == 0.206
    # Judged only once a new period has run for interleave_settle_s, over a whole window.
    assert step(0.206, 0.206, dt=1.0) == 0.206
    assert step(0.206, 0.206, scheduled=0.5) == 0.206
    while periods[-1] > 0.16:
        periods.append(step(periods[-1], periods[-1]))
    # Down to the floor (0.152 s) and no further.
    assert step(periods[-1], periods[-1]) == periods[-1] >= 0.152
    # A job whose steps outgrow the period (by more than half the margin) for a settle time
    # lengthens it one step, and that short a period is not tried again for ten settle times.
    # Outgrown once and not a settle time later (a stall of the machine in the window), it
    # stays.
    failed = periods[-1]
    assert step(failed * 1.03, failed) == failed
    assert step(failed, failed) == failed
    assert step(failed * 1.03, failed) == failed
    grown = step(failed * 1.03, failed)
    assert grown == round(failed / 0.96, 3)
    assert out.info["interleave"]["floor_s"] > failed
    assert step(grown, grown) == grown
    # Steps far over the period: as long as they are plus the margin.
    assert step(0.3, grown) == grown
    assert step(0.3, grown) == 0.315
    # Down again while the steps keep up, to the raised floor; once it expires (ten settle
    # times after it was raised), the floor is the estimate without the collision again.
    seen = [0.315]
    for _ in range(20):
        seen.append(step(seen[-1], seen[-1]))
    assert min(seen) > failed
    assert out.info["interleave"]["floor_s"] == 0.152


def test_a_shorter_period_on_trial_that_fails_goes_back_to_the_last_one_kept_up() -> None:
    """The debug run of issue 23: the period came down to 153 ms, the jobs fell out of their
    turns there and collided (177 ms steps), and the period jumped to the collided steps plus
    the margin (189 ms), far above the 159 ms the steps had kept up with. A failed trial now
    goes back to the last period kept up with, and stays there while its floor holds; should
    that one fail later, it goes one step longer."""
    params = InterleaveParams(interleave_effect_pairs=0, interleave_settle_s=6.0)
    policy = InterleavePolicy(params)
    out = policy.decide(
        _window("B", (job_group("A"), job_group("B")), 0.0, 0.0), policy.initial_state()
    )
    now = 0.0

    def step(step_a: float, step_b: float) -> float:
        nonlocal out, now
        now += 6.0
        held = (
            job_group("A", step_s=step_a, phase=(0.1, 0.0525)),
            job_group("B", step_s=step_b, phase=(0.153, 0.0525)),
        )
        out = policy.decide(_window("B", held, now, 1.0), out.state)
        return float(out.info["schedule"]["period_s"])

    period = float(out.info["schedule"]["period_s"])
    kept_up = period
    while period > 0.17:  # every step keeps up: 4% shorter each settle
        kept_up, period = period, step(period, period)
    assert period == round(kept_up * 0.96, 3)
    # The trial fails: steps of a collision, 15% over it (more than the margin).
    back = step(period * 1.15, period * 1.15)
    assert back == kept_up < round(period * 1.15 * 1.05, 3)
    assert out.info["interleave"]["floor_s"] == kept_up
    assert out.info["interleave"]["failed_trials"] == 1
    # It stays while the raised floor holds (two settle times after a first failure: the trial
    # may have been judged while the jobs moved into their turns), even where the window
    # still shows the collision's steps (the jobs move back into their turns) ...
    assert step(back * 1.1, back * 1.1) == back
    # ... and is tried again once the floor expires, half as far below it (2%): the search
    # narrows on the shortest period the steps keep up with.
    trial = step(back, back)
    assert trial == round(back * 0.98, 3)
    assert out.info["interleave"]["trial_step_halvings"] == 1
    # It fails again: back, and the floor holds twice as long (four settle times).
    assert step(trial * 1.15, trial * 1.15) == back
    assert out.info["interleave"]["failed_trials"] == 2
    assert [step(back, back) for _ in range(3)] == [back] * 3
    trial = step(back, back)
    assert trial == round(back * 0.99, 3)  # 1% below
    # This time the steps keep up with the trial: it passes, the count of failures in a row
    # starts again, and the search goes on down at the narrowed step (not back to 4%, into
    # the periods that failed).
    passed = trial
    trial = step(passed, passed)
    assert trial == round(passed * 0.99, 3)
    assert "failed_trials" not in out.info["interleave"]
    # A failure now is a first one in a row (back to the trial that passed, two settles), and
    # the third of the search: the next trial would be 0.5% below, too close to be worth a
    # collision, so the search is done and the period holds for 50 settle times (5 min).
    assert step(trial * 1.15, trial * 1.15) == passed
    assert out.info["interleave"]["failed_trials"] == 1
    assert out.info["interleave"]["trial_step_halvings"] == 3
    assert out.info["interleave"]["floor_s"] == passed
    assert [step(passed, passed) for _ in range(20)] == [passed] * 20  # past any other hold
    # A period kept up with that fails later (it is no trial) for a settle time: one step
    # longer, not back, and its floor holds ten settle times whatever the count ...
    assert step(passed * 1.03, passed * 1.03) == passed
    longer = step(passed * 1.03, passed * 1.03)
    assert longer == round(passed / 0.96, 3)
    assert [step(longer, longer) for _ in range(9)] == [longer] * 9
    # ... after which the done search starts again from the full step.
    assert step(longer, longer) == round(longer * 0.96, 3)
    assert "trial_step_halvings" not in out.info["interleave"]


class _Search:
    """Two colliding jobs under the interleave policy (no effect guard, 6 s settle), stepped
    one settle time at a time with both jobs' steps at a given length."""

    def __init__(self) -> None:
        self.policy = InterleavePolicy(
            InterleaveParams(interleave_effect_pairs=0, interleave_settle_s=6.0)
        )
        self.out = self.policy.decide(
            _window("B", (job_group("A"), job_group("B")), 0.0, 0.0),
            self.policy.initial_state(),
        )
        self.now = 0.0
        self.period = float(self.out.info["schedule"]["period_s"])

    @property
    def interleave(self) -> dict:
        return self.out.info["interleave"]

    def step(self, steps_s: float) -> float:
        """One settle time with every step ``steps_s`` long: the period decided."""
        self.now += 6.0
        held = (
            job_group("A", step_s=steps_s, phase=(0.1, 0.0525)),
            job_group("B", step_s=steps_s, phase=(0.153, 0.0525)),
        )
        self.out = self.policy.decide(_window("B", held, self.now, 1.0), self.out.state)
        self.period = float(self.out.info["schedule"]["period_s"])
        return self.period


def test_a_done_search_holds_its_period_fifty_settle_times() -> None:
    search = _Search()
    step, kept = search.step, search.period
    # Searching, for the effect guard (it judges the period found, not the search) ...
    assert search.out.searching
    # Three trials fail in a row, 4%, 2% and 1% below the period kept up with; the floor
    # holds 2 and 4 settle times after the first two.
    for below, hold in ((0.96, 2), (0.98, 4), (0.99, None)):
        assert search.out.searching
        trial = step(kept)
        assert trial == round(kept * below, 3)
        assert step(trial * 1.15) == kept
        if hold is not None:
            assert [step(kept) for _ in range(hold - 1)] == [kept] * (hold - 1)
    assert search.interleave["trial_step_halvings"] == 3
    # The next would be 0.5% below: the search is done, and the period holds 50 settle times.
    assert not search.out.searching
    held = [step(kept) for _ in range(50)]
    assert held[:49] == [kept] * 49
    assert held[49] == round(kept * 0.96, 3)


def test_a_done_search_comes_back_after_a_collision_and_tries_nothing_below() -> None:
    search = _Search()
    step, kept = search.step, search.period
    settles = 0
    for below, hold in ((0.96, 2), (0.98, 4), (0.99, None)):
        assert step(kept) == round(kept * below, 3)
        assert step(kept * 1.4) == kept
        if hold is not None:
            assert [step(kept) for _ in range(hold - 1)] == [kept] * (hold - 1)
    # The third failure's collision outlasts its hold (8 settle times: the third in a row)
    # and then a settle time.
    assert [step(kept * 1.4) for _ in range(8)] == [kept] * 8
    settles += 8
    longer = step(kept * 1.4)
    settles += 1
    assert longer == round(kept * 1.4 * 1.05, 3)
    back = [step(longer)]
    while back[-1] > kept and len(back) < 10:
        back.append(step(back[-1]))
    settles += len(back)
    assert back[-1] == kept
    # No trial below it until the done search's 50 settle times are over, then the full step.
    rest = [step(kept) for _ in range(50 - settles)]
    assert rest[:-1] == [kept] * (len(rest) - 1)
    assert rest[-1] == round(kept * 0.96, 3)


def test_a_trial_kept_up_with_below_a_failed_one_widens_the_search_again() -> None:
    """The 18:08 run of benchmarks/collision.py, round 2: the first trials (187 and 183 ms)
    failed while the jobs were still moving into their turns, the search narrowed to 1% a
    settle time, and then crawled from 183 ms to 169 ms through the whole measured window,
    where every trial passed. A trial that passes below one that failed shows that failure
    was not the period's: the full step again."""
    search = _Search()
    step, kept = search.step, search.period
    failed = step(kept)
    assert failed == round(kept * 0.96, 3)
    assert step(failed * 1.15) == kept  # fails: back, and the next trial is 2% below
    assert step(kept) == kept  # the floor's hold
    period = step(kept)
    assert period == round(kept * 0.98, 3)
    while period >= failed:  # passing, 2% at a time, down past the failed period
        assert search.interleave["trial_step_halvings"] == 1
        period = step(period)
    below = period
    assert below < failed
    assert step(below) == round(below * 0.96, 3)  # kept up with below it: 4% again
    assert "trial_step_halvings" not in search.interleave


def test_a_collision_that_outlasts_a_failed_trial_comes_back_fast() -> None:
    """The 15:36 run of benchmarks/collision.py: a trial of 141 ms failed, the period went
    back to 144 ms, but the jobs stayed collided (steps of 200 ms run late for every slot, so
    they never fall back into their turns), and 12 s later the period was lengthened to
    211 ms and searched down again at 1% a settle time. Now it is lengthened as far, and then
    comes back halfway to the shortest period kept up with each settle time."""
    search = _Search()
    step, kept = search.step, search.period
    trial = step(kept)
    assert trial == round(kept * 0.96, 3)
    assert step(trial * 1.4) == kept  # the trial fails: back
    assert step(kept * 1.4) == kept  # the floor's hold: the collision is not judged
    assert step(kept * 1.4) == kept  # it outlasts the hold: seen, and a settle time later
    longer = step(kept * 1.4)  # it still does: as long as the steps plus the margin
    assert longer == round(kept * 1.4 * 1.05, 3)
    assert search.interleave["floor_s"] == kept
    # A step back toward it that fails goes back to the longer period, and is no narrowing
    # of the trials below it (one failed trial so far: the next one 2% below).
    halfway = step(longer)
    assert halfway == round((longer + kept) / 2, 3)
    assert step(halfway * 1.15) == longer
    assert search.interleave["trial_step_halvings"] == 1
    assert step(longer) == longer  # the floor's hold after a second failure in a row
    assert [step(longer) for _ in range(3)] == [longer] * 2 + [halfway]
    # In turns again at that period: back toward the period kept up with, halfway each time.
    back = [halfway]
    while back[-1] > kept and len(back) < 10:
        back.append(step(back[-1]))
    assert back[-1] == kept and len(back) <= 5, back
    # Its floor (raised by the failed step back) has expired by then: trials below it,
    # narrowed by the one failed trial (2%).
    assert step(kept) == round(kept * 0.98, 3)


def test_a_schedule_is_placed_again_only_from_a_window_without_one() -> None:
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    first = decide_jobs(policy, "B", (job_group("A"), job_group("B")))
    held = (
        job_group("A", step_s=0.215, phase=(0.1, 0.0525)),
        job_group("B", step_s=0.215, phase=(0.153, 0.0525)),
    )
    kept = decide_jobs(policy, "B", held, first.state, scheduled=0.5)
    assert kept.info["schedule"] == first.info["schedule"]
    # Once no schedule is in force (the effect guard's phase without it), placed again: the
    # phases as observed no longer collide.
    again = decide_jobs(policy, "B", held, first.state, scheduled=0.0)
    assert again.reason == REASON_NO_COLLISION and "schedule" not in again.info
    # Still colliding without it: placed again, at the period its search had got to.
    searched = replace(first.state, schedule=first.state.schedule.rescaled(0.17, now=0.0))
    colliding = decide_jobs(policy, "B", (job_group("A"), job_group("B")), searched, scheduled=0.0)
    assert colliding.info["schedule"] == {"period_s": 0.17, "slots": {"0": 0.085}, "late_s": 0.0325}


def test_no_schedule_without_the_jobs_step_times() -> None:
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    out = decide_jobs(policy, "A", (job_group("A"), job_group("B", step_s=0.0)))
    assert out.reason == REASON_NO_COLLISION and not out.active


def test_a_guarded_schedule_is_withheld_while_measuring() -> None:
    params = InterleaveParams(interleave_effect_pairs=2, interleave_effect_phase_s=5.0)
    policy = build_policy("interleave", [params])
    groups = (job_group("A"), job_group("B"))
    state = None
    seen = []
    for now in (0.0, 6.0):
        window = JobWindow(now=now, ranks={}, job="B", groups=groups[1:], fabric=groups[:1])
        out = policy.decide(window, policy.initial_state() if state is None else state)
        state = out.state
        seen.append((out.active, "schedule" in out.info, out.reason))
    assert seen == [(False, False, "measuring"), (True, True, REASON_INTERLEAVING)]


def test_jobs_behind_other_uplinks_are_not_in_the_schedule() -> None:
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    far = GroupPhases("0", (COLLIDING,), ("leaf-07", "leaf-08"), ("C-n0",), 0.0, "C", 0.4)
    groups = (job_group("A"), job_group("B"), far)
    a = decide_jobs(policy, "A", groups)
    assert a.info["interleave"]["jobs"] == ["A", "B"]
    assert a.info["schedule"]["period_s"] == 0.215  # C's 0.4 s steps do not count
    c = decide_jobs(policy, "C", groups)
    assert c.reason == REASON_NO_COLLISION and "schedule" not in c.info


def test_units_keep_taking_turns_whatever_the_period() -> None:
    """Units whose phases start at different points of their steps: at any period of the
    search, the longest phases start their share of the period apart."""
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    groups = (
        job_group("A", phase=(0.05, 0.105)),
        job_group("B", phase=(0.12, 0.105)),
    )
    out = decide_jobs(policy, "A", groups)
    schedule = out.state.schedule
    for period in (0.215, 0.19, 0.16):
        slots = schedule.rescaled(period, 0.0).slots
        # The phase of each starts at slot + natural start; they are half a period apart.
        starts = sorted(
            (slots[(job, "0")] + start) % period for job, start in (("A", 0.05), ("B", 0.12))
        )
        gap = (starts[1] - starts[0]) % period
        assert gap == pytest.approx(period / 2, abs=2e-6)
        assert all(0 <= slot < period for slot in slots.values())


def test_a_slot_is_always_below_its_period() -> None:
    from skewtrace.controller.policies.interleave import Schedule

    # A raw slot a hair below the period rounds to the period itself: it wraps to 0.
    schedule = Schedule(0.21, {("A", "0"): (0.0, 0.0), ("B", "0"): (0.5, 0.1050000001)})
    assert all(0 <= slot < 0.21 for slot in schedule.slots.values())


def test_a_period_step_of_one_or_more_is_refused() -> None:
    from skewtrace._options import FieldError

    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(FieldError):
            InterleaveParams(interleave_period_step=bad)


def test_a_change_of_groups_under_a_schedule_withdraws_it_for_a_window() -> None:
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    first = decide_jobs(policy, "A", (job_group("A"), job_group("B")))
    joined = (job_group("A"), job_group("B"), job_group("C"))
    out = decide_jobs(policy, "A", joined, first.state, scheduled=1.0)
    assert out.reason == "regrouping" and not out.active and "schedule" not in out.info
    placed = decide_jobs(policy, "A", joined, out.state, scheduled=0.0)
    assert placed.reason == REASON_INTERLEAVING
    assert placed.info["interleave"]["jobs"] == ["A", "B", "C"]


def test_jobs_that_stay_in_their_turns_without_the_schedule_are_left_alone() -> None:
    """Issue 23's guarded run (2026-12-06, round 1): jobs that took turns by themselves were
    given a schedule, because their DDP all-reduce phases span backward and overlap on the
    controller's clock whether or not their transfers do. And once a schedule had put the
    jobs in turns, they stayed in them for tens of seconds without it. Once the phases'
    length in their turns is known (a whole window of steps that kept up with a period), a
    window without the schedule is a collision only where the phases last longer than
    that."""
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    in_turns = (0.05, 0.1)

    def groups(phase, step_s):
        return (
            job_group("A", step_s=step_s, phase=phase),
            job_group("B", step_s=step_s, phase=phase),
        )

    # No turns seen yet: phases that overlap as placed get a schedule.
    first = policy.decide(_window("B", groups(in_turns, 0.15), 0.0, 0.0), policy.initial_state())
    assert first.reason == REASON_INTERLEAVING
    assert "dilation" not in first.info["interleave"]
    period = first.info["schedule"]["period_s"]
    # Under it, a whole window of steps that keep up with the period, a settle time on.
    held = policy.decide(_window("B", groups(in_turns, period), 6.0, 1.0), first.state)
    assert held.state.schedule.turn_busy == {("A", ("0",)): 0.1, ("B", ("0",)): 0.1}
    # A window that is not wholly under the schedule records nothing.
    part = policy.decide(_window("B", groups((0.05, 0.2), period), 12.0, 0.5), first.state)
    assert part.state.schedule.turn_busy == {}
    # Without the schedule, phases as long as in their turns: no schedule, however they
    # overlap as placed.
    free = policy.decide(_window("B", groups(in_turns, 0.15), 20.0, 0.0), held.state)
    assert free.reason == REASON_NO_COLLISION and not free.active
    assert free.info["interleave"]["dilation"] == pytest.approx(1.0)
    assert "schedule" not in free.info
    # 9% longer: still the turns (the bar is 10%).
    free = policy.decide(_window("B", groups((0.05, 0.109), 0.15), 21.0, 0.0), free.state)
    assert free.reason == REASON_NO_COLLISION
    # 30% longer: they collide again. A schedule, at the period its search had got to.
    again = policy.decide(_window("B", groups((0.05, 0.13), 0.18), 22.0, 0.0), free.state)
    assert again.reason == REASON_INTERLEAVING and again.active
    assert again.info["interleave"]["dilation"] == pytest.approx(1.3)
    assert again.info["schedule"]["period_s"] == held.info["schedule"]["period_s"] < period
    assert again.state.schedule.turn_busy == held.state.schedule.turn_busy


def test_the_guards_experiment_ends_without_a_verdict_while_the_jobs_stay_in_their_turns() -> None:
    """Issue 23's guarded run (2026-12-06, round 2): the schedule took colliding jobs from 216
    ms to 150 ms; its withheld phases then inherited the turns, measured no gain, and the
    guard turned the schedule off for 10 minutes, while the jobs drifted back into collision
    every minute or so. Now an off phase that ends with the jobs in their turns ends the
    experiment without a verdict (no schedule is published while they stay in them), and a
    collision that comes back starts a new one."""
    params = InterleaveParams(interleave_effect_pairs=3, interleave_effect_phase_s=5.0)
    policy = build_policy("interleave", [params])
    colliding, in_turns = (0.05, 0.13), (0.05, 0.1)

    state = policy.initial_state()
    trace = []

    def at(now: float, phase, step_s: float, scheduled: float) -> None:
        nonlocal state
        out = policy.decide(window(now, phase, step_s, scheduled), state)
        state = out.state
        trace.append((now, out.reason, "schedule" in out.info))

    # Colliding: withheld for a phase (the baseline), then published.
    at(0.0, colliding, 0.2, 0.0)
    at(5.0, colliding, 0.2, 0.0)
    assert trace[-2:] == [(0.0, "measuring", False), (5.0, REASON_INTERLEAVING, True)]
    period = 0.21
    # The schedule holds the jobs in their turns; its search runs on, and the phase with it
    # ends a phase after the search is done (here: 20 settle times at most).
    now = 5.0
    while trace[-1][1] == REASON_INTERLEAVING and now < 400:
        now += 6.0
        at(now, in_turns, period, 1.0)
    assert trace[-1][1] == "measuring" and not trace[-1][2]
    # Withheld: the jobs stay in their turns. The policy asks for nothing, and when the
    # phase is over the experiment ends without a verdict: no no_gain, nothing published.
    for dt in (1.0, 3.0, 6.0):
        at(now + dt, in_turns, 0.15, 0.0)
    assert [reason for _, reason, _ in trace[-3:]] == [REASON_NO_COLLISION] * 3
    assert not any(published for _, _, published in trace[-3:])
    assert "no_gain" not in [reason for _, reason, _ in trace]
    # The collision comes back: a new experiment, withheld first, then the schedule again.
    at(now + 30.0, colliding, 0.2, 0.0)
    at(now + 36.0, colliding, 0.2, 0.0)
    assert trace[-2:] == [
        (now + 30.0, "measuring", False),
        (now + 36.0, REASON_INTERLEAVING, True),
    ]


def test_jobs_that_moved_into_their_turns_while_withheld_are_held_at_their_own_steps() -> None:
    """Issue 23's guarded run (2026-12-06 15:33, round 1): the first window asked for a
    schedule at 193 ms, 5% above the collided steps; in the guard's withheld phase the
    free-running jobs moved into their turns by themselves (145 ms), and the schedule then
    published held them at 193 ms and searched down for two minutes. A schedule placed again
    starts no higher than the margin above the steps as they are then, and where the steps
    are longer (a collision back after a search), at the period its search had got to."""
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    colliding, in_turns = (0.05, 0.13), (0.05, 0.1)

    first = policy.decide(window(0.0, colliding, 0.184), policy.initial_state())
    assert first.info["schedule"]["period_s"] == pytest.approx(0.193)
    # No turns known yet, and the steps fell by less than the collision's dilation (10%):
    # the phases overlapping as placed still ask for a schedule, at the margin above the
    # steps they take now. (Steps that fell by more left the collision: the test below.)
    moved = policy.decide(window(9.0, in_turns, 0.17), first.state)
    assert moved.reason == REASON_INTERLEAVING
    assert moved.info["schedule"]["period_s"] == pytest.approx(0.179)
    assert moved.state.schedule.since == 9.0 and moved.state.schedule.kept_up_s == 0.0
    # Collided again: not lengthened past the period it had.
    back = policy.decide(window(15.0, colliding, 0.19), moved.state)
    assert back.info["schedule"]["period_s"] == pytest.approx(0.179)
    # Never below the floor (the steps' estimate without the collision, or a raised one).
    raised = replace(moved.state, schedule=replace(moved.state.schedule, floor_s=0.178))
    floored = policy.decide(window(20.0, in_turns, 0.168), raised)
    assert floored.info["schedule"]["period_s"] == pytest.approx(0.178)


def test_jobs_that_left_their_collision_while_withheld_are_left_alone() -> None:
    """Issue 23's guarded run on a fairly shared uplink (2026-12-06, 18:25): the jobs collided
    at their start (183 ms), took turns by themselves within the guard's withheld phase
    (146 ms), and the schedule then published ran 96 s of its search 5% slower than the jobs
    ran free. Before any turns are known, steps that fell by the collision's dilation since
    it asked are the jobs in their turns: nothing is published, through the guard either; a
    collision is then steps that much longer than the shortest seen since."""
    colliding, in_turns = (0.05, 0.13), (0.05, 0.1)

    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    first = policy.decide(window(0.0, colliding, 0.184), policy.initial_state())
    assert first.reason == REASON_INTERLEAVING
    left = policy.decide(window(9.0, in_turns, 0.1456), first.state)
    assert left.reason == REASON_NO_COLLISION and not left.active and "schedule" not in left.info
    assert left.info["interleave"]["asked_step_s"] == pytest.approx(0.184)
    assert left.info["interleave"]["free_step_s"] == pytest.approx(0.1456)
    # Within 10% of the shortest steps seen free: still their turns; shorter ones lower it.
    still = policy.decide(window(12.0, in_turns, 0.158), left.state)
    assert still.reason == REASON_NO_COLLISION
    still = policy.decide(window(13.0, in_turns, 0.14), still.state)
    assert still.info["interleave"]["free_step_s"] == pytest.approx(0.14)
    # 15% longer than that: a collision again, scheduled at the margin above its steps.
    again = policy.decide(window(20.0, colliding, 0.161), still.state)
    assert again.reason == REASON_INTERLEAVING and again.active
    assert again.info["schedule"]["period_s"] == pytest.approx(0.169)

    # Through the effect guard, as a user runs it: withheld first, and the jobs' turns found
    # in that phase publish nothing; the experiment ends without a verdict.
    params = InterleaveParams(interleave_effect_pairs=3, interleave_effect_phase_s=5.0)
    guarded = build_policy("interleave", [params])
    state = guarded.initial_state()
    reasons = []
    for now, phase, step_s in [
        (0.0, colliding, 0.183),
        (2.0, colliding, 0.17),
        (4.0, in_turns, 0.146),
        (6.0, in_turns, 0.147),
        (30.0, in_turns, 0.148),
    ]:
        out = guarded.decide(window(now, phase, step_s), state)
        state = out.state
        reasons.append(out.reason)
        assert "schedule" not in out.info, (now, out.reason)
    assert reasons[0] == "measuring"
    assert reasons[-1] == REASON_NO_COLLISION
    assert "no_gain" not in reasons


def test_a_shortest_period_that_fails_when_come_back_to_is_given_up() -> None:
    """The 21:26 run of benchmarks/collision.py (2026-12-06): the steps had kept up with
    148 ms, a later collision lengthened the period to 164 ms, and on the way back the step
    that reached 148 ms (150 ms after rounding) failed, at 240, 257 and 287 s, each time a
    collision and a hold, the search never done and the effect guard's judgment waiting for
    it to the end of the run. A step back that fails within a full step of the shortest
    period kept up with now gives that period up: the one kept up with now is the shortest
    known, and the search narrows as after any failed trial."""
    search = _Search()
    step, kept = search.step, search.period
    trial = step(kept)
    assert step(trial * 1.4) == kept  # a failed trial (4% below): next ones 2% below
    assert step(kept * 1.4) == kept  # its collision outlasts the hold ...
    assert step(kept * 1.4) == kept
    longer = step(kept * 1.4)  # ... and the period is lengthened to the collided steps
    assert longer == round(kept * 1.4 * 1.05, 3)
    back = [longer]
    while True:  # in turns again: back toward the period kept up with, halfway each time
        nxt = step(back[-1])
        if nxt >= back[-1]:
            break
        back.append(nxt)
        if nxt <= kept * 1.04:
            break
    near = back[-1]
    before = back[-2]
    assert kept <= near <= kept * 1.04 and before > near, back
    assert search.interleave["trial_step_halvings"] == 1
    # The machine slowed: the step back that reaches it fails.
    assert step(near * 1.15) == before
    assert search.interleave["trial_step_halvings"] == 2
    # Not back to the given-up period after the hold: trials 1% below the one kept up with.
    held = [step(before) for _ in range(2)]
    assert held == [before, round(before * 0.99, 3)], (held, near)
    assert search.out.searching
    # That one fails too: the next would be 0.5% below, and the search is done.
    assert step(held[1] * 1.15) == before
    assert search.interleave["trial_step_halvings"] == 3
    assert not search.out.searching
