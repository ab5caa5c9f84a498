"""Single-process tests of the instrumentation: one gloo rank, spans read from an in-memory
exporter behind a user TracerProvider (the multi-rank, real-OTLP tests are in
test_instrumentation_multiproc.py)."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import skewtrace
from conftest import free_port
from skewtrace import semconv
from skewtrace._ids import step_root_span_id, step_trace_id
from skewtrace.rank._events import PHASE, CollectiveEvent, PhaseEvent, StepEvent, typed
from skewtrace.rank._export.materialize import Identity, SpanMaterializer
from skewtrace.rank._recorder import Recorder
from skewtrace.rank.hooks import MARKER, process_group
from skewtrace.rank.hooks.collectives import COLLECTIVE_FUNCTIONS
from skewtrace.rank.resource import RankInfo, build_resource

pytestmark = pytest.mark.usefixtures("unit_job")


def _ddp_setup(batches: int = 4) -> tuple[DistributedDataParallel, Any, DataLoader[Any]]:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(8 * batches, 8), torch.randint(0, 2, (8 * batches,)))
    return model, optimizer, DataLoader(data, batch_size=8)


def _train(model: nn.Module, optimizer: Any, loader: Any) -> int:
    steps = 0
    for inputs, targets in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        steps += 1
    return steps


# ------------------------------------------------------------------ recorder and materializer


def test_full_buffer_drops_counts_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder(capacity=3)
    with caplog.at_level(logging.WARNING, logger="skewtrace"):
        for i in range(10):
            recorder.record(StepEvent(i, 0, 1))
    assert len(recorder.events) == 3
    assert recorder.dropped() == {"buffer_full": 7}
    assert sum("dropping events" in r.message for r in caplog.records) == 1


def _identity(rank: int) -> Identity:
    return Identity(
        "job-x", rank, build_resource("job-x", RankInfo(rank, rank, 2), host_name="node1")
    )


def test_materializer_builds_the_step_tree() -> None:
    spans = {}
    for rank in (0, 1):
        materializer = SpanMaterializer(_identity(rank), epoch_anchor_ns=1_000)
        spans[rank] = materializer.materialize(
            [
                PhaseEvent(semconv.SPAN_FORWARD, 0, 10, 20, "host", None),
                CollectiveEvent(
                    0, 20, 30, "all_reduce", "default", 2, 0, 64, False, "api", "host", None
                ),
                StepEvent(0, 5, 40),
            ]
        )
    names0 = [s.name for s in spans[0]]
    assert names0 == ["forward", "collective.all_reduce", "train.step", "train.step.root"]
    assert "train.step.root" not in [s.name for s in spans[1]]
    root_id = step_root_span_id("job-x", 0)
    for rank in (0, 1):
        by_name = {s.name: s for s in spans[rank]}
        step = by_name["train.step"]
        assert step.context.trace_id == step_trace_id("job-x", 0)
        assert step.parent is not None and step.parent.span_id == root_id
        for child in ("forward", "collective.all_reduce"):
            assert by_name[child].parent.span_id == step.context.span_id
            assert by_name[child].context.trace_id == step.context.trace_id
        coll = by_name["collective.all_reduce"]
        assert coll.attributes[semconv.COLLECTIVE_SEQ] == 0
        assert coll.attributes[semconv.COLLECTIVE_PG] == "default"
        assert coll.start_time == 20 + 1_000 and coll.end_time == 30 + 1_000
        assert step.resource.attributes[semconv.RANK] == rank
    root = {s.name: s for s in spans[0]}["train.step.root"]
    assert root.context.span_id == root_id and root.parent is None
    assert spans[0][2].context.span_id != spans[1][2].context.span_id


class _FakeCudaTimer:
    def __init__(self) -> None:
        self.resolved: list[tuple[int, float]] = []

    def poll(self) -> list[tuple[int, float]]:
        out, self.resolved = self.resolved, []
        return out


def test_cuda_event_durations_replace_host_durations() -> None:
    """No GPU here: a fake timer stands in for CudaEventTimer's poll()."""
    timer = _FakeCudaTimer()
    materializer = SpanMaterializer(_identity(0), 0, cuda_timer=timer)
    event = PhaseEvent(semconv.SPAN_BACKWARD, 3, 1_000, 2_000, "host", 17)
    assert materializer.materialize([event]) == []  # waits for its CUDA events
    timer.resolved = [(17, 0.5)]
    (span,) = materializer.materialize([])
    assert span.attributes[semconv.TIMING] == "cuda_event"
    assert span.end_time - span.start_time == 500_000_000
    # Unresolved at exit: host times instead of nothing.
    assert materializer.materialize([PhaseEvent("forward", 3, 0, 9, "host", 18)]) == []
    (late,) = materializer.materialize([], final=True)
    assert late.attributes[semconv.TIMING] == "host" and late.end_time - late.start_time == 9


def test_cuda_result_polled_before_its_event_arrives_is_kept() -> None:
    """A pair can resolve between the hook's stop() and its event reaching the buffer; the
    result must wait for the event instead of being lost (the span would then sit pending
    until exit). No GPU here: a fake timer stands in for CudaEventTimer's poll()."""
    timer = _FakeCudaTimer()
    materializer = SpanMaterializer(_identity(0), 0, cuda_timer=timer)
    assert materializer.materialize([PhaseEvent(semconv.SPAN_FORWARD, 3, 0, 9, "host", 30)]) == []
    timer.resolved = [(30, 0.1), (31, 0.25)]  # 31's event is still in the buffer
    (first,) = materializer.materialize([])
    assert first.end_time - first.start_time == 100_000_000
    (second,) = materializer.materialize([PhaseEvent(semconv.SPAN_BACKWARD, 3, 10, 20, "host", 31)])
    assert second.attributes[semconv.TIMING] == "cuda_event"
    assert second.end_time - second.start_time == 250_000_000


def test_failed_forward_gives_its_cuda_pair_back() -> None:
    """No GPU here: a fake timer stands in for CudaEventTimer (start/stop/discard)."""
    from skewtrace.rank.hooks._context import HookContext
    from skewtrace.rank.hooks.module import ModuleHooks

    class _Timer:
        def __init__(self) -> None:
            self.next, self.started, self.stopped, self.discarded = 0, [], [], []

        def start(self, stream: object | None = None) -> int:
            self.next += 1
            self.started.append(self.next)
            return self.next

        def stop(self, handle: int, stream: object | None = None) -> None:
            self.stopped.append(handle)

        def discard(self, handle: int) -> None:
            self.discarded.append(handle)

    class _Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fail = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.fail:
                raise RuntimeError("bad batch")
            return x * 2

    timer = _Timer()
    ctx = HookContext(Recorder(64), cuda_timer=timer)
    model = _Failing()
    hooks = ModuleHooks(ctx, model, use_cuda=True)
    with pytest.raises(RuntimeError):
        model(torch.ones(1))
    model.fail = False
    model(torch.ones(1))
    hooks.remove()
    assert timer.started == [1, 2]
    assert timer.discarded == [1]
    assert timer.stopped == [2]


# ------------------------------------------------------------------ instrument / uninstrument


def _wrapped_state() -> dict[str, Any]:
    state: dict[str, Any] = {}
    if process_group.supported():
        # Collectives are seen by hooks on the groups; only group registration is wrapped.
        state["c10d._register_pg_in_world"] = c10d._register_pg_in_world
    else:
        for name in COLLECTIVE_FUNCTIONS:
            if hasattr(c10d, name):
                state[f"c10d.{name}"] = getattr(c10d, name)
                state[f"dist.{name}"] = getattr(dist, name)
    for name in ("send", "recv", "isend", "irecv", "batch_isend_irecv"):
        state[f"c10d.{name}"] = getattr(c10d, name)
    state["Work.wait"] = c10d.Work.wait
    state["ddp.register_comm_hook"] = DistributedDataParallel.__dict__["register_comm_hook"]
    return state


def test_uninstrument_restores_every_wrapped_function(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    model, optimizer, loader = _ddp_setup()
    before = _wrapped_state()
    loader_class = type(loader)
    module_hooks = (len(model._forward_pre_hooks), len(model._forward_hooks))
    optimizer_hooks = (
        len(optimizer._optimizer_step_pre_hooks),
        len(optimizer._optimizer_step_post_hooks),
    )

    skewtrace.instrument(
        model=model, optimizer=optimizer, dataloader=loader, tracer_provider=memory_provider[0]
    )
    recorder = skewtrace.SkewtraceInstrumentor().session.recorder
    during = _wrapped_state()
    for key, original in before.items():
        assert during[key] is not original, key
        assert getattr(during[key], MARKER) is original, key
    assert type(loader) is not loader_class and isinstance(loader, loader_class)
    assert len(model._forward_pre_hooks) == module_hooks[0] + 1

    skewtrace.uninstrument()
    assert _wrapped_state() == before
    # The group's hooks went with it: even with its recorder forced back on, a collective
    # reaches nothing of the old session.
    recorder.active = True
    recorder.events.clear()
    dist.all_reduce(torch.ones(1))
    assert not recorder.events
    recorder.active = False
    assert type(loader) is loader_class
    assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == module_hooks
    assert (
        len(optimizer._optimizer_step_pre_hooks),
        len(optimizer._optimizer_step_post_hooks),
    ) == optimizer_hooks
    assert not skewtrace.is_instrumented()
    # The model still trains after uninstrument (the DDP hook only forwards now).
    assert _train(model, optimizer, loader) == 4


def test_second_instrument_warns_and_keeps_the_first(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, _ = memory_provider
    skewtrace.instrument(
        tracer_provider=provider, optimizer=torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    )
    session = skewtrace.SkewtraceInstrumentor().session
    with pytest.warns(RuntimeWarning, match="twice"):
        skewtrace.instrument(tracer_provider=provider)
    assert skewtrace.SkewtraceInstrumentor().session is session


def test_custom_tracer_provider_gets_spans_and_global_is_untouched(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = memory_provider
    global_before = trace.get_tracer_provider()
    model, optimizer, loader = _ddp_setup(batches=3)
    skewtrace.instrument(
        model=model, optimizer=optimizer, dataloader=loader, tracer_provider=provider
    )
    assert _train(model, optimizer, loader) == 3
    skewtrace.uninstrument()
    assert trace.get_tracer_provider() is global_before
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    for name in (
        "train.step.root",
        "train.step",
        "dataloader.fetch",
        "forward",
        "backward",
        "optimizer.step",
        "collective.all_reduce",
    ):
        assert name in names, name
    assert names.count("train.step") == 3
    assert all(semconv.STEP in s.attributes for s in spans)
    resource = spans[0].resource.attributes
    assert resource["service.name"] == "my-trainer"  # the user's choice is kept
    assert resource[semconv.JOB_ID] == "unit-job" and resource[semconv.RANK] == 0
    steps = sorted(
        (s for s in spans if s.name == "train.step"), key=lambda s: s.attributes[semconv.STEP]
    )
    assert [s.attributes[semconv.STEP] for s in steps] == [0, 1, 2]
    # Each step starts where the previous one ended.
    for previous, current in itertools.pairwise(steps):
        assert current.start_time == previous.end_time
    fetch0 = min((s for s in spans if s.name == "dataloader.fetch"), key=lambda s: s.start_time)
    assert steps[0].start_time == fetch0.start_time
    ddp = [
        s
        for s in spans
        if s.name == "collective.all_reduce" and s.attributes[semconv.COLLECTIVE_SOURCE] == "ddp"
    ]
    assert ddp and all(s.attributes[semconv.COLLECTIVE_ASYNC] for s in ddp)
    seqs = [s.attributes[semconv.COLLECTIVE_SEQ] for s in spans if s.name.startswith("collective.")]
    assert sorted(seqs) == list(range(len(seqs)))


class _DropStep(Sampler):
    """Drops one step's trace (decided by trace ID, as a ratio sampler would)."""

    def __init__(self, step: int) -> None:
        self.trace_id = step_trace_id("unit-job", step)

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if trace_id == self.trace_id:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "DropStep"


class _CountingProcessor(SpanProcessor):
    def __init__(self) -> None:
        self.started = 0
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def test_custom_sampler_applies_and_on_start_is_not_called(world_of_one: None) -> None:
    """What a user's TracerProvider applies: its sampler (whole steps here, parent-based)
    and its processors' on_end; on_start is never called (spans are built after the fact)."""
    processor = _CountingProcessor()
    provider = TracerProvider(sampler=ParentBased(_DropStep(1)))
    provider.add_span_processor(processor)
    model, optimizer, loader = _ddp_setup(batches=3)
    skewtrace.instrument(
        model=model, optimizer=optimizer, dataloader=loader, tracer_provider=provider
    )
    assert _train(model, optimizer, loader) == 3
    skewtrace.uninstrument()
    provider.shutdown()
    assert processor.started == 0
    by_step: dict[int, set[str]] = {}
    for span in processor.ended:
        by_step.setdefault(span.attributes[semconv.STEP], set()).add(span.name)
    assert sorted(by_step) == [0, 2]
    for names in by_step.values():
        assert {"train.step", "train.step.root", "forward", "backward", "optimizer.step"} <= names


def test_zero_code_keyword_chooses_the_mode(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, _ = memory_provider

    def zero_code_patches() -> tuple[bool, bool]:
        return (
            hasattr(DataLoader.__dict__["__iter__"], MARKER),
            hasattr(DistributedDataParallel.__dict__["__init__"], MARKER),
        )

    skewtrace.instrument(tracer_provider=provider)
    assert zero_code_patches() == (False, False)
    skewtrace.uninstrument()
    skewtrace.instrument(tracer_provider=provider, zero_code=True)
    assert zero_code_patches() == (True, True)
    skewtrace.uninstrument()
    assert zero_code_patches() == (False, False)
    # BaseInstrumentor's contract: no targets is what opentelemetry-instrument does ...
    skewtrace.SkewtraceInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    assert zero_code_patches() == (True, True)
    skewtrace.uninstrument()
    # ... and zero_code=False says otherwise.
    skewtrace.SkewtraceInstrumentor().instrument(
        tracer_provider=provider, zero_code=False, skip_dep_check=True
    )
    assert zero_code_patches() == (False, False)
    skewtrace.uninstrument()


class _FakePacingClient:
    """Stands in for skewtrace.rank.pacing_client.PacingClient (no pacer service in a unit test)."""

    def __init__(self, delay: float, version: int) -> None:
        self.delay, self.version, self.calls = delay, version, 0

    def current_delay(self) -> tuple[float, int]:
        self.calls += 1
        return self.delay, self.version


def _pacing_spans_before(spans: list[Any], names: tuple[str, ...]) -> list[Any]:
    """The pacing.delay spans, each checked to end before the step's first span named in
    ``names`` (a prefix match) starts."""
    pacing = [s for s in spans if s.name == "pacing.delay"]
    for span in pacing:
        assert span.attributes[semconv.PACING_DELAY] == pytest.approx(0.02)
        assert span.attributes[semconv.PACING_VERSION] == 7
        assert (span.end_time - span.start_time) >= 0.018e9
        first = min(
            s.start_time
            for s in spans
            if s.name.startswith(names)
            and s.attributes[semconv.STEP] == span.attributes[semconv.STEP]
        )
        assert span.end_time <= first
    return pacing


def test_pacing_delay_applied_once_per_step_before_forward(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """With a model, the delay goes before its forward: a collective issued before the
    forward (a loss all-reduce after the previous step's gradient sync, where every rank
    arrives together) is not where a paced rank would otherwise wait."""
    provider, exporter = memory_provider
    model, optimizer, loader = _ddp_setup(batches=3)
    client = _FakePacingClient(0.02, 7)
    skewtrace.instrument(
        model=model,
        optimizer=optimizer,
        dataloader=loader,
        tracer_provider=provider,
        pacing_client=client,
    )
    for inputs, targets in loader:
        dist.all_reduce(torch.ones(1))  # before the forward: not delayed
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        dist.all_reduce(torch.ones(1))  # a second collective in the step: no second delay
        optimizer.step()
    skewtrace.uninstrument()
    assert client.calls == 3
    spans = exporter.get_finished_spans()
    pacing = _pacing_spans_before(spans, ("forward",))
    assert [s.attributes[semconv.STEP] for s in pacing] == [0, 1, 2]
    for span in pacing:
        early = [
            s
            for s in spans
            if s.name == "collective.all_reduce"
            and s.attributes[semconv.STEP] == span.attributes[semconv.STEP]
            and s.end_time <= span.start_time
        ]
        assert early, "the all-reduce issued before the forward ran before the delay"


class _HoldingPacingClient(_FakePacingClient):
    """A pacing client with the interleave policy's hold: 0.02 s for the world group."""

    def __init__(self) -> None:
        super().__init__(0.0, 7)
        self.groups: list[list[str]] = []
        self.starts: list[tuple[float, float]] = []  # (the step start set, monotonic then)

    @property
    def step_started_at(self) -> float | None:
        return self.starts[-1][0] if self.starts else None

    @step_started_at.setter
    def step_started_at(self, value: float) -> None:
        self.starts.append((value, time.monotonic()))

    def current_hold(self, groups: list[str]) -> float:
        self.groups.append(list(groups))
        return 0.02 if semconv.DEFAULT_PG_NAME in groups else 0.0


def test_the_interleave_hold_is_applied_for_the_ranks_process_groups(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """A client's hold for the rank's process groups (by the names its collectives carry) is
    applied where a delay is, once per step before forward; before the rank issued any
    collective it knows no group and holds nothing."""
    provider, exporter = memory_provider
    model, optimizer, loader = _ddp_setup(batches=3)
    client = _HoldingPacingClient()
    skewtrace.instrument(
        model=model,
        optimizer=optimizer,
        dataloader=loader,
        tracer_provider=provider,
        pacing_client=client,
    )
    for inputs, targets in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        dist.all_reduce(torch.ones(1))
        optimizer.step()
    skewtrace.uninstrument()
    assert client.groups[0] == [] and client.groups[1:] == [[semconv.DEFAULT_PG_NAME]] * 2
    pacing = _pacing_spans_before(exporter.get_finished_spans(), ("forward",))
    assert [s.attributes[semconv.STEP] for s in pacing] == [1, 2]
    # Each step's start, for the poll's step_age: once per step, in the past, in order (the
    # first step's start is where its first timed event opened it).
    starts = [start for start, _ in client.starts]
    assert len(starts) >= 2 and starts == sorted(starts) and len(set(starts)) == len(starts)
    assert all(start <= set_at for start, set_at in client.starts)


def test_pacing_delay_before_first_collective_without_a_model(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = memory_provider
    _model, optimizer, _loader = _ddp_setup(batches=1)
    client = _FakePacingClient(0.02, 7)
    skewtrace.instrument(optimizer=optimizer, tracer_provider=provider, pacing_client=client)
    for _ in range(3):
        dist.all_reduce(torch.ones(1))
        dist.all_reduce(torch.ones(1))  # a second collective in the step: no second delay
        optimizer.step()
    skewtrace.uninstrument()
    assert client.calls == 3
    pacing = _pacing_spans_before(exporter.get_finished_spans(), ("collective.",))
    assert [s.attributes[semconv.STEP] for s in pacing] == [0, 1, 2]


def test_dataloader_is_instrumented_in_place(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = memory_provider
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=2)
    original_class = type(loader)
    skewtrace.instrument(dataloader=loader, tracer_provider=provider)
    assert isinstance(loader, DataLoader) and len(loader) == 5
    assert [len(batch[0]) for batch in loader] == [2] * 5
    skewtrace.uninstrument()
    assert type(loader) is original_class
    fetches = [s for s in exporter.get_finished_spans() if s.name == "dataloader.fetch"]
    assert len(fetches) == 5


class _AcceleratedLike(torch.optim.Optimizer):
    """Shaped as Accelerate's AcceleratedOptimizer: an Optimizer subclass that never runs
    Optimizer.__init__ and keeps the real one in ``.optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, closure: Any = None) -> Any:
        return self.optimizer.step(closure)


class _ZeroLike:
    """Shaped as DeepSpeed's ZeRO optimizers: no torch Optimizer at all, one inside."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        self.optimizer.step()


@pytest.mark.parametrize("wrapper", [_AcceleratedLike, _ZeroLike])
def test_framework_optimizer_wrappers_are_hooked_at_the_torch_optimizer_inside(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    wrapper: Any,
) -> None:
    provider, exporter = memory_provider
    model = nn.Linear(4, 1)
    wrapped = wrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    skewtrace.instrument(model=model, optimizer=wrapped, tracer_provider=provider)
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        wrapped.step()
    skewtrace.uninstrument()
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("optimizer.step") == 2 and names.count("train.step") == 2, names


def test_an_optimizer_that_is_none_of_these_is_refused_naming_its_type(
    world_of_one: None,
) -> None:
    with pytest.raises(TypeError, match=r"optimizer= must be a torch\.optim\.Optimizer.*object"):
        skewtrace.instrument(optimizer=object())
    assert not skewtrace.SkewtraceInstrumentor().is_instrumented_by_opentelemetry


def test_a_step_with_a_closure_times_the_update_not_the_closure(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """optimizer.step(closure), as Lightning's automatic optimization and LBFGS call it: the
    forward and backward run inside the step; the optimizer.step span starts after them."""
    provider, exporter = memory_provider
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    skewtrace.instrument(model=model, optimizer=optimizer, tracer_provider=provider)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4)).square().mean()
        loss.backward()
        return loss

    losses = [optimizer.step(closure) for _ in range(2)]
    optimizer.step(closure=closure)
    skewtrace.uninstrument()
    assert all(isinstance(loss, torch.Tensor) for loss in losses)  # the closure's result kept
    spans = exporter.get_finished_spans()
    for step in (0, 1, 2):
        of_step = {s.name: s for s in spans if s.attributes.get(semconv.STEP) == step}
        update, backward = of_step["optimizer.step"], of_step["backward"]
        assert update.start_time >= backward.end_time, step


def test_builtin_iterables_are_rejected_with_advice(world_of_one: None) -> None:
    with pytest.raises(TypeError, match="traced_iterable"):
        skewtrace.instrument(dataloader=[1, 2, 3])
    assert not skewtrace.is_instrumented()
    # Nothing stays patched after a failed instrument().
    assert not hasattr(dist.all_reduce, MARKER)


def test_disabled_instrument_is_a_noop(world_of_one: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKEWTRACE_ENABLED", "false")
    skewtrace.instrument(optimizer=torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1))
    assert skewtrace.SkewtraceInstrumentor().session is None
    assert not hasattr(dist.all_reduce, MARKER)


def test_resource_honors_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer-svc")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml,training.rank=99")
    monkeypatch.setenv("SKEWTRACE_SWITCH", "leaf7")
    monkeypatch.setenv("SKEWTRACE_NIC", "mlx5_0")
    attrs = build_resource("job-r", RankInfo(3, 1, 8), host_name="node3").attributes
    assert attrs["service.name"] == "trainer-svc"
    assert attrs["team"] == "ml"
    assert attrs[semconv.RANK] == 3  # ours wins: the collector joins on it
    assert attrs[semconv.LOCAL_RANK] == 1 and attrs[semconv.WORLD_SIZE] == 8
    assert attrs[semconv.SWITCH] == "leaf7" and attrs[semconv.NIC] == "mlx5_0"
    assert attrs[semconv.SERVICE_INSTANCE_ID] == "job-r/3"
    assert attrs[semconv.HOST_NAME] == "node3"
    assert semconv.GPU_UUID not in attrs


def test_default_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    attrs = build_resource("j", RankInfo(0, 0, 1), host_name="h").attributes
    assert attrs["service.name"] == semconv.DEFAULT_SERVICE_NAME


def test_hot_path_record_is_cheap() -> None:
    """A loose bound that catches gross regressions; benchmarks/overhead.py has the target."""
    from skewtrace.rank._recorder import now_ns

    recorder = Recorder(capacity=1 << 20)
    record = recorder.record
    n = 2000
    # The fastest of ten batches: a loaded machine (the full suite on two cores) descheduled
    # one batch of 20,000 for 0.7 s; a regression slows every batch.
    per_event = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        for _ in range(n):
            t0 = now_ns()
            record((PHASE, "forward", 0, t0, now_ns(), "host", None, None))
        per_event = min(per_event, (time.perf_counter() - start) / n)
    assert per_event < 20e-6
    event = typed(recorder.events[0])
    assert isinstance(event, PhaseEvent) and (event.name, event.timing) == ("forward", "host")


def test_unreachable_pacer_fails_open(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """The real HTTP pacing client against a port where nothing listens: no delay, no error."""
    provider, exporter = memory_provider
    model, optimizer, loader = _ddp_setup(batches=2)
    skewtrace.instrument(
        model=model,
        optimizer=optimizer,
        dataloader=loader,
        tracer_provider=provider,
        pacer_url=f"http://127.0.0.1:{free_port()}",
    )
    session = skewtrace.SkewtraceInstrumentor().session
    assert session is not None
    from skewtrace.rank.pacing_client import PacingClient

    assert isinstance(session.ctx.pacer, PacingClient)
    assert session.ctx.pacer.job_id == "unit-job"
    assert _train(model, optimizer, loader) == 2
    skewtrace.uninstrument()
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("train.step") == 2 and "pacing.delay" not in names


def test_example_rejects_malformed_straggler_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py"
    spec = importlib.util.spec_from_file_location("train_ddp", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_ddp", example)  # dataclasses look it up
    spec.loader.exec_module(example)
    parser = example.build_parser()
    args = parser.parse_args(
        [
            "--straggler",
            "1:data:0.2",
            "--straggler",
            "2:compute:0.1",
            "--jitter",
            "1,3:0.03",
            "--jitter-steps",
            "5:10",
        ]
    )
    assert args.straggler[0] == example.Straggler(1, "data", 0.2)
    assert args.jitter == ([1, 3], 0.03) and args.jitter_steps == (5, 10)
    plan = example.rank_plan(args, 1)
    assert plan.data_s == pytest.approx(0.2) and plan.jitter_s == pytest.approx(0.03)
    for bad in (
        ["--straggler", "1:disk:0.2"],
        ["--straggler", "x:data:1"],
        ["--jitter", "1,3"],
        ["--jitter-steps", "9:3"],
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


class _RecordingCudaTimer(_FakeCudaTimer):
    """Stands in for CudaEventTimer (no GPU here): hands out handles, records start/stop."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[int] = []
        self.stopped: list[int] = []

    def start(self, stream: object | None = None) -> int | None:
        self.started.append(len(self.started) + 1)
        return self.started[-1]

    def stop(self, handle: int, stream: object | None = None) -> None:
        self.stopped.append(handle)


class _FakeCudaTensor:
    """A tensor that says it lives on CUDA; the wrapped collective is a stand-in."""

    is_cuda = True

    def numel(self) -> int:
        return 4

    def element_size(self) -> int:
        return 4


def test_sync_collective_on_cuda_is_timed_with_cuda_events(world_of_one: None) -> None:
    """No GPU here: a fake timer and a fake CUDA tensor drive the CUDA branch of the wrapper;
    the materializer then takes the duration from the (fake) resolved events."""
    from skewtrace.rank.hooks._context import HookContext
    from skewtrace.rank.hooks.collectives import COLLECTIVE_FUNCTIONS, _wrap_collective

    timer = _RecordingCudaTimer()
    recorder = Recorder(capacity=16)
    ctx = HookContext(recorder, cuda_timer=timer)
    calls: list[Any] = []
    wrapped = _wrap_collective(
        ctx, lambda *a, **k: calls.append(a), COLLECTIVE_FUNCTIONS["all_reduce"]
    )
    wrapped(_FakeCudaTensor())
    wrapped(_FakeCudaTensor(), async_op=False)
    assert len(calls) == 2 and timer.started == timer.stopped == [1, 2]
    events = list(recorder.events)
    assert [typed(e).cuda_handle for e in events] == [1, 2]
    materializer = SpanMaterializer(_identity(0), 0, cuda_timer=timer)
    assert materializer.materialize(events) == []
    timer.resolved = [(1, 0.25)]
    (span,) = materializer.materialize([])
    assert span.name == "collective.all_reduce"
    assert span.attributes[semconv.TIMING] == "cuda_event"
    assert span.attributes[semconv.COLLECTIVE_BYTES] == 16
    assert span.end_time - span.start_time == 250_000_000
    (late,) = materializer.materialize([], final=True)
    assert late.attributes[semconv.TIMING] == "host"


def test_traced_iterable_for_plain_iterables(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = memory_provider
    assert list(skewtrace.traced_iterable([1, 2])) == [1, 2]  # not instrumented: passthrough
    skewtrace.instrument(tracer_provider=provider)
    assert list(skewtrace.traced_iterable(iter(range(4)))) == [0, 1, 2, 3]
    skewtrace.uninstrument()
    fetches = [s for s in exporter.get_finished_spans() if s.name == "dataloader.fetch"]
    assert len(fetches) == 4


def test_comm_hook_registered_before_instrument_still_runs(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DDP takes one comm hook for life: a hook registered first stays in charge, and its
    own dist.all_reduce calls are traced as source=api."""
    provider, exporter = memory_provider
    model, optimizer, loader = _ddp_setup(batches=2)
    calls = 0

    def user_hook(state, bucket):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return (
            dist.all_reduce(bucket.buffer(), async_op=True)
            .get_future()
            .then(lambda fut: fut.value()[0])
        )

    model.register_comm_hook(None, user_hook)
    with caplog.at_level(logging.WARNING, logger="skewtrace"):
        skewtrace.instrument(
            model=model, optimizer=optimizer, dataloader=loader, tracer_provider=provider
        )
    assert any("already has a communication hook" in r.message for r in caplog.records)
    assert _train(model, optimizer, loader) == 2
    skewtrace.uninstrument()
    assert calls >= 2
    collectives = [s for s in exporter.get_finished_spans() if s.name.startswith("collective.")]
    reduces = [s for s in collectives if s.name == "collective.all_reduce"]
    assert len(reduces) == calls
    assert {s.attributes[semconv.COLLECTIVE_SOURCE] for s in collectives} == {"api"}
    if process_group.supported():
        # Seen at the group, DDP's own C++ collectives show too: after the first step the
        # reducer rebuilds its buckets and broadcasts their layout from rank 0.
        others = {s.name for s in collectives} - {"collective.all_reduce"}
        assert others == {"collective.broadcast"}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_private_exporter_delivers_within_a_second(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """No user provider: skewtrace's own OTLP exporter, per OTEL_EXPORTER_OTLP_PROTOCOL, sends
    to a real receiver while training goes on (the collector joins spans within ~1 s)."""
    from otlp_sink import OtlpSink

    monkeypatch.delenv("SKEWTRACE_EXPORT_INTERVAL_MILLIS")  # the 500 ms default
    with OtlpSink() as sink:
        endpoint = sink.endpoint if protocol == "grpc" else sink.http_endpoint
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        model, optimizer, loader = _ddp_setup(batches=1)
        global_before = trace.get_tracer_provider()
        skewtrace.instrument(model=model, optimizer=optimizer, dataloader=loader)
        assert _train(model, optimizer, loader) == 1
        ended = time.monotonic()
        spans = sink.wait_for_spans(lambda s: any(x.name == "train.step" for x in s), 5.0)
        latency = time.monotonic() - ended
        skewtrace.uninstrument()
        assert trace.get_tracer_provider() is global_before
    assert any(s.name == "train.step" for s in spans)
    assert latency < 1.0, latency
    step = next(s for s in spans if s.name == "train.step")
    assert step.resource[semconv.JOB_ID] == "unit-job"
    assert step.resource["service.name"] == semconv.DEFAULT_SERVICE_NAME


class _KeywordModel(nn.Module):
    """A model called as transformers' models are: tensors as keywords."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (self.embed(input_ids) * attention_mask.unsqueeze(-1)).sum()


def test_forward_spans_carry_their_input_size(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """training.input.size: the elements of the tensors a forward got, positional or keyword,
    from their shapes; a sequence length that varies per step shows in it."""
    provider, exporter = memory_provider
    model = _KeywordModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    skewtrace.instrument(model=model, optimizer=optimizer, tracer_provider=provider)
    lengths = (16, 48, 24)
    for length in lengths:
        ids = torch.randint(0, 32, (2, length))
        optimizer.zero_grad()
        model(input_ids=ids, attention_mask=torch.ones(2, length)).backward()
        optimizer.step()
    skewtrace.uninstrument()
    forwards = sorted(
        (s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_FORWARD),
        key=lambda s: s.attributes[semconv.STEP],
    )
    assert [s.attributes.get(semconv.INPUT_SIZE) for s in forwards] == [2 * 2 * n for n in lengths]
    others = [s for s in exporter.get_finished_spans() if s.name != semconv.SPAN_FORWARD]
    assert others and not any(semconv.INPUT_SIZE in s.attributes for s in others)


class _PerSampleModel(nn.Module):
    """A model given its batch as a list of samples, each run at its own length (the shape of
    variable-length training without padding: tests/work_balance_job.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 4)

    def forward(self, samples: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        return sum((self.embed(t) * m.unsqueeze(-1)).sum() for t, m in samples)


def test_a_batch_given_as_a_list_of_samples_has_its_input_size(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """A batch that is a list of samples (tuples or dicts of tensors) gives its elements too:
    without them a job whose ranks get sequences of varying length this way would never be
    told its data_imbalance (the Collector's evidence without pipeline stages)."""
    from skewtrace.rank.hooks.module import _MAX_SAMPLE_ITEMS, input_size

    provider, exporter = memory_provider
    model = _PerSampleModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    skewtrace.instrument(model=model, optimizer=optimizer, tracer_provider=provider)
    batches = ((5, 9), (30,), (2, 3, 4))
    for lengths in batches:
        samples = [(torch.randint(0, 32, (n,)), torch.ones(n)) for n in lengths]
        optimizer.zero_grad()
        model(samples).backward()
        optimizer.step()
    skewtrace.uninstrument()
    forwards = sorted(
        (s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_FORWARD),
        key=lambda s: s.attributes[semconv.STEP],
    )
    assert [s.attributes.get(semconv.INPUT_SIZE) for s in forwards] == [
        2 * sum(lengths) for lengths in batches
    ]
    # Dicts per sample; non-tensors ignored; past the bound unknown rather than a part.
    tensor = torch.Tensor
    dicts = [{"input_ids": torch.ones(7), "labels": torch.ones(7), "id": 3}]
    assert input_size((dicts,), {}, tensor) == 14
    assert input_size(([(1, "a")],), {"x": [[2.0]]}, tensor) is None
    many = [(torch.ones(1),)] * (_MAX_SAMPLE_ITEMS + 1)
    assert input_size((many,), {}, tensor) is None
    assert input_size((many[:_MAX_SAMPLE_ITEMS],), {}, tensor) == _MAX_SAMPLE_ITEMS
