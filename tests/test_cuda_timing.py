"""The CUDA event pool and the NCCL completion-hook helper.

There is no GPU on the CI machine, so the pool is driven by a fake event class that
models a stream-ordered device: work queued on a stream finishes when the test advances
the device clock, ``query()`` says whether an event's point on its stream has passed,
and ``elapsed_time``/``synchronize`` record a violation if the timer would have had to
wait. The NCCL hook is checked against the installed torch's real API, a real gloo group
(which must be refused), and a fake NCCL group (no NCCL without a GPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
from datetime import timedelta
from typing import Any

import pytest

from skewtrace.rank import _cuda_timing
from skewtrace.rank._cuda_timing import (
    CudaEventTimer,
    NcclWorkTiming,
    cuda_available_for,
    register_nccl_completion_hook,
)


class FakeDevice:
    def __init__(self) -> None:
        self.now = 0.0  # device time in seconds
        self.violations: list[str] = []
        self.default_stream = FakeStream(self)


class FakeStream:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.tail = 0.0  # when the work queued so far finishes

    def enqueue(self, seconds: float) -> None:
        self.tail = max(self.tail, self.device.now) + seconds


class FakeEvent:
    """Stand-in for ``torch.cuda.Event(enable_timing=True)`` (no GPU here)."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at: float | None = None
        self.queries = 0

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self.device.default_stream
        self.at = max(stream.tail, self.device.now)

    def query(self) -> bool:
        self.queries += 1
        return self.at is None or self.device.now >= self.at

    def elapsed_time(self, end_event: FakeEvent) -> float:
        if not (self.query() and end_event.query()):
            self.device.violations.append("elapsed_time before both events completed")
            raise RuntimeError("cudaErrorNotReady")
        assert self.at is not None and end_event.at is not None
        return (end_event.at - self.at) * 1000.0

    def synchronize(self) -> None:
        self.device.violations.append("synchronize")


@pytest.fixture
def device() -> FakeDevice:
    return FakeDevice()


def make_timer(device: FakeDevice, pool_size: int = 8) -> CudaEventTimer:
    return CudaEventTimer(pool_size, event_factory=lambda: FakeEvent(device))


def test_resolves_only_after_the_device_finishes(device: FakeDevice) -> None:
    timer = make_timer(device)
    handle = timer.start()
    assert handle is not None
    device.default_stream.enqueue(0.005)
    timer.stop(handle)
    assert timer.poll() == []
    device.now = 0.003
    assert timer.poll() == []
    device.now = 0.006
    [(resolved, elapsed)] = timer.poll()
    assert resolved == handle
    assert elapsed == pytest.approx(0.005)
    assert timer.poll() == []  # reported once
    assert device.violations == []


def test_pool_exhaustion_returns_none_and_counts(device: FakeDevice) -> None:
    timer = make_timer(device, pool_size=2)
    handles = [timer.start(), timer.start()]
    assert None not in handles
    assert timer.start() is None
    assert timer.start() is None
    assert timer.exhausted == 2
    assert timer.in_flight == 2
    for handle in handles:
        assert handle is not None
        timer.stop(handle)
    assert sorted(h for h, _ in timer.poll()) == sorted(h for h in handles if h is not None)
    assert timer.in_flight == 0
    assert timer.start() is not None  # slots came back


def test_start_and_end_on_different_streams(device: FakeDevice) -> None:
    """The end event may complete before the start event; both must be done."""
    busy, idle = FakeStream(device), FakeStream(device)
    busy.enqueue(0.010)
    timer = make_timer(device)
    handle = timer.start(busy)
    assert handle is not None
    timer.stop(handle, idle)  # idle stream: this event is done at once
    device.now = 0.004
    assert timer.poll() == []
    device.now = 0.011
    assert [h for h, _ in timer.poll()] == [handle]
    assert device.violations == []


def test_unfinished_pairs_stay_pending_while_others_resolve(device: FakeDevice) -> None:
    timer = make_timer(device)
    slow_stream, fast_stream = FakeStream(device), FakeStream(device)
    slow = timer.start(slow_stream)
    slow_stream.enqueue(1.0)
    assert slow is not None
    timer.stop(slow, slow_stream)
    fast = timer.start(fast_stream)
    fast_stream.enqueue(0.001)
    assert fast is not None
    timer.stop(fast, fast_stream)
    device.now = 0.5
    assert [h for h, _ in timer.poll()] == [fast]
    device.now = 2.0
    [(handle, elapsed)] = timer.poll()
    assert (handle, elapsed) == (slow, pytest.approx(1.0))


def test_events_are_created_lazily_and_reused(device: FakeDevice) -> None:
    created: list[FakeEvent] = []

    def factory() -> FakeEvent:
        created.append(FakeEvent(device))
        return created[-1]

    timer = CudaEventTimer(1024, event_factory=factory)
    assert created == []
    for _ in range(50):
        handle = timer.start()
        assert handle is not None
        timer.stop(handle)
        assert len(timer.poll()) == 1
    assert len(created) == 2  # one slot, reused: a pair of events in all


def test_discard_and_misuse(device: FakeDevice) -> None:
    timer = make_timer(device, pool_size=1)
    handle = timer.start()
    assert handle is not None
    timer.discard(handle)  # e.g. forward raised; the slot must come back
    assert timer.in_flight == 0
    again = timer.start()
    assert again is not None and again != handle  # same slot, new handle
    timer.stop(handle)  # stale: must not stop the slot's new user
    assert timer.misused == 1
    timer.stop(again)
    timer.stop(again)  # twice
    timer.stop(99)  # never handed out
    timer.stop(-1)
    timer.discard(again)  # already stopped
    assert timer.misused == 5
    assert [h for h, _ in timer.poll()] == [again]
    assert timer.in_flight == 0


def test_handles_are_never_reused(device: FakeDevice) -> None:
    """A result read after its slot was reused must not be taken for the new user's."""
    timer = make_timer(device, pool_size=1)
    first = timer.start()
    assert first is not None
    timer.stop(first)
    [(resolved, _)] = timer.poll()
    second = timer.start()  # reuses the slot the moment poll() freed it
    assert resolved == first
    assert second is not None and second != first
    timer.stop(second)
    assert [h for h, _ in timer.poll()] == [second]
    handles = set()
    for _ in range(100):
        handle = timer.start()
        assert handle is not None
        handles.add(handle)
        timer.stop(handle)
        timer.poll()
    assert len(handles) == 100


def test_event_errors_are_counted_and_free_the_slot(device: FakeDevice) -> None:
    class BrokenEvent(FakeEvent):
        def query(self) -> bool:
            raise RuntimeError("an illegal memory access was encountered")

    timer = CudaEventTimer(1, event_factory=lambda: BrokenEvent(device))
    handle = timer.start()
    assert handle is not None
    timer.stop(handle)
    assert timer.poll() == []
    assert timer.failed == 1
    assert timer.in_flight == 0


def test_record_failure_falls_back_to_host_timing(device: FakeDevice) -> None:
    class NoDriverEvent(FakeEvent):
        def record(self, stream: FakeStream | None = None) -> None:
            raise RuntimeError("Found no NVIDIA driver on your system")

    timer = CudaEventTimer(4, event_factory=lambda: NoDriverEvent(device))
    assert timer.start() is None
    assert timer.failed == 1
    assert timer.in_flight == 0


def test_default_factory_without_a_gpu() -> None:
    """On this CPU-only machine the real torch.cuda.Event cannot be recorded: start()
    must say so with None (host timing), not raise."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present; the GPU run checks the real events")
    timer = CudaEventTimer()
    assert timer.start() is None
    assert timer.failed == 1


def test_pool_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="pool_size"):
        CudaEventTimer(0)


def test_training_thread_and_poller_thread(device: FakeDevice) -> None:
    """start/stop on one thread, poll on another: every started pair resolves exactly
    once and no slot is lost."""
    device.now = float("inf")  # every recorded event is complete
    timer = make_timer(device, pool_size=64)
    calls = 20000
    started: list[int] = []
    resolved: list[int] = []
    done = threading.Event()

    def poller() -> None:
        while not done.is_set():
            resolved.extend(h for h, _ in timer.poll())
        resolved.extend(h for h, _ in timer.poll())

    thread = threading.Thread(target=poller)
    thread.start()
    try:
        for _ in range(calls):
            handle = timer.start()
            if handle is not None:
                started.append(handle)
                timer.stop(handle)
    finally:
        done.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(started) + timer.exhausted == calls
    assert len(set(started)) == len(started)
    assert len(resolved) == len(started)
    assert sorted(resolved) == sorted(started)
    assert timer.in_flight == 0
    assert timer.failed == timer.misused == 0
    assert device.violations == []


def test_cuda_available_for_cpu_objects() -> None:
    import torch

    assert cuda_available_for(torch.zeros(2)) is False
    assert cuda_available_for(torch.nn.Linear(2, 2)) is False
    assert cuda_available_for(torch.nn.ReLU()) is False  # no parameters at all
    assert cuda_available_for(object()) is False
    assert cuda_available_for(None) is False


# --------------------------------------------------------------------------------------
# NCCL completion hook


def test_installed_torch_has_the_hook_api_we_use() -> None:
    """The API register_nccl_completion_hook codes against, in the installed torch."""
    from torch._C._distributed_c10d import OpType, ProcessGroup, WorkInfo

    assert hasattr(ProcessGroup, "_register_on_completion_hook")
    for name in ("op_type", "seq", "time_started", "time_finished", "active_duration"):
        assert hasattr(WorkInfo, name), name
    assert OpType.ALLREDUCE.name == "ALLREDUCE"


GLOO_SCRIPT = """
import torch.distributed as dist, sys
dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
from skewtrace.rank._cuda_timing import register_nccl_completion_hook
calls = []
print(register_nccl_completion_hook(dist.group.WORLD, calls.append))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_gloo_group_gets_no_hook(port_factory: Any) -> None:
    """A real gloo group (in a child process, to keep this one's c10d state clean)."""
    result = subprocess.run(
        [sys.executable, "-c", GLOO_SCRIPT, f"tcp://127.0.0.1:{port_factory()}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.strip() == "False", result.stderr


class FakeNcclGroup:
    """Stands in for a classic ProcessGroupNCCL (no GPU, so no NCCL here)."""

    def __init__(self, refuse: str | None = None) -> None:
        self.timing = False
        self.refuse = refuse
        self.hook: Any = None

    def _enable_collectives_timing(self) -> None:
        self.timing = True

    def _register_on_completion_hook(self, hook: Any) -> None:
        if self.refuse:
            raise RuntimeError(self.refuse)
        if not self.timing:
            raise ValueError(
                "ProcessGroupNCCL OnCompletion hook requires recording start and end events "
                "which require setting TORCH_NCCL_ENABLE_TIMING environment variable."
            )
        self.hook = hook


def work_info(op: str = "ALLREDUCE") -> types.SimpleNamespace:
    return types.SimpleNamespace(
        op_type=types.SimpleNamespace(name=op),
        seq=7,
        time_started=timedelta(seconds=100.5),
        time_finished=timedelta(seconds=100.625),
        active_duration=timedelta(milliseconds=42),
    )


@pytest.fixture
def nccl_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cuda_timing, "_nccl_backend_name", lambda pg: "nccl")


@pytest.mark.usefixtures("nccl_backend")
def test_hook_turns_on_timing_and_converts_work_info() -> None:
    group = FakeNcclGroup()
    received: list[NcclWorkTiming] = []
    assert register_nccl_completion_hook(group, received.append) is True
    assert group.timing is True
    group.hook(work_info())
    assert received == [
        NcclWorkTiming(
            op_type="ALLREDUCE",
            seq=7,
            started=100.5,
            finished=100.625,
            active_duration=pytest.approx(0.042),
        )
    ]


@pytest.mark.usefixtures("nccl_backend")
def test_hook_without_timing_permission_is_refused() -> None:
    group = FakeNcclGroup()
    assert register_nccl_completion_hook(group, print, enable_timing=False) is False
    assert group.timing is False


@pytest.mark.usefixtures("nccl_backend")
def test_nccl2_backend_refusal_returns_false() -> None:
    group = FakeNcclGroup(refuse="Only ProcessGrouppNCCL supports onCompletion hook, but got nccl2")
    assert register_nccl_completion_hook(group, print) is False


@pytest.mark.usefixtures("nccl_backend")
def test_callback_errors_stay_out_of_c10d() -> None:
    group = FakeNcclGroup()

    def failing(timing: NcclWorkTiming) -> None:
        raise KeyError("bug in the consumer")

    assert register_nccl_completion_hook(group, failing) is True
    group.hook(work_info())  # must not raise into the c10d hook thread


def test_group_without_the_api_returns_false() -> None:
    assert register_nccl_completion_hook(object(), print) is False


# --------------------------------------------------------------------------------------
# On a GPU machine only (skipped on CI): the real events, NVML and NCCL.


def _cuda_ready() -> bool:
    import torch

    return bool(torch.cuda.is_available())


requires_cuda = pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA GPU")


@requires_cuda
def test_real_events_resolve_without_blocking() -> None:
    """A kernel that spins the GPU for a known time: poll() returns at once while it runs,
    resolves it afterwards, and the device duration is the kernel's, not the launch's."""
    import time

    import torch

    # Calibrate GPU spin cycles per second with plain events (synchronize is fine here,
    # in the test, never in the timer).
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_second = 10_000_000 / (begin.elapsed_time(end) / 1000.0)
    spin = 0.2  # seconds of GPU work

    timer = CudaEventTimer(16)
    launch_start = time.perf_counter()
    handle = timer.start()
    torch.cuda._sleep(int(spin * cycles_per_second))
    assert handle is not None
    timer.stop(handle)
    launch = time.perf_counter() - launch_start

    poll_start = time.perf_counter()
    assert timer.poll() == []  # still spinning
    assert time.perf_counter() - poll_start < 0.01  # and poll did not wait for it

    deadline = time.monotonic() + 10
    resolved: list[tuple[int, float]] = []
    while not resolved and time.monotonic() < deadline:
        time.sleep(0.005)
        resolved = timer.poll()
    [(got, elapsed)] = resolved
    assert got == handle
    assert elapsed == pytest.approx(spin, rel=0.2)
    assert launch < spin / 10  # host clocks alone would have measured the launch
    assert cuda_available_for(torch.zeros(1, device="cuda")) is True
    assert cuda_available_for(torch.nn.Linear(2, 2).cuda()) is True


@requires_cuda
def test_real_gpu_attributes_match_torch() -> None:
    import torch

    from skewtrace.rank.topology import gpu_attributes
    from skewtrace.semconv import GPU_NAME, GPU_PCI_BUS_ID, GPU_UUID

    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    attributes = gpu_attributes(0)
    assert str(attributes[GPU_UUID]).endswith(str(props.uuid))
    assert attributes[GPU_NAME] == props.name
    domain, bus, _ = str(attributes[GPU_PCI_BUS_ID]).split(":")
    assert (int(domain, 16), int(bus, 16)) == (props.pci_domain_id, props.pci_bus_id)


NCCL_SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
from skewtrace.rank._cuda_timing import register_nccl_completion_hook
dist.init_process_group("nccl", init_method=sys.argv[1], rank=0, world_size=1,
                        device_id=torch.device("cuda", 0))
received = []
ok = register_nccl_completion_hook(dist.group.WORLD, received.append)
tensor = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(tensor)
torch.cuda.synchronize()
deadline = time.monotonic() + 10
while ok and len(received) < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
print(ok, len(received), [(w.op_type, w.active_duration > 0) for w in received[:1]])
dist.destroy_process_group()
"""


@requires_cuda
@pytest.mark.parametrize(
    ("use_nccl2", "expected_prefix"),
    [("0", "True 3 [('ALLREDUCE', True)]"), ("1", "False 0")],
)
def test_real_nccl_completion_hook(port_factory: Any, use_nccl2: str, expected_prefix: str) -> None:
    """Classic ProcessGroupNCCL gives per-work timing; torch 2.15's default nccl2 does
    not offer it to Python, and the helper must say so."""
    env = {**os.environ, "TORCH_DIST_USE_NCCL2": use_nccl2}
    result = subprocess.run(
        [sys.executable, "-c", NCCL_SCRIPT, f"tcp://127.0.0.1:{port_factory()}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.stdout.strip().startswith(expected_prefix), result.stdout + result.stderr


def test_backend_name_of_a_group_made_by_hand() -> None:
    """A real gloo group built without init_process_group: c10d's registry does not know
    it, its own backend name still says gloo, so no hook."""
    import torch.distributed as dist

    store = dist.HashStore()
    group = dist.ProcessGroupGloo(store, 0, 1)
    assert _cuda_timing._nccl_backend_name(group) == "gloo"
    assert register_nccl_completion_hook(group, print) is False
