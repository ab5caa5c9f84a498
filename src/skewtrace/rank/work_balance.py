"""Work-balanced batches: each rank gets an equal share of every global batch's *work*.

With sequences of varying length, equal sample counts give ranks unequal work (a transformer
layer's cost grows with the tokens and, through attention, with their square), and in
synchronous training every rank waits for the one that drew the long sequences: the
``data_imbalance`` verdict. :class:`WorkBalancedSampler` is a drop-in batch sampler that
takes the same global batch per step as :class:`~skewtrace.rank.rebalance_sampler.ShareSampler`
(the next ``global_batch_size`` indices of one permutation, ``seed`` + epoch, the same on every
rank) and assigns its samples to the ranks by their cost, so that each rank's work is its
share of the total (:func:`skewtrace.remedy.work_split.split_by_work`, largest first)::

    import skewtrace
    from skewtrace.rank.work_balance import WorkBalancedSampler

    sampler = WorkBalancedSampler(dataset, global_batch_size=64, lengths=token_counts)
    sampler.time_forward(ddp_model)          # the online cost fit (or cost=TokenCost(...))
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pack)
    skewtrace.instrument(model=ddp_model, optimizer=optimizer, dataloader=loader)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for index, batch in enumerate(loader):
            token_losses = ddp_model(batch)                    # one loss per real token
            loss = token_losses.sum() * sampler.token_loss_scale(index)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

What it keeps and where each piece lives:

- **The global batch.** Unchanged: the same samples per optimizer step as equal counts, an
  epoch covers every index once, every rank runs the same number of steps. Only which rank
  takes which sample of the step changes.
- **The update.** DDP averages the ranks' gradients. With the loss summed over the rank's
  tokens and scaled by ``world_size / global tokens`` (:meth:`token_loss_scale`), the
  averaged gradient is the mean over the global batch's tokens: the same sum, in another
  order, as with equal counts. A loss that is the mean over the rank's samples is made the
  same by :meth:`loss_scale` (``world_size * local / global`` samples). Not the same: a loss
  averaged over the rank's own tokens (without the scale: each rank's tokens weigh
  ``1 / its own tokens``), anything computed per local batch (BatchNorm statistics, per-rank
  metrics), and dropout or other randomness drawn per rank (the samples move between ranks).
- **The cost model**, a :class:`~skewtrace.remedy.work_split.TokenCost`, lives in the sampler
  of every rank, at version ``cost_version``: either fixed by configuration
  (``cost=TokenCost(...)``: version 0 forever), or fitted online. Online, each rank observes
  its own forward time against the real tokens of the batch it ran (:meth:`time_forward`
  hooks the model; :meth:`observe` takes the seconds from the user) into a local
  :class:`~skewtrace.remedy.work_split.CostFit`; at each sync point the ranks all-reduce the
  fits' statistics (sums) and every rank solves the same merged fit, so every rank adopts the
  same model at the same step (version n: the n-th adopted fit). Until the merged fit has
  ``fit_min_observations`` observations (over all ranks), ``default_cost`` prices samples
  (default: linear in tokens; ``TokenCost.with_crossover(6 * hidden)`` is closer for a
  transformer). Forward only: a backward span ends after DDP's gradient all-reduce, so it
  holds the wait for the slowest rank; a forward does not, and the forward's cost is
  proportional to forward+backward's. Only the ratio of the two coefficients matters.
- **Agreement.** Everything that decides a step's split (shares by speed, the mode, the cost
  model) changes only at *sync points*, every ``sync_every`` steps and at the first step of
  each pass, through one collective: an all-reduce (sum) of one float64 vector into which
  rank 0 writes its reading of the controller (shares version, shares, balance mode, balance
  version) and every rank adds its fit statistics; the other ranks write zeros in rank 0's
  part, so its values arrive exactly. The split is then a pure function of the same inputs
  on every rank (:func:`split_by_work` is deterministic). The sampler runs ahead of the
  training loop by the DataLoader's prefetch depth, the same on every rank.
- **The mode.** ``"work"`` (default): split by work. ``"count"``: consecutive slices of equal
  count (within the shares), as ``DistributedSampler`` with ShareSampler's shares: the
  baseline. ``"pacer"``: the controller decides: rank 0 reads ``current_balance() -> (mode,
  version)`` from ``source`` (else the skewtrace session's pacing client); absent, failing or
  anything but ``"work"``: ``"count"`` (fail open).
- **Shares compose.** With the rebalancing policy's shares (rank 0's ``current_shares()``,
  as ShareSampler), each rank's work is its share of the step's work: shares by speed,
  samples by work within a share (``split_by_work(costs, N, weights=shares)``).
- **Pipelining.** ``microbatches=M > 1``: the global batch is split into ``N x M`` parts of
  equal work (weights ``share / M``), rank r's micro-batches being parts ``r*M .. r*M+M-1``;
  the sampler yields the rank's batch flattened, micro-batch by micro-batch, and
  :meth:`microbatch_slices` (by the batch's index in the epoch) says where each one is.
- **Spans.** With ``skewtrace.instrument`` (an instrumented DataLoader), the
  ``dataloader.fetch`` span of each batch carries ``training.balance.mode`` (``work`` /
  ``count``), ``training.balance.version`` and ``training.balance.cost_version``: the n-th
  fetch of a pass returns the sampler's n-th batch of that pass, so the tag is looked up by
  the fetch's index (:meth:`skewtrace_balance_tag`). The report compares mean step time by
  mode.

See ``docs/rebalancing.md`` (the work-balanced split).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any

from skewtrace.decision import BALANCE_COUNT, BALANCE_WORK
from skewtrace.rank.rebalance_sampler import (
    DEFAULT_SYNC_EVERY,
    ShareSampler,
    ShareSource,
    _session_source,
    batch_sizes,
    collective_device,
)
from skewtrace.remedy.work_split import FIT_STATISTICS, CostFit, TokenCost, split_by_work

_log = logging.getLogger(__name__)

WORK, COUNT = BALANCE_WORK, BALANCE_COUNT
MODES = (WORK, COUNT, "pacer")
_MODE_CODE = {COUNT: 0.0, WORK: 1.0}


@dataclass(frozen=True)
class StepPlan:
    """One step of a pass, as this rank sees it."""

    index: int
    """The batch's index in the pass (``enumerate(loader)``)."""
    indices: tuple[int, ...]
    """This rank's dataset indices, micro-batch by micro-batch."""
    microbatch_sizes: tuple[int, ...]
    """How many of ``indices`` each micro-batch holds (one entry without pipelining)."""
    global_indices: tuple[int, ...]
    """The step's whole global batch (every rank's samples), in permutation order."""
    sizes: tuple[int, ...]
    """Every rank's sample count this step."""
    local_tokens: int
    global_tokens: int
    work: tuple[float, ...]
    """Every rank's work this step under the cost model in force (in its unit)."""
    mode: str
    """``work`` or ``count``: how this step was split."""
    version: int
    """The controller's ``balance_version`` (mode ``pacer``), else 0."""
    cost_version: int
    """The cost model's version (0: configured or default)."""

    def microbatch_slices(self) -> list[slice]:
        """Where each micro-batch lies in :attr:`indices` (and in the collated batch)."""
        out, start = [], 0
        for size in self.microbatch_sizes:
            out.append(slice(start, start + size))
            start += size
        return out


class WorkBalancedSampler(ShareSampler):
    """A batch sampler (``DataLoader(batch_sampler=...)``) giving each rank an equal share of
    each global batch's work; see the module docstring."""

    def __init__(
        self,
        dataset: Sized | int,
        global_batch_size: int,
        *,
        lengths: Sequence[float] | Callable[[int], float],
        cost: TokenCost | None = None,
        default_cost: TokenCost | None = None,
        microbatches: int = 1,
        mode: str = WORK,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        sync_every: int = DEFAULT_SYNC_EVERY,
        source: ShareSource | Any | None = None,
        group: Any | None = None,
        fit_min_observations: int = 8,
        fit_decay: float = 1.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
        if not isinstance(microbatches, int) or microbatches < 1:
            raise ValueError(f"microbatches must be an int >= 1, got {microbatches!r}")
        for name, value in (("cost", cost), ("default_cost", default_cost)):
            if value is not None and not isinstance(value, TokenCost):
                raise TypeError(f"{name} must be a TokenCost or None, got {type(value).__name__}")
        super().__init__(
            dataset,
            global_batch_size,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            sync_every=sync_every,
            source=source,
            group=group,
        )
        parts = self.num_replicas * microbatches
        if global_batch_size < parts:
            raise ValueError(
                f"global_batch_size {global_batch_size} must be at least ranks x micro-batches "
                f"({self.num_replicas} x {microbatches}): every micro-batch gets a sample"
            )
        if callable(lengths):
            self._length_of: Callable[[int], float] = lengths
        else:
            if len(lengths) != self.num_samples:
                raise ValueError(
                    f"lengths has {len(lengths)} entries for a dataset of {self.num_samples}"
                )
            self._length_of = lengths.__getitem__
        self.microbatches = microbatches
        self.mode = mode
        self.fixed_cost = cost
        self.default_cost = default_cost if default_cost is not None else TokenCost()
        self._fit = CostFit(min_observations=fit_min_observations, decay=fit_decay)
        self._fit_kwargs = {"min_observations": fit_min_observations}
        self._cost: TokenCost = cost if cost is not None else self.default_cost
        self._cost_version = 0
        self._balance = COUNT if mode == COUNT else WORK
        self._balance_version = 0
        self._balance_failed_logged = False
        self._plans: dict[int, StepPlan] = {}
        # Micro-batches yielded and not yet observed (their samples' tokens), oldest first.
        self._pending: deque[list[float]] = deque(maxlen=4096)
        self._timers: list[Any] = []

    # ------------------------------------------------------------------ the plan

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch_size)
        parts = self.num_replicas * self.microbatches
        return full + (1 if rest >= parts and not self.drop_last else 0)

    @property
    def sampler(self) -> WorkBalancedSampler:
        """This sampler: frameworks that set the epoch through the loader's
        ``batch_sampler.sampler.set_epoch`` (Lightning, as for torch's ``BatchSampler``)
        reach :meth:`set_epoch` this way."""
        return self

    @property
    def cost(self) -> TokenCost:
        """The cost model in force (agreed at the latest sync point)."""
        return self._cost

    @property
    def cost_version(self) -> int:
        return self._cost_version

    @property
    def balance(self) -> tuple[str, int]:
        """(mode in force: ``work`` or ``count``, the controller's balance version or 0)."""
        return self._balance, self._balance_version

    def tokens(self, index: int) -> float:
        """A sample's tokens (``lengths``)."""
        value = float(self._length_of(index))
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"lengths gave {value!r} for sample {index}: need a finite >= 0")
        return value

    def step_plan(self, index: int) -> StepPlan:
        """The plan of the batch at ``index`` in the current pass (already yielded)."""
        try:
            return self._plans[index]
        except KeyError:
            raise KeyError(
                f"no batch {index} in this pass yet (yielded: {len(self._plans)}); "
                "index is the batch's position in the epoch, as enumerate(loader) gives"
            ) from None

    def microbatch_slices(self, index: int) -> list[slice]:
        """Where each micro-batch of batch ``index`` lies in the yielded (collated) batch."""
        return self.step_plan(index).microbatch_slices()

    def global_tokens(self, index: int, per_sample: Callable[[int], float] | None = None) -> float:
        """The tokens of the step's whole global batch (``lengths``, or ``per_sample`` where
        the loss counts other tokens, e.g. ``lambda i: lengths[i] - 1`` for next-token
        prediction)."""
        plan = self.step_plan(index)
        if per_sample is None:
            return plan.global_tokens
        return float(sum(per_sample(i) for i in plan.global_indices))

    def local_tokens(self, index: int) -> float:
        return self.step_plan(index).local_tokens

    def token_loss_scale(
        self, index: int, per_sample: Callable[[int], float] | None = None
    ) -> float:
        """The factor on this rank's loss *summed* over its tokens that makes DDP's averaged
        gradient the mean over the global batch's tokens: ``world_size / global tokens``."""
        total = self.global_tokens(index, per_sample)
        return self.num_replicas / total if total > 0 else 0.0

    def skewtrace_balance_tag(self, fetch: int) -> tuple[str, int, int] | None:
        """The span tag of the ``fetch``-th batch of the current pass (see
        :data:`skewtrace.rank.hooks.dataloader.BALANCE_TAG`)."""
        plan = self._plans.get(fetch)
        return None if plan is None else (plan.mode, plan.version, plan.cost_version)

    def __iter__(self) -> Iterator[list[int]]:
        order = self._order()
        self._plans = {}
        self._pending.clear()
        for index in range(len(self)):
            if index % self.sync_every == 0:
                self._agree(index)
            plan = self._plan(index, order)
            self._plans[index] = plan
            self._sizes = list(plan.sizes)
            start = 0
            for size in plan.microbatch_sizes:
                chunk = plan.indices[start : start + size]
                self._pending.append([self.tokens(i) for i in chunk])
                start += size
            yield list(plan.indices)

    def _plan(self, index: int, order: Sequence[int]) -> StepPlan:
        start = index * self.global_batch_size
        batch = order[start : start + min(self.global_batch_size, self.num_samples - start)]
        tokens = [self.tokens(i) for i in batch]
        ranks, per_rank = self.num_replicas, self.microbatches
        parts = ranks * per_rank
        weights = [share / per_rank for share in self._shares for _ in range(per_rank)]
        cost = self._cost
        costs = [cost(t) for t in tokens]
        if self._balance == WORK:
            assigned = split_by_work(costs, parts, weights=weights)
        else:
            assigned, offset = [], 0
            for size in batch_sizes(weights, len(batch)):
                assigned.append(list(range(offset, offset + size)))
                offset += size
        mine = assigned[self.rank * per_rank : (self.rank + 1) * per_rank]
        rank_parts = [
            [i for part in assigned[r * per_rank : (r + 1) * per_rank] for i in part]
            for r in range(ranks)
        ]
        local = [i for part in mine for i in part]
        return StepPlan(
            index=index,
            indices=tuple(batch[i] for i in local),
            microbatch_sizes=tuple(len(part) for part in mine),
            global_indices=tuple(batch),
            sizes=tuple(len(p) for p in rank_parts),
            local_tokens=int(sum(tokens[i] for i in local)),
            global_tokens=int(sum(tokens)),
            work=tuple(sum(costs[i] for i in p) for p in rank_parts),
            mode=self._balance,
            version=self._balance_version,
            cost_version=self._cost_version,
        )

    # ------------------------------------------------------------------ the cost fit

    def observe(self, seconds: float, tokens: Sequence[float] | None = None) -> bool:
        """This rank's compute seconds (forward, or forward+backward without the gradient
        sync: be consistent) of one yielded micro-batch (the whole batch without pipelining):
        ``tokens`` (its samples' tokens), by default the oldest yielded and not yet observed
        one; the training loop consumes batches in the order they were yielded. Ignored
        (False) with a fixed ``cost``, a non-positive or non-finite time, or nothing pending.
        Takes effect at the next sync point, on every rank alike."""
        if self.fixed_cost is not None:
            return False
        if tokens is None:
            if not self._pending:
                return False
            tokens = self._pending.popleft()
        return self._fit.observe(list(tokens), float(seconds))

    def time_forward(self, model: Any) -> Callable[[], None]:
        """Time every training-mode forward of ``model`` (the DDP model, or the stage under
        pipelining: one forward per yielded micro-batch) and :meth:`observe` it. Host clock on
        the CPU; CUDA events (read at the next sync point, long finished by then) when the
        model's parameters are on a CUDA device. Returns a function that removes the hooks."""
        state: dict[str, Any] = {}

        def pre(module: Any, _args: Any) -> None:
            if not module.training:
                state.pop("start", None)
                return
            state["start"] = time.perf_counter()
            state["event"] = None
            if _on_cuda(module):
                import torch

                event = torch.cuda.Event(enable_timing=True)
                event.record()
                state["event"] = event

        def post(module: Any, _args: Any, _output: Any) -> None:
            started = state.pop("start", None)
            if started is None or not module.training:
                return
            first = state.pop("event", None)
            if first is None:
                self.observe(time.perf_counter() - started)
                return
            import torch

            last = torch.cuda.Event(enable_timing=True)
            last.record()
            tokens = self._pending.popleft() if self._pending else None
            if tokens is not None:
                self._timers.append((first, last, tokens))

        handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]

        def remove() -> None:
            for handle in handles:
                handle.remove()

        return remove

    def _resolve_timers(self) -> None:
        """Observe the CUDA-timed forwards (at a sync point: they have long finished)."""
        timers, self._timers = self._timers, []
        for first, last, tokens in timers:
            try:
                last.synchronize()
                self._fit.observe(tokens, first.elapsed_time(last) / 1e3)
            except Exception:
                _log.debug("skewtrace: a forward timing could not be read", exc_info=True)

    # ------------------------------------------------------------------ agreement

    def _agree(self, index: int) -> None:
        """One collective: rank 0's shares and balance mode, and the sum of every rank's fit
        statistics; then every rank adopts the same shares, mode and cost model."""
        ranks = self.num_replicas
        self._resolve_timers()
        # Rank 0's reading; zeros elsewhere, so that the sum is rank 0's values exactly.
        head = [0.0] * (ranks + 3)
        if self.rank == 0:
            head = self._read_source() + self._read_balance()
        fitting = self.fixed_cost is None
        stats = self._fit.statistics() if fitting else [0.0] * FIT_STATISTICS
        agreed = _all_reduce_sum(head + stats, self.group)
        if agreed is None:
            # No process group: this process's own reading (one process, or tests).
            if self.rank != 0:
                head = self._read_source() + self._read_balance()
            agreed = head + stats
        version, shares = int(agreed[0]), [float(s) for s in agreed[1 : ranks + 1]]
        mode_code, balance_version = agreed[ranks + 1], int(agreed[ranks + 2])
        balance = WORK if mode_code > 0.5 else COUNT
        cost, cost_version = self._cost, self._cost_version
        if fitting:
            fitted = CostFit.merged(agreed[ranks + 3 :], **self._fit_kwargs).model()
            if fitted is not None and fitted != cost:
                cost, cost_version = fitted, cost_version + 1
        if self.rank == 0 and (balance, balance_version) != (self._balance, self._balance_version):
            _log.info(
                "skewtrace: balance %s (version %d) from step %d of epoch %d",
                balance,
                balance_version,
                index,
                self.epoch,
            )
        if self.rank == 0 and version != self._version:
            _log.info(
                "skewtrace: shares version %d from step %d of epoch %d: %s",
                version,
                index,
                self.epoch,
                [round(s, 4) for s in shares],
            )
        self._shares, self._version = shares, version
        self._balance, self._balance_version = balance, balance_version
        self._cost, self._cost_version = cost, cost_version

    def _read_balance(self) -> list[float]:
        """[mode code, balance version]: the configured mode, or in mode ``pacer`` rank 0's
        source's ``current_balance()`` (``count`` when absent or failing). Never raises."""
        if self.mode != "pacer":
            return [_MODE_CODE[self.mode], 0.0]
        count = [_MODE_CODE[COUNT], 0.0]
        try:
            source = self.source if self.source is not None else _session_source()
            reader = getattr(source, "current_balance", None)
            if reader is None:
                return count
            mode, version = reader()
            version = int(version)
            if mode not in _MODE_CODE or not math.isfinite(version):
                return [_MODE_CODE[COUNT], float(version)]
            return [_MODE_CODE[mode], float(version)]
        except Exception:
            if not self._balance_failed_logged:
                self._balance_failed_logged = True
                _log.warning("skewtrace: reading the balance mode failed; count", exc_info=True)
            return count


def _on_cuda(module: Any) -> bool:
    parameter = next(module.parameters(), None)
    return parameter is not None and parameter.is_cuda


def _all_reduce_sum(values: list[float], group: Any | None) -> list[float] | None:
    """The sum of every group member's ``values`` (float64); None without a process group or
    in a group of one (each process then reads its own source, as without one)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size(group) == 1:
        return None
    tensor = torch.tensor(values, dtype=torch.float64, device=collective_device(group))
    dist.all_reduce(tensor, group=group)
    result: list[float] = tensor.cpu().tolist()
    return result
