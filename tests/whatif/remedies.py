"""The remedies of issue 46 on the step simulator, in simulated time: the jobs and the measure.

The jobs are the generator's (``generate.py``: Megatron's schedule, the data-parallel
collectives, the optimizer, host gaps and jitter), generated twice from the same seed, as they
are and with the remedy applied (:func:`~whatif.generate.with_remedy`): the same samples, the
same jitter; only the split or the partition differs, and the split and the partition are the
product's own (``skewtrace.remedy``). A gain is the mean step time before over the mean step
time after, minus 1 (throughput: the same global batch per step). Used by
``benchmarks/remedies.py`` (the figures) and ``tests/test_remedies_sim.py`` (the targets).
"""

from __future__ import annotations

import itertools
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skewtrace.remedy.partition import replay_1f1b, stage_costs

from .generate import JobSpec, Layers, TokenLengths, generate, with_remedy

SEEDS = (1, 2, 3, 4, 5)
"""The five seeds every percentage is given over."""

DATA_TIMINGS: dict[str, Any] = {
    "tp": 1,
    "forward": 40e-3,
    "backward": 80e-3,
    "dataloader": 1e-3,
    "layernorm_all_reduce": 0.2e-3,
    "clip_grad": 1e-3,
    "optimizer": 5e-3,
    "reduce_scatter": 15e-3,
    "all_gather": 10e-3,
}
"""The data-parallel job's base timings (s): one GPU a rank; a rank's micro-batch of average work
(8 samples, about 6,700 tokens) 40 ms forward and 80 ms backward (a model of about 1B
parameters at about a third of an H100's bf16 peak); the gradients' reduce-scatter 15 ms and
the parameters' all-gather 10 ms (2 GB each in bf16 over 8 ranks of one NVLink node); the
sharded optimizer 5 ms. The generator's own defaults for the rest (host gaps, 2% jitter)."""

HEADED = (1.0,) * 16 + (1.6,)
"""16 equal layers and a loss head of 1.6 layers: 4 layers a stage put 4 + 1.6 = 5.6 = 1.4 x 4
on the last stage."""
AS_IS = (4, 4, 4, 5)
"""4 layers a stage, the head on the last."""

STAGE_MICROBATCHES = 16
"""The pipeline job's micro-batches: 4 per stage, the usual floor for 1F1B (its bubble, (P - 1)
/ (M + P - 1) of the step, is 16% at 16 and 27% at 8). As the bubble vanishes the gain of a
repartition tends to the slowest stage's 5.6 / 5.0 - 1 = +12%; at few micro-batches the place
of the heavy stage adds to it (a heavy last stage costs 1F1B more than a heavy first one)."""

MIB = 2**20

STAGE_COMPUTE_SCALE = 4.5
"""The stage job's compute over the generator's default (a stage of the mean stage's work 4 ms
forward, 8 ms backward a micro-batch): see :data:`STAGE_TIMINGS`."""

STAGE_TIMINGS: dict[str, Any] = {
    "forward": 4e-3 * STAGE_COMPUTE_SCALE,
    "backward": 8e-3 * STAGE_COMPUTE_SCALE,
    "p2p_transfer": 1e-3,
    "p2p_bytes": 32 * MIB,
    "reduce_scatter": 60e-3,
    "all_gather": 40e-3,
    "optimizer": 10e-3,
}
"""The pipeline job's base timings (s), stated as :data:`DATA_TIMINGS` is: a 7B-class model
(32 layers of about 200M parameters, hidden 4096), 4096 tokens a micro-batch. A layer's
forward is then about 1.6-1.9 TFLOP (with attention), 4.1-4.8 ms on an H100 at about 40% of its
989 TFLOP/s bf16 dense peak; here a unit of layer cost is 18 ms / 4.4 = 4.1 ms forward and
8.2 ms backward a micro-batch (a stage of the mean stage's work, 4.4 units, 18 ms and 36 ms:
the generator's default times 4.5). A point-to-point message is one micro-batch's activations,
4096 x 4096 in bf16 = 32 MiB, about 1 ms at about 32 GB/s. Each stage holds a quarter of the
7B model (about 1.75B parameters): the gradients' reduce-scatter 60 ms and the parameters'
all-gather 40 ms (3.5 GB in bf16, half of it crossing between the 2 replicas, at about 30-45
GB/s), the sharded optimizer 10 ms. The generator's own defaults for the rest (host gaps, 2%
jitter).

The gain depends on the ratio of compute to what does not move with the layers (messages,
host gaps, collectives): at the generator's defaults (a unit of layer cost about 0.9 ms
forward, 0.4 ms transfers, 10 ms of collectives) the advice gains about +9.2% at 16
micro-batches, at twice their compute about +10.8%, at 4x about +11.7%
(benchmarks/remedies.py prints this sensitivity)."""


def data_job(seed: int, *, sigma: float = 1.0, steps: int = 20, samples: int = 64) -> JobSpec:
    """8 ranks, data-parallel only (dp 8, pp 1, one micro-batch of 8 samples a rank by equal
    counts), a global batch of ``samples`` sequences packed without padding, lengths
    log-normal (median 512 tokens, ``sigma``) clipped to 16..8192, a sample's cost
    ``t + t**2 / 2048`` (``TokenCost.with_crossover(2048)``), :data:`DATA_TIMINGS`.
    ``sigma=0``: every sample 512 tokens (the balanced job)."""
    return JobSpec(
        f"data-dp8-s{seed}" + ("-equal" if sigma == 0 else ""),
        dp=8,
        pp=1,
        microbatches=1,
        steps=steps,
        seed=seed,
        causes=(TokenLengths(samples=samples, sigma=sigma),),
        **DATA_TIMINGS,
    )


def stage_job(
    seed: int,
    *,
    microbatches: int = STAGE_MICROBATCHES,
    costs: tuple[float, ...] = HEADED,
    partition: tuple[int, ...] = AS_IS,
    steps: int = 10,
    timings: dict[str, Any] | None = None,
    compute_scale: float = 1.0,
    **overrides: Any,
) -> JobSpec:
    """4 stages x 2 replicas at ``timings`` (default :data:`STAGE_TIMINGS`; ``{}``: the
    generator's defaults, a stage of the mean stage's work 4 ms forward, 8 ms backward a
    micro-batch), ``compute_scale`` times their forward and backward, ``overrides`` on top; the
    model as ``costs`` (default :data:`HEADED`) in ``partition``."""
    base = dict(STAGE_TIMINGS if timings is None else timings)
    base.update(overrides)
    base["forward"] = base.get("forward", 4e-3) * compute_scale
    base["backward"] = base.get("backward", 8e-3) * compute_scale
    return JobSpec(
        f"stage-pp4-m{microbatches}-s{seed}",
        dp=2,
        pp=4,
        microbatches=microbatches,
        steps=steps,
        seed=seed,
        causes=(Layers(costs=costs, partition=partition),),
        **base,
    )


COMPUTE_ONLY: dict[str, Any] = {
    "dataloader": 0.0,
    "layernorm_all_reduce": 0.0,
    "clip_grad": 0.0,
    "optimizer": 0.0,
    "p2p_transfer": 0.0,
    "reduce_scatter": 0.0,
    "all_gather": 0.0,
    "embedding_all_reduce": 0.0,
    "host_gap": 0.0,
    "gap_jitter": 0.0,
    "jitter": 0.0,
}
"""Every timing but the forward and backward at zero, no jitter: the generator's step is then
``replay_1f1b``'s of the stages' costs (tests/test_remedies_sim.py checks it)."""


@dataclass(frozen=True)
class Gain:
    before_s: float
    """The mean step time as the job is."""
    after_s: float
    """The mean step time with the remedy applied."""

    @property
    def gain(self) -> float:
        """Throughput with the remedy over without, minus 1."""
        return self.before_s / self.after_s - 1


def measure(spec: JobSpec) -> Gain:
    """The job generated as it is and again with the remedy: mean step times."""
    before = generate(spec).step_times
    after = generate(with_remedy(spec)).step_times
    return Gain(statistics.mean(before.values()), statistics.mean(after.values()))


def over_seeds(make: Any, seeds: tuple[int, ...] = SEEDS) -> list[Gain]:
    return [measure(make(seed)) for seed in seeds]


def spread(gains: list[Gain]) -> str:
    """``+31.2% (+25.0%..+40.1%, 5 seeds)``: the mean gain and its range."""
    values = [g.gain for g in gains]
    mean = statistics.mean(values)
    return f"{mean:+.1%} ({min(values):+.1%}..{max(values):+.1%}, {len(values)} seeds)"


def partitions(layers: int, stages: int) -> list[tuple[int, ...]]:
    """Every contiguous partition of ``layers`` layers into ``stages`` non-empty stages."""
    out = []
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        out.append(tuple(b - a for a, b in itertools.pairwise(bounds)))
    return out


def exhaustive_best(
    costs: tuple[float, ...], stages: int, microbatches: int = STAGE_MICROBATCHES
) -> tuple[float, list[tuple[int, ...]], tuple[int, ...]]:
    """An exhaustive search of every contiguous partition (what the advice is checked
    against): the least slowest stage, every partition that reaches it, and the one first by
    (slowest stage, 1F1B step replayed with backward twice the forward, sum of squares of the
    stages, layer counts), ``advise_partition``'s rule, each by brute force."""
    every = partitions(len(costs), stages)
    slowest = {p: max(stage_costs(costs, p)) for p in every}
    least = min(slowest.values())
    ties = [p for p in every if slowest[p] <= least * (1 + 1e-12)]

    def key(p: tuple[int, ...]) -> tuple[float, float, float, tuple[int, ...]]:
        c = stage_costs(costs, p)
        replayed = replay_1f1b(list(c), [2 * x for x in c], microbatches)
        return (round(max(c), 9), round(replayed, 9), round(sum(x * x for x in c), 9), p)

    return least, ties, min(ties, key=key)


# -- the corpus: the verdict's price beside the saving realized --------------------------------

_SAVES = re.compile(r"saves about (\d+)% of the step")


@dataclass
class Compared:
    """One imbalance of one corpus job: what the Collector's verdict predicts it saves and what
    generating the job again with the remedy saves, per step, averaged over the steps where the
    verdict named it."""

    name: str
    spec: JobSpec
    cause: str
    """``data_imbalance`` or ``stage_imbalance``."""
    stage: int | None
    """The stage the job's ground truth makes heavy (stage imbalance)."""
    steps: int
    named_steps: int
    """Steps whose root causes named this imbalance (the right stage, for a stage)."""
    wrong_steps: int
    """Steps whose root causes named a stage imbalance at another stage, or data where the
    job has no data-dependent work (or the reverse)."""
    step_s: float
    """The mean step time as the job is (the generator's own)."""
    predicted_s: float
    """The verdict's ``training.imbalance.cost``: the replayed step minus the step with the
    imbalance evened out (data: every micro-batch at its class mean; stage: the stage as fast
    as the others)."""
    repartition_s: float | None
    """Stage: the fix's "moving its work ... saves about N% of the step" (the excess moved
    evenly to the other stages) times the step; whole percents."""
    realized_s: float | None
    """Before minus after with the remedy applied (None: a bare factor, nothing to move)."""
    realized_positive: int
    """Named steps whose realized saving is positive."""


def remedy_of(spec: JobSpec) -> str | None:
    """Which remedy the job's causes can be generated again with, if any."""
    kinds = {type(c).__name__ for c in spec.causes}
    if "TokenLengths" in kinds:
        return "split_by_work"
    if "Layers" in kinds:
        return "advise_partition"
    return None


def imbalances_of(spec: JobSpec) -> list[tuple[str, int | None]]:
    """The imbalances the job's ground truth holds: (cause, heavy stage)."""
    out: list[tuple[str, int | None]] = []
    for cause in spec.causes:
        kind = type(cause).__name__
        if kind in ("TokenLengths", "SequenceImbalance"):
            out.append(("data_imbalance", None))
        elif kind == "HeavyStage":
            out.append(("stage_imbalance", cause.stage))  # type: ignore[attr-defined]
        elif isinstance(cause, Layers):
            factors = cause.factors()
            out.append(("stage_imbalance", max(range(len(factors)), key=factors.__getitem__)))
    return out


def compare_corpus(names: list[str], otelcol: Path, workdir: Path) -> list[Compared]:
    """Each job played through the built Collector as the corpus tests play it (its what-if CSV
    read by ``skewtrace import``'s reader, tests/span_replay.py), its verdicts' prices beside
    the saving realized by the generator with the remedy applied."""
    from skewtrace.importer.whatif import read_whatif
    from span_replay import replay, requests_of_job

    from .corpus import CORPUS
    from .generate import write_csv, write_metadata

    jobs = {name: generate(CORPUS[name]) for name in names}
    requests = []
    for name, job in jobs.items():
        write_csv(job, workdir / f"{name}.csv")
        write_metadata(job, workdir / f"{name}.json")
        imported = read_whatif(
            [workdir / f"{name}.csv"], job_id=name, meta=workdir / f"{name}.json", time_unit="us"
        )
        requests += requests_of_job(imported)
    summaries = replay(otelcol, requests, workdir / "collector")
    out = []
    for name, job in jobs.items():
        spec = CORPUS[name]
        after = generate(with_remedy(spec)).step_times if remedy_of(spec) else None
        by_step = summaries.get(name, {})
        for cause, stage in imbalances_of(spec):
            named, wrong, predicted, repartition, realized = [], 0, [], [], []
            for step in sorted(by_step):
                summary = by_step[step]
                mine = [
                    im
                    for im in summary.imbalance_causes
                    if im.cause == cause and (stage is None or im.stage == stage)
                ]
                others = [
                    im
                    for im in summary.imbalance_causes
                    if im.cause == cause and stage is not None and im.stage != stage
                ]
                wrong += bool(others)
                if not mine:
                    continue
                named.append(step)
                predicted.append(mine[0].cost_s)
                found = _SAVES.findall(mine[0].fix)
                if cause == "stage_imbalance" and found:
                    repartition.append(float(found[-1]) / 100 * summary.duration_s)
                if after is not None:
                    realized.append(job.step_times[step] - after[step])
            out.append(
                Compared(
                    name=name,
                    spec=spec,
                    cause=cause,
                    stage=stage,
                    steps=len(by_step),
                    named_steps=len(named),
                    wrong_steps=wrong,
                    step_s=statistics.mean(job.step_times.values()),
                    predicted_s=statistics.mean(predicted) if predicted else 0.0,
                    repartition_s=statistics.mean(repartition) if repartition else None,
                    realized_s=statistics.mean(realized) if realized else None,
                    realized_positive=sum(1 for r in realized if r > 0),
                )
            )
    return out
