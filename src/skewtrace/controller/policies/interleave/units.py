"""Units: the groups of the window that get one offset (or one slot), and which of them
share an uplink.

From the window's :class:`~skewtrace.controller.window.GroupPhases`, pure:

- groups that share a host are tied (a delay before one rank's forward holds the host's other
  ranks at their tensor-parallel collective) and get one offset; a unit's phases are its
  groups' phases, its switches theirs. Units whose members sit behind one switch cross no
  uplink and are left alone;
- a group over every host of its job (the world's loss or gradient-norm all-reduce that keeps
  a job's halves in one step) ties nothing where the job's other groups form two or more
  units that cross the spine without it: every rank waits for it whatever the offsets, so no
  offset moves it, and tying through it would make the halves one unit with nothing to
  interleave (``examples/train_ddp.py --sets 2``). It is left out of the placement then; a
  job whose only crossing group is its world (plain DDP) keeps it;
- where such a group's phase starts before a unit's (a loss all-reduce after the optimizer,
  at the next step's start), the job's ranks wait there for the most held unit: every unit's
  phases then start as late after its own step start whatever its offset, and they are read
  on the time line after that wait (earlier by the most held unit's offset less its own).

Why each rule, and what showed it: docs/pacing.md, "Interleaving: why the schedule is built
this way".
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from skewtrace.controller.window import GroupPhases


@dataclass(frozen=True)
class Unit:
    """Groups that get one offset."""

    pgs: tuple[str, ...]
    switches: frozenset[str]
    observed: tuple[tuple[float, float], ...]
    """(start, duration) of its phases as observed (after its members' step start; where the
    job's ranks wait for each other before them, on the time line after that wait)."""
    applied_offset_s: float
    job: str = ""
    """The job its groups belong to."""
    step_s: float = 0.0
    """Its job's mean step time (0: not known)."""
    step_start: float = 0.0
    """When one of its job's steps started on the controller's clock (0: not reported)."""

    @property
    def crosses(self) -> bool:
        return len(self.switches) >= 2 or "many" in self.switches


def _root_finder(parent: list[int]) -> Callable[[int], int]:
    """The root lookup of a union-find over ``parent`` (path halving); a union is
    ``parent[root(i)] = root(j)``."""

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    return root


def _tied(groups: Sequence[GroupPhases]) -> list[list[GroupPhases]]:
    """The groups in sets tied by shared hosts (within a job)."""
    parent = list(range(len(groups)))
    root = _root_finder(parent)

    by_host: dict[tuple[str, str], int] = {}
    for i, group in enumerate(groups):
        for host in group.hosts:
            # Ranks of two jobs on one host do not step together: only a job's own tie.
            j = by_host.setdefault((group.job, host), i)
            parent[root(i)] = root(j)
    members: dict[int, list[GroupPhases]] = {}
    for i, group in enumerate(groups):
        members.setdefault(root(i), []).append(group)
    return list(members.values())


def _without_job_wide(
    groups: Sequence[GroupPhases],
) -> tuple[list[GroupPhases], dict[str, float]]:
    """The groups less each job's groups over every host of the job, where the job's other
    groups form two or more units that cross the spine without them (see the module
    docstring); and by job, the earliest start of those groups' phases (where the job's
    ranks wait for each other)."""
    dropped: set[int] = set()
    sync_at: dict[str, float] = {}
    for job in {g.job for g in groups}:
        mine = [g for g in groups if g.job == job]
        hosts = {h for g in mine for h in g.hosts}
        if len(hosts) < 2 or "many" in hosts:
            continue
        wide: list[GroupPhases] = []
        rest: list[GroupPhases] = []
        for g in mine:
            (wide if set(g.hosts) >= hosts else rest).append(g)
        crossing = sum(1 for tied in _tied(rest) if any(_crosses(g) for g in tied))
        if wide and crossing >= 2:
            dropped.update(id(g) for g in wide)
            sync_at[job] = min(start for g in wide for start, _ in g.phases)
    return [g for g in groups if id(g) not in dropped], sync_at


def units(groups: Iterable[GroupPhases]) -> list[Unit]:
    """The window's groups, tied by shared hosts, that have phases; in name order (a job's
    groups over all its hosts left out where they would tie its halves: see the module
    docstring)."""
    out = []
    kept, sync_at = _without_job_wide([g for g in groups if g.phases])
    most = {job: max(g.applied_offset_s for g in kept if g.job == job) for job in sync_at}
    for tied in _tied(kept):
        observed = _merged([g for g in tied if _crosses(g)] or tied)
        applied = max(g.applied_offset_s for g in tied)
        job = tied[0].job
        if job in sync_at and sync_at[job] < min(start for start, _ in observed):
            # The job's ranks wait for each other (its world collective) after their step
            # started and before these phases: a unit held less than the job's most held one
            # waits there for the difference, so every unit's phases start as late after its
            # own step start, whatever its offset. On the job's one time line, after that
            # wait, they start the difference earlier.
            shift = most[job] - applied
            observed = tuple((start - shift, duration) for start, duration in observed)
        out.append(
            Unit(
                pgs=tuple(sorted(g.pg for g in tied)),
                switches=frozenset(s for g in tied for s in g.switches),
                observed=observed,
                applied_offset_s=applied,
                job=job,
                step_s=max(g.step_s for g in tied),
                step_start=max(g.step_start_unix for g in tied),
            )
        )
    return sorted(out, key=lambda u: (u.job, u.pgs))


def _crosses(group: GroupPhases) -> bool:
    return len(group.switches) >= 2 or "many" in group.switches


def _merged(tied: Sequence[GroupPhases]) -> tuple[tuple[float, float], ...]:
    """A unit's phases: the k-th phase of its groups, the median start and duration, when
    they all have as many (a set's rails, tied by their hosts, run their phases together);
    else every group's phases."""
    counts = {len(g.phases) for g in tied}
    if len(counts) != 1:
        return tuple(sorted(p for g in tied for p in g.phases))
    return tuple(
        (
            statistics.median(g.phases[k][0] for g in tied),
            statistics.median(g.phases[k][1] for g in tied),
        )
        for k in range(counts.pop())
    )


def share_uplink(a: Unit, b: Unit) -> bool:
    """Whether two units cross a common leaf's uplink (a unit behind ``many`` switches
    shares with every one)."""
    return bool(a.switches & b.switches) or "many" in a.switches or "many" in b.switches


def colliding_with(found: Sequence[Unit], job: str) -> list[Unit]:
    """The crossing units that share an uplink with the job's, directly or through others
    (a unit behind ``many`` switches shares with every one): the units one schedule
    concerns."""
    crossing = [u for u in found if u.crosses]
    parent = list(range(len(crossing)))
    root = _root_finder(parent)

    for i, a in enumerate(crossing):
        for j in range(i):
            b = crossing[j]
            if share_uplink(a, b):
                parent[root(i)] = root(j)
    mine = {root(i) for i, u in enumerate(crossing) if u.job == job}
    return [u for i, u in enumerate(crossing) if root(i) in mine]
