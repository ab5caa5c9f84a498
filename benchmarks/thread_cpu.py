"""Training-thread CPU per step, instrumented against plain in the same processes (issue 49,
item 3): what skewtrace costs where a GPU job's feed runs, measured where it cannot hide.

A step-time ratio on a shared machine moves by a few percent with nothing instrumented (the
A/A control in benchmarks/overhead.py), more than the 1% it is meant to judge. The training
thread's own CPU time (``time.thread_time``) does not count what other processes or threads
do on the core, so here each step of rank 0 is timed that way as well as by the clock, in
blocks that alternate instrumented and plain (``skewtrace.instrument``/``uninstrument``
between blocks, the first mode of each pair alternating), and the added CPU per step is the
mean over block pairs of the instrumented block's median step minus the plain one's, with a
~95% interval (t over the pairs). Beside it: the export thread's CPU over the instrumented blocks'
wall time (its share of a core, and with the GIL the share the training thread cannot have),
and what that leaves for the GPU feed.

Jobs (the example jobs' models, at their real collective counts, on CPU with gloo; counted
per step by a process-group pre-hook in a counting step before the measured blocks):

- ``ddp``: examples/train_ddp.py's Net in DistributedDataParallel, 2 ranks;
- ``fsdp2``: examples/frameworks/fsdp2.py's model, ``fully_shard`` per block and root, 2 ranks;
- ``tp``: examples/frameworks/tensor_parallel.py's model and plan, 2 ranks;
- ``fsdp2_tp``: examples/frameworks/fsdp2_tp.py's 2-D mesh (2 x 2), 4 ranks.

Then the projection onto a 100 ms GPU step: the per-call figures of benchmarks/overhead.py's
hook section (run here, on the fake process group) times the collectives of a 32-layer FSDP2
x TP model (about 5 per layer and step), plus one forward+backward and the optimizer step.

    python benchmarks/thread_cpu.py            # all four jobs, ~5 minutes on 2 shared cores
    python benchmarks/thread_cpu.py --smoke    # ddp only, 2 block pairs: it runs (no target judged)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "examples" / "frameworks"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _smoke import SMOKE_DONE, SMOKE_HELP, verdict  # noqa: E402
from skewtrace._ports import free_port  # noqa: E402

STEP_CPU_TARGET = 0.01
"""Training-thread CPU added per step, as a share of the plain step."""
GPU_STEP_S = 0.100
PROJECTED_LAYERS = 32
COLLECTIVES_PER_LAYER = 5

JOBS: dict[str, int] = {"ddp": 2, "fsdp2": 2, "tp": 2, "fsdp2_tp": 4}
"""Each job and its ranks."""


def _t_quantile(df: int) -> float:
    """Two-sided 95% Student t quantile (a table; scipy is not a dependency)."""
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31,
             9: 2.26, 10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}  # fmt: skip
    for k in sorted(table):
        if df <= k:
            return table[k]
    return 1.96


def mean_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its ~95% interval (t over the values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.inf
    return mean, _t_quantile(len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5


def _build(job: str, device: Any) -> tuple[Any, Any, Any]:
    """The job's model, optimizer and one step's function (examples' models)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(dist.get_rank())
    if job == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        from train_ddp import Net

        model: Any = DistributedDataParallel(Net(64, 256, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()
        x, y = torch.randn(32, 64, generator=generator), torch.randint(0, 4, (32,))

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()

        return model, optimizer, step
    import _knobs
    from torch.distributed.fsdp import fully_shard

    if job == "fsdp2":
        import fsdp2

        model = fsdp2.Model(64, 4, _knobs.SlowRank())
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        x, y = torch.randn(16, 64, generator=generator), torch.randn(16, 1, generator=generator)

        def loss() -> Any:
            return nn.functional.mse_loss(model(x), y)

    else:
        from tensor_parallel import Model, tp_plan
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        world = dist.get_world_size()
        tp = 2
        if job == "tp":
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
            model = Model(32, 3, _knobs.SlowRank())
            parallelize_module(model, mesh["tp"], tp_plan(3))
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
        else:
            mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
            model = Model(32, 3, _knobs.SlowRank())
            parallelize_module(model, mesh["tp"], tp_plan(3))
            for layer in model.layers:
                fully_shard(layer, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            row = mesh.get_coordinate()[0]
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(row))

        def loss() -> Any:
            return model(x).pow(2).mean()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, optimizer, step


def _count_collectives(step: Any) -> int:
    """Collectives one step issues on this rank (every group's pre-hook counting)."""
    import torch.distributed.distributed_c10d as c10d

    count = [0]

    def pre(_args: Any) -> None:
        count[0] += 1

    groups = list(c10d._world.pg_map)
    for pg in groups:
        pg.register_pre_hook(0xC0C0, pre)
    try:
        step()
    finally:
        for pg in groups:
            pg.unregister_pre_hook(0xC0C0)
    return count[0]


def _worker(rank: int, world: int, port: int, conf: dict[str, Any], queue: Any) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    os.environ.update(conf["env"])
    import torch
    import torch.distributed as dist

    import skewtrace

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        model, optimizer, step = _build(conf["job"], torch.device("cpu"))
        plain_step = step
        if conf["job"] == "ddp":
            # DDP's reducer takes one comm hook for its lifetime, and skewtrace's stays
            # registered (forwarding only) after uninstrument: plain blocks run a second,
            # identical DDP model that never saw instrument(), so they are plain DDP (the
            # reducer's all-reduce in C++) and the Python comm hook is counted as ours.
            _, _, plain_step = _build(conf["job"], torch.device("cpu"))
        for _ in range(3):  # warm up (FSDP2's lazy init, allocator)
            step()
            plain_step()
        collectives = _count_collectives(plain_step)
        plain_cpu: list[float] = []
        instr_cpu: list[float] = []
        plain_wall: list[float] = []
        instr_wall: list[float] = []
        export_cpu_ns = 0
        instr_wall_ns = 0
        background: dict[str, int] = {}
        for pair in range(conf["pairs"]):
            order = (False, True) if pair % 2 == 0 else (True, False)
            means: dict[bool, tuple[float, float]] = {}
            for instrumented in order:
                if instrumented:
                    skewtrace.instrument(model=model, optimizer=optimizer)
                dist.barrier()
                cpu: list[int] = []
                wall: list[int] = []
                block_start = time.perf_counter_ns()
                run = step if instrumented else plain_step
                for index in range(conf["steps"]):
                    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                    run()
                    c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
                    if index >= 1:  # the first step of a block absorbs the switch
                        cpu.append(c1 - c0)
                        wall.append(w1 - w0)
                if instrumented:
                    session = skewtrace.SkewtraceInstrumentor().session
                    instr_wall_ns += time.perf_counter_ns() - block_start
                    # Every skewtrace thread's CPU since it started with this block's
                    # instrument(): the export thread, and the Flight Recorder reader where
                    # one runs (it holds the GIL while it reads the ring).
                    for thread in threading.enumerate():
                        if thread.name.startswith("skewtrace") and thread.ident is not None:
                            with contextlib.suppress(OSError):
                                clock = time.pthread_getcpuclockid(thread.ident)
                                background[thread.name] = background.get(
                                    thread.name, 0
                                ) + time.clock_gettime_ns(clock)
                    skewtrace.uninstrument()
                    assert session is not None
                    export_cpu_ns += session.exporter.stats.cpu_ns
                # The block's median step: a step that a collection of the garbage collector
                # or a preemption's cache refill lands on moves a mean by far more than the
                # hooks cost; the interval over pairs still carries the spread of the blocks.
                means[instrumented] = (statistics.median(cpu), statistics.median(wall))
            plain_cpu.append(means[False][0])
            instr_cpu.append(means[True][0])
            plain_wall.append(means[False][1])
            instr_wall.append(means[True][1])
        if rank == 0:
            queue.put(
                {
                    "collectives_per_step": collectives,
                    "plain_cpu_ns": plain_cpu,
                    "instr_cpu_ns": instr_cpu,
                    "plain_wall_ns": plain_wall,
                    "instr_wall_ns": instr_wall,
                    "export_cpu_ns": export_cpu_ns,
                    "background_cpu_ns": background,
                    "instrumented_wall_ns": instr_wall_ns,
                }
            )
    finally:
        dist.destroy_process_group()


def bench_job(job: str, pairs: int, steps: int, endpoint: str, smoke: bool) -> dict[str, Any]:
    import torch.multiprocessing as mp

    world = JOBS[job]
    conf = {
        "job": job,
        "pairs": pairs,
        "steps": steps,
        "env": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "SKEWTRACE_JOB_ID": f"thread-cpu-{job}",
            "SKEWTRACE_NODE_TELEMETRY": "false",
            "SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS": "1000",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        },
    }
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, conf, queue)) for r in range(world)]
    for proc in procs:
        proc.start()
    try:
        result = queue.get(timeout=900)
    finally:
        for proc in procs:
            proc.join(120)
    diffs = [
        (i - p) / 1e3 for i, p in zip(result["instr_cpu_ns"], result["plain_cpu_ns"], strict=True)
    ]
    added_us, half_us = mean_interval(diffs)
    plain_wall_us = statistics.fmean(result["plain_wall_ns"]) / 1e3
    plain_cpu_us = statistics.fmean(result["plain_cpu_ns"]) / 1e3
    instr_wall_us = statistics.fmean(result["instr_wall_ns"]) / 1e3
    share = added_us / plain_wall_us
    share_hi = (added_us + half_us) / plain_wall_us
    export_share = result["export_cpu_ns"] / max(result["instrumented_wall_ns"], 1)
    n = result["collectives_per_step"]
    ok = share_hi <= STEP_CPU_TARGET
    print(
        f"[{job}] {JOBS[job]} ranks, {n} collectives/step; plain step {plain_wall_us / 1e3:.2f}"
        f" ms wall, {plain_cpu_us / 1e3:.2f} ms training-thread CPU (instrumented "
        f"{instr_wall_us / 1e3:.2f} ms wall)"
    )
    print(
        f"    training-thread CPU added per step: {added_us:+.1f} us +/- {half_us:.1f} "
        f"(95%, {len(diffs)} block pairs of {steps - 1} steps) = {share:+.2%} of the plain "
        f"step [upper {share_hi:+.2%}] (target <= {STEP_CPU_TARGET:.0%}) "
        f"{verdict(ok, smoke, 'OK', 'OVER TARGET')}; per collective "
        f"{added_us / max(n, 1):+.2f} us (phases included)"
    )
    wall_ns = max(result["instrumented_wall_ns"], 1)
    shares = {name: ns / wall_ns for name, ns in sorted(result["background_cpu_ns"].items())}
    # The export thread by its own count (its cycles, the flush at uninstrument included);
    # the others by their thread clocks while the blocks ran.
    held = export_share + sum(v for k, v in shares.items() if k != "skewtrace-export")
    print(
        f"    export thread: {export_share:.2%} of a core over the instrumented blocks (its "
        "export cycles, the flush at uninstrument included); skewtrace threads' clocks while "
        "the blocks ran: "
        + (", ".join(f"{name} {share:.2%}" for name, share in shares.items()) or "none seen")
        + f" (with the GIL, {1 - held:.2%} of the time is left for the training thread's "
        f"GPU feed)"
    )
    return {
        "ranks": JOBS[job],
        "collectives_per_step": n,
        "plain_step_wall_us": plain_wall_us,
        "plain_step_cpu_us": plain_cpu_us,
        "instrumented_step_wall_us": instr_wall_us,
        "added_cpu_us": added_us,
        "added_cpu_ci_us": half_us,
        "added_share": share,
        "added_share_upper": share_hi,
        "export_thread_share": export_share,
        "background_thread_shares": shares,
        "instrumented_wall_over_plain": instr_wall_us / plain_wall_us,
    }


def project(hooks: dict[str, float], smoke: bool) -> dict[str, float]:
    """A 32-layer FSDP2 x TP model on a 100 ms GPU step, from the per-call figures: once from
    the fastest rounds (a quiet machine; the figure judged) and once from the rounds' medians
    (this machine's load, an upper reading)."""
    collectives = PROJECTED_LAYERS * COLLECTIVES_PER_LAYER
    kinds = ("all_reduce", "all_reduce_async_wait", "functional_all_reduce_wait")
    result: dict[str, float] = {"collectives": collectives}
    for label, suffix in (("fastest rounds", ""), ("medians", "_median")):
        per_collective = max(hooks[f"{kind}{suffix}"] for kind in kinds)
        phases = hooks[f"forward_backward{suffix}"] + max(hooks[f"optimizer_step{suffix}"], 0.0)
        total_us = collectives * per_collective + phases
        share = total_us / (GPU_STEP_S * 1e6)
        judged = (
            f"(target <= {STEP_CPU_TARGET:.0%}) "
            f"{verdict(share <= STEP_CPU_TARGET, smoke, 'OK', 'OVER TARGET')}"
            if not suffix
            else "(this machine's load: an upper reading, not judged)"
        )
        print(
            f"[projection, {label}] {PROJECTED_LAYERS} layers x {COLLECTIVES_PER_LAYER} "
            f"collectives = {collectives} collectives x {per_collective:.2f} us (the dearest of "
            f"sync, async and functional) + forward/backward and optimizer {phases:.1f} us = "
            f"{total_us / 1e3:.2f} ms of training-thread CPU on a {GPU_STEP_S * 1e3:.0f} ms "
            f"step = {share:.2%} {judged}"
        )
        key = "fastest" if not suffix else "median"
        result[f"{key}_per_collective_us"] = per_collective
        result[f"{key}_total_us"] = total_us
        result[f"{key}_share"] = share
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument(
        "--jobs", default=",".join(JOBS), help="comma-separated, of " + ",".join(JOBS)
    )
    parser.add_argument("--pairs", type=int, default=30, help="instrumented/plain block pairs")
    parser.add_argument("--steps", type=int, default=9, help="steps per block")
    parser.add_argument("--hook-rounds", type=int, default=21)
    args = parser.parse_args()
    smoke = args.smoke
    jobs = ["ddp"] if smoke else [j for j in args.jobs.split(",") if j]
    pairs, steps = (2, 3) if smoke else (args.pairs, args.steps)
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
        "CPU times are the training thread's own (time.thread_time)"
    )
    from otlp_sink import OtlpSink

    summary: dict[str, Any] = {"loadavg": os.getloadavg()}
    sink = OtlpSink().start()
    try:
        for job in jobs:
            summary[job] = bench_job(job, pairs, steps, sink.endpoint, smoke)
        summary["spans_received"] = len(sink.spans())
    finally:
        sink.stop()
    import overhead

    hooks = overhead.bench_hook_overhead(
        50 if smoke else 300, 2 if smoke else args.hook_rounds, smoke
    )
    summary["hooks"] = hooks
    summary["projection"] = project(hooks, smoke)
    summary["loadavg_end"] = os.getloadavg()
    print("SUMMARY " + json.dumps(summary))
    if smoke:
        print(SMOKE_DONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
