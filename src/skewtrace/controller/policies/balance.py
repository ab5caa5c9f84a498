"""The work-balance policy (``--policy balance``): the remedy of a ``data_imbalance``, switched
on for a job while the Collector flags one, and kept only while it pays.

A ``data_imbalance`` is work that varies with each sample (sequence lengths per batch): the
replica that drew the long documents is late, a different one each step. Its remedy is on the
rank side: :class:`~skewtrace.rank.work_balance.WorkBalancedSampler` with ``mode="pacer"``
splits each global batch by work instead of by count while the controller says ``balance:
"work"``, and by count otherwise. This policy says it:

- ``work`` from the first window in which the Collector flags the job's ``data_imbalance``
  (its ``training.imbalance`` gauge, :attr:`~skewtrace.controller.window.JobWindow.declines`),
  and then for good: once the split is by work, the imbalance is meant to go, and the
  policy does not read its own effect as the cause's end (that would switch it off again
  and the imbalance back on, for ever). Whether it pays is the effect guard's to say;
- the guard (:mod:`~skewtrace.controller.policies.effect`, as for pacing and interleave)
  alternates phases by count (``off``) and by work (``on``) and compares the job's mean step
  time; below ``balance_effect_min_gain`` over ``balance_effect_pairs`` pairs it is withheld
  (``count``) for ``balance_effect_backoff_s`` and then measured again (a job whose lengths
  changed may pay now); kept, it is measured again after half that;
- the samples of a step are the same whichever split: the update does not change (see
  ``docs/rebalancing.md``), so the experiment costs at most the imbalance's own price during
  an ``off`` phase.

The body says ``balance`` (``work`` or ``count``) and ``balance_version`` (changes exactly
when ``balance`` does); rank 0 reads them and broadcasts them at the sampler's sync points.
Pure, like the other policies.
"""

from __future__ import annotations

from dataclasses import dataclass

from skewtrace._options import at_least, check_fields, integer, non_negative, option, positive
from skewtrace.controller.policies.base import Outcome
from skewtrace.controller.window import REASON_DATA_IMBALANCE, JobWindow
from skewtrace.decision import BALANCE_COUNT, BALANCE_WORK

REASON_BALANCING = "balancing"
"""The split is by work (asked since a ``data_imbalance`` was flagged)."""
REASON_BALANCED = "balanced"
"""No data imbalance flagged yet: the split is by count."""


@dataclass(frozen=True)
class BalanceParams:
    """The work-balance policy's settings; every field is a ``skewtrace pacer`` flag."""

    balance_effect_pairs: int = option(3, parse=integer, check=at_least(0))
    """The split by work stays only when this many phases by count and by work show a real
    gain in step time (the effect guard, as for pacing); 0: no measurement."""

    balance_effect_phase_s: float = option(10.0, check=positive, seconds=True)
    """Length of each phase by count or by work (keep it above window_s + 3 s and a few of
    the sampler's sync points)."""

    balance_effect_min_gain: float = option(0.0, check=non_negative)
    """The least gain (a fraction of the step time, at the 90% lower bound) that keeps it."""

    balance_effect_backoff_s: float = option(600.0, check=positive, seconds=True)
    """After a measurement without a real gain, split by count for this long (no_gain); a
    kept split is measured again after half of it."""

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def effect_pairs(self) -> int:
        return self.balance_effect_pairs

    @property
    def effect_phase_s(self) -> float:
        return self.balance_effect_phase_s

    @property
    def effect_min_gain(self) -> float:
        return self.balance_effect_min_gain

    @property
    def effect_backoff_s(self) -> float:
        return self.balance_effect_backoff_s

    @property
    def effect_recheck_s(self) -> float:
        return self.balance_effect_backoff_s / 2


@dataclass(frozen=True)
class BalanceState:
    asked: bool = False
    """A ``data_imbalance`` was flagged for the job (sticky: see the module docstring)."""


class BalancePolicy:
    """See the module docstring."""

    name = "balance"

    def __init__(self, params: BalanceParams | None = None) -> None:
        self.params = params or BalanceParams()

    def initial_state(self) -> BalanceState:
        return BalanceState()

    def decide(self, window: JobWindow, previous: BalanceState) -> Outcome:
        asked = previous.asked or REASON_DATA_IMBALANCE in window.declines
        mode = BALANCE_WORK if asked else BALANCE_COUNT
        return Outcome(
            reason=REASON_BALANCING if asked else REASON_BALANCED,
            state=BalanceState(asked=asked),
            ranks=len(window.ranks),
            balance=mode,
        )
