"""The Flight Recorder path's overhead (``SKEWTRACE_COLLECTIVES=flight_recorder``), a section of
``benchmarks/overhead.py`` kept in its own file (the Python hooks' sections are edited apart).

Two figures:

- Added per call on the training thread: gloo collectives (one rank, so the bare call is
  gloo's own thread hand-off, about 20-60 us here) with skewtrace reading them from the
  Flight Recorder, against the bare call in the same process, rounds interleaved and each
  mode's fastest round kept. Gloo records every collective to the Flight Recorder whether
  skewtrace is there or not, so what is added is what skewtrace adds: nothing per call but
  the ``Work.wait`` wrapper (kept for point-to-point) and the reader thread's reads, which
  hold the GIL. Target: at most 1 us.
- The reader's own cost: microseconds per read, per entry in the ring, amortized per
  collective it recorded (reads hold the GIL, so the training thread waits for them whenever
  it needs the GIL: the fastest-round figure above misses them, this one does not), and the
  longest another Python thread was kept waiting during one read, at the ring size in use
  (``TORCH_FR_BUFFER_SIZE``).

Run alone: ``python benchmarks/overhead_flight_recorder.py [--quick|--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _smoke import SMOKE_DONE, SMOKE_HELP, verdict  # noqa: E402

FR_CALL_TARGET_US = 1.0


def bench_flight_recorder(n: int, smoke: bool = False, rounds: int = 7) -> dict[str, float]:
    from skewtrace.rank import flight_recorder

    if flight_recorder.api() is None:
        print("[fr] this PyTorch has no Flight Recorder to read: skipped")
        return {}
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(_ENV)
    try:
        return _bench(n, smoke, rounds)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_ENV = {
    "SKEWTRACE_JOB_ID": "overhead-fr",
    "SKEWTRACE_NODE_TELEMETRY": "false",
    "SKEWTRACE_COLLECTIVES": "flight_recorder",
}


def _bench(n: int, smoke: bool, rounds: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import skewtrace
    from skewtrace.rank import flight_recorder

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        torch.set_num_threads(1)
        tensor = torch.ones(1)
        world = dist.group.WORLD
        calls: dict[str, Any] = {
            "all_reduce": lambda: dist.all_reduce(tensor),
            "all_reduce_async_wait": lambda: dist.all_reduce(tensor, async_op=True).wait(),
            "functional_all_reduce_wait": lambda: funcol.all_reduce(tensor, "sum", world).wait(),
        }

        def timed(fn: Any) -> float:
            start = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - start) / n

        plain = dict.fromkeys(calls, float("inf"))
        instrumented = dict(plain)
        reads = read_ns = recorded = lost = 0
        for _ in range(2 if smoke else rounds):
            for name, fn in calls.items():
                plain[name] = min(plain[name], timed(fn))
            skewtrace.instrument(
                tracer_provider=TracerProvider(),
                meter_provider=MeterProvider(),
                buffer_events=16 * n * len(calls) + 16,
                export_interval_millis=3_600_000,
            )
            session = skewtrace.SkewtraceInstrumentor().session
            reader = session.flight_recorder if session is not None else None
            for name, fn in calls.items():
                instrumented[name] = min(instrumented[name], timed(fn))
            skewtrace.uninstrument()
            if session is not None:
                lost += sum(
                    v for k, v in session.recorder.dropped().items() if k.startswith("flight")
                )
            if reader is not None:
                reads += reader.reads
                read_ns += reader.read_ns
                recorded += reader.recorded
        stall = _longest_stall_during_a_read(flight_recorder)
        dist.destroy_process_group()
    added = {name: (instrumented[name] - plain[name]) * 1e6 for name in plain}
    ring = flight_recorder.buffer_size()
    per_read_us = read_ns / reads / 1e3 if reads else 0.0
    print(
        "[fr] Flight Recorder path (SKEWTRACE_COLLECTIVES=flight_recorder, gloo, one rank), "
        "added per call on the training thread (bare call beside it):"
    )
    for name in calls:
        word = verdict(added[name] <= FR_CALL_TARGET_US, smoke, "OK", "OVER")
        print(
            f"    {name:28s} +{added[name]:6.2f} us   bare {plain[name] * 1e6:7.2f} us"
            f"  (target <= {FR_CALL_TARGET_US:.1f} us)  {word}"
        )
    print(
        f"    reader: {reads} reads of a {ring}-entry ring, {per_read_us:.0f} us each "
        f"({per_read_us / max(ring, 1):.1f} us per ring entry, GIL held), "
        f"{recorded} collectives recorded; longest stall of another Python thread during "
        f"one read: {stall * 1e3:.1f} ms"
    )
    amortized = read_ns / 1e3 / recorded if recorded else 0.0
    word = verdict(amortized <= FR_CALL_TARGET_US, smoke, "OK", "OVER")
    print(
        f"    reader, amortized per collective read: {amortized:.2f} us with the GIL held "
        f"(target <= {FR_CALL_TARGET_US:.1f} us)  {word}; {lost} entries overwritten before a "
        "read (counted)"
    )
    return {
        "fr_read_us_per_collective": amortized,
        "fr_lost": lost,
        **{f"fr_{k}": v for k, v in added.items()},
        **{f"fr_bare_{k}": v * 1e6 for k, v in plain.items()},
        "fr_read_us": per_read_us,
        "fr_read_us_per_entry": per_read_us / max(ring, 1),
        "fr_ring_entries": ring,
        "fr_read_stall_ms": stall * 1e3,
    }


def _longest_stall_during_a_read(flight_recorder: Any) -> float:
    """Fill the ring, then time one full read while another thread counts its own gaps."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    for _ in range(flight_recorder.buffer_size()):
        dist.all_reduce(t)
    api = flight_recorder.api()
    stop = threading.Event()
    gaps = [0.0]

    def spin() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last)
            last = now

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.02)
    gaps[0] = 0.0
    flight_recorder.parse_dump(api._dump_fr_trace(True, False, False, "gloo"))
    time.sleep(0.02)
    stop.set()
    thread.join()
    return gaps[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    n = 50 if args.smoke else 500 if args.quick else 3000
    print("SUMMARY " + json.dumps(bench_flight_recorder(n, args.smoke)))
    if args.smoke:
        print(SMOKE_DONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
