"""The controller policies a job can be given (``skewtrace pacer --policy NAME[,NAME]``): the
registry.

- ``pacing`` (:mod:`~skewtrace.controller.policies.pacing`): delays ranks that persistently
  arrive early, kept only while its measured effect on the step time is a real gain
  (:mod:`~skewtrace.controller.policies.effect`).
- ``rebalance`` (:mod:`~skewtrace.controller.policies.rebalance`): each rank's share of the
  global batch.
- ``interleave`` (:mod:`~skewtrace.controller.policies.interleave`): offsets for groups whose
  communication phases collide on a shared uplink, kept only while they pay (the same guard).
- ``balance`` (:mod:`~skewtrace.controller.policies.balance`): each global batch split by
  work instead of by count while the Collector flags a ``data_imbalance``, kept only while it
  pays (the same guard).
- several, comma-separated: composed in registry order
  (:mod:`~skewtrace.controller.policies.compose`).

Every policy is one :class:`PolicySpec` in :data:`POLICIES`, and that entry is all the rest
of the controller knows of it: the ``--policy`` names and their order, the ``skewtrace
pacer`` flags (every field of its ``params_type``, a dataclass of
:func:`skewtrace._options.option` fields whose docstrings are the help), the service's
configuration (:attr:`~skewtrace.controller.config.PacerConfig.policy_params`), the
composition, and the check that ``docs/pacing.md`` documents each name and flag. A new policy
is a module in this package (its parameters, and a class that follows
:class:`~skewtrace.controller.policies.base.ControllerPolicy`) and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from skewtrace.controller.policies.balance import BalanceParams, BalancePolicy
from skewtrace.controller.policies.base import ControllerPolicy, ServiceSettings
from skewtrace.controller.policies.compose import ComposedPolicy
from skewtrace.controller.policies.effect import EffectGuard
from skewtrace.controller.policies.interleave import InterleaveParams, InterleavePolicy
from skewtrace.controller.policies.pacing import PacingPolicy, PolicyParams
from skewtrace.controller.policies.rebalance import (
    RebalanceParams,
    RebalancePolicy,
    check_with_service,
)

P = TypeVar("P")


@dataclass(frozen=True)
class PolicySpec(Generic[P]):
    """One registered policy."""

    name: str
    """Its ``--policy`` name (lower case, no commas)."""

    params_type: type[P]
    """Its parameters: a frozen dataclass of option fields, each a ``skewtrace pacer`` flag
    (field names unique across the service and every policy), with defaults."""

    build: Callable[[P], ControllerPolicy]
    """The policy object from its parameters."""

    summary: str
    """What it does, in a few words (``--policy``'s help)."""

    docs: str
    """Where it is documented (``--help`` heads its flags with it)."""

    check: Callable[[P, ServiceSettings], None] | None = None
    """Checks its parameters against the service's settings when it is chosen; raises
    :class:`~skewtrace._options.FieldError`."""

    @property
    def title(self) -> str:
        """The heading of its flags in ``skewtrace pacer --help``."""
        return f"{self.name} policy ({self.docs})"


POLICIES: tuple[PolicySpec[Any], ...] = (
    PolicySpec(
        "pacing",
        PolicyParams,
        lambda params: EffectGuard(PacingPolicy(params), params),
        summary="delay ranks that arrive early",
        docs="docs/pacing.md, 'The policy'",
    ),
    PolicySpec(
        "rebalance",
        RebalanceParams,
        RebalancePolicy,
        summary="size each rank's share of the global batch to its speed",
        docs="docs/rebalancing.md",
        check=check_with_service,
    ),
    PolicySpec(
        "interleave",
        InterleaveParams,
        lambda params: EffectGuard(InterleavePolicy(params), params),
        summary="offset groups whose communication phases collide on a shared uplink",
        docs="docs/pacing.md, 'Interleaving'",
    ),
    PolicySpec(
        "balance",
        BalanceParams,
        lambda params: EffectGuard(BalancePolicy(params), params),
        summary="split each global batch by work while a data imbalance is flagged",
        docs="docs/rebalancing.md, 'Work-balanced batches'",
    ),
)
"""Every policy, in the order a composition runs them (and ``--help`` lists them)."""


def _names() -> list[str]:
    return [spec.name for spec in POLICIES]


def spec_of(name: str) -> PolicySpec[Any]:
    """The registered policy of a ``--policy`` name; KeyError when there is none."""
    for spec in POLICIES:
        if spec.name == name:
            return spec
    raise KeyError(name)


def policy_names(raw: str) -> str:
    """``--policy`` text -> its canonical form (known names, in registry order, no repeats)."""
    known = _names()
    names = {name.strip().lower() for name in raw.split(",") if name.strip()}
    if not names:
        raise ValueError(f"expected one or more of {', '.join(known)}, comma-separated")
    unknown = sorted(names - set(known))
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)} (known: {', '.join(known)})")
    return ",".join(sorted(names, key=known.index))


def known_policies(value: object) -> str | None:
    """The ``check`` of ``--policy``: a canonical list of known names."""
    try:
        ok = isinstance(value, str) and policy_names(value) == value
    except ValueError as exc:
        return str(exc)
    return None if ok else "expected known policy names, comma-separated, e.g. pacing,rebalance"


_JOB_POLICY_FORM = "expected PATTERN=POLICY[,POLICY] entries separated by ';'"


def job_policies(raw: str) -> str:
    """``--job-policy`` text -> its canonical form: ``PATTERN=NAME[,NAME]`` entries separated
    by ``;``, each pattern a shell-style pattern of job ids (``*``, ``?``, ``[...]``; case
    matters) and each policy list as ``--policy`` takes it (canonical, see
    :func:`policy_names`)."""
    entries = []
    for part in raw.split(";"):
        if not part.strip():
            continue
        pattern, sep, names = part.partition("=")
        pattern = pattern.strip()
        if not sep or not pattern:
            raise ValueError(
                f"{_JOB_POLICY_FORM}, got {part.strip()!r}"
                " (e.g. 'bench-*-interleave=interleave;bench-*-both=pacing,interleave')"
            )
        entries.append(f"{pattern}={policy_names(names)}")
    if not entries:
        raise ValueError(_JOB_POLICY_FORM)
    return ";".join(entries)


def job_policy_entries(canonical: str | None) -> list[tuple[str, str]]:
    """The (pattern, policy names) pairs of a canonical ``--job-policy`` value, in order."""
    if not canonical:
        return []
    return [
        (pattern, names)
        for pattern, _, names in (entry.partition("=") for entry in canonical.split(";"))
    ]


def known_job_policies(value: object) -> str | None:
    """The ``check`` of ``--job-policy``: canonical entries of known policy names."""
    try:
        ok = isinstance(value, str) and job_policies(value) == value
    except ValueError as exc:
        return str(exc)
    return None if ok else _JOB_POLICY_FORM


def complete_params(given: Iterable[Any] = ()) -> tuple[Any, ...]:
    """Every registered policy's parameters, in registry order: those given (at most one
    instance of each ``params_type``), the defaults for the rest."""
    by_type: dict[type, Any] = {}
    for params in given:
        kind = type(params)
        if not any(spec.params_type is kind for spec in POLICIES):
            raise TypeError(f"{kind.__name__} is not the parameters of a registered policy")
        if kind in by_type:
            raise TypeError(f"{kind.__name__} given twice")
        by_type[kind] = params
    return tuple(
        by_type[spec.params_type] if spec.params_type in by_type else spec.params_type()
        for spec in POLICIES
    )


def check_params(names: str, params: Iterable[Any], service: ServiceSettings) -> None:
    """Each chosen policy's :attr:`PolicySpec.check`; raises FieldError."""
    by_type = {type(p): p for p in complete_params(params)}
    for name in policy_names(names).split(","):
        spec = spec_of(name)
        if spec.check is not None:
            spec.check(by_type[spec.params_type], service)


def build_policy(names: str, params: Iterable[Any] = ()) -> ControllerPolicy:
    """The policy object for a ``--policy`` value: one policy, or the chosen ones composed in
    registry order; ``params`` as :func:`complete_params` takes them."""
    by_type = {type(p): p for p in complete_params(params)}
    built = [
        spec.build(by_type[spec.params_type])
        for spec in map(spec_of, policy_names(names).split(","))
    ]
    return built[0] if len(built) == 1 else ComposedPolicy(*built)


__all__ = [
    "POLICIES",
    "ComposedPolicy",
    "PolicySpec",
    "build_policy",
    "check_params",
    "complete_params",
    "job_policies",
    "job_policy_entries",
    "known_job_policies",
    "known_policies",
    "policy_names",
    "spec_of",
]
