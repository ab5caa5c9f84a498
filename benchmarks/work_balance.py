"""Work-balanced batches vs equal counts: 4 gloo ranks, a small transformer, real training.

The job (tests/work_balance_job.py): 4 gloo DDP ranks, a transformer layer (embedding, one
``TransformerEncoderLayer``, a head; no dropout), each sequence run at its own length (packed
without padding: its real compute grows with its tokens and, through attention, with their
square), lengths log-normal (median ``--median`` tokens, sigma 1, clipped to
``--min-len``..``--max-len``), the loss summed over tokens and normalized by the global
batch's tokens, SGD with momentum, a fixed seed. Both arms use
:class:`skewtrace.rank.work_balance.WorkBalancedSampler`: ``mode="count"`` (equal counts: the
baseline, as ``DistributedSampler``) and ``mode="work"`` (the split by work, its cost model
fitted online from the ranks' forward times and agreed at sync points).

Four ranks on a machine with fewer cores share the cores, so a rank that finishes early gives
its core to the one still computing and real compute alone cannot show what four devices
would. Each sample therefore also costs a modelled device time, ``a*t + b*t**2`` seconds of
sleep in its forward (``--device-us-per-token`` = a, quadratic equal to linear at
``--crossover`` tokens), as benchmarks/rebalance.py models device time; the real compute still
runs and decides the losses (and adds its own, contended, time).

Sections:

- ``loss``: one run of each arm for ``--steps`` steps: the loss at every step of the split by
  work against equal counts (max absolute and relative difference; float32 by default);
- ``throughput``: ``--pairs`` interleaved pairs (equal counts, then balanced) of
  ``--pair-steps`` steps each; throughput is global samples per second over rank 0's steps
  after ``--warmup``; the ratio balanced / equal per pair, its mean and spread. Beside it, what
  the cost model predicts: the mean over steps of the heaviest rank's modelled work, equal
  counts over balanced.

    python benchmarks/work_balance.py                 # both sections (about 6 minutes on
                                                      # 2 cores)
    python benchmarks/work_balance.py --smoke         # 6 steps, 1 pair of 6 steps

Targets: the loss curves equal within float tolerance (relative 1e-4 in float32 after 200
steps, where summation order is the only difference), and balanced faster than equal counts.
The issue's +20% is a simulator target at 8 ranks (the step simulator); WLB-LLM reports 1.23x
on average end to end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
sys.path.insert(0, str(REPO_ROOT / "src"))

from _smoke import SMOKE_DONE, SMOKE_HELP, verdict  # noqa: E402

WORLD = 4
LOSS_TOLERANCE = {"float32": 1e-4, "float64": 1e-9}
WLB_LLM_SPEEDUP = 1.23


def _worker(rank: int, plan: list[dict[str, Any]], out: str) -> None:
    from work_balance_job import JobConfig, run_rank

    results = []
    for run in plan:
        config = JobConfig(**run["config"])
        results.append(run_rank(rank, WORLD, run["port"], config, run["mode"]))
    if rank == 0:
        Path(out, "rank0.json").write_text(json.dumps(results))


def run_all(plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run of ``plan`` in order, in one spawn of 4 ranks."""
    import torch.multiprocessing as mp

    from skewtrace._ports import free_port

    for run in plan:
        run["port"] = free_port()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(plan, out), nprocs=WORLD, join=True)
        results: list[dict[str, Any]] = json.loads(Path(out, "rank0.json").read_text())
    return results


def throughput(run: dict[str, Any], warmup: int, global_batch: int) -> float:
    seconds = sum(run["step_s"][warmup:])
    return global_batch * len(run["step_s"][warmup:]) / seconds if seconds > 0 else 0.0


def heaviest(run: dict[str, Any]) -> float:
    """The mean over steps of the heaviest rank's modelled work."""
    return statistics.fmean(max(work) for work in run["work"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps of each 'loss' run")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--pair-steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--median", type=float, default=256.0)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=sorted(LOSS_TOLERANCE))
    parser.add_argument("--device-us-per-token", type=float, default=30.0)
    parser.add_argument("--crossover", type=float, default=2048.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sections", default="loss,throughput")
    parser.add_argument(
        "--smoke", action="store_true", help=f"{SMOKE_HELP}: 6 steps, 1 pair of 6 steps"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.pairs, args.pair_steps, args.warmup = 6, 1, 6, 1
    sections = set(args.sections.split(","))
    base = {
        "global_batch": args.global_batch,
        "samples": args.global_batch * 50,
        "median": args.median,
        "min_len": args.min_len,
        "max_len": args.max_len,
        "d_model": args.d_model,
        "nhead": 2,
        "ff": 2 * args.d_model,
        "dtype": args.dtype,
        "lr": 0.02,
        "seed": args.seed,
        "sync_every": 8,
        "fit": True,
        "crossover": args.crossover,
        "device_s_per_token": args.device_us_per_token * 1e-6,
    }
    plan: list[dict[str, Any]] = []
    if "loss" in sections:
        for mode in ("count", "work"):
            plan.append({"section": "loss", "mode": mode, "config": {**base, "steps": args.steps}})
    if "throughput" in sections:
        for pair in range(args.pairs):
            for mode in ("count", "work"):
                config = {**base, "steps": args.pair_steps, "seed": args.seed + 1 + pair}
                plan.append({"section": "throughput", "pair": pair, "mode": mode, "config": config})
    print(
        f"{WORLD} gloo ranks, global batch {args.global_batch}, lengths log-normal median "
        f"{args.median:g} sigma 1 clipped {args.min_len}-{args.max_len}, d_model {args.d_model}, "
        f"{args.dtype}; modelled device {args.device_us_per_token:g} us/token, quadratic = "
        f"linear at {args.crossover:g} tokens; {len(plan)} runs",
        flush=True,
    )
    started = time.monotonic()
    results = run_all(plan)
    print(f"ran in {time.monotonic() - started:.0f} s")
    failed = False
    lines: list[str] = []
    runs = list(zip(plan, results, strict=True))
    if "loss" in sections:
        count, work = (r for p, r in runs if p["section"] == "loss")
        diffs = [abs(a - b) for a, b in zip(count["loss"], work["loss"], strict=True)]
        rel = max(d / abs(a) for d, a in zip(diffs, count["loss"], strict=True))
        tolerance = LOSS_TOLERANCE[args.dtype]
        linear, quadratic = work["cost"]
        crossover = linear / quadratic if quadratic else float("inf")
        ok = rel <= tolerance
        failed |= not ok
        lines += [
            f"loss over {len(diffs)} steps: first {count['loss'][0]:.6f}, last equal "
            f"{count['loss'][-1]:.6f}, last balanced {work['loss'][-1]:.6f}",
            f"loss curves, balanced vs equal: max abs diff {max(diffs):.3g}, max rel diff "
            f"{rel:.3g} (target <= {tolerance:g}): {'met' if ok else 'FAIL'}",
            f"cost model: version {work['cost_versions'][-1]} at the end, "
            f"linear {work['cost'][0]:.3g} s/token, quadratic {work['cost'][1]:.3g} s/token^2 "
            f"(crossover {crossover:.0f} tokens; modelled device {args.crossover:g} plus the "
            "real compute's)",
        ]
    if "throughput" in sections:
        ratios, predicted = [], []
        lines.append("pair   equal samples/s   balanced samples/s   ratio   predicted")
        for pair in range(args.pairs):
            count, work = (r for p, r in runs if p["section"] == "throughput" and p["pair"] == pair)
            eq = throughput(count, args.warmup, args.global_batch)
            bal = throughput(work, args.warmup, args.global_batch)
            ratio = bal / eq if eq > 0 else 0.0
            pred = heaviest(count) / heaviest(work)
            ratios.append(ratio)
            predicted.append(pred)
            lines.append(f"{pair:>4} {eq:>17.2f} {bal:>20.2f} {ratio:>7.3f} {pred:>11.3f}")
        spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        mean = statistics.fmean(ratios)
        lines.append(
            f"balanced over equal throughput: mean {mean:.3f} (spread {min(ratios):.3f}-"
            f"{max(ratios):.3f}, stdev {spread:.3f}; {len(ratios)} pairs) target > 1: "
            f"{verdict(mean > 1.0, args.smoke)}; the cost model predicted "
            f"{statistics.fmean(predicted):.3f}; WLB-LLM reports {WLB_LLM_SPEEDUP:.2f}x end to end"
        )
    print()
    print("\n".join(lines))
    if args.smoke:
        print(SMOKE_DONE)
        return 1 if failed else 0
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
