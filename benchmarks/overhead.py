"""Instrumentation overhead: the three targets of issue 2, each printed beside its target.

1. Hot path: cost of recording one event on the training thread (two clock reads and a
   buffer append) vs the 2 us target, and a full OTel SDK span in the same run for scale.
2. Step time: a 4-rank gloo DDP job (~50 ms steps) alternating instrumented and plain blocks
   of steps inside the same processes (so machine-load drift hits both alike), once with an
   OTLP endpoint up (a real gRPC receiver, tests/otlp_sink.py) and once with it down.
   Target: instrumented/plain step time <= 1.01.
3. Memory: a long single-rank run with the endpoint down and a small buffer: RSS must stop
   growing once the buffer is full (bounded by the buffer, not by the run length).

    python benchmarks/overhead.py            # all three, ~5 minutes on 2 shared cores
    python benchmarks/overhead.py --quick    # smaller
    python benchmarks/overhead.py --smoke    # 1 rank, a few steps: it runs (no target judged)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "examples"))

from _smoke import NOT_JUDGED, SMOKE_DONE, SMOKE_HELP, verdict  # noqa: E402
from skewtrace._ports import free_port  # noqa: E402

HOT_PATH_TARGET_US = 2.0
STEP_OVERHEAD_TARGET = 1.01


# ------------------------------------------------------------------------------ 1. hot path


def bench_hot_path(n: int, smoke: bool = False) -> dict[str, float]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from skewtrace import semconv
    from skewtrace.rank._events import PHASE, PhaseEvent
    from skewtrace.rank._recorder import Recorder, now_ns

    recorder = Recorder(capacity=n + 1)
    record = recorder.record
    forward = semconv.SPAN_FORWARD
    tuple_new = tuple.__new__

    # What the hooks do: a plain tuple, its kind first and then PhaseEvent's fields.
    def kind_tuples() -> None:
        for step in range(n):
            t0 = now_ns()
            record((PHASE, forward, step, t0, now_ns(), "host", None, None))

    # For comparison, what naming the fields on the hot path would cost: the NamedTuple
    # built with tuple.__new__ or its class call, and a tuple headed by the class (which the
    # garbage collector keeps tracking, unlike a tuple of ints, strings and None).
    def tuple_new_calls() -> None:
        for step in range(n):
            t0 = now_ns()
            record(tuple_new(PhaseEvent, (forward, step, t0, now_ns(), "host", None)))

    def class_calls() -> None:
        for step in range(n):
            t0 = now_ns()
            record(PhaseEvent(forward, step, t0, now_ns(), "host", None))

    def class_heads() -> None:
        for step in range(n):
            t0 = now_ns()
            record((PhaseEvent, forward, step, t0, now_ns(), "host", None))

    forms = (
        ("kind_tuple", kind_tuples),
        ("tuple_new", tuple_new_calls),
        ("class_call", class_calls),
        ("class_head", class_heads),
    )
    best = {key: float("inf") for key, _ in forms}
    # Interleaved rounds in rotating order, fastest of each: shared-machine load hits all
    # forms alike. Each starts from an empty buffer.
    for round_index in range(8):
        for key, fn in forms[round_index % 4 :] + forms[: round_index % 4]:
            recorder.events.clear()
            start = time.perf_counter()
            fn()
            best[key] = min(best[key], (time.perf_counter() - start) / n)
    recorder.events.clear()
    best_event = best["kind_tuple"]
    baseline_loop = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _step in range(n):
            pass
        baseline_loop = min(baseline_loop, (time.perf_counter() - start) / n)

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=n + 1))
    tracer = provider.get_tracer("bench")
    m = max(n // 10, 1000)
    best_sdk = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for step in range(m):
            span = tracer.start_span(semconv.SPAN_FORWARD, attributes={semconv.STEP: step})
            span.end()
        best_sdk = min(best_sdk, (time.perf_counter() - start) / m)
        provider.force_flush()
    provider.shutdown()
    event_us = (best_event - baseline_loop) * 1e6
    per_form = {key: (best[key] - baseline_loop) * 1e6 for key in best}
    sdk_us = (best_sdk - baseline_loop) * 1e6
    print(
        f"[1] record one event:      {event_us:6.2f} us   (target <= {HOT_PATH_TARGET_US} us)"
        f"  {verdict(event_us <= HOT_PATH_TARGET_US, smoke, 'OK', 'OVER TARGET')}"
    )
    print(
        f"    naming fields on the hot path instead would cost: NamedTuple by tuple.__new__ "
        f"{per_form['tuple_new']:.2f} us, by its class call {per_form['class_call']:.2f} us,"
        f" tuple headed by the class {per_form['class_head']:.2f} us"
    )
    print(
        f"    full SDK span, same run: {sdk_us:6.2f} us   (ratio SDK/skewtrace "
        f"{sdk_us / event_us:.1f}x)"
    )
    return {
        "record_event_us": event_us,
        "record_namedtuple_tuple_new_us": per_form["tuple_new"],
        "record_namedtuple_call_us": per_form["class_call"],
        "record_class_head_tuple_us": per_form["class_head"],
        "sdk_span_us": sdk_us,
    }


COLLECTIVE_HOOK_TARGET_US = 5.0
FORWARD_BACKWARD_TARGET_US = 5.0


def median_interval(values: list[float], z: float = 1.96) -> tuple[float, float, float]:
    """The median of ``values`` and a distribution-free ~95% interval for it (the order
    statistics n/2 -/+ z*sqrt(n)/2, from the binomial distribution of values below the
    median): no assumption that a shared machine's noise is normal."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * n**0.5 / 2
    lo = max(0, int(n / 2 - half))
    hi = min(n - 1, int(n / 2 + half + 0.5))
    return statistics.median(ordered), ordered[lo], ordered[hi]


def bench_hook_overhead(n: int, rounds: int, smoke: bool = False) -> dict[str, float]:
    """Per-call cost the hooks add on the training thread, instrumented minus the bare call
    in the same process, in training-thread CPU time (``time.thread_time_ns``: what another
    process does on a shared core is not counted).

    Each round times a block of ``n`` calls of every kind bare and instrumented, in
    alternating order; its difference is one sample, and the figure is the median of the
    rounds with a distribution-free ~95% interval (:func:`median_interval`).

    Collectives run on PyTorch's fake process group (torch.testing._internal's
    FakeProcessGroup): the real c10d dispatcher path and the real process-group hooks, on a
    backend that completes at once, so the bare call is a few microseconds with no thread
    hand-off (gloo's wake-up of its worker thread alone varies by tens of microseconds run to
    run and would drown the figure). An asynchronous work's future is complete when the hook
    asks, so its callback (recording the span's end) runs inline and is counted here; on a
    real backend it runs on a c10d thread. The export thread is held off (a long export
    interval and a buffer for every event): this is what the training thread pays; turning
    events into spans happens later on the export thread."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from torch import nn
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import skewtrace

    os.environ["SKEWTRACE_JOB_ID"] = "overhead-hooks"
    os.environ["SKEWTRACE_NODE_TELEMETRY"] = "false"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.set_num_threads(1)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(2, 4)
    tensor = torch.ones(1)
    world = dist.group.WORLD

    calls: dict[str, Any] = {
        "all_reduce": lambda: dist.all_reduce(tensor),
        "all_reduce_async_wait": lambda: dist.all_reduce(tensor, async_op=True).wait(),
        "functional_all_reduce_wait": lambda: funcol.all_reduce(tensor, "sum", world).wait(),
        "forward": lambda: model(x),
        "forward_backward": lambda: model(x).sum().backward(),
        "optimizer_step": lambda: optimizer.step(),
    }
    targets = {
        "all_reduce": COLLECTIVE_HOOK_TARGET_US,
        "all_reduce_async_wait": COLLECTIVE_HOOK_TARGET_US,
        "functional_all_reduce_wait": COLLECTIVE_HOOK_TARGET_US,
        "forward_backward": FORWARD_BACKWARD_TARGET_US,
    }

    def timed(fn: Any) -> float:
        start = time.thread_time_ns()
        for _ in range(n):
            fn()
        return (time.thread_time_ns() - start) / n / 1e3

    def instrument() -> None:
        skewtrace.instrument(
            model=model,
            optimizer=optimizer,
            tracer_provider=TracerProvider(),
            meter_provider=MeterProvider(),
            buffer_events=16 * n * len(calls) + 16,
            export_interval_millis=3_600_000,
        )

    for fn in calls.values():  # warm up both modes (first calls build caches)
        timed(fn)
    instrument()
    for fn in calls.values():
        timed(fn)
    skewtrace.uninstrument()
    diffs: dict[str, list[float]] = {name: [] for name in calls}
    bare: dict[str, list[float]] = {name: [] for name in calls}
    for index in range(rounds):
        first_plain = index % 2 == 0
        plain: dict[str, float] = {}
        instrumented: dict[str, float] = {}
        for mode_plain in (first_plain, not first_plain):
            if not mode_plain:
                instrument()
            for name, fn in calls.items():
                (plain if mode_plain else instrumented)[name] = timed(fn)
            if not mode_plain:
                skewtrace.uninstrument()
        for name in calls:
            diffs[name].append(instrumented[name] - plain[name])
            bare[name].append(plain[name])
    dist.destroy_process_group()
    result: dict[str, float] = {}
    print(
        f"[1] hooks, added per call on the training thread (thread CPU time over {rounds} "
        f"interleaved rounds of {n} calls: fastest instrumented round minus fastest bare one, "
        "the figure judged, as a quiet machine would see it; then the median of the rounds' "
        "differences and its ~95% interval, as this machine's load saw it; bare call beside it):"
    )
    for name in calls:
        fastest = min(d + b for d, b in zip(diffs[name], bare[name], strict=True)) - min(bare[name])
        median, lo, hi = median_interval(diffs[name])
        result[name] = fastest
        result[f"{name}_median"] = median
        result[f"{name}_ci_low"] = lo
        result[f"{name}_ci_high"] = hi
        result[f"bare_{name}"] = min(bare[name])
        target = targets.get(name)
        judged = ""
        if target is not None:
            word = verdict(fastest <= target, smoke, "OK", "OVER")
            judged = f"  (target <= {target:.1f} us)  {word}"
        print(
            f"    {name:28s} +{fastest:6.2f} us   median +{median:6.2f} [{lo:+6.2f}, {hi:+6.2f}]"
            f"   bare {result[f'bare_{name}']:7.2f} us{judged}"
        )
    return result


# ------------------------------------------------------------------------------ 2. step time


def _ddp_worker(rank: int, world: int, port: int, conf: dict[str, Any], queue: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    os.environ.update(conf["env"])
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    import skewtrace
    from train_ddp import Net, SyntheticDataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    blocks, per_block, batch = conf["blocks"], conf["steps_per_block"], conf["batch_size"]
    dataset = SyntheticDataset(batch * blocks * per_block * world + batch * world, 64, 0)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        drop_last=True,
        sampler=DistributedSampler(dataset, world, rank, shuffle=False),
    )
    model = DistributedDataParallel(Net(64, conf["hidden"], 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    iterator = iter(loader)
    times: dict[str, list[float]] = {"plain": [], "instrumented": []}
    export_cpu_s = 0.0
    instrumented_steps = 0
    events = 0
    for block in range(blocks):
        # Alternate which mode goes first in each pair so neither always follows the other.
        instrumented = (block % 2 == 0) == ((block // 2) % 2 == 0)
        # A/A control: the "instrumented" blocks stay plain, to show the method's noise floor.
        really = instrumented and not conf.get("null_control", False)
        if really:
            skewtrace.instrument(model=model, optimizer=optimizer)
        dist.barrier()
        block_times = []
        last = time.perf_counter()
        for _ in range(per_block):
            inputs, targets = next(iterator)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            reported = loss.detach().clone()
            dist.all_reduce(reported)
            now = time.perf_counter()
            block_times.append(now - last)
            last = now
        if really:
            session = skewtrace.SkewtraceInstrumentor().session
            skewtrace.uninstrument()
            assert session is not None
            export_cpu_s += session.exporter.stats.cpu_ns / 1e9
            events += session.exporter.stats.exported + session.exporter.stats.failed
            instrumented_steps += per_block
        # The first steps of a block absorb the mode switch; keep the steady state.
        times["instrumented" if instrumented else "plain"].extend(block_times[2:])
    dist.destroy_process_group()
    queue.put(
        (rank, dict(times, export_cpu_s=export_cpu_s, steps=instrumented_steps, spans=events))
    )


def bench_step_time(
    endpoint_up: bool, conf: dict[str, Any], null_control: bool = False
) -> dict[str, float]:
    import torch.multiprocessing as mp

    from otlp_sink import OtlpSink

    world = conf["world"]
    sink = OtlpSink().start() if endpoint_up else None
    endpoint = sink.endpoint if sink else f"http://127.0.0.1:{free_port()}"
    conf = dict(
        conf,
        null_control=null_control,
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "SKEWTRACE_JOB_ID": f"overhead-{'up' if endpoint_up else 'down'}",
            "SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS": "1000",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        },
    )
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    try:
        procs = [
            ctx.Process(target=_ddp_worker, args=(r, world, port, conf, queue))
            for r in range(world)
        ]
        for proc in procs:
            proc.start()
        results = dict(queue.get(timeout=900) for _ in range(world))
        for proc in procs:
            proc.join(60)
    finally:
        spans = len(sink.spans()) if sink else 0
        if sink:
            sink.stop()
    # A synchronous job runs at its slowest rank's pace: compare the per-step max over ranks.
    plain = [
        max(r["plain"][i] for r in results.values())
        for i in range(min(len(r["plain"]) for r in results.values()))
    ]
    instr = [
        max(r["instrumented"][i] for r in results.values())
        for i in range(min(len(r["instrumented"]) for r in results.values()))
    ]
    mean_plain, mean_instr = statistics.fmean(plain), statistics.fmean(instr)
    med_plain, med_instr = statistics.median(plain), statistics.median(instr)
    ratio = mean_instr / mean_plain
    ratio_median = med_instr / med_plain
    if null_control:
        print(
            f"[2] A/A control (no block instrumented, same schedule): mean ratio {ratio:.4f},"
            f" median ratio {ratio_median:.4f} (ideal 1.0: anything else is the method's "
            f"noise floor at this load; plain CV {statistics.pstdev(plain) / mean_plain:.2f})"
        )
        return {"ratio": ratio, "median_ratio": ratio_median}
    label = "up  " if endpoint_up else "down"
    cpu_per_step = statistics.fmean(
        r["export_cpu_s"] / max(r["steps"], 1) for r in results.values()
    )
    spans_per_step = statistics.fmean(r["spans"] / max(r["steps"], 1) for r in results.values())
    print(
        f"[2] endpoint {label}: plain {mean_plain * 1e3:6.2f} ms, instrumented "
        f"{mean_instr * 1e3:6.2f} ms per step (mean of {len(plain)}/{len(instr)} steps); "
        f"ratio {ratio:.4f} (target <= {STEP_OVERHEAD_TARGET}) "
        f"{verdict(ratio <= STEP_OVERHEAD_TARGET, conf['smoke'], 'OK', 'OVER TARGET')}; "
        "median ratio "
        f"{ratio_median:.4f}; plain CV {statistics.pstdev(plain) / mean_plain:.2f}"
        + (f"; spans received {spans}" if endpoint_up else "")
    )
    print(
        f"    export thread CPU per rank-step: {cpu_per_step * 1e6:.0f} us for "
        f"{spans_per_step:.1f} spans = {cpu_per_step / med_plain:.2%} of the median plain "
        f"step (target <= 1%)"
    )
    return {
        "plain_mean_s": mean_plain,
        "instrumented_mean_s": mean_instr,
        "ratio": ratio,
        "export_cpu_per_step_s": cpu_per_step,
        "spans_per_step": spans_per_step,
        "median_ratio": ratio_median,
        "spans_received": spans,
    }


# ------------------------------------------------------------------------------ 3. memory


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory_loop(steps: int, on_checkpoint: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    on_checkpoint(None, model, optimizer)
    inputs, targets = torch.randn(4, 8), torch.randint(0, 2, (4,))
    checkpoints = {steps * k // 8 for k in range(1, 9)}
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        dist.all_reduce(torch.ones(1))
        optimizer.step()
        if step in checkpoints:
            on_checkpoint(step, model, optimizer)


def bench_memory(steps: int, buffer_events: int, smoke: bool = False) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import skewtrace

    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"  # down
    os.environ["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
    os.environ["SKEWTRACE_JOB_ID"] = "overhead-memory"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    torch.set_num_threads(1)

    plain: list[tuple[int, int]] = []

    def plain_checkpoint(step: int | None, _model: Any, _optimizer: Any) -> None:
        if step is not None:
            plain.append((step, _rss_bytes()))

    # Baseline in the same process: what RSS does over the same loop without skewtrace.
    _memory_loop(steps, plain_checkpoint)

    samples: list[tuple[int, int, int]] = []
    sessions: list[Any] = []

    def checkpoint(step: int | None, model: Any, optimizer: Any) -> None:
        if step is None:
            skewtrace.instrument(
                model=model,
                optimizer=optimizer,
                buffer_events=buffer_events,
                shutdown_timeout_millis=1000,
            )
            sessions.append(skewtrace.SkewtraceInstrumentor().session)
            return
        samples.append((step, _rss_bytes(), len(sessions[0].recorder.events)))

    _memory_loop(steps, checkpoint)
    dropped = sessions[0].recorder.dropped().get("buffer_full", 0)
    skewtrace.uninstrument()
    dist.destroy_process_group()
    growth_mb = (samples[-1][1] - samples[1][1]) / 2**20
    plain_growth_mb = (plain[-1][1] - plain[1][1]) / 2**20
    max_buffered = max(s[2] for s in samples)
    print(
        f"[3] memory, endpoint down, buffer {buffer_events} events, {steps} steps "
        f"(~{steps * 5} events, {dropped} dropped):"
    )
    for (step, rss, buffered), (_, plain_rss) in zip(samples, plain, strict=True):
        print(
            f"    step {step:7d}: RSS {rss / 2**20:7.1f} MiB (plain run {plain_rss / 2**20:7.1f}"
            f" MiB), buffered events {buffered}"
        )
    bound_ok = max_buffered <= buffer_events
    print(
        f"    RSS growth from 1/4 to the end: instrumented {growth_mb:+.1f} MiB vs plain "
        f"{plain_growth_mb:+.1f} MiB in the same process (target: no growth with run "
        f"length once the buffer is full{'; ' + NOT_JUDGED if smoke else ''}); buffered <= "
        f"capacity: {'OK' if bound_ok else 'VIOLATED'}"
    )
    return {
        "rss_growth_after_quarter_mib": growth_mb,
        "plain_rss_growth_after_quarter_mib": plain_growth_mb,
        "max_buffered": max_buffered,
        "capacity": buffer_events,
        "dropped": dropped,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument(
        "--skip", action="append", default=[], choices=("hot", "ddp", "memory", "fr")
    )
    parser.add_argument("--blocks", type=int, default=None)
    parser.add_argument("--steps-per-block", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    summary: dict[str, Any] = {"loadavg": os.getloadavg(), "cpus": os.cpu_count()}
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start "
        "(figures below are only as steady as this load)"
    )
    smoke = args.smoke
    if "hot" not in args.skip:
        summary["hot_path"] = bench_hot_path(
            2_000 if smoke else 20_000 if args.quick else 200_000, smoke
        )
        summary["hooks"] = bench_hook_overhead(
            50 if smoke else 200 if args.quick else 400,
            2 if smoke else 15 if args.quick else 41,
            smoke,
        )
    if "ddp" not in args.skip:
        conf = {
            # One rank in a smoke run: the same code (DDP, the hooks, the export) at the
            # least process start-up, the most of a smoke run's time.
            "world": 1 if smoke else 4,
            "blocks": args.blocks or (2 if smoke else 4 if args.quick else 10),
            "steps_per_block": args.steps_per_block or (3 if smoke else 10 if args.quick else 30),
            "hidden": args.hidden,
            "batch_size": args.batch_size,
            "smoke": smoke,
        }
        summary["step_time_endpoint_up"] = bench_step_time(True, conf)
        summary["step_time_endpoint_down"] = bench_step_time(False, conf)
        if not (args.quick or smoke):
            summary["step_time_null_control"] = bench_step_time(False, conf, null_control=True)
    if "memory" not in args.skip:
        # The smoke run's buffer still fills (five events a step), so dropping is exercised.
        steps, buffer_events = (
            (400, 256) if smoke else (4_000, 2048) if args.quick else (24_000, 8192)
        )
        summary["memory"] = bench_memory(steps, buffer_events=buffer_events, smoke=smoke)
    if "fr" not in args.skip:
        from overhead_flight_recorder import bench_flight_recorder

        summary["flight_recorder"] = bench_flight_recorder(
            50 if smoke else 500 if args.quick else 3000, smoke
        )
    summary["loadavg_end"] = os.getloadavg()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print("SUMMARY " + json.dumps(summary))
    if "memory" in summary and summary["memory"]["max_buffered"] > summary["memory"]["capacity"]:
        # A bound broken at any size: not a figure of the machine.
        print("FAIL: more events buffered than the buffer holds")
        return 1
    if smoke:
        print(SMOKE_DONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
