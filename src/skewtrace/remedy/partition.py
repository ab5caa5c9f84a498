"""A pipeline's layers into stages: the partition that minimizes the slowest stage, and its price.

:func:`best_partition` takes the per-layer costs of the whole model in order (each layer's
forward plus backward seconds) and returns the layers per stage, contiguous, every stage at
least one layer, that minimizes the slowest stage's cost; among those, the most even (least
sum of squares of the stages' costs), then the lexicographically smallest. Exact: a dynamic
program over (layers, stages) in O(L^2 x S), instant for hundreds of layers.

:func:`advise_partition` is the advice: many partitions share the least slowest stage (16
equal layers and a head of 1.6 over 4 stages: ten of them), and they do not run alike. Under
1F1B a stage's place matters: the first stages' warm-up forwards and the last stages'
cool-down backwards are not hidden alike, so (5, 4, 4, 4) replays about 2% shorter than
(4, 4, 5, 4). So among the partitions with the least slowest stage (up to :data:`MAX_TIES`
of them, enumerated in lexicographic order, the most even always among them) the advice is
the one whose step :func:`replay_1f1b` replays shortest, from each layer's forward and
backward apart; ties then as :func:`best_partition`. The Collector's advice
(``src/collector/internal/diagnosis/partition.go``) is the same rule; the shared cases in
``tests/data/partition/cases.json`` hold both to it.

:func:`replay_1f1b` prices a partition: one step of the 1F1B schedule (PipeDream-flush, what
``torch.distributed.pipelining.Schedule1F1B`` and Megatron run) replayed from each stage's
forward and backward time per micro-batch, with a fixed transfer between stages. The
saving of a partition is the step replayed with the old stage times minus the step with the
new ones, both from the same per-layer costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Partition:
    """Layers per stage (contiguous, in order) and each stage's cost under the given costs."""

    layers: tuple[int, ...]
    costs: tuple[float, ...]

    @property
    def slowest(self) -> float:
        return max(self.costs)

    @property
    def split_points(self) -> tuple[int, ...]:
        """The index of each stage's first layer after the first: what a split-points
        argument takes (``torch.distributed.pipelining``'s ``split_spec`` at those layers)."""
        points, at = [], 0
        for n in self.layers[:-1]:
            at += n
            points.append(at)
        return tuple(points)


def stage_costs(costs: Sequence[float], layers: Sequence[int]) -> tuple[float, ...]:
    """Each stage's summed cost under a partition (``layers`` per stage, in order)."""
    if sum(layers) != len(costs) or any(n < 1 for n in layers):
        raise ValueError(f"partition {tuple(layers)} does not cover {len(costs)} layers")
    out, at = [], 0
    for n in layers:
        out.append(float(sum(costs[at : at + n])))
        at += n
    return tuple(out)


def best_partition(costs: Sequence[float], stages: int) -> Partition:
    """The contiguous partition of ``costs`` into ``stages`` stages that minimizes the slowest
    stage (then the sum of squares, then lexicographic order of the layer counts)."""
    n = len(costs)
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if n < stages:
        raise ValueError(f"{n} layers cannot fill {stages} stages")
    if any(not (math.isfinite(c) and c >= 0) for c in costs):
        raise ValueError("layer costs must be finite and >= 0")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def seg(i: int, j: int) -> float:
        return prefix[j] - prefix[i]

    # 1. the least possible slowest stage (the dynamic program tied_partitions walks too)
    bound, _ = _bound_and_suffix(costs, stages)
    slack = 1e-9 * max(bound, 1e-300)
    # 2. among partitions whose every stage is within the bound, the least sum of squares;
    # ties to the lexicographically smallest counts (a smaller first stage first)
    best: list[list[tuple[float, tuple[int, ...]] | None]] = [
        [None] * (n + 1) for _ in range(stages + 1)
    ]
    best[0][0] = (0.0, ())
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            choice: tuple[float, tuple[int, ...]] | None = None
            for j in range(s - 1, i):
                prev = best[s - 1][j]
                cost = seg(j, i)
                if prev is None or cost > bound + slack:
                    continue
                cand = (prev[0] + cost * cost, prev[1] + (i - j,))
                if (
                    choice is None
                    or cand[0] < choice[0] - slack * bound
                    or (abs(cand[0] - choice[0]) <= slack * bound and cand[1] < choice[1])
                ):
                    choice = cand
            best[s][i] = choice
    final = best[stages][n]
    assert final is not None  # the bound is attainable by construction
    return Partition(layers=final[1], costs=stage_costs(costs, final[1]))


MAX_TIES = 512
"""The most partitions with the least slowest stage :func:`advise_partition` replays."""

_REL = 1e-9
"""Relative tolerance under which two costs or two replayed steps are equal (float sums)."""


def _bound_and_suffix(costs: Sequence[float], stages: int) -> tuple[float, list[list[float]]]:
    """The least possible slowest stage, and ``tail[s][i]``: the least slowest stage of
    layers ``i..`` in ``s`` stages (inf where impossible)."""
    n = len(costs)
    suffix = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + costs[i]
    inf = math.inf
    tail = [[inf] * (n + 1) for _ in range(stages + 1)]
    tail[0][n] = 0.0
    for s in range(1, stages + 1):
        for i in range(n - s, -1, -1):
            best = inf
            for j in range(i + 1, n - (s - 1) + 1):
                best = min(best, max(suffix[i] - suffix[j], tail[s - 1][j]))
            tail[s][i] = best
    return tail[stages][0], tail


def tied_partitions(
    costs: Sequence[float], stages: int, limit: int = MAX_TIES
) -> list[tuple[int, ...]]:
    """Every contiguous partition whose slowest stage is the least possible (within a relative
    1e-9), in lexicographic order of the layer counts, at most ``limit`` of them."""
    n = len(costs)
    if stages < 1 or n < stages:
        raise ValueError(f"{n} layers cannot fill {stages} stages")
    bound, tail = _bound_and_suffix(costs, stages)
    slack = _REL * max(bound, 1e-300)
    out: list[tuple[int, ...]] = []
    counts: list[int] = []

    def walk(i: int, left: int) -> None:
        if len(out) >= limit:
            return
        if left == 0:
            if i == n:
                out.append(tuple(counts))
            return
        cost = 0.0
        for j in range(i + 1, n - (left - 1) + 1):
            cost += costs[j - 1]
            if cost > bound + slack:
                break
            if tail[left - 1][j] > bound + slack:
                continue
            counts.append(j - i)
            walk(j, left - 1)
            counts.pop()
            if len(out) >= limit:
                return

    walk(0, stages)
    return out


def advise_partition(
    forward: Sequence[float],
    backward: Sequence[float],
    stages: int,
    microbatches: int,
    transfer: float = 0.0,
    limit: int = MAX_TIES,
) -> Partition:
    """The advice (see the module docstring): ``forward`` and ``backward`` are each layer's
    seconds per step (summed over its ``microbatches``); among the partitions with the least
    slowest stage of forward plus backward, the one whose 1F1B step replays shortest."""
    if len(forward) != len(backward):
        raise ValueError("forward and backward need one time per layer")
    costs = [f + b for f, b in zip(forward, backward, strict=True)]
    candidates = tied_partitions(costs, stages, limit)
    if len(candidates) >= limit:  # capped: the most even may not be among those enumerated
        even = best_partition(costs, stages).layers
        if even not in candidates:
            candidates.append(even)

    def price(layers: tuple[int, ...]) -> float:
        f = [c / microbatches for c in stage_costs(forward, layers)]
        b = [c / microbatches for c in stage_costs(backward, layers)]
        return replay_1f1b(f, b, microbatches, transfer)

    best: tuple[float, float, tuple[int, ...]] | None = None
    for layers in sorted(candidates):
        key = (price(layers), sum(c * c for c in stage_costs(costs, layers)), layers)
        if best is None or _before(key, best):
            best = key
    assert best is not None
    return Partition(layers=best[2], costs=stage_costs(costs, best[2]))


def _before(
    a: tuple[float, float, tuple[int, ...]], b: tuple[float, float, tuple[int, ...]]
) -> bool:
    """``a`` ranks before ``b``: a shorter replay, then a smaller sum of squares (each beyond
    a relative 1e-9), then smaller counts."""
    for x, y in ((a[0], b[0]), (a[1], b[1])):
        if abs(x - y) > _REL * max(abs(x), abs(y), 1e-300):
            return x < y
    return a[2] < b[2]


def replay_1f1b(
    forward: Sequence[float],
    backward: Sequence[float],
    microbatches: int,
    transfer: float = 0.0,
) -> float:
    """One step of 1F1B: stage ``s`` runs ``min(P - s - 1, M)`` warm-up forwards, then
    alternates one forward and one backward, then the remaining backwards; a forward of
    micro-batch ``m`` on stage ``s`` starts after stage ``s-1`` finished it plus ``transfer``,
    a backward after stage ``s+1``'s backward of it (the last stage: after its own forward).
    Returns the time from the first forward's start to the last backward's end."""
    stages = len(forward)
    if stages < 1 or len(backward) != stages:
        raise ValueError("forward and backward need one time per stage")
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    programs: list[list[tuple[str, int]]] = []
    for s in range(stages):
        warm = min(stages - s - 1, microbatches)
        prog = [("F", m) for m in range(warm)]
        f, b = warm, 0
        while f < microbatches:
            prog.append(("F", f))
            f += 1
            prog.append(("B", b))
            b += 1
        prog.extend(("B", m) for m in range(b, microbatches))
        programs.append(prog)
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * stages
    pos = [0] * stages
    remaining = sum(len(p) for p in programs)
    while remaining:
        progressed = False
        for s in range(stages):
            while pos[s] < len(programs[s]):
                kind, m = programs[s][pos[s]]
                if kind == "F":
                    dep = 0.0 if s == 0 else end.get(("F", s - 1, m))
                    if dep is not None and s > 0:
                        dep += transfer
                    duration = forward[s]
                else:
                    if s == stages - 1:
                        dep = end.get(("F", s, m))
                    else:
                        dep = end.get(("B", s + 1, m))
                        if dep is not None:
                            dep += transfer
                    duration = backward[s]
                if dep is None:
                    break
                start = max(free[s], dep)
                free[s] = start + duration
                end[(kind, s, m)] = free[s]
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen with the schedule above
            raise RuntimeError("1F1B replay deadlocked")
    return max(free)
