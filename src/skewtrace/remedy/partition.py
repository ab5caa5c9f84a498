"""A pipeline's layers into stages: the partition that minimizes the slowest stage, and its price.

:func:`best_partition` takes the per-layer costs of the whole model in order (each layer's
forward plus backward seconds, or forward and backward apart) and returns the layers per
stage, contiguous, every stage at least one layer, that minimizes the slowest stage's cost;
among those, the most even (least sum of squares of the stages' costs), then the
lexicographically smallest. Exact: a binary-search-free dynamic program over (layers,
stages) in O(L^2 x S), instant for hundreds of layers.

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

    inf = math.inf
    # 1. the least possible slowest stage: best_max[s][i] over the first i layers in s stages
    best_max = [[inf] * (n + 1) for _ in range(stages + 1)]
    best_max[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            best_max[s][i] = min(max(best_max[s - 1][j], seg(j, i)) for j in range(s - 1, i))
    bound = best_max[stages][n]
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
