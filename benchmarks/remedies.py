"""The remedies of issue 46 in simulated time: their gains on the step simulator, and the
corpus's verdicts' predicted saving beside the saving realized with the remedy applied.

    python benchmarks/remedies.py                          # both sections, 5 seeds
    python benchmarks/remedies.py --sections proofs        # the simulator alone (no Collector)
    python benchmarks/remedies.py --sections corpus        # the table (the built Collector)
    python benchmarks/remedies.py --smoke                  # one seed, few steps, one corpus job

Every job is the what-if generator's (tests/whatif/generate.py: Megatron's 1F1B, the
data-parallel collectives, the optimizer, host gaps, 2% jitter), generated twice from the same
seed: as it is, and with the remedy applied (tests/whatif/generate.py's ``with_remedy``: the
same samples and the same jitter; only the split or the partition differs, and they are the
product's own ``split_by_work`` and ``best_partition``). A gain is the mean step time before
over after, minus 1 (the same global batch per step: throughput); each over 5 seeds, the mean
and the range. The jobs and their timings: tests/whatif/remedies.py.

proofs:
- data: 8 ranks data-parallel, 64 sequences a step packed without padding, log-normal lengths
  (median 512, sigma 1.0, clipped to 16..8192), a sample's cost t + t^2/2048: split_by_work
  over equal counts, target >= +20%.
- stage: 4 stages x 2 replicas, 16 equal layers, 4 a stage, and a loss head that puts 1.4x on
  the last stage: best_partition over 4-4-4-4+head, target >= +10%, at 16 micro-batches (and
  at 8 and 32, and priced by replay_1f1b, beside); the advice against an exhaustive search of
  every contiguous partition (by slowest stage; and, in a full run, by simulated step time).
- balanced: equal lengths (sigma 0) and equal layers without the head: each remedy changes
  throughput by at most 1%.

corpus: each imbalance job of the what-if corpus played through the built Collector (as
tests/test_whatif_corpus.py plays it): the verdict's predicted saving per step
(``training.imbalance.cost``; for a stage also the fix's repartition share) beside the saving
realized when the generator plays the job again with the remedy (before minus after).

A missed gain target prints ``NOT met`` (a --smoke run: not judged); what holds at any size (the
advice is the exhaustive best, the generator with every timing but compute at zero is
replay_1f1b's step, a balanced job unchanged, each corpus verdict naming its imbalance with a
positive realized saving) prints ``FAIL`` and exits 1.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from _smoke import SMOKE_DONE, SMOKE_HELP, verdict  # noqa: E402
from skewtrace.remedy.partition import best_partition, replay_1f1b, stage_costs  # noqa: E402
from skewtrace.remedy.work_split import split_by_work  # noqa: E402
from whatif.corpus import CORPUS  # noqa: E402
from whatif.generate import (  # noqa: E402
    GENERATOR_VERSION,
    TokenLengths,
    generate,
    token_lengths,
)
from whatif.remedies import (  # noqa: E402
    AS_IS,
    COMPUTE_ONLY,
    DATA_TIMINGS,
    HEADED,
    SEEDS,
    STAGE_MICROBATCHES,
    Compared,
    compare_corpus,
    data_job,
    exhaustive_best,
    imbalances_of,
    measure,
    over_seeds,
    partitions,
    remedy_of,
    spread,
    stage_job,
)

SMOKE_CORPUS = ("layers-heavy-2stage",)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def proofs(smoke: bool) -> list[str]:
    """Print the proofs; return what failed (judged at any size)."""
    failed: list[str] = []
    seeds = SEEDS[:1] if smoke else SEEDS
    data_steps, stage_steps = (3, 2) if smoke else (20, 10)

    # -- data --------------------------------------------------------------------------------
    timings = ", ".join(f"{k} {v * 1e3:g} ms" for k, v in DATA_TIMINGS.items() if k != "tp")
    print(f"data-parallel job: dp 8, pp 1, 1 GPU a rank; {timings}; {data_steps} steps a seed")
    gains = over_seeds(lambda s: data_job(s, steps=data_steps), seeds)
    for seed, g in zip(seeds, gains, strict=True):
        print(
            f"  seed {seed}: equal counts {_ms(g.before_s)} ms/step, split_by_work "
            f"{_ms(g.after_s)} ms/step, {g.gain:+.1%}"
        )
    ok = min(g.gain for g in gains) >= 0.20
    print(
        f"data: split_by_work over equal counts {spread(gains)}  target >= +20% "
        f"(each seed)  {verdict(ok, smoke)}"
    )
    # What a split costs on the host (not in the simulated time): LPT of 64 samples into 8.
    lengths = token_lengths(data_job(1), TokenLengths(), 0)
    costs = [TokenLengths().cost(t) for t in lengths]
    started = time.perf_counter()
    rounds = 20 if smoke else 2000
    for _ in range(rounds):
        split_by_work(costs, 8)
    print(
        f"  split_by_work of 64 samples into 8 parts: "
        f"{(time.perf_counter() - started) / rounds * 1e6:.0f} us on this host (not simulated)"
    )

    # -- stage -------------------------------------------------------------------------------
    advice = best_partition(HEADED, 4)
    least, best, first = exhaustive_best(HEADED, 4)
    every = partitions(len(HEADED), 4)
    exact = advice.layers == first and advice.slowest == least
    print(
        f"stage job: 16 layers of 1.0 + a loss head of 1.6, as is {AS_IS} (stages "
        f"{stage_costs(HEADED, AS_IS)}); the advice {advice.layers} (stages {advice.costs})"
    )
    print(
        f"advice against an exhaustive search of all {len(every)} contiguous partitions: "
        f"least slowest stage {least:g}, reached by {len(best)} ({', '.join(map(str, best))}); "
        f"first of them by the tie-breaks (sum of squares, then counts) {first}; the advice "
        f"{advice.layers} slowest {advice.slowest:g}: {'equal' if exact else 'DIFFERENT'}"
    )
    if not exact:
        failed.append("advice is not the exhaustive best")
    micro = (8,) if smoke else (8, STAGE_MICROBATCHES, 32)
    print(
        "| micro-batches | replay_1f1b (compute only) | generator, compute only | "
        "generator, default timings | generator, compute x4 |"
    )
    print("|---|---|---|---|---|")
    headline = None
    for m in micro:
        before = stage_costs(HEADED, AS_IS)
        old = replay_1f1b(list(before), [2 * c for c in before], m)
        new = replay_1f1b(list(advice.costs), [2 * c for c in advice.costs], m)
        bare = measure(stage_job(1, microbatches=m, steps=2, **COMPUTE_ONLY))
        scale = 4e-3 / (sum(HEADED) / 4)  # a unit of layer cost in seconds of forward
        same = (
            abs(bare.before_s - old * scale) <= 1e-9 * old * scale
            and abs(bare.after_s - new * scale) <= 1e-9 * new * scale
        )
        if not same:
            failed.append(f"generator != replay_1f1b at {m} micro-batches")
        default = over_seeds(lambda s, m=m: stage_job(s, microbatches=m, steps=stage_steps), seeds)
        heavy = over_seeds(
            lambda s, m=m: stage_job(s, microbatches=m, steps=stage_steps, compute_scale=4),
            seeds,
        )
        if m == STAGE_MICROBATCHES or smoke:
            headline = (m, default)
        print(
            f"| {m} | {old / new - 1:+.1%} ({old:.1f} vs {new:.1f} units) | "
            f"{bare.gain:+.1%} ({'= replay_1f1b' if same else 'DIFFERS from replay_1f1b'}) | "
            f"{spread(default)} | {spread(heavy)} |"
        )
    assert headline is not None
    m, default = headline
    ok = min(g.gain for g in default) >= 0.10
    print(
        f"stage: best_partition over as-is, {m} micro-batches, default timings "
        f"{spread(default)}  target >= +10% (each seed)  {verdict(ok, smoke)}"
    )

    # best_partition breaks ties by the sum of squares, then the counts; replay_1f1b tells the
    # ties apart (a heavy first stage costs 1F1B less than a heavy middle one).
    def priced(p: tuple[int, ...]) -> float:
        c = stage_costs(HEADED, p)
        return replay_1f1b(list(c), [2 * x for x in c], STAGE_MICROBATCHES)

    cheapest = min(best, key=lambda p: (priced(p), p))
    tie = over_seeds(lambda s: stage_job(s, partition=cheapest, steps=stage_steps), seeds)
    as_is = over_seeds(lambda s: stage_job(s, steps=stage_steps), seeds)
    ratio = [a.before_s / t.before_s - 1 for a, t in zip(as_is, tie, strict=True)]
    print(
        f"  of the {len(best)} ties, replay_1f1b prices {cheapest} cheapest at "
        f"{STAGE_MICROBATCHES} micro-batches ({priced(cheapest):.1f} against the advice's "
        f"{priced(advice.layers):.1f} units); on the generator it gains "
        f"{statistics.mean(ratio):+.1%} ({min(ratio):+.1%}..{max(ratio):+.1%}) over as-is "
        f"(not the product's advice: its tie-break)"
    )
    if not smoke:
        # The advice against every partition no slower than as-is, by simulated step time.
        limit = max(stage_costs(HEADED, AS_IS))
        candidates = [p for p in every if max(stage_costs(HEADED, p)) <= limit]
        times = {}
        for p in candidates:
            job = generate(stage_job(1, partition=p, steps=3))
            times[p] = statistics.mean(job.step_times.values())
        fastest = min(times, key=times.__getitem__)
        print(
            f"  simulated (seed 1, 3 steps) over the {len(candidates)} partitions no slower "
            f"than as-is by slowest stage: fastest {fastest} {_ms(times[fastest])} ms, the "
            f"advice {_ms(times[advice.layers])} ms (rank "
            f"{sorted(times.values()).index(times[advice.layers]) + 1})"
        )

    # -- balanced ----------------------------------------------------------------------------
    equal_data = over_seeds(lambda s: data_job(s, sigma=0.0, steps=data_steps), seeds)
    equal_stage = over_seeds(
        lambda s: stage_job(s, costs=(1.0,) * 16, partition=(4, 4, 4, 4), steps=stage_steps),
        seeds,
    )
    for what, gains in (("equal lengths", equal_data), ("equal layers", equal_stage)):
        worst = max(abs(g.gain) for g in gains)
        print(
            f"balanced ({what}): change {spread(gains)}  target within 1%  "
            f"{'met' if worst <= 0.01 else 'NOT met'}"
        )
        if worst > 0.01:
            failed.append(f"balanced job ({what}) changed by {worst:.2%}")
    return failed


def _describe(cause: object) -> str:
    if hasattr(cause, "describe"):
        return str(cause.describe())
    fields = {k: v for k, v in vars(cause).items() if k not in ("first_step", "last_step")}
    return type(cause).__name__ + "(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


def _explain(c: Compared) -> str:
    if c.realized_s is None:
        return "a bare factor (nothing to move): no remedy to generate"
    if c.cause == "data_imbalance":
        tokens = next(x for x in c.spec.causes if isinstance(x, TokenLengths))
        mean = tokens.expected_cost() * tokens.samples / (c.spec.dp * c.spec.microbatches)
        largest = statistics.mean(
            max(tokens.cost(t) for t in token_lengths(c.spec, tokens, step)) / mean
            for step in range(c.spec.steps)
        )
        return (
            "the verdict prices every micro-batch at its class mean (work split finely); "
            "split_by_work moves whole samples, and a step's longest sample alone holds "
            f"{largest:.1f}x a mean micro-batch's work (mean over the steps)"
        )
    layers = next(x for x in c.spec.causes if hasattr(x, "partition"))
    costs, pp = layers.costs, c.spec.pp  # type: ignore[attr-defined]
    continuous = sum(costs) / pp
    whole = best_partition(costs, pp).slowest
    heavy = max(stage_costs(costs, layers.partition))  # type: ignore[attr-defined]
    return (
        f"the verdict prices the stage as fast as the others and the repartition as its "
        f"excess moved evenly (slowest {heavy:g} -> {continuous:g}); whole layers reach "
        f"{whole:g}"
    )


def corpus(otelcol: Path, smoke: bool) -> list[str]:
    names = list(SMOKE_CORPUS) if smoke else [n for n in CORPUS if imbalances_of(CORPUS[n])]
    print(
        f"generator {GENERATOR_VERSION}; per step, averaged over the steps that named it; "
        f"realized = the generator's step before minus after the remedy"
    )
    print(
        "| job | layout | causes | remedy | named in | step | predicted (cost) | "
        "predicted (repartition) | realized | realized / predicted | why they differ |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        rows = compare_corpus(names, otelcol, Path(tmp))
    for c in rows:
        spec = c.spec
        remedy = remedy_of(spec) or "-"
        what = "data" if c.cause == "data_imbalance" else f"stage {c.stage}"
        causes = " + ".join(_describe(x) for x in spec.causes)
        predicted = c.repartition_s if c.repartition_s is not None else c.predicted_s
        ratio = "-" if c.realized_s is None else f"{c.realized_s / predicted:.2f}"
        realized = (
            "-"
            if c.realized_s is None
            else (f"{_ms(c.realized_s)} ms ({c.realized_s / c.step_s:.1%})")
        )
        print(
            f"| {c.name} | {spec.pp}x{spec.dp}, {spec.microbatches} mb | {causes} | {remedy} | "
            f"{what}: {c.named_steps}/{c.steps} | {_ms(c.step_s)} ms | "
            f"{_ms(c.predicted_s)} ms ({c.predicted_s / c.step_s:.1%}) | "
            + (
                "-"
                if c.repartition_s is None
                else f"{_ms(c.repartition_s)} ms ({c.repartition_s / c.step_s:.1%})"
            )
            + f" | {realized} | {ratio} | {_explain(c)} |"
        )
        if c.named_steps != c.steps or c.wrong_steps:
            failed.append(f"{c.name}: {what} named in {c.named_steps}/{c.steps} steps")
        if c.realized_s is not None and c.realized_s <= 0:
            failed.append(f"{c.name}: realized saving {c.realized_s:.4f} s")
    print("realized / predicted: over the repartition figure for a stage, the cost for data")
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="proofs,corpus", help="proofs, corpus")
    parser.add_argument("--otelcol", default=str(REPO / "build" / "otelcol-skewtrace"))
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP}: 1 seed, few steps")
    args = parser.parse_args()
    sections = {s for s in args.sections.split(",") if s}
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit or '?'}")
    failed = []
    if "proofs" in sections:
        failed += proofs(args.smoke)
    if "corpus" in sections:
        failed += corpus(Path(args.otelcol), args.smoke)
    for f in failed:
        print(f"FAIL: {f}")
    if failed:
        return 1
    print(SMOKE_DONE if args.smoke else "PASS (what holds at any size; gains: met / NOT met above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
