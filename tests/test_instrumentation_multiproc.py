"""Multi-process tests: real gloo ranks (separate processes, launched like torchrun does)
export over real OTLP/gRPC to tests/otlp_sink.py; the assertions read what arrived.

Run as a script this file is the rank worker: ``--scenario full|unreachable|zero_code``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import needs

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from conftest import free_port  # noqa: E402
from otlp_sink import OtlpSink, ReceivedSpan  # noqa: E402

STEPS = 3
ASYNC_DELAY_S = 0.4
PHASES = ("train.step", "dataloader.fetch", "forward", "backward", "optimizer.step")


# ---------------------------------------------------------------------------- rank side


def _setup_training(seed: int = 0) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)),
        bucket_cap_mb=0.01,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(8 * STEPS, 16), torch.randint(0, 4, (8 * STEPS,)))
    return model, optimizer, DataLoader(data, batch_size=8)


def _rank_full() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn

    import skewtrace

    # Every rank seeds identically, as training scripts do: span IDs must still differ.
    random.seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    subgroup = dist.new_group([0, 1])
    model, optimizer, loader = _setup_training()
    skewtrace.instrument(model=model, optimizer=optimizer, dataloader=loader)

    hook_calls = 0

    # Unannotated: DDP rejects postponed (string) annotations on comm hooks.
    def user_hook(state, bucket):  # type: ignore[no-untyped-def]
        nonlocal hook_calls
        hook_calls += 1
        # Calls the patched dist.all_reduce: must not be traced a second time.
        tensor = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(tensor, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    model.register_comm_hook(None, user_hook)

    async_return_s = 0.0
    for step, (inputs, targets) in enumerate(loader):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        dist.all_reduce(torch.ones(4))
        out = torch.zeros(2 * 4)
        dist.all_gather_into_tensor(out, torch.full((4,), float(rank)))
        dist.broadcast(torch.ones(3), src=0, group=subgroup)
        dist.barrier()
        if step == STEPS - 1:
            if rank == 1:
                time.sleep(ASYNC_DELAY_S)
            start = time.perf_counter()
            work = dist.all_reduce(torch.ones(2), async_op=True)
            async_return_s = time.perf_counter() - start
            work.wait()
        optimizer.step()
    session = skewtrace.SkewtraceInstrumentor().session
    skewtrace.uninstrument()
    assert session is not None
    return {
        "rank": rank,
        "hook_calls": hook_calls,
        "async_return_s": async_return_s,
        "dropped": session.recorder.dropped(),
        "subgroup": str(subgroup.group_name),
    }


def _rank_unreachable(steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn

    import skewtrace

    dist.init_process_group("gloo")
    model, optimizer, _ = _setup_training()
    skewtrace.instrument(model=model, optimizer=optimizer)
    session = skewtrace.SkewtraceInstrumentor().session
    assert session is not None
    done = 0
    for _ in range(steps):
        optimizer.zero_grad()
        inputs, targets = torch.randn(8, 16), torch.randint(0, 4, (8,))
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        time.sleep(0.02)
        done += 1
    start = time.perf_counter()
    skewtrace.uninstrument()
    return {
        "rank": dist.get_rank(),
        "steps": done,
        "uninstrument_s": time.perf_counter() - start,
        "dropped": session.recorder.dropped(),
        "failed": session.exporter.stats.failed,
        "exported": session.exporter.stats.exported,
    }


def _rank_zero_code() -> dict[str, Any]:
    """No skewtrace call at all: opentelemetry-instrument loaded it through the entry point."""
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    model, optimizer, loader = _setup_training()
    for inputs, targets in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        dist.all_reduce(torch.ones(1))
        optimizer.step()
    import skewtrace

    return {"rank": dist.get_rank(), "instrumented": skewtrace.is_instrumented()}


PIPELINE_STEPS = 16
PIPELINE_SLOW_FROM = 7
PIPELINE_SLOW_S = 0.05


def _rank_pipeline() -> dict[str, Any]:
    """Three pipeline stages, two microbatches per step: activations go forward by send/recv
    (microbatch 0) and isend/irecv (microbatch 1), gradients come back by
    batch_isend_irecv. Stage 1 computes PIPELINE_SLOW_S longer from step PIPELINE_SLOW_FROM."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import skewtrace

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    slow = [False]

    class Stage(nn.Sequential):
        # The slow stage's extra time is inside its forward, where compute is measured: a
        # sleep between recv and forward is time no phase explains (cause unknown).
        def forward(self, x: Any) -> Any:
            if slow[0]:
                time.sleep(PIPELINE_SLOW_S)
            return super().forward(x)

    stage = Stage(nn.Linear(32, 32), nn.ReLU())
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    skewtrace.instrument(model=stage, optimizer=optimizer)
    prev, nxt = rank - 1, rank + 1
    for step in range(PIPELINE_STEPS):
        slow[0] = rank == 1 and step >= PIPELINE_SLOW_FROM
        optimizer.zero_grad()
        outputs = []
        for micro in range(2):
            x = torch.randn(8, 32)
            if prev >= 0:
                if micro == 0:
                    dist.recv(x, src=prev)
                else:
                    dist.irecv(x, src=prev).wait()
            y = stage(x)
            outputs.append(y)
            if nxt < world:
                if micro == 0:
                    dist.send(y.detach(), dst=nxt)
                else:
                    dist.isend(y.detach(), dst=nxt).wait()
        grads = [torch.ones(8, 32) for _ in outputs]
        ops = []
        if nxt < world:
            ops += [dist.P2POp(dist.irecv, g, nxt) for g in grads]
        if prev >= 0:
            ops += [dist.P2POp(dist.isend, torch.ones(8, 32), prev) for _ in outputs]
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        sum((y * g).sum() for y, g in zip(outputs, grads, strict=True)).backward()
        optimizer.step()
    skewtrace.uninstrument()
    return {"rank": rank}


def worker_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    if args.scenario == "full":
        result = _rank_full()
    elif args.scenario == "unreachable":
        result = _rank_unreachable(args.steps)
    elif args.scenario == "zero_code":
        result = _rank_zero_code()
    elif args.scenario == "pipeline":
        result = _rank_pipeline()
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------- test side


def launch(
    scenario: str,
    world: int,
    env_extra: dict[str, str],
    *,
    prefix: list[str] | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 120,
) -> list[dict[str, Any]]:
    """Start ``world`` rank processes the way torchrun would and collect their results."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **env_extra,
        )
        command = [
            *(prefix or []),
            sys.executable,
            str(HERE),
            "--scenario",
            scenario,
            *(extra_args or []),
        ]
        procs.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"rank failed ({proc.returncode}):\n{err[-3000:]}"
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            assert lines, f"no result line:\n{out[-2000:]}\n{err[-3000:]}"
            results.append(json.loads(lines[-1][len("RESULT ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return sorted(results, key=lambda r: r["rank"])


def _env(sink: OtlpSink, job: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        "SKEWTRACE_JOB_ID": job,
        "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }


def _rank(span: ReceivedSpan) -> int:
    return int(span.resource["training.rank"])


@pytest.fixture(scope="module")
def full_run() -> tuple[list[dict[str, Any]], list[ReceivedSpan], OtlpSink]:
    job = f"mp-{uuid.uuid4().hex[:8]}"
    with OtlpSink() as sink:
        results = launch("full", 2, _env(sink, job))
        spans = sink.wait_for_spans(
            lambda s: sum(x.name == "train.step" for x in s) >= 2 * STEPS, timeout=10
        )
        return results, [s for s in spans if s.resource.get("training.job.id") == job], sink


@pytest.mark.slow
def test_every_phase_span_is_present_with_attributes(full_run: Any) -> None:
    _, spans, _ = full_run
    for rank in (0, 1):
        mine = [s for s in spans if _rank(s) == rank]
        counts = collections.Counter((s.name, s.attributes["training.step"]) for s in mine)
        for step in range(STEPS):
            for phase in PHASES:
                assert counts[(phase, step)] == 1, (rank, phase, step, counts)
        assert all("training.step" in s.attributes for s in mine)
        resource = mine[0].resource
        assert resource["training.world_size"] == 2 and resource["training.local_rank"] == rank
        assert resource["service.instance.id"].endswith(f"/{rank}")
        for span in mine:
            if span.name.startswith("collective."):
                for key in (
                    "training.collective.op",
                    "training.collective.pg",
                    "training.collective.pg_size",
                    "training.collective.seq",
                    "training.collective.bytes",
                    "training.collective.async",
                    "training.collective.source",
                    "training.timing",
                ):
                    assert key in span.attributes, (span.name, key)
    roots = [s for s in spans if s.name == "train.step.root"]
    assert sorted(s.attributes["training.step"] for s in roots) == list(range(STEPS))
    assert {_rank(s) for s in roots} == {0}


@pytest.mark.slow
def test_same_collective_has_same_pg_and_seq_on_every_rank(full_run: Any) -> None:
    results, spans, _ = full_run
    by_key: dict[tuple[str, int], list[ReceivedSpan]] = collections.defaultdict(list)
    for span in spans:
        if span.name.startswith("collective."):
            key = (
                span.attributes["training.collective.pg"],
                span.attributes["training.collective.seq"],
            )
            by_key[key].append(span)
    assert by_key
    for key, members in by_key.items():
        assert sorted(_rank(s) for s in members) == [0, 1], key
        assert len({s.name for s in members}) == 1, key
        assert len({s.attributes["training.step"] for s in members}) == 1, key
        assert len({s.attributes["training.collective.bytes"] for s in members}) == 1, key
    pgs = {pg for pg, _ in by_key}
    assert "default" in pgs and results[0]["subgroup"] in pgs
    # Sequence numbers have no gaps: nothing was counted without being traced.
    for pg in pgs:
        seqs = sorted(seq for p, seq in by_key if p == pg)
        assert seqs == list(range(len(seqs)))


@pytest.mark.slow
def test_one_trace_per_step_across_ranks_with_unique_span_ids(full_run: Any) -> None:
    _, spans, _ = full_run
    traces = collections.defaultdict(set)
    for span in spans:
        traces[span.attributes["training.step"]].add(span.trace_id)
    assert sorted(traces) == list(range(STEPS))
    assert all(len(ids) == 1 for ids in traces.values()), traces
    assert len({next(iter(ids)) for ids in traces.values()}) == STEPS
    span_ids = [s.span_id for s in spans]
    assert len(span_ids) == len(set(span_ids)), "span IDs collided across ranks"
    root_ids = {
        s.attributes["training.step"]: s.span_id for s in spans if s.name == "train.step.root"
    }
    for span in spans:
        if span.name == "train.step":
            assert span.parent_span_id == root_ids[span.attributes["training.step"]]


@pytest.mark.slow
def test_ddp_buckets_traced_once_and_user_hook_still_runs(full_run: Any) -> None:
    results, spans, _ = full_run
    for result in results:
        rank = result["rank"]
        assert result["hook_calls"] > STEPS  # small buckets: several per step
        ddp = [
            s
            for s in spans
            if _rank(s) == rank and s.attributes.get("training.collective.source") == "ddp"
        ]
        assert len(ddp) == result["hook_calls"]
        assert all(s.attributes["training.collective.async"] for s in ddp)
        api_all_reduce = [
            s
            for s in spans
            if _rank(s) == rank
            and s.name == "collective.all_reduce"
            and s.attributes["training.collective.source"] == "api"
        ]
        # One sync per step plus the final async one: the hook's own all_reduce is not here.
        assert len(api_all_reduce) == STEPS + 1
        assert result["dropped"] == {}


@pytest.mark.slow
def test_async_collective_ends_when_its_work_completes(full_run: Any) -> None:
    results, spans, _ = full_run
    rank0 = results[0]
    async_spans = [
        s
        for s in spans
        if _rank(s) == 0
        and s.name == "collective.all_reduce"
        and s.attributes["training.collective.async"]
        and s.attributes["training.collective.source"] == "api"
    ]
    assert len(async_spans) == 1
    # The call returned at once; the span lasted until rank 1 joined, ~ASYNC_DELAY_S later.
    assert rank0["async_return_s"] < ASYNC_DELAY_S / 2
    assert async_spans[0].duration_s > ASYNC_DELAY_S * 0.6


@pytest.mark.slow
def test_self_metrics_reach_the_receiver(full_run: Any) -> None:
    _, spans, sink = full_run
    exported: dict[int, float] = {}
    for point in sink.metric_points():
        if point.name == "skewtrace.spans.exported":
            rank = int(point.resource["training.rank"])
            exported[rank] = max(exported.get(rank, 0), point.value)
    for rank in (0, 1):
        # The last report comes at uninstrument, after the final span export.
        assert exported.get(rank) == sum(1 for s in spans if _rank(s) == rank), exported


@pytest.mark.slow
def test_unreachable_endpoint_training_completes_and_drops_are_counted() -> None:
    port = free_port()  # nothing listens here
    steps = 40
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "SKEWTRACE_JOB_ID": "unreachable",
        "SKEWTRACE_BUFFER_EVENTS": "32",
        "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "50",
        "SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS": "1500",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
    }
    results = launch("unreachable", 2, env, extra_args=["--steps", str(steps)])
    for result in results:
        assert result["steps"] == steps
        assert result["dropped"].get("buffer_full", 0) > 0, result
        assert result["failed"] > 0, result
        assert result["exported"] == 0
        assert result["uninstrument_s"] < 1.5 + 1.0


@pytest.mark.slow
def test_zero_code_opentelemetry_instrument() -> None:
    instrument_bin = Path(sys.executable).with_name("opentelemetry-instrument")
    if not instrument_bin.exists():
        needs.unavailable("opentelemetry-instrument is not installed in this environment")
    job = f"zc-{uuid.uuid4().hex[:8]}"
    with OtlpSink() as sink:
        results = launch("zero_code", 2, _env(sink, job), prefix=[str(instrument_bin)])
        spans = sink.wait_for_spans(
            lambda s: sum(x.name == "train.step" for x in s) >= 2 * STEPS, timeout=10
        )
    assert all(r["instrumented"] for r in results)
    spans = [s for s in spans if s.resource.get("training.job.id") == job]
    names = collections.Counter((s.name, _rank(s)) for s in spans)
    for rank in (0, 1):
        for name in ("train.step", "dataloader.fetch", "forward", "backward", "optimizer.step"):
            assert names[(name, rank)] == STEPS, (name, rank, names)
        assert names[("collective.all_reduce", rank)] > STEPS  # buckets + explicit calls
    sources = {
        s.attributes.get("training.collective.source")
        for s in spans
        if s.name.startswith("collective.")
    }
    assert sources == {"api", "ddp"}


if __name__ == "__main__":
    worker_main()
