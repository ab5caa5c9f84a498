"""The interleave policy (``--policy interleave``): offsets for process groups whose
communication phases collide on a shared uplink, so that the phases interleave.

Why: two groups whose transfers run at the same time over an uplink that carries one of them
at full rate each take twice as long (processor sharing); shifted by one phase's length they
each take it once. A group that starts its step later pays the offset on its own path, so an
offset pays only where the phase it takes out of the collision is exposed (not hidden behind
compute) and more than the offset itself, e.g. a group with a gather before forward and an
all-reduce after backward. Whether it pays is measured: the registry wraps the policy in the
effect guard (:mod:`~skewtrace.controller.policies.effect`), which keeps offsets only while the
job's step time shows a real gain.

The model is pure (no I/O, no clock, no randomness), from the window's
:class:`~skewtrace.controller.window.GroupPhases`, in these modules:

- :mod:`~.units`: the groups tied by their hosts into units that get one offset or slot, and
  which units share an uplink;
- :mod:`~.placement`: each phase's duration alone, one job's offsets, a schedule's turns;
- :mod:`~.collision`: whether units of several jobs collide now (their phases on the
  controller's clock; how long they last against their turns under a schedule);
- :mod:`~.period_search`: the state machine that searches a schedule's period down from the
  collided step time while the jobs' steps keep up with it;
- :mod:`~.schedule`: the schedule published for groups of several jobs (period, slots,
  ``late_s``) and the state one decision hands to the next;
- :mod:`~.policy`: the decision itself, its reasons and its figures;
- :mod:`~.params`: the settings (``skewtrace pacer`` flags).

Why each rule is there, and the runs that showed it: docs/pacing.md, "Interleaving: why the
schedule is built this way".
"""

from skewtrace.controller.policies.interleave.collision import aligned_overlap, dilation
from skewtrace.controller.policies.interleave.params import InterleaveParams, below_one
from skewtrace.controller.policies.interleave.placement import (
    alone_durations,
    natural_step,
    place,
    spread,
)
from skewtrace.controller.policies.interleave.policy import (
    REASON_INTERLEAVING,
    REASON_NO_COLLISION,
    REASON_NO_PHASES,
    REASON_REGROUPING,
    SCHEDULE,
    InterleavePolicy,
)
from skewtrace.controller.policies.interleave.schedule import InterleaveState, Schedule
from skewtrace.controller.policies.interleave.units import Unit, colliding_with, units

__all__ = [
    "REASON_INTERLEAVING",
    "REASON_NO_COLLISION",
    "REASON_NO_PHASES",
    "REASON_REGROUPING",
    "SCHEDULE",
    "InterleaveParams",
    "InterleavePolicy",
    "InterleaveState",
    "Schedule",
    "Unit",
    "aligned_overlap",
    "alone_durations",
    "below_one",
    "colliding_with",
    "dilation",
    "natural_step",
    "place",
    "spread",
    "units",
]
