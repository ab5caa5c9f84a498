"""Rebalancing on the rank side: each rank's share of the global batch, applied to its data.

With ``skewtrace pacer --policy rebalance`` the pacer publishes ``shares: {rank: fraction of
the global batch}`` sized to each rank's speed. :class:`ShareSampler` applies them in place of
a ``DistributedSampler``, and :meth:`ShareSampler.loss_scale` keeps the update what it would
have been with equal shares::

    import skewtrace
    from skewtrace.rank.rebalance_sampler import ShareSampler

    skewtrace.instrument(model=ddp_model, optimizer=optimizer, pacer_url=...)
    sampler = ShareSampler(dataset, global_batch_size=256)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for index, (inputs, targets) in enumerate(loader):
            loss = criterion(ddp_model(inputs), targets)       # mean over the local batch
            (loss * sampler.loss_scale(len(inputs), index)).backward()
            optimizer.step()
            optimizer.zero_grad()

What it keeps:

- **The global batch.** Every step takes the next ``global_batch_size`` indices of one
  permutation of the dataset (the same on every rank: ``seed`` + epoch) and splits them into
  consecutive per-rank slices whose sizes are the shares times the global batch, rounded by
  the largest-remainder method so they sum to it exactly; every rank gets at least one
  sample. So an epoch covers every index exactly once whatever the shares (the final partial
  global batch is split the same way; with fewer samples left than ranks it is dropped, as is
  any partial one with ``drop_last``), every rank runs the same number of steps, and a step's
  global batch is the same samples with any shares.
- **The update.** DDP averages gradients over ranks. A rank whose loss is the mean over ``b``
  of the ``B`` samples contributes ``1/b`` per sample where equal shares give ``N/B``, so the
  loss is scaled by ``N * b / B`` (:func:`loss_scale`) and the averaged gradient is the mean
  over the global batch, as with equal shares (``tests/test_rebalance_equivalence.py``).
  With a sum-reduced loss, scale by ``N / B`` instead. What does change: anything computed
  per local batch (BatchNorm statistics, per-rank metrics) sees different batch sizes.
- **Agreement.** Every rank must use the same sizes in a step or the epoch's coverage breaks.
  Shares change only at *sync points*, every ``sync_every`` steps of an epoch (and at its
  first): rank 0 of the group reads the latest shares and broadcasts them with one small
  collective; every rank then uses the broadcast values until the next sync point. With
  DataLoader workers the sampler runs ahead of the training loop by the prefetch depth, the
  same on every rank, so agreement holds.
- **Failing open.** No pacer, no shares in its answer, a stale or failing one, or shares that
  do not cover exactly this group's ranks: equal shares. Reading shares never raises; only
  the broadcast, a collective like any other, can fail the step.

Shares come from ``source`` (anything with ``current_shares() -> (shares or None,
version)``), else from the pacing client of the running ``skewtrace.instrument()`` session
(``pacer_url`` / ``SKEWTRACE_PACER_URL``). Only rank 0's source is read. See
``docs/rebalancing.md``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any, Protocol

from torch.utils.data import Sampler

_log = logging.getLogger(__name__)

DEFAULT_SYNC_EVERY = 16


class ShareSource(Protocol):
    """Where rank 0 reads shares: :class:`skewtrace.rank.pacing_client.PacingClient` is one."""

    def current_shares(self) -> tuple[Mapping[int, float] | None, int]:
        """({rank: share} or None for equal shares, shares version)."""


def batch_sizes(shares: Sequence[float], total: int) -> list[int]:
    """Integer batch sizes in proportion to ``shares`` summing exactly to ``total``.

    The largest-remainder method: every rank gets the integer part of its share times the
    total, and the items left over go to the largest fractional parts (ties to the lower
    rank). When ``total`` is at least the number of ranks, every rank gets at least one.
    Deterministic: the same shares give the same sizes on every rank.
    """
    count = len(shares)
    if count == 0 or total <= 0:
        return [0] * count
    weight = sum(shares)
    if not (math.isfinite(weight) and weight > 0) or any(
        not (math.isfinite(s) and s >= 0) for s in shares
    ):
        shares, weight = [1.0] * count, float(count)
    exact = [s / weight * total for s in shares]
    sizes = [math.floor(e) for e in exact]
    left = total - sum(sizes)
    by_remainder = sorted(range(count), key=lambda r: (-(exact[r] - sizes[r]), r))
    for rank in by_remainder[: max(left, 0)]:
        sizes[rank] += 1
    while sum(sizes) > total:  # float rounding; never in practice
        sizes[max(range(count), key=lambda r: (sizes[r], -r))] -= 1
    if total >= count:
        for rank in range(count):
            while sizes[rank] < 1:
                donor = max(range(count), key=lambda r: (sizes[r], -r))
                sizes[donor] -= 1
                sizes[rank] += 1
    return sizes


def loss_scale(local_batch_size: int, global_batch_size: int, world_size: int) -> float:
    """The factor on a rank's mean loss that makes DDP's averaged gradient the mean over the
    global batch: ``world_size * local / global`` (1 with equal shares)."""
    if global_batch_size <= 0:
        return 0.0
    return world_size * local_batch_size / global_batch_size


class ShareSampler(Sampler[list[int]]):
    """A batch sampler (``DataLoader(batch_sampler=...)``) giving each rank its share of every
    global batch; see the module docstring."""

    def __init__(
        self,
        dataset: Sized | int,
        global_batch_size: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        sync_every: int = DEFAULT_SYNC_EVERY,
        source: ShareSource | None = None,
        group: Any | None = None,
    ) -> None:
        super().__init__()
        self.num_samples = dataset if isinstance(dataset, int) else len(dataset)
        if num_replicas is None or rank is None:
            dist_rank, dist_size = _group_rank_and_size(group)
            num_replicas = dist_size if num_replicas is None else num_replicas
            rank = dist_rank if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        if global_batch_size < num_replicas:
            raise ValueError(
                f"global_batch_size {global_batch_size} must be at least the number of "
                f"ranks ({num_replicas}): every rank gets at least one sample"
            )
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.global_batch_size = global_batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.sync_every = sync_every
        self.source = source
        self.group = group
        self.epoch = 0
        self._shares: list[float] = [1.0 / num_replicas] * num_replicas
        self._version = 0
        self._sizes: list[int] = batch_sizes(self._shares, global_batch_size)
        self._source_failed_logged = False

    # ------------------------------------------------------------------ the plan

    def set_epoch(self, epoch: int) -> None:
        """Like ``DistributedSampler.set_epoch``: a different permutation per epoch."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Steps per epoch (the same on every rank)."""
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + (1 if rest >= self.num_replicas and not self.drop_last else 0)

    def global_batch_size_at(self, index: int | None) -> int:
        """The global batch size of step ``index`` of the epoch (None: a full one)."""
        if index is None:
            return self.global_batch_size
        return max(
            0, min(self.global_batch_size, self.num_samples - index * self.global_batch_size)
        )

    def loss_scale(self, local_batch_size: int, index: int | None = None) -> float:
        """The factor on this rank's mean loss for the batch at step ``index`` of the epoch
        (pass it when the epoch's last global batch can be partial); see :func:`loss_scale`."""
        return loss_scale(local_batch_size, self.global_batch_size_at(index), self.num_replicas)

    @property
    def shares(self) -> list[float]:
        """The shares in force (agreed at the latest sync point)."""
        return list(self._shares)

    @property
    def shares_version(self) -> int:
        """The pacer's ``shares_version`` they came from (0: equal shares by default)."""
        return self._version

    @property
    def sizes(self) -> list[int]:
        """Every rank's batch size in the latest step this sampler produced."""
        return list(self._sizes)

    def __iter__(self) -> Iterator[list[int]]:
        order = self._order()
        for index in range(len(self)):
            if index % self.sync_every == 0:
                self._agree(index)
            start = index * self.global_batch_size
            size = min(self.global_batch_size, self.num_samples - start)
            sizes = batch_sizes(self._shares, size)
            self._sizes = sizes
            offset = start + sum(sizes[: self.rank])
            yield order[offset : offset + sizes[self.rank]]

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    # ------------------------------------------------------------------ agreement

    def _agree(self, index: int) -> None:
        """Make every rank use rank 0's reading of the shares from now on."""
        proposal = self._read_source() if self.rank == 0 else None
        agreed = _broadcast(proposal, self.num_replicas + 1, self.group)
        if agreed is None:
            # No process group: each process reads its own source (one process, or tests
            # where every "rank" reads the same fixed source).
            agreed = proposal if proposal is not None else self._read_source()
        version, shares = int(agreed[0]), [float(s) for s in agreed[1:]]
        if version != self._version and self.rank == 0:
            _log.info(
                "skewtrace: shares version %d from step %d of epoch %d: batch sizes %s",
                version,
                index,
                self.epoch,
                batch_sizes(shares, self.global_batch_size),
            )
        self._shares, self._version = shares, version

    def _read_source(self) -> list[float]:
        """[shares version, share of rank 0, ...]: rank 0's reading, equal shares (version 0)
        when there are none usable. Never raises."""
        equal = [0.0] + [1.0 / self.num_replicas] * self.num_replicas
        try:
            source = self.source if self.source is not None else _session_source()
            if source is None:
                return equal
            found, version = source.current_shares()
            if not found or set(found) != set(range(self.num_replicas)):
                return equal
            shares = [float(found[r]) for r in range(self.num_replicas)]
            total = sum(shares)
            if not (math.isfinite(total) and total > 0) or any(
                not (math.isfinite(s) and s >= 0) for s in shares
            ):
                return equal
            return [float(version), *(s / total for s in shares)]
        except Exception:
            if not self._source_failed_logged:
                self._source_failed_logged = True
                _log.warning("skewtrace: reading shares failed; equal shares", exc_info=True)
            return equal


def _group_rank_and_size(group: Any | None) -> tuple[int, int]:
    """This process's rank and the size of ``group`` (the world); (0, 1) without one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def collective_device(group: Any | None) -> Any:
    """Where a small tensor for a collective of ``group`` lives: the current CUDA device
    under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast(values: list[float] | None, length: int, group: Any | None) -> list[float] | None:
    """Group rank 0's ``values`` on every rank of ``group``; None without a process group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size(group) == 1:
        return values
    device = collective_device(group)
    if values is not None:
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
    else:
        tensor = torch.zeros(length, dtype=torch.float64, device=device)
    source = 0 if group is None else dist.get_global_rank(group, 0)
    dist.broadcast(tensor, src=source, group=group)
    result: list[float] = tensor.cpu().tolist()
    return result


def _session_source() -> ShareSource | None:
    """The running ``skewtrace.instrument()`` session's pacing client (equal shares from a
    user's ``pacing_client`` without ``current_shares``)."""
    from skewtrace.rank.instrumentor import SkewtraceInstrumentor

    session = SkewtraceInstrumentor().session
    return session.ctx.pacer if session is not None else None
