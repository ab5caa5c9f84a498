"""What ``pipeline.layers`` costs a pipeline stage (issue 46, item 2).

One process, one stage's model on the CPU: ``--layers`` blocks (``Linear`` + ReLU, width
``--width``) run forward and backward over ``--microbatches`` micro-batches of ``--rows``
rows per step, as a 1F1B stage does between its messages. Three ways, interleaved in blocks
of steps so that machine-load drift hits all alike:

- ``plain``: no profiler;
- ``unsampled``: the profiler installed, on steps it does not sample (its model pre-hook
  compares the step and returns);
- ``sampled``: every step sampled (hooks on every layer, gradient hooks on their tensors,
  one event recorded).

It prints the median step time of each and the added time per step, per layer and
micro-batch; a sampled step's added time divided by ``layer_profile_every`` (50) is what
profiling costs per step on average.

    python benchmarks/layer_profile.py [--layers 16 --width 256 --rows 16 --microbatches 4]
    python benchmarks/layer_profile.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from _smoke import SMOKE_DONE, verdict  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=20, help="blocks of steps per way")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--smoke", action="store_true", help="a few steps: it runs")
    args = parser.parse_args()
    if args.smoke:
        args.blocks, args.steps = 2, 2

    import torch
    from torch import nn

    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.hooks._context import HookContext
    from skewtrace.rank.hooks.layers import LayerProfiler

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.layers)]
    )
    batches = [torch.randn(args.rows, args.width) for _ in range(args.microbatches)]

    recorder = Recorder(1 << 20)
    ctx = HookContext(recorder)
    ctx.p2p_seen = True

    def step() -> float:
        start = time.perf_counter()
        for x in batches:
            model(x).sum().backward()
        recorder.end_step(time.perf_counter_ns())
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"plain": [], "unsampled": [], "sampled": []}
    for _ in range(3):  # warm up
        step()
    for _ in range(args.blocks):
        for way in times:
            profiler = None
            if way != "plain":
                # every=1 samples each step; a huge every samples none (its pre-hook runs).
                profiler = LayerProfiler(ctx, model, 1 if way == "sampled" else 1 << 30, False)
            for _ in range(args.steps):
                times[way].append(step())
            if profiler is not None:
                profiler.remove()
            recorder.events.clear()
    plain = statistics.median(times["plain"])
    calls = args.layers * args.microbatches
    print(
        f"{args.layers} layers x {args.microbatches} micro-batches, width {args.width}, "
        f"{args.rows} rows, {len(times['plain'])} steps each"
    )
    for way, values in times.items():
        med = statistics.median(values)
        added = med - plain
        print(
            f"{way:>9}: median step {1000 * med:8.3f} ms, added {1000 * added:+7.3f} ms "
            f"({100 * added / plain:+5.1f}%), {1e6 * added / calls:+6.1f} us per layer call"
        )
    sampled = statistics.median(times["sampled"]) - plain
    share = sampled / 50 / plain
    print(
        f"averaged over layer_profile_every=50: {1000 * sampled / 50:.3f} ms per step "
        f"({100 * share:.2f}% of the plain step) "
        f"target <= 1%: {verdict(share <= 0.01, args.smoke)}"
    )
    print(SMOKE_DONE if args.smoke else "PASS (the share: met / NOT met above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
