"""Recorded-style Megatron 3D-parallel training jobs with known causes, from a seed.

A job (:class:`JobSpec`) is a data-parallel x pipeline-parallel layout of *workers* (a worker
is one tensor-parallel group), Megatron's 1F1B or interleaved 1F1B schedule, base timings and
a tuple of causes (:class:`SlowWorker`, :class:`HeavyStage`, :class:`SequenceImbalance`,
:class:`SlowLink`, :class:`SlowDataLoader`, :class:`HostWork`, and with their remedies
:class:`TokenLengths` and :class:`Layers`). :func:`generate` builds each
worker's program of ops, step after step, plays them with a small discrete-event simulation
that follows the semantics of ``README.md`` (beside this file) and returns a :class:`Job`: the
rows of the what-if format, its metadata and the ground truth.

Everything random comes from one ``random.Random(spec.seed)``, drawn in a fixed order: the same
spec gives the same rows. (:class:`TokenLengths` draws its samples from a stream of its own per
step, so that a job and the job with the remedy applied, :func:`with_remedy`, see the same
samples and the same jitter: they differ by the split alone.) The simulation runs in float
seconds; the rows are integer microseconds since the Unix epoch, each start and end rounded on
its own (durations are the difference), so that a replay of the rows reproduces the simulated
ends exactly.

    job = generate(CORPUS["slow-worker-stage0"])
    write_csv(job, "job.csv"); write_metadata(job, "job.json")
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from skewtrace.remedy.partition import advise_partition, stage_costs
from skewtrace.remedy.work_split import TokenCost, split_by_count, split_by_work

GENERATOR_VERSION = "whatif-gen-1"
"""Bump on any change of what a spec generates."""

EPOCH_US = int(datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()) * 1_000_000
"""Simulated time 0, in microseconds since the Unix epoch (2026-12-01T00:00:00Z)."""

COLUMNS = (
    "dp_rank",
    "stage",
    "rank",
    "step",
    "optype",
    "start_ts",
    "duration",
    "seq_id",
    "mc",
    "mb_id",
    "gmc",
)
EXTENSIONS = ("host", "switch", "nic", "bytes")
HOSTS_PER_SWITCH = 4
MIB = 1 << 20


class Row(NamedTuple):
    """One op of one worker: the what-if columns, then the extension columns."""

    dp_rank: int
    stage: int
    rank: int
    step: int
    optype: str
    start_ts: int
    duration: int
    seq_id: int
    mc: int
    mb_id: int
    gmc: int
    host: str
    switch: str
    nic: str
    bytes: int


# -- causes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cause:
    """A fault, active in steps ``first_step`` to ``last_step`` (None: to the end)."""

    _: KW_ONLY
    first_step: int = 0
    last_step: int | None = None

    def active(self, step: int) -> bool:
        return step >= self.first_step and (self.last_step is None or step <= self.last_step)


@dataclass(frozen=True)
class SlowWorker(Cause):
    """Forward and backward of one worker take ``factor`` times as long (a slow GPU)."""

    stage: int
    dp_rank: int
    factor: float = 1.5


@dataclass(frozen=True)
class HeavyStage(Cause):
    """Every replica's worker of ``stage`` computes more (too many layers on it)."""

    stage: int
    forward_factor: float = 1.5
    backward_factor: float = 1.5


@dataclass(frozen=True)
class SequenceImbalance(Cause):
    """Each (replica, microbatch) gets a length factor L per step: lognormal(0, sigma) (median
    1), times ``tail_factor`` with probability ``tail_probability`` (a long document). Its
    forward and backward on every stage of the replica take ``cost(L)`` times as long
    (attention grows with the square of the length)."""

    sigma: float = 0.2
    tail_probability: float = 0.03
    tail_factor: float = 1.8
    linear: float = 0.5
    quadratic: float = 0.3

    def cost(self, length: float) -> float:
        constant = 1.0 - self.linear - self.quadratic
        return constant + self.linear * length + self.quadratic * length * length


@dataclass(frozen=True)
class SlowLink(Cause):
    """Every transfer of one worker's messages, and of the collectives it is a member of,
    takes ``factor`` times as long (a slow NIC)."""

    stage: int
    dp_rank: int
    factor: float = 4.0


@dataclass(frozen=True)
class SlowDataLoader(Cause):
    """Every ``dataloader`` op of one replica (stage 0) takes ``seconds`` more."""

    dp_rank: int
    seconds: float = 0.004


@dataclass(frozen=True)
class HostWork(Cause):
    """``seconds`` of host time (a gap, no op) before the worker's first forward-compute of
    each step: Python work in the training loop outside any traced phase."""

    stage: int
    dp_rank: int
    seconds: float = 0.02


ATTENTION_AT_2048 = TokenCost.with_crossover(2048)
"""A sample's work ``t + t**2 / 2048``: attention's term equals the linear one at 2048 tokens."""


@dataclass(frozen=True)
class TokenLengths(Cause):
    """Real token lengths (issue 46): each step a global batch of ``samples`` samples, lengths
    log-normal (median ``median`` tokens, ``sigma``) rounded and clipped to
    ``min_tokens``..``max_tokens``, drawn from a stream of their own (the job's seed and the
    step, :func:`token_lengths`): the same samples whatever the split and whatever else the job
    draws. The batch is split into ``dp x microbatches`` parts, replica r's micro-batch m being
    part ``r * microbatches + m``, packed without padding (a part's work is the sum of its
    samples' ``cost``): by equal counts (``split_by_count``, consecutive slices, as
    ``DistributedSampler``) or, ``balanced``, by the product's ``split_by_work`` on the samples'
    costs (the remedy). A part's forward and backward, on every stage of its replica, take its
    work over the expected work of a part times as long: the spec's ``forward`` and
    ``backward`` are a micro-batch of average work."""

    samples: int = 64
    median: float = 512.0
    sigma: float = 1.0
    min_tokens: int = 16
    max_tokens: int = 8192
    cost: TokenCost = ATTENTION_AT_2048
    balanced: bool = False

    def describe(self) -> str:
        split = "split_by_work" if self.balanced else "equal counts"
        return (
            f"TokenLengths({self.samples} samples, median {self.median:g}, sigma "
            f"{self.sigma:g}, {self.min_tokens}..{self.max_tokens}, {split})"
        )

    def expected_cost(self) -> float:
        """The mean cost of one sample, by quadrature over the clipped log-normal (the
        rounding to whole tokens left out): deterministic, no random draw."""
        return _expected_cost(self.median, self.sigma, self.min_tokens, self.max_tokens, self.cost)


def _expected_cost(
    median: float, sigma: float, lo: int, hi: int, cost: TokenCost, points: int = 20_001
) -> float:
    if sigma <= 0:
        return cost(min(max(median, lo), hi))
    total, weight = 0.0, 0.0
    for i in range(points):
        z = -8.0 + 16.0 * i / (points - 1)
        w = math.exp(-0.5 * z * z)
        total += w * cost(min(max(median * math.exp(sigma * z), lo), hi))
        weight += w
    return total / weight


def token_lengths(spec: JobSpec, cause: TokenLengths, step: int, index: int = 0) -> list[int]:
    """The ``step``'s global batch of ``cause`` (the ``index``-th TokenLengths of the spec):
    every sample's tokens, in the batch's order, from ``random.Random`` seeded with the job's
    seed, the step and the index alone."""
    rng = random.Random(f"whatif-tokens:{spec.seed}:{step}:{index}")
    out = []
    for _ in range(cause.samples):
        if cause.sigma > 0:
            t = round(rng.lognormvariate(math.log(cause.median), cause.sigma))
        else:
            t = round(cause.median)
        out.append(min(max(t, cause.min_tokens), cause.max_tokens))
    return out


def token_split(spec: JobSpec, cause: TokenLengths, lengths: list[int]) -> list[list[int]]:
    """The samples (indices into ``lengths``) of each part, ``dp x microbatches`` parts,
    replica r's micro-batch m being part ``r * microbatches + m``. Equal counts: consecutive
    slices (``split_by_count`` over the replicas, then over each replica's micro-batches).
    ``cause.balanced``: the product's ``split_by_work`` over the replicas (equal work per
    replica: what the data-parallel collectives wait for), then over each replica's
    micro-batches (equal work per micro-batch: what the pipeline's stages wait for)."""
    dp, microbatches = spec.dp, spec.microbatches
    if cause.samples < dp * microbatches:
        raise ValueError(
            f"{spec.name}: {cause.samples} samples cannot fill {dp * microbatches} parts"
        )
    costs = [cause.cost(t) for t in lengths]
    replicas = split_by_work(costs, dp) if cause.balanced else split_by_count(len(lengths), dp)
    parts: list[list[int]] = []
    for samples in replicas:
        if cause.balanced:
            within = split_by_work([costs[i] for i in samples], microbatches)
        else:
            within = split_by_count(len(samples), microbatches)
        parts += [[samples[i] for i in part] for part in within]
    return parts


@dataclass(frozen=True)
class Layers(Cause):
    """The model as layers (issue 46): each layer's cost in order (forward and backward alike,
    any unit; a loss head is the last layer) and the layers each stage holds, contiguous. A
    stage's forward and backward take its layers' cost over the mean stage's cost times as long
    (the spec's ``forward`` and ``backward`` are a stage of the mean stage's work), so moving
    layers moves work and keeps the total. The remedy (:func:`with_remedy`) is the product's
    advice, ``advise_partition`` of the same costs."""

    costs: tuple[float, ...]
    partition: tuple[int, ...]

    def describe(self) -> str:
        runs: list[list[float]] = []
        for c in self.costs:
            if runs and runs[-1][0] == c:
                runs[-1][1] += 1
            else:
                runs.append([c, 1])
        costs = " + ".join(f"{int(n)} x {c:g}" if n > 1 else f"{c:g}" for c, n in runs)
        return f"Layers({costs}; partition {self.partition})"

    def factors(self) -> tuple[float, ...]:
        per_stage = stage_costs(self.costs, self.partition)
        mean = sum(per_stage) / len(per_stage)
        return tuple(c / mean for c in per_stage)


def with_remedy(spec: JobSpec) -> JobSpec:
    """The same job with the remedies applied: every :class:`TokenLengths` split by work, every
    :class:`Layers` at the product's advice (``advise_partition``: the least slowest stage,
    then the shortest 1F1B replay, from the layers' forward and backward times as the
    Collector gets them from the ranks' profiles, no transfer) over the job's stages; the same
    seed, so the same samples and the same jitter. Named ``<name>+remedy``."""
    from dataclasses import replace

    causes: list[Cause] = []
    for cause in spec.causes:
        if isinstance(cause, TokenLengths):
            cause = replace(cause, balanced=True)
        elif isinstance(cause, Layers):
            advice = advise_partition(
                [c * spec.forward for c in cause.costs],
                [c * spec.backward for c in cause.costs],
                spec.pp,
                spec.microbatches,
            )
            cause = replace(cause, partition=advice.layers)
        causes.append(cause)
    return replace(spec, name=spec.name + "+remedy", causes=tuple(causes))


# -- the job -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """A job: layout, schedule, base timings (seconds), bytes and causes."""

    name: str
    dp: int
    pp: int
    tp: int = 8
    """Metadata only: a worker is one tensor-parallel group."""
    microbatches: int = 8
    chunks: int = 1
    """Model chunks per worker: 1 is plain 1F1B, more is interleaved 1F1B."""
    p2p: str = "batched"
    """``batched``: Megatron's combined p2p calls, one batch each, rendezvous messages;
    ``eager``: every p2p op on its own, sends complete without their receiver."""
    steps: int = 10
    seed: int = 0
    forward: float = 4e-3
    """Per microbatch per chunk, as every timing of a compute op below."""
    backward: float = 8e-3
    dataloader: float = 3e-4
    layernorm_all_reduce: float = 2e-4
    clip_grad: float = 6e-4
    optimizer: float = 3e-3
    p2p_transfer: float = 4e-4
    reduce_scatter: float = 6e-3
    """Per chunk, as ``all_gather``."""
    all_gather: float = 4e-3
    embedding_all_reduce: float = 8e-4
    host_gap: float = 75e-6
    """The host time before each op (or batch)."""
    gap_jitter: float = 0.15
    """Lognormal sigma of each gap."""
    jitter: float = 0.02
    """Lognormal sigma of each op's duration or transfer."""
    p2p_bytes: int = 16 * MIB
    grads_bytes: int = 512 * MIB
    params_bytes: int = 256 * MIB
    embedding_bytes: int = 64 * MIB
    causes: tuple[Cause, ...] = ()

    def __post_init__(self) -> None:
        if self.dp < 1 or self.pp < 1 or self.tp < 1 or self.microbatches < 1:
            raise ValueError(f"{self.name}: dp, pp, tp and microbatches must be >= 1")
        if self.p2p not in ("batched", "eager"):
            raise ValueError(f"{self.name}: p2p must be 'batched' or 'eager'")
        if self.chunks > 1 and (self.pp < 2 or self.microbatches % self.pp):
            raise ValueError(f"{self.name}: interleaving needs pp >= 2 and microbatches % pp == 0")
        for cause in self.causes:
            if isinstance(cause, Layers) and (len(cause.partition) != self.pp or self.chunks > 1):
                raise ValueError(f"{self.name}: Layers needs one layer count per stage, 1 chunk")

    @property
    def workers(self) -> int:
        return self.dp * self.pp

    def worker(self, stage: int, dp_rank: int) -> int:
        return stage * self.dp + dp_rank

    @property
    def schedule(self) -> str:
        return "interleaved-1f1b" if self.chunks > 1 else "1f1b"


@dataclass
class Job:
    spec: JobSpec
    rows: list[Row]
    metadata: dict[str, Any]
    step_times: dict[int, float]
    """Per step, as simulated: the latest op end minus the latest worker entry (a worker
    enters a step at its last end of the previous step; in the first step at its first issue)."""

    @property
    def causes(self) -> tuple[Cause, ...]:
        """The ground truth."""
        return self.spec.causes


# -- Megatron's schedules ------------------------------------------------------------------
#
# A schedule is a list of actions of one worker: ("F", chunk, mb), ("B", chunk, mb) and
# ("P", sends, recvs), one of Megatron's p2p calls, with sends [(direction, chunk, mb)] and
# recvs [(direction, chunk)], direction "forward" or "backward". A recv names the chunk it
# feeds; label_recvs() then gives it the microbatch of the compute op it feeds.

Action = tuple[Any, ...]


def _one_f_one_b(pp: int, stage: int, microbatches: int) -> list[Action]:
    first, last = stage == 0, stage == pp - 1
    recv_fwd = [] if first else [("forward", 0)]
    recv_bwd = [] if last else [("backward", 0)]

    def send_fwd(mb: int) -> list[tuple[str, int, int]]:
        return [] if last else [("forward", 0, mb)]

    def send_bwd(mb: int) -> list[tuple[str, int, int]]:
        return [] if first else [("backward", 0, mb)]

    warmup = min(pp - stage - 1, microbatches)
    remaining = microbatches - warmup
    actions: list[Action] = []
    for i in range(warmup):
        actions += [("P", [], recv_fwd), ("F", 0, i), ("P", send_fwd(i), [])]
    if remaining:
        actions.append(("P", [], recv_fwd))
    for i in range(remaining):
        actions += [("F", 0, warmup + i), ("P", send_fwd(warmup + i), recv_bwd), ("B", 0, i)]
        actions.append(("P", send_bwd(i), [] if i == remaining - 1 else recv_fwd))
    for i in range(remaining, microbatches):
        actions += [("P", [], recv_bwd), ("B", 0, i), ("P", send_bwd(i), [])]
    return actions


def _interleaved(pp: int, stage: int, microbatches: int, chunks: int) -> list[Action]:
    """Megatron's forward_backward_pipelining_with_interleaving, its p2p calls included."""
    first, last = stage == 0, stage == pp - 1
    total = microbatches * chunks
    all_warmup = microbatches == pp
    warmup = total if all_warmup else min((pp - stage - 1) * 2 + (chunks - 1) * pp, total)
    remaining = total - warmup

    def chunk(k: int, forward: bool) -> int:
        c = (k % (pp * chunks)) // pp
        return c if forward else chunks - 1 - c

    def mb(k: int) -> int:
        return (k // (pp * chunks)) * pp + k % pp

    def sends_of(forward_k: int | None, backward_k: int | None) -> list[tuple[str, int, int]]:
        sends = []
        if forward_k is not None:
            c = chunk(forward_k, True)
            if not (last and c == chunks - 1):
                sends.append(("forward", c, mb(forward_k)))
        if backward_k is not None:
            c = chunk(backward_k, False)
            if not (first and c == 0):
                sends.append(("backward", c, mb(backward_k)))
        return sends

    actions: list[Action] = []
    if not first:
        actions.append(("P", [], [("forward", 0)]))
    for k in range(warmup):
        actions.append(("F", chunk(k, True), mb(k)))
        next_chunk = chunk(k + 1, True)
        recv_prev = not (first and next_chunk == 0) and k != total - 1
        recvs = [("forward", next_chunk)] if recv_prev else []
        if k == warmup - 1 and not all_warmup and not last:
            recvs.append(("backward", chunks - 1))
        actions.append(("P", sends_of(k, None), recvs))
    for k in range(remaining):
        forward_k, backward_k = k + warmup, k
        actions.append(("F", chunk(forward_k, True), mb(forward_k)))
        actions.append(("B", chunk(backward_k, False), mb(backward_k)))
        recv_prev = True
        if first:
            # The first stage is ahead of the last by pp - 1 forwards.
            next_forward = chunk(forward_k - (pp - 1), True)
            if next_forward == chunks - 1:
                recv_prev = False
            next_forward += 1
        else:
            next_forward = chunk(forward_k + 1, True)
        recv_next = True
        if last:
            next_backward = chunk(backward_k - (pp - 1), False)
            if next_backward == 0:
                recv_next = False
            next_backward -= 1
        else:
            next_backward = chunk(backward_k + 1, False)
        if k == remaining - 1:
            recv_prev = False
        recvs = []
        if recv_prev:
            recvs.append(("forward", next_forward))
        if recv_next:
            recvs.append(("backward", next_backward))
        actions.append(("P", sends_of(forward_k, backward_k), recvs))
    if all_warmup and not last:
        actions.append(("P", [], [("backward", chunks - 1)]))
    for k in range(remaining, total):
        actions.append(("B", chunk(k, False), mb(k)))
        next_backward = chunk(k + 1, False)
        recv_next = not (last and next_backward == chunks - 1) and k != total - 1
        recvs = [("backward", next_backward)] if recv_next else []
        actions.append(("P", sends_of(None, k), recvs))
    return actions


def label_recvs(actions: list[Action], pp: int, stage: int, chunks: int) -> list[Action]:
    """Give each recv the microbatch of the op it feeds: the i-th forward recv for chunk c
    feeds the i-th forward of chunk c that takes an input from another worker (backward
    likewise); empty p2p calls are dropped. Raises if the counts or the order disagree."""
    first, last = stage == 0, stage == pp - 1
    consumers: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for index, action in enumerate(actions):
        if action[0] == "F" and not (first and action[1] == 0):
            consumers.setdefault(("forward", action[1]), []).append((index, action[2]))
        if action[0] == "B" and not (last and action[1] == chunks - 1):
            consumers.setdefault(("backward", action[1]), []).append((index, action[2]))
    taken: dict[tuple[str, int], int] = {}
    labeled: list[Action] = []
    for index, action in enumerate(actions):
        if action[0] != "P":
            labeled.append(action)
            continue
        _, sends, recvs = action
        if not sends and not recvs:
            continue
        out = []
        for direction, c in recvs:
            n = taken.get((direction, c), 0)
            taken[(direction, c)] = n + 1
            feeds, mb = consumers[(direction, c)][n]
            if feeds < index:
                raise AssertionError(f"stage {stage}: the {direction} recv for {c} comes late")
            out.append((direction, c, mb))
        labeled.append(("P", list(sends), out))
    for key, ops in consumers.items():
        if taken.get(key, 0) != len(ops):
            raise AssertionError(f"stage {stage}: {key} got {taken.get(key, 0)} of {len(ops)}")
    return labeled


def schedule(pp: int, stage: int, microbatches: int, chunks: int = 1) -> list[Action]:
    """One worker's step in Megatron's order, recvs labeled (see :func:`label_recvs`)."""
    if chunks > 1:
        actions = _interleaved(pp, stage, microbatches, chunks)
    else:
        actions = _one_f_one_b(pp, stage, microbatches)
    return label_recvs(actions, pp, stage, chunks)


def _sender(direction: str, stage: int, chunk: int, pp: int) -> tuple[int, int]:
    """The (stage, chunk) that sends what a recv of (direction, stage, chunk) receives."""
    if direction == "forward":
        return (stage - 1, chunk) if stage > 0 else (pp - 1, chunk - 1)
    return (stage + 1, chunk) if stage < pp - 1 else (0, chunk + 1)


def _receiver_stage(direction: str, stage: int, pp: int) -> int:
    if direction == "forward":
        return stage + 1 if stage < pp - 1 else 0
    return stage - 1 if stage > 0 else pp - 1


# -- the programs --------------------------------------------------------------------------


@dataclass
class _Op:
    optype: str
    mc: int
    mb: int
    kind: str
    """``compute``, ``send``, ``recv`` or ``coll``."""
    duration: float = 0.0
    """A compute op's."""
    key: tuple[Any, ...] | None = None
    """A message's or a collective's."""
    nbytes: int = 0
    start: float = 0.0
    end: float = 0.0


@dataclass
class _Unit:
    """Ops a worker issues together, after ``gap`` of host time."""

    step: int
    gap: float
    ops: list[_Op]
    issue: float = 0.0


@dataclass
class _Builder:
    spec: JobSpec
    rng: random.Random
    transfers: dict[tuple[Any, ...], float] = field(default_factory=dict)
    members: dict[tuple[Any, ...], int] = field(default_factory=dict)

    def jitter(self, sigma: float) -> float:
        return self.rng.lognormvariate(0.0, sigma) if sigma > 0 else 1.0

    def gap(self) -> float:
        return self.spec.host_gap * self.jitter(self.spec.gap_jitter)

    def link_factor(self, step: int, workers: list[tuple[int, int]]) -> float:
        factor = 1.0
        for cause in self.spec.causes:
            active = isinstance(cause, SlowLink) and cause.active(step)
            if active and (cause.stage, cause.dp_rank) in workers:  # type: ignore[attr-defined]
                factor = max(factor, cause.factor)  # type: ignore[attr-defined]
        return factor

    def lengths(self, step: int) -> dict[tuple[int, int], float]:
        """(dp_rank, mb) -> the cost factor of its length, this step."""
        costs: dict[tuple[int, int], float] = {}
        for cause in self.spec.causes:
            if isinstance(cause, SequenceImbalance) and cause.active(step):
                for dp_rank in range(self.spec.dp):
                    for mb in range(self.spec.microbatches):
                        length = self.rng.lognormvariate(0.0, cause.sigma)
                        if self.rng.random() < cause.tail_probability:
                            length *= cause.tail_factor
                        key = (dp_rank, mb)
                        costs[key] = costs.get(key, 1.0) * cause.cost(length)
        return costs

    def token_costs(self, step: int, costs: dict[tuple[int, int], float]) -> None:
        """Multiply into ``costs`` each (dp_rank, mb)'s work factor of every active
        :class:`TokenLengths` (no draw from the job's stream)."""
        spec = self.spec
        index = 0
        for cause in spec.causes:
            if not isinstance(cause, TokenLengths):
                continue
            if cause.active(step):
                lengths = token_lengths(spec, cause, step, index)
                split = token_split(spec, cause, lengths)
                mean = cause.expected_cost() * cause.samples / len(split)
                for part, samples in enumerate(split):
                    key = divmod(part, spec.microbatches)
                    work = sum(cause.cost(lengths[i]) for i in samples)
                    costs[key] = costs.get(key, 1.0) * work / mean
            index += 1

    def compute_factor(self, step: int, stage: int, dp_rank: int, forward: bool) -> float:
        factor = 1.0
        for cause in self.spec.causes:
            if not cause.active(step):
                continue
            if isinstance(cause, Layers):
                factor *= cause.factors()[stage]
                continue
            if isinstance(cause, SlowWorker) and (cause.stage, cause.dp_rank) == (stage, dp_rank):
                factor *= cause.factor
            elif isinstance(cause, HeavyStage) and cause.stage == stage:
                factor *= cause.forward_factor if forward else cause.backward_factor
        return factor

    def host_work(self, step: int, stage: int, dp_rank: int) -> float:
        return sum(
            c.seconds
            for c in self.spec.causes
            if isinstance(c, HostWork)
            and c.active(step)
            and (c.stage, c.dp_rank) == (stage, dp_rank)
        )

    def loader_delay(self, step: int, dp_rank: int) -> float:
        return sum(
            c.seconds
            for c in self.spec.causes
            if isinstance(c, SlowDataLoader) and c.active(step) and c.dp_rank == dp_rank
        )

    def collective(self, step: int, optype: str, group: tuple[str, int], mc: int) -> _Op:
        spec = self.spec
        base, nbytes = {
            "grads-reduce-scatter": (spec.reduce_scatter, spec.grads_bytes),
            "params-all-gather": (spec.all_gather, spec.params_bytes),
            "embedding-grads-all-reduce": (spec.embedding_all_reduce, spec.embedding_bytes),
        }[optype]
        key = (step, optype, group, mc)
        if key not in self.transfers:
            if group[0] == "dp":
                workers = [(group[1], r) for r in range(self.spec.dp)]
            else:
                workers = [(0, group[1]), (self.spec.pp - 1, group[1])]
            factor = self.link_factor(step, workers)
            self.transfers[key] = base * factor * self.jitter(self.spec.jitter)
            self.members[key] = len(workers)
        return _Op(optype, mc, -1, "coll", key=key, nbytes=nbytes)

    def send(self, step: int, stage: int, dp_rank: int, direction: str, c: int, mb: int) -> _Op:
        spec = self.spec
        key = (step, direction, dp_rank, mb, stage, c)
        to = _receiver_stage(direction, stage, spec.pp)
        factor = self.link_factor(step, [(stage, dp_rank), (to, dp_rank)])
        self.transfers[key] = spec.p2p_transfer * factor * self.jitter(spec.jitter)
        return _Op(f"{direction}-send", c, mb, "send", key=key, nbytes=spec.p2p_bytes)

    def recv(self, step: int, stage: int, dp_rank: int, direction: str, c: int, mb: int) -> _Op:
        sender_stage, sender_chunk = _sender(direction, stage, c, self.spec.pp)
        key = (step, direction, dp_rank, mb, sender_stage, sender_chunk)
        return _Op(f"{direction}-recv", c, mb, "recv", key=key, nbytes=self.spec.p2p_bytes)

    def step_units(
        self,
        step: int,
        stage: int,
        dp_rank: int,
        actions: list[Action],
        costs: dict[tuple[int, int], float],
    ) -> list[_Unit]:
        spec = self.spec
        units: list[_Unit] = []

        def unit(*ops: _Op, extra_gap: float = 0.0) -> None:
            units.append(_Unit(step, self.gap() + extra_gap, list(ops)))

        def compute(optype: str, mc: int, mb: int, seconds: float) -> _Op:
            return _Op(optype, mc, mb, "compute", duration=seconds * self.jitter(spec.jitter))

        host_work = self.host_work(step, stage, dp_rank)  # before the first forward-compute
        for action in actions:
            if action[0] in ("F", "B"):
                _, c, mb = action
                forward = action[0] == "F"
                if forward and stage == 0 and c == 0:
                    loader = spec.dataloader * self.jitter(spec.jitter)
                    loader += self.loader_delay(step, dp_rank)
                    unit(_Op("dataloader", 0, mb, "compute", duration=loader))
                factor = self.compute_factor(step, stage, dp_rank, forward)
                factor *= costs.get((dp_rank, mb), 1.0)
                if forward:
                    unit(
                        compute("forward-compute", c, mb, spec.forward * factor),
                        extra_gap=host_work,
                    )
                    host_work = 0.0
                else:
                    unit(compute("backward-compute", c, mb, spec.backward * factor))
                continue
            _, sends, recvs = action
            ops = [self.send(step, stage, dp_rank, *s) for s in sends]
            ops += [self.recv(step, stage, dp_rank, *r) for r in recvs]
            if spec.p2p == "batched":
                unit(*ops)
            else:
                for op in ops:
                    unit(op)
        for c in range(spec.chunks):
            unit(self.collective(step, "grads-reduce-scatter", ("dp", stage), c))
        if spec.pp >= 2 and stage in (0, spec.pp - 1):
            unit(self.collective(step, "embedding-grads-all-reduce", ("emb", dp_rank), 0))
        unit(compute("layernorm-grads-all-reduce", 0, -1, spec.layernorm_all_reduce))
        unit(compute("optimizer-clip-main-grad", 0, -1, spec.clip_grad))
        unit(compute("optimizer", 0, -1, spec.optimizer))
        for c in range(spec.chunks):
            unit(self.collective(step, "params-all-gather", ("dp", stage), c))
        return units


# -- the simulation ------------------------------------------------------------------------


class Deadlock(RuntimeError):
    pass


def _simulate(programs: list[list[_Unit]], builder: _Builder, eager: bool) -> None:
    """Play every worker's units: each issued at the previous one's end plus its gap, ended
    when all its ops have ended (README's semantics). Sets each unit's issue and each op's
    start and end; raises Deadlock when no worker can go on."""
    transfers, members = builder.transfers, builder.members
    issued: dict[tuple[Any, ...], dict[str | int, float]] = {}
    position = [0] * len(programs)
    ready = [0.0] * len(programs)
    is_issued = [False] * len(programs)

    def end_of(op: _Op, issue: float) -> float | None:
        if op.kind == "compute":
            return issue + op.duration
        assert op.key is not None
        seen = issued[op.key]
        if op.kind == "coll":
            if len(seen) < members[op.key]:
                return None
            return max(seen.values()) + transfers[op.key]
        if eager:
            if op.kind == "send":
                return issue + transfers[op.key]
            if "send" not in seen:
                return None
            return max(issue, seen["send"] + transfers[op.key])
        if len(seen) < 2:
            return None
        return max(seen.values()) + transfers[op.key]

    progress = True
    while progress:
        progress = False
        for w, program in enumerate(programs):
            while position[w] < len(program):
                unit = program[position[w]]
                if not is_issued[w]:
                    unit.issue = ready[w] + unit.gap
                    for op in unit.ops:
                        if op.key is not None:
                            side: str | int = w if op.kind == "coll" else op.kind
                            issued.setdefault(op.key, {})[side] = unit.issue
                    is_issued[w] = True
                    progress = True
                ends = [end_of(op, unit.issue) for op in unit.ops]
                if any(end is None for end in ends):
                    break
                end = max(e for e in ends if e is not None)
                for op in unit.ops:
                    op.start, op.end = unit.issue, end
                ready[w] = end
                position[w] += 1
                is_issued[w] = False
                progress = True
    stuck = [
        f"worker {w} at step {p[position[w]].step} {[op.optype for op in p[position[w]].ops]}"
        for w, p in enumerate(programs)
        if position[w] < len(p)
    ]
    if stuck:
        raise Deadlock("deadlock: " + "; ".join(stuck[:8]))


def _us(seconds: float) -> int:
    return EPOCH_US + math.floor(seconds * 1e6 + 0.5)


def generate(spec: JobSpec) -> Job:
    """Build, play and record the job."""
    rng = random.Random(spec.seed)
    builder = _Builder(spec, rng)
    schedules = [schedule(spec.pp, s, spec.microbatches, spec.chunks) for s in range(spec.pp)]
    programs: list[list[_Unit]] = [[] for _ in range(spec.workers)]
    for step in range(spec.steps):
        costs = builder.lengths(step)
        builder.token_costs(step, costs)
        for stage in range(spec.pp):
            for dp_rank in range(spec.dp):
                programs[spec.worker(stage, dp_rank)] += builder.step_units(
                    step, stage, dp_rank, schedules[stage], costs
                )
    _simulate(programs, builder, eager=spec.p2p == "eager")

    by_step: list[dict[int, list[_Unit]]] = [{} for _ in programs]
    for w, program in enumerate(programs):
        for unit in program:
            by_step[w].setdefault(unit.step, []).append(unit)
    rows: list[Row] = []
    for step in range(spec.steps):
        for stage in range(spec.pp):
            for dp_rank in range(spec.dp):
                w = spec.worker(stage, dp_rank)
                where = (dp_rank, stage, w * spec.tp, step)
                topology = (f"node{w}", f"leaf{w // HOSTS_PER_SWITCH}", "eth0")
                seq: dict[str, int] = {}
                for unit in by_step[w][step]:
                    for op in unit.ops:
                        n = seq[op.optype] = seq.get(op.optype, -1) + 1
                        start, end = _us(op.start), _us(op.end)
                        gmc = op.mc * spec.pp + stage
                        chunk = (n, op.mc, op.mb, gmc)
                        rows.append(
                            Row(*where, op.optype, start, end - start, *chunk, *topology, op.nbytes)
                        )
    return Job(spec, rows, metadata(spec), _step_times(by_step, spec.steps))


def _step_times(by_step: list[dict[int, list[_Unit]]], steps: int) -> dict[int, float]:
    times: dict[int, float] = {}
    last_end: list[float | None] = [None] * len(by_step)
    for step in range(steps):
        entries: list[float] = []
        ends: list[float] = []
        for w, worker_steps in enumerate(by_step):
            units = worker_steps[step]
            previous = last_end[w]
            entries.append(units[0].issue if previous is None else previous)
            end = max(op.end for op in units[-1].ops)
            ends.append(end)
            last_end[w] = end
        times[step] = max(ends) - max(entries)
    return times


def metadata(spec: JobSpec) -> dict[str, Any]:
    return {
        "dp_size": spec.dp,
        "pp_size": spec.pp,
        "tp_size": spec.tp,
        "world_size": spec.dp * spec.pp * spec.tp,
        "num_microbatches": spec.microbatches,
        "num_model_chunks": spec.chunks,
        "schedule": spec.schedule,
        "generator_version": GENERATOR_VERSION,
    }


# -- files ---------------------------------------------------------------------------------


def write_csv(job: Job, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS + EXTENSIONS)
        writer.writerows(job.rows)


def write_metadata(job: Job, path: str | Path) -> None:
    Path(path).write_text(json.dumps(job.metadata, indent=2, sort_keys=True) + "\n")


def write_parquet(job: Job, path: str | Path) -> None:
    """Needs pyarrow (an ImportError without it)."""
    import pyarrow as pa  # type: ignore[import-not-found]
    import pyarrow.parquet as pq  # type: ignore[import-not-found]

    names = COLUMNS + EXTENSIONS
    table = pa.table({name: [getattr(row, name) for row in job.rows] for name in names})
    pq.write_table(table, str(path))
