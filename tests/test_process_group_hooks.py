"""Collectives seen at the process group (hooks.process_group): whatever API issues them, each
collective the group ran has one span, numbered as the group counts it.

The independent count is the group's own sequence number (``_get_sequence_number_for_group``,
which gloo advances once per collective): a PyTorch release that routes a call around our
hooks fails here instead of losing spans silently. One gloo rank, real c10d.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import skewtrace
from skewtrace import semconv
from skewtrace.rank.hooks import process_group

pytestmark = [
    pytest.mark.usefixtures("unit_job"),
    pytest.mark.skipif(not process_group.supported(), reason="PyTorch without group hooks"),
]


def _every_api(group: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(op, call) for each way a collective reaches a group."""
    t = torch.ones(4)
    out = torch.empty(4 * group.size())
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("all_reduce", lambda: dist.all_reduce(t, group=group)),
        ("all_reduce", lambda: dist.all_reduce(t, group=group, async_op=True).wait()),
        ("all_reduce", lambda: funcol.all_reduce(t, "sum", group).wait()),
        ("all_gather", lambda: dist.all_gather_into_tensor(out, t, group=group)),
        ("reduce_scatter", lambda: dist.reduce_scatter_tensor(t, out, group=group)),
        ("all_gather", lambda: dist.all_gather([torch.empty(4)], t, group=group)),
        ("broadcast", lambda: dist.broadcast(t, group_src=0, group=group)),
        ("barrier", lambda: dist.barrier(group=group)),
        ("all_to_all", lambda: dist.all_to_all_single(torch.empty(4), t, group=group)),
        ("all_reduce", lambda: group.allreduce([t]).wait()),  # the group's own method
    ]
    for name in ("all_gather_single", "reduce_scatter_single"):  # FSDP2's, PyTorch 2.15
        function = getattr(dist, name, None)
        if function is not None:
            op = "all_gather" if name.startswith("all_gather") else "reduce_scatter"
            calls.append((op, lambda f=function: f(torch.empty(4), t, group=group)))
    return calls


def test_functional_collectives_gloo_cannot_end_are_counted_as_dropped(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """On gloo the functional all-gather and reduce-scatter issue coalesced works that have no
    future and never report completion, and their wait is in C++: the span cannot be ended.
    It is not silently lost: instrumentation's end counts it as dropped (NCCL's works have
    futures; there the span ends when the collective does)."""
    provider, exporter = memory_provider
    skewtrace.instrument(tracer_provider=provider)
    recorder = skewtrace.SkewtraceInstrumentor().session.recorder  # type: ignore[union-attr]
    t = torch.ones(4)
    funcol.reduce_scatter_single(t, "sum", 0, dist.group.WORLD).wait()
    funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    spans = _collective_spans(exporter)
    assert [s.attributes[semconv.COLLECTIVE_SEQ] for s in spans] == [1]
    assert recorder.dropped() == {"work_never_waited": 1}


def _collective_spans(exporter: InMemorySpanExporter) -> list[Any]:
    """Every collective span, after uninstrument's final drain."""
    skewtrace.uninstrument()
    return [s for s in exporter.get_finished_spans() if s.name.startswith("collective.")]


@pytest.mark.parametrize("which", ["world", "new_group"])
def test_every_api_gives_one_span_per_collective_the_group_ran(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter], which: str
) -> None:
    provider, exporter = memory_provider
    skewtrace.instrument(tracer_provider=provider)
    # A group made after instrument() is hooked as it is registered.
    group = c10d._get_default_group() if which == "world" else dist.new_group([0])
    before = group._get_sequence_number_for_group()
    calls = _every_api(group)
    for _, call in calls:
        call()
    ran = group._get_sequence_number_for_group() - before
    spans = _collective_spans(exporter)
    name = semconv.DEFAULT_PG_NAME if which == "world" else c10d._get_process_group_name(group)
    mine = [s for s in spans if s.attributes[semconv.COLLECTIVE_PG] == name]
    assert len(mine) == ran == len(calls)
    # In call order: numbered 0..n-1 and named by the op the call made.
    mine.sort(key=lambda s: s.attributes[semconv.COLLECTIVE_SEQ])
    assert [s.attributes[semconv.COLLECTIVE_SEQ] for s in mine] == list(range(len(calls)))
    assert [s.attributes[semconv.COLLECTIVE_OP] for s in mine] == [op for op, _ in calls]
    assert all(s.end_time >= s.start_time for s in mine)


def test_async_work_ends_when_it_completes_not_when_issued(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = memory_provider
    skewtrace.instrument(tracer_provider=provider)
    work = dist.all_reduce(torch.ones(1 << 20), async_op=True)
    work.wait()
    (span,) = _collective_spans(exporter)
    assert span.attributes[semconv.COLLECTIVE_ASYNC] is True
    assert span.attributes[semconv.COLLECTIVE_BYTES] == 4 << 20


def test_a_failing_hook_never_fails_the_collective(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """c10d raises whatever a hook raises: ours swallow their own errors."""
    provider, exporter = memory_provider
    skewtrace.instrument(tracer_provider=provider)
    session_ctx = skewtrace.SkewtraceInstrumentor().session.ctx  # type: ignore[union-attr]

    def broken(_group: Any) -> Any:
        raise RuntimeError("boom")

    group = dist.new_group([0])
    monkeypatch.setattr(session_ctx, "group_state", broken)
    t = torch.ones(2)
    dist.all_reduce(t, group=group)
    assert t.tolist() == [1.0, 1.0]
    assert not [
        s for s in _collective_spans(exporter) if s.attributes[semconv.COLLECTIVE_PG] != "default"
    ]


def test_functions_mode_wraps_the_functions_and_leaves_groups_alone(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SKEWTRACE_COLLECTIVE_HOOKS=functions (and PyTorch before 2.15): torch.distributed
    calls are traced, functional collectives are not."""
    monkeypatch.setenv("SKEWTRACE_COLLECTIVE_HOOKS", "functions")
    provider, exporter = memory_provider
    skewtrace.instrument(tracer_provider=provider)
    assert skewtrace.SkewtraceInstrumentor().session.ctx.process_groups is None  # type: ignore[union-attr]
    t = torch.ones(2)
    dist.all_reduce(t)
    funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    spans = _collective_spans(exporter)
    assert [s.attributes[semconv.COLLECTIVE_SOURCE] for s in spans] == ["api"]


def test_pytorch_without_group_hooks_falls_back_and_says_what_is_missed(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``auto`` on a PyTorch that has no group hooks (simulated: ``supported`` False),
    the functions are wrapped and one warning names what goes untraced."""
    monkeypatch.setattr(process_group, "supported", lambda: False)
    provider, exporter = memory_provider
    with caplog.at_level("WARNING", logger="skewtrace"):
        skewtrace.instrument(tracer_provider=provider)
    assert skewtrace.SkewtraceInstrumentor().session.ctx.process_groups is None  # type: ignore[union-attr]
    warnings = [r.getMessage() for r in caplog.records if "process-group hooks" in r.getMessage()]
    assert len(warnings) == 1 and "functional collectives" in warnings[0], warnings
    dist.all_reduce(torch.ones(2))
    assert len(_collective_spans(exporter)) == 1


def test_ddp_buckets_are_counted_once(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """A DDP bucket goes through skewtrace's comm hook (source ddp); the group hook it then
    reaches does not count it again."""
    provider, exporter = memory_provider
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    skewtrace.instrument(model=model, tracer_provider=provider)
    group = c10d._get_default_group()
    before = group._get_sequence_number_for_group()
    model(torch.ones(2, 4)).sum().backward()
    ran = group._get_sequence_number_for_group() - before
    spans = _collective_spans(exporter)
    assert len(spans) == ran
    assert {s.attributes[semconv.COLLECTIVE_SOURCE] for s in spans} == {"ddp"}
