"""A global batch split by work: the cost of a sample from its tokens, and equal-work parts.

A sample of ``t`` tokens costs ``linear * t + quadratic * t**2`` (:class:`TokenCost`): the
linear term is the layers' matrix products, the quadratic one attention's scores. Its two
coefficients are what matters for a split, and only their ratio: :class:`CostFit` fits them
online from a rank's own forward and backward times against the tokens of its batch, with an
intercept for the per-step work that does not grow with the batch (launches, the optimizer's
share). The fit's statistics are sums, so ranks agree on one model by all-reducing them.

:func:`split_by_work` assigns the samples of one global batch to ``parts`` (ranks, or ranks x
micro-batches) so that each part's work is as equal as it can be: the largest-processing-time
rule (each sample, heaviest first, to the part with the least work relative to its weight),
which is within 4/3 of the best makespan and, with many small samples, close to equal.
Deterministic: the same costs and weights give the same split on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenCost:
    """The work of a sample of ``t`` tokens: ``linear * t + quadratic * t**2`` (any unit)."""

    linear: float = 1.0
    quadratic: float = 0.0

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"TokenCost.{name} must be finite and >= 0, got {value!r}")
        if self.linear == 0 and self.quadratic == 0:
            raise ValueError("TokenCost needs a positive linear or quadratic term")

    @classmethod
    def with_crossover(cls, tokens: float, linear: float = 1.0) -> TokenCost:
        """A model whose quadratic term equals the linear one at ``tokens`` tokens (where
        attention's share of a layer's work is one half: about 6 x the hidden size for a
        transformer layer)."""
        if not (math.isfinite(tokens) and tokens > 0):
            raise ValueError(f"crossover tokens must be > 0, got {tokens!r}")
        return cls(linear=linear, quadratic=linear / tokens)

    def __call__(self, tokens: float) -> float:
        return self.linear * tokens + self.quadratic * tokens * tokens

    def of_batch(self, lengths: Sequence[float]) -> float:
        """The work of a batch of samples packed without padding: the sum over its samples."""
        return sum(self(t) for t in lengths)


FIT_STATISTICS = 10
"""The length of :meth:`CostFit.statistics` (what ranks all-reduce to agree on one model)."""


class CostFit:
    """Least squares of a step's compute seconds on ``(sum t, sum t**2, 1)`` over observed steps.

    :meth:`observe` one rank-step: the tokens of every sample of the batch and the seconds its
    forward and backward took. :meth:`model` solves the normal equations (coefficients held at
    zero where they come out negative: a coefficient the data cannot see is not negative) and
    returns a :class:`TokenCost`, or None while the data cannot tell the terms apart (fewer
    than ``min_observations``, or no spread of lengths). ``decay`` (< 1) weighs older
    observations down at each :meth:`observe`, so the model follows a job whose speed drifts.
    """

    def __init__(self, *, min_observations: int = 8, decay: float = 1.0) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        if min_observations < 3:
            raise ValueError(f"min_observations must be >= 3, got {min_observations!r}")
        self.min_observations = min_observations
        self.decay = decay
        self._s = [0.0] * FIT_STATISTICS

    # statistics: [w, w*x1, w*x2, w*y, w*x1*x1, w*x1*x2, w*x2*x2, w*x1*y, w*x2*y, n]
    # with x1 = tokens / 1e3, x2 = sum of squares / 1e6 (scaled for the solve).

    def observe(self, lengths: Sequence[float], seconds: float) -> bool:
        """Add one step's batch and its forward+backward seconds; False (ignored) when the
        seconds are not a finite positive number or the batch is empty."""
        if not lengths or not (math.isfinite(seconds) and seconds > 0):
            return False
        x1 = sum(lengths) / 1e3
        x2 = sum(t * t for t in lengths) / 1e6
        if not (math.isfinite(x1) and math.isfinite(x2)):
            return False
        if self.decay < 1:
            self._s = [v * self.decay for v in self._s[:-1]] + [self._s[-1]]
        y = seconds
        for i, v in enumerate((1.0, x1, x2, y, x1 * x1, x1 * x2, x2 * x2, x1 * y, x2 * y, 1.0)):
            self._s[i] += v
        return True

    def statistics(self) -> list[float]:
        """The sums the fit is made of: all-reduce (sum) them over ranks and :meth:`merged`."""
        return list(self._s)

    @classmethod
    def merged(cls, statistics: Sequence[float], **kwargs: float) -> CostFit:
        """A fit of summed :meth:`statistics` (every rank computes the same one from them)."""
        if len(statistics) != FIT_STATISTICS:
            raise ValueError(f"expected {FIT_STATISTICS} statistics, got {len(statistics)}")
        fit = cls(**kwargs)  # type: ignore[arg-type]
        fit._s = [float(v) for v in statistics]
        return fit

    @property
    def observations(self) -> int:
        return round(self._s[-1])

    def model(self) -> TokenCost | None:
        """The fitted :class:`TokenCost` (seconds per token and per token squared), or None."""
        if self.observations < self.min_observations:
            return None
        w, s1, s2, sy, s11, s12, s22, s1y, s2y, _ = self._s
        # Try the full model, then each single term; keep the best non-negative one.
        candidates: list[tuple[float, float, float]] = []
        full = _solve3(
            [[s11, s12, s1], [s12, s22, s2], [s1, s2, w]],
            [s1y, s2y, sy],
        )
        if full is not None and full[0] >= 0 and full[1] >= 0:
            candidates.append(full)
        for coef, sxx, sx, sxy in ((0, s11, s1, s1y), (1, s22, s2, s2y)):
            det = sxx * w - sx * sx
            if det <= 1e-12 * max(sxx * w, 1e-300):
                continue
            slope = (sxy * w - sx * sy) / det
            if slope <= 0:
                continue
            intercept = (sy - slope * sx) / w
            pair = [0.0, 0.0, intercept]
            pair[coef] = slope
            candidates.append((pair[0], pair[1], pair[2]))
        if not candidates:
            return None

        def residual(c: tuple[float, float, float]) -> float:
            a, b, k = c
            # sum of w (y - a x1 - b x2 - k)^2, expanded; only differences between candidates
            return (
                -2 * (a * s1y + b * s2y + k * sy)
                + a * a * s11
                + b * b * s22
                + k * k * w
                + 2 * (a * b * s12 + a * k * s1 + b * k * s2)
            )

        a, b, _ = min(candidates, key=residual)
        if a <= 0 and b <= 0:
            return None
        return TokenCost(linear=a / 1e3, quadratic=b / 1e6)


def _solve3(m: list[list[float]], v: list[float]) -> tuple[float, float, float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    a = [[*row, rhs] for row, rhs in zip(m, v, strict=True)]
    scale = max(abs(x) for row in m for x in row) or 1.0
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-12 * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(3):
            if r != col:
                f = a[r][col] / a[col][col]
                for c in range(col, 4):
                    a[r][c] -= f * a[col][c]
    return (a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2])


def split_by_work(
    costs: Sequence[float],
    parts: int,
    weights: Sequence[float] | None = None,
) -> list[list[int]]:
    """Indices into ``costs`` for each of ``parts`` parts, each part's work as close to its
    weight's share of the total as the largest-processing-time rule gets it.

    ``weights`` (default equal) are the parts' shares (the rebalancing policy's shares of the
    batch by speed: samples by work within a share). Every part gets at least one sample when
    there are at least as many samples as parts. Each part lists its indices in ascending
    order. Deterministic: ties go to the lower index and the lower part.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if weights is None:
        weights = [1.0] * parts
    if len(weights) != parts:
        raise ValueError(f"expected {parts} weights, got {len(weights)}")
    if any(not (math.isfinite(w) and w > 0) for w in weights):
        raise ValueError("weights must be finite and > 0")
    if any(not (math.isfinite(c) and c >= 0) for c in costs):
        raise ValueError("costs must be finite and >= 0")
    loads = [0.0] * parts
    assigned: list[list[int]] = [[] for _ in range(parts)]
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    for i in order:
        best = min(range(parts), key=lambda p: ((loads[p] + costs[i]) / weights[p], p))
        loads[best] += costs[i]
        assigned[best].append(i)
    if len(costs) >= parts:
        for p in range(parts):
            while not assigned[p]:
                donor = max(range(parts), key=lambda q: (len(assigned[q]), -q))
                # the donor's lightest sample (the last it took, heaviest first)
                lightest = min(assigned[donor], key=lambda i: (costs[i], -i))
                assigned[donor].remove(lightest)
                assigned[p].append(lightest)
    return [sorted(part) for part in assigned]


def split_by_count(count: int, parts: int) -> list[list[int]]:
    """Equal counts, as ``DistributedSampler`` splits a batch: consecutive slices, the first
    ``count % parts`` one longer (the baseline :func:`split_by_work` is measured against)."""
    size, extra = divmod(count, parts)
    out, start = [], 0
    for p in range(parts):
        n = size + (1 if p < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out
