"""Node telemetry: sources read from a fake /proc and /sys tree, a stand-in NVML, a real
qdisc in a namespace of the test's own, and its start and stop with the instrumentation.

Metrics are read with the SDK's InMemoryMetricReader, through the same observable
instruments and MeterProvider path that exports them over OTLP in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.metrics import _internal as metrics_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

import skewtrace
from skewtrace import semconv
from skewtrace.rank._events import PHASE, STEP
from skewtrace.rank.config import ConfigError, Settings
from skewtrace.rank.instrumentor import SkewtraceInstrumentor
from skewtrace.rank.telemetry import FetchCountingRecorder, NodeTelemetry
from skewtrace.rank.telemetry.gpu import GpuSampler
from skewtrace.rank.telemetry.qdisc import BacklogAverager, QdiscStats
from skewtrace.rank.telemetry.storage import ProcessTreeIO

REPO_ROOT = Path(__file__).resolve().parent.parent

Points = dict[str, dict[frozenset[tuple[str, Any]], Any]]


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


TCP_FIELDS = (
    "RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets "
    "CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts"
)
SNMP = (
    "Ip: Forwarding DefaultTTL InReceives\nIp: 1 64 1000\n"
    f"Tcp: {TCP_FIELDS}\nTcp: 1 200 120000 -1 10 5 0 0 3 5000 4000 {{retrans}} 0 2\n"
    "Udp: InDatagrams NoPorts\nUdp: 7 0\n"
)

DISKSTATS = """\
   7       0 loop0 96 0 12288 10 0 0 0 0 0 12 10 0 0 0 0 0 0
   1       0 ram0 5 0 10 0 0 0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda {sda_reads} 3 2000 1500 40 1 800 2500 0 900 4000 0 0 0 0 0 0
   8       1 sda1 50 3 1000 700 20 1 400 1200 0 400 1900 0 0 0 0 0 0
"""


def fake_tree(root: Path, *, retrans: int = 17, sda_reads: int = 100) -> None:
    """A node with eth0 (and lo), one RDMA port, TCP, two block devices and a worker."""
    for direction, base in (("rx", 1000), ("tx", 2000)):
        for offset, statistic in enumerate(("bytes", "packets", "errors", "dropped")):
            _write(
                root, f"sys/class/net/eth0/statistics/{direction}_{statistic}", f"{base + offset}\n"
            )
            _write(root, f"sys/class/net/lo/statistics/{direction}_{statistic}", "5\n")
    _write(root, "sys/class/net/eth0/speed", "25000\n")  # 25 Gbit/s
    _write(root, "sys/class/net/lo/speed", "10\n")  # the loopback: never read
    port = "sys/class/infiniband/mlx5_0/ports/1"
    _write(root, f"{port}/counters/port_xmit_wait", "7\n")
    _write(root, f"{port}/counters/symbol_error", "1\n")
    _write(root, f"{port}/counters/port_rcv_data", "123456\n")
    _write(root, f"{port}/hw_counters/np_cnp_sent", "3\n")
    _write(root, f"{port}/hw_counters/out_of_sequence", "2\n")
    _write(root, f"{port}/hw_counters/vendor_new_counter", "9\n")
    _write(root, f"{port}/hw_counters/lifespan", "12\n")
    _write(root, "proc/net/snmp", SNMP.format(retrans=retrans))
    _write(root, "proc/diskstats", DISKSTATS.format(sda_reads=sda_reads))
    for device in ("sda", "loop0", "ram0"):
        (root / "sys/block" / device).mkdir(parents=True, exist_ok=True)
    _write(root, "proc/self/io", "rchar: 1\nread_bytes: 4096\nwrite_bytes: 512\n")
    _write(root, "proc/self/task/100/children", "200 ")
    _write(root, "proc/self/task/101/children", "")
    _write(root, "proc/200/io", "read_bytes: 8192\nwrite_bytes: 0\n")
    _write(root, "proc/200/task/200/children", "")


def rank_resource(local_rank: int = 0, **extra: Any) -> Resource:
    return Resource.create(
        {
            semconv.JOB_ID: "job-1",
            semconv.RANK: 3 + local_rank,
            semconv.LOCAL_RANK: local_rank,
            semconv.HOST_NAME: "node7",
            **extra,
        }
    )


def collect(reader: InMemoryMetricReader) -> tuple[Points, dict[str, str], Resource | None]:
    """{metric: {attributes: value}}, {metric: unit}, and the resource of what was read."""
    points: Points = {}
    units: dict[str, str] = {}
    resource = None
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        resource = resource_metrics.resource
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                units[metric.name] = metric.unit or ""
                points[metric.name] = {
                    frozenset(p.attributes.items()): p.value for p in metric.data.data_points
                }
    return points, units, resource


def attrs(**items: Any) -> frozenset[tuple[str, Any]]:
    return frozenset(items.items())


NO_QDISCS: list[QdiscStats] = []


@pytest.fixture
def started() -> Iterator[Any]:
    """Start a NodeTelemetry on a fresh in-memory reader; shut down afterwards."""
    made: list[NodeTelemetry] = []

    def start(root: Path, resource: Resource | None = None, **kwargs: Any) -> InMemoryMetricReader:
        reader = InMemoryMetricReader()
        kwargs.setdefault("qdisc_reader", lambda: list(NO_QDISCS))
        kwargs.setdefault("nvml_loader", lambda: None)
        telemetry = NodeTelemetry(interval_s=1.0, root=str(root), reader=reader, **kwargs)
        telemetry.start(resource or rank_resource())
        made.append(telemetry)
        return reader

    yield start, made
    for telemetry in made:
        telemetry.shutdown(1000)


def test_node_sources_exact_values_and_attributes(tmp_path: Path, started: Any) -> None:
    fake_tree(tmp_path)
    start, made = started
    qdiscs = [QdiscStats("eth0", "tbf", 4, 9, 1500), QdiscStats("lo", "noqueue", 0, 0, 0)]
    reader = start(tmp_path, qdisc_reader=lambda: qdiscs)
    points, units, resource = collect(reader)

    assert resource is not None
    assert resource.attributes[semconv.RANK] == 3
    assert resource.attributes[semconv.HOST_NAME] == "node7"
    eth0_rx = attrs(**{semconv.NETWORK_INTERFACE: "eth0", semconv.NETWORK_DIRECTION: "receive"})
    eth0_tx = attrs(**{semconv.NETWORK_INTERFACE: "eth0", semconv.NETWORK_DIRECTION: "transmit"})
    assert points[semconv.METRIC_NETWORK_IO] == {eth0_rx: 1000, eth0_tx: 2000}
    assert points[semconv.METRIC_NETWORK_PACKETS] == {eth0_rx: 1001, eth0_tx: 2001}
    assert points[semconv.METRIC_NETWORK_ERRORS] == {eth0_rx: 1002, eth0_tx: 2002}
    assert points[semconv.METRIC_NETWORK_DROPPED] == {eth0_rx: 1003, eth0_tx: 2003}

    def port(counter: str, signal: str) -> frozenset[tuple[str, Any]]:
        return attrs(
            **{
                semconv.NIC_DEVICE: "mlx5_0",
                semconv.NIC_PORT: 1,
                semconv.NIC_COUNTER: counter,
                semconv.NIC_SIGNAL: signal,
            }
        )

    assert points[semconv.METRIC_NIC_PORT_COUNTER] == {
        port("port_xmit_wait", semconv.NIC_SIGNAL_XMIT_WAIT): 7,
        port("symbol_error", semconv.NIC_SIGNAL_LINK_ERROR): 1,
        port("port_rcv_data", semconv.NIC_SIGNAL_TRAFFIC): 123456,
        port("np_cnp_sent", semconv.NIC_SIGNAL_CONGESTION): 3,
        port("out_of_sequence", semconv.NIC_SIGNAL_RETRANSMIT): 2,
        port("vendor_new_counter", semconv.NIC_SIGNAL_OTHER): 9,
    }
    assert points[semconv.METRIC_TCP_RETRANSMITS] == {frozenset(): 17}
    # The link's speed, Mbit/s as bytes per second (issue 25: what a NIC that trained down
    # shows).
    assert points[semconv.METRIC_NETWORK_SPEED] == {
        attrs(**{semconv.NETWORK_INTERFACE: "eth0"}): 25000 * 1e6 / 8
    }

    tbf = attrs(**{semconv.NETWORK_INTERFACE: "eth0", semconv.QDISC_KIND: "tbf"})
    assert points[semconv.METRIC_QDISC_DROPS] == {tbf: 4}
    assert points[semconv.METRIC_QDISC_OVERLIMITS] == {tbf: 9}
    assert points[semconv.METRIC_QDISC_BACKLOG] == {tbf: 1500}

    def disk(device: str, direction: str) -> frozenset[tuple[str, Any]]:
        return attrs(**{semconv.SYSTEM_DEVICE: device, semconv.DISK_DIRECTION: direction})

    # sda1 is a partition (not in /sys/block), ram0 a RAM disk: both left out.
    assert points[semconv.METRIC_DISK_IO] == {
        disk("loop0", "read"): 12288 * 512,
        disk("loop0", "write"): 0,
        disk("sda", "read"): 2000 * 512,
        disk("sda", "write"): 800 * 512,
    }
    assert points[semconv.METRIC_DISK_OPERATIONS][disk("sda", "read")] == 100
    assert points[semconv.METRIC_DISK_OPERATIONS][disk("sda", "write")] == 40
    assert points[semconv.METRIC_DISK_OPERATION_TIME][disk("sda", "read")] == pytest.approx(1.5)
    assert points[semconv.METRIC_DISK_OPERATION_TIME][disk("sda", "write")] == pytest.approx(2.5)

    # The rank's own I/O plus its worker's (pid 200).
    assert points[semconv.METRIC_PROCESS_IO] == {
        attrs(**{semconv.DISK_DIRECTION: "read"}): 4096 + 8192,
        attrs(**{semconv.DISK_DIRECTION: "write"}): 512,
    }
    assert units[semconv.METRIC_NETWORK_IO] == "By"
    assert units[semconv.METRIC_DISK_OPERATION_TIME] == "s"
    assert units[semconv.METRIC_QDISC_BACKLOG] == "By"
    assert made[0].failures == {}


def test_counters_going_up_show_in_the_next_collection(tmp_path: Path, started: Any) -> None:
    fake_tree(tmp_path)
    start, _ = started
    reader = start(tmp_path)
    first, _, _ = collect(reader)
    fake_tree(tmp_path, retrans=25, sda_reads=130)
    _write(tmp_path, "sys/class/net/eth0/statistics/tx_bytes", "9000\n")
    second, _, _ = collect(reader)

    assert first[semconv.METRIC_TCP_RETRANSMITS] == {frozenset(): 17}
    assert second[semconv.METRIC_TCP_RETRANSMITS] == {frozenset(): 25}
    eth0_tx = attrs(**{semconv.NETWORK_INTERFACE: "eth0", semconv.NETWORK_DIRECTION: "transmit"})
    assert second[semconv.METRIC_NETWORK_IO][eth0_tx] == 9000
    sda_reads = attrs(**{semconv.SYSTEM_DEVICE: "sda", semconv.DISK_DIRECTION: "read"})
    assert second[semconv.METRIC_DISK_OPERATIONS][sda_reads] == 130


def test_each_source_is_read_once_per_collection(tmp_path: Path, started: Any) -> None:
    fake_tree(tmp_path)
    start, _ = started
    dumps: list[int] = []

    def qdiscs() -> list[QdiscStats]:
        dumps.append(1)
        return [QdiscStats("eth0", "tbf", len(dumps), 0, 0)]

    reader = start(tmp_path, qdisc_reader=qdiscs)
    collect(reader)
    points, _, _ = collect(reader)
    # Three instruments read the dump; two collections made two dumps, not six.
    assert len(dumps) == 2
    tbf = attrs(**{semconv.NETWORK_INTERFACE: "eth0", semconv.QDISC_KIND: "tbf"})
    assert points[semconv.METRIC_QDISC_DROPS] == {tbf: 2}


def test_other_local_ranks_sample_only_their_own(tmp_path: Path, started: Any) -> None:
    fake_tree(tmp_path)
    start, _ = started
    points, _, _ = collect(start(tmp_path, rank_resource(local_rank=1)))
    assert semconv.METRIC_PROCESS_IO in points
    for node_metric in (
        semconv.METRIC_NETWORK_IO,
        semconv.METRIC_NIC_PORT_COUNTER,
        semconv.METRIC_TCP_RETRANSMITS,
        semconv.METRIC_QDISC_DROPS,
        semconv.METRIC_DISK_IO,
    ):
        assert node_metric not in points


def test_bad_input_skips_and_counts_the_source(tmp_path: Path, started: Any) -> None:
    fake_tree(tmp_path)
    _write(tmp_path, "proc/net/snmp", "Tcp: RtoAlgorithm RetransSegs\nTcp: 1 many\n")
    _write(tmp_path, "sys/class/net/eth0/statistics/rx_bytes", "garbage\n")
    _write(tmp_path, "proc/diskstats", "   8 0 sda not numbers at all 1 2 3 4 5 6 7 8 9\n")
    import shutil

    shutil.rmtree(tmp_path / "sys/class/infiniband")
    start, made = started

    def broken_dump() -> list[QdiscStats]:
        raise OSError("netlink refused")

    points, _, _ = collect(start(tmp_path, qdisc_reader=broken_dump))

    eth0_rx = attrs(**{semconv.NETWORK_INTERFACE: "eth0", semconv.NETWORK_DIRECTION: "receive"})
    eth0_tx = attrs(**{semconv.NETWORK_INTERFACE: "eth0", semconv.NETWORK_DIRECTION: "transmit"})
    # The garbled file costs its own series only.
    assert points[semconv.METRIC_NETWORK_IO] == {eth0_tx: 2000}
    assert points[semconv.METRIC_NETWORK_PACKETS][eth0_rx] == 1001
    assert semconv.METRIC_TCP_RETRANSMITS not in points
    assert semconv.METRIC_QDISC_DROPS not in points
    assert semconv.METRIC_DISK_IO not in points
    # No RDMA on a node is not a failure; the rank's own sources still report.
    assert semconv.METRIC_NIC_PORT_COUNTER not in points
    assert semconv.METRIC_PROCESS_IO in points
    assert made[0].failures == {"interfaces": 1, "tcp": 1, "qdisc": 1, "disks": 1}


def test_missing_proc_file_is_counted_not_raised(tmp_path: Path, started: Any) -> None:
    start, made = started
    points, _, _ = collect(start(tmp_path))  # an empty root: nothing exists
    assert points == {}
    assert set(made[0].failures) == {"interfaces", "link_speed", "tcp", "disks", "process_io"}


def test_process_io_stays_monotonic_when_a_worker_exits(tmp_path: Path) -> None:
    fake_tree(tmp_path)
    tree = ProcessTreeIO(str(tmp_path))
    assert tree.read().read_bytes == 4096 + 8192
    # The worker exits; a new one (pid 300) starts for the next epoch.
    _write(tmp_path, "proc/self/task/100/children", "300")
    _write(tmp_path, "proc/300/io", "read_bytes: 100\nwrite_bytes: 0\n")
    (tmp_path / "proc/200/io").unlink()
    assert tree.read().read_bytes == 4096 + 8192 + 100


# ---------------------------------------------------------------------- GPU, with a fake NVML


class FakeNvml:
    """A stand-in for ``pynvml``: there is no GPU on the machines these tests run on, so the
    sampler is checked against what NVML's Python binding returns and raises."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    class NVMLError_NotSupported(NVMLError):
        def __init__(self) -> None:
            super().__init__(3)

    class NVMLError_Timeout(NVMLError):
        def __init__(self) -> None:
            super().__init__(10)

    class _Utilization:
        gpu = 87
        memory = 40

    class _Memory:
        used = 30 * 2**30
        total = 80 * 2**30

    class _Event:
        def __init__(self, xid: int) -> None:
            self.eventData = xid

    def __init__(self) -> None:
        self.reasons = 0x4 | 0x40  # sw power cap, hw thermal slowdown
        self.pcie_kb_per_s = {0: 1000, 1: 2000}  # TX, RX
        self.events: list[FakeNvml._Event] = []
        self.calls: dict[str, int] = {}
        self.shut = False

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        assert uuid == "GPU-1234"
        return "handle"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return self._Utilization()

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return self._Memory()

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        assert clock == 1  # NVML_CLOCK_SM
        return 1410

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        return self.reasons

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 312_500  # milliwatts

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        return 71

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        assert counter == 0  # NVML_VOLATILE_ECC
        return {0: 5, 1: 0}[kind]

    def nvmlDeviceGetPcieThroughput(self, handle: str, counter: int) -> int:
        return self.pcie_kb_per_s[counter]

    def nvmlDeviceGetFieldValues(self, handle: str, fields: list[int]) -> Any:
        self._count("nvlink")
        raise self.NVMLError_NotSupported()

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, events: str) -> None:
        assert types & 0x8  # xid critical errors

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never block the sample
        if not self.events:
            raise self.NVMLError_Timeout()
        return self.events.pop(0)

    def nvmlEventSetFree(self, events: str) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_gpu_metrics_from_nvml(tmp_path: Path, started: Any) -> None:
    fake_tree(tmp_path)
    start, made = started
    nvml = FakeNvml()
    clock = FakeClock()
    nvml.events.append(FakeNvml._Event(79))
    reader = start(
        tmp_path,
        rank_resource(local_rank=1, **{semconv.GPU_UUID: "GPU-1234"}),
        nvml_loader=lambda: nvml,
        clock=clock,
    )
    first, units, _ = collect(reader)
    clock.now += 2.0
    second, _, _ = collect(reader)

    gpu = attrs(**{semconv.GPU_UUID: "GPU-1234"})
    assert first[semconv.METRIC_GPU_UTILIZATION] == {gpu: pytest.approx(0.87)}
    assert first[semconv.METRIC_GPU_MEMORY_USAGE] == {gpu: 30 * 2**30}
    assert first[semconv.METRIC_GPU_SM_CLOCK] == {gpu: pytest.approx(1.41e9)}
    assert first[semconv.METRIC_GPU_POWER] == {gpu: pytest.approx(312.5)}
    assert first[semconv.METRIC_GPU_TEMPERATURE] == {gpu: 71}
    reason = semconv.GPU_THROTTLE_REASON
    assert first[semconv.METRIC_GPU_THROTTLE] == {
        attrs(**{semconv.GPU_UUID: "GPU-1234", reason: "sw_power_cap"}): 1,
        attrs(**{semconv.GPU_UUID: "GPU-1234", reason: "hw_thermal_slowdown"}): 1,
        attrs(**{semconv.GPU_UUID: "GPU-1234", reason: "hw_slowdown"}): 0,
        attrs(**{semconv.GPU_UUID: "GPU-1234", reason: "sw_thermal_slowdown"}): 0,
        attrs(**{semconv.GPU_UUID: "GPU-1234", reason: "hw_power_brake_slowdown"}): 0,
        attrs(**{semconv.GPU_UUID: "GPU-1234", reason: "sync_boost"}): 0,
    }
    assert first[semconv.METRIC_GPU_ECC_ERRORS] == {
        attrs(**{semconv.GPU_UUID: "GPU-1234", semconv.ERROR_TYPE: "corrected"}): 5,
        attrs(**{semconv.GPU_UUID: "GPU-1234", semconv.ERROR_TYPE: "uncorrected"}): 0,
    }
    # One XID event: counted once, and still once a collection later.
    xid79 = attrs(**{semconv.GPU_UUID: "GPU-1234", semconv.GPU_XID_CODE: 79})
    assert first[semconv.METRIC_GPU_XID] == {xid79: 1}
    assert second[semconv.METRIC_GPU_XID] == {xid79: 1}
    # PCIe: nothing before the first interval, then KB/s x 1024 x 2 s.
    tx = attrs(**{semconv.GPU_UUID: "GPU-1234", semconv.NETWORK_DIRECTION: "transmit"})
    rx = attrs(**{semconv.GPU_UUID: "GPU-1234", semconv.NETWORK_DIRECTION: "receive"})
    assert first[semconv.METRIC_GPU_PCIE_IO] == {tx: 0, rx: 0}
    assert second[semconv.METRIC_GPU_PCIE_IO] == {tx: 1000 * 1024 * 2, rx: 2000 * 1024 * 2}
    # NVLink is NotSupported on this GPU: no series, no failure, and not asked again.
    assert semconv.METRIC_GPU_NVLINK_IO not in second
    assert nvml.calls["nvlink"] == 1
    assert made[0].failures == {}
    assert units[semconv.METRIC_GPU_SM_CLOCK] == "Hz"
    assert units[semconv.METRIC_GPU_TEMPERATURE] == "Cel"
    made[0].shutdown(1000)
    assert nvml.shut


def test_gpu_throttle_reasons_follow_the_bitmask() -> None:
    nvml = FakeNvml()
    sampler = GpuSampler(nvml, "GPU-1234", on_error=lambda call, error: None)
    nvml.reasons = 0x8 | 0x10 | 0x80
    throttled = {reason for reason, on in sampler.read().throttle.items() if on}
    assert throttled == {"hw_slowdown", "sync_boost", "hw_power_brake_slowdown"}
    nvml.reasons = 0
    assert not any(sampler.read().throttle.values())


def test_nvml_errors_other_than_not_supported_are_counted_and_retried() -> None:
    nvml = FakeNvml()
    errors: list[str] = []
    sampler = GpuSampler(nvml, "GPU-1234", on_error=lambda call, error: errors.append(call))

    def unknown(handle: str) -> int:
        raise nvml.NVMLError(999)

    nvml.nvmlDeviceGetPowerUsage = unknown  # type: ignore[method-assign]
    assert sampler.read().power_w is None
    assert sampler.read().power_w is None
    assert errors == ["power", "power"]  # asked again each sample: it may come back
    assert "power" not in sampler.unsupported


def test_gpu_telemetry_off_without_nvml(tmp_path: Path, started: Any) -> None:
    start, _ = started
    reader = start(
        tmp_path,
        rank_resource(local_rank=1, **{semconv.GPU_UUID: "GPU-1234"}),
        nvml_loader=lambda: None,
    )
    points, _, _ = collect(reader)
    assert not any(name.startswith(("hw.gpu", "training.gpu")) for name in points)


# ---------------------------------------------------------------------- data loader


def test_dataloader_wait_is_summed_as_events_are_drained() -> None:
    recorder = FetchCountingRecorder(16)
    recorder.record((PHASE, semconv.SPAN_DATALOADER_FETCH, 0, 1_000, 251_000, None, None, None))
    recorder.record((PHASE, semconv.SPAN_FORWARD, 0, 251_000, 900_000, None, None, None))
    recorder.record((STEP, 0, 0, 1_000_000))
    recorder.record(
        (PHASE, semconv.SPAN_DATALOADER_FETCH, 1, 1_000_000, 1_500_000, None, None, None)
    )
    assert recorder.fetches == 0  # nothing counted on the recording side
    assert len(recorder.drain(100)) == 4
    assert recorder.fetches == 2
    assert recorder.fetch_wait_ns == 250_000 + 500_000


# ---------------------------------------------------------------------- settings


def test_settings_defaults_and_variables() -> None:
    assert Settings().node_telemetry is True
    assert Settings().node_telemetry_interval_s == 1.0
    assert Settings().node_telemetry_root == "/"
    settings = Settings.from_env(
        {
            "SKEWTRACE_NODE_TELEMETRY": "off",
            "SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS": "250",
            "SKEWTRACE_NODE_TELEMETRY_ROOT": "/tmp/fake",
        }
    )
    assert settings.node_telemetry is False
    assert settings.node_telemetry_interval_s == pytest.approx(0.25)
    assert settings.node_telemetry_root == "/tmp/fake"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS": "50"},
            "SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS='50': must be at least 100 (milliseconds)",
        ),
        (
            {"SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS": "soon"},
            "SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS='soon': expected a number",
        ),
        ({"SKEWTRACE_NODE_TELEMETRY": "maybe"}, "SKEWTRACE_NODE_TELEMETRY='maybe': expected"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(env)
    assert str(raised.value).startswith(message)


# ---------------------------------------------------------------------- with the instrumentation


@pytest.fixture
def instrumentation_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setenv("SKEWTRACE_JOB_ID", "telemetry-job")
    monkeypatch.setenv("SKEWTRACE_EXPORT_INTERVAL_MILLIS", "20")
    monkeypatch.setenv("SKEWTRACE_NODE_TELEMETRY_ROOT", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    # No global SDK MeterProvider from another test may leak in.
    monkeypatch.setattr(metrics_api, "_METER_PROVIDER", None)
    fake_tree(tmp_path)
    yield tmp_path
    skewtrace.uninstrument()


def _instrument(reader: InMemoryMetricReader, **kwargs: Any) -> None:
    import torch
    from torch import nn

    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    skewtrace.instrument(
        optimizer=optimizer,
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[reader]),
        **kwargs,
    )


def test_instrument_starts_and_uninstrument_stops_node_telemetry(
    instrumentation_env: Path,
) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    reader = InMemoryMetricReader()
    loader = DataLoader(TensorDataset(torch.zeros(6, 2)), batch_size=2)
    _instrument(reader, dataloader=loader)
    session = SkewtraceInstrumentor().session
    assert session is not None and session.node_telemetry is not None
    telemetry = session.node_telemetry
    assert telemetry.started and telemetry.samples_node
    assert list(loader) and True  # three fetches
    deadline = time.monotonic() + 5
    points, _, _ = collect(reader)
    while points.get(semconv.METRIC_DATALOADER_FETCHES) != {frozenset(): 3}:
        assert time.monotonic() < deadline, points.get(semconv.METRIC_DATALOADER_FETCHES)
        time.sleep(0.02)
        points, _, _ = collect(reader)
    assert points[semconv.METRIC_TCP_RETRANSMITS] == {frozenset(): 17}
    assert points[semconv.METRIC_DATALOADER_WAIT][frozenset()] > 0
    skewtrace.uninstrument()
    assert telemetry.started
    deadline = time.monotonic() + 5
    while not telemetry._closed:  # shut down on the side thread within the budget
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_node_telemetry_off_starts_nothing(
    instrumentation_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKEWTRACE_NODE_TELEMETRY", "off")
    reader = InMemoryMetricReader()
    _instrument(reader)
    session = SkewtraceInstrumentor().session
    assert session is not None
    assert session.node_telemetry is None
    assert not isinstance(session.recorder, FetchCountingRecorder)
    points, _, _ = collect(reader)
    assert semconv.METRIC_PROCESS_IO not in points
    assert semconv.METRIC_SPANS_EXPORTED in points  # the self-metrics still run


# ---------------------------------------------------------------------- a real qdisc


SAMPLE_IN_NAMESPACE = """
import json
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from skewtrace.rank.telemetry import NodeTelemetry

reader = InMemoryMetricReader()
telemetry = NodeTelemetry(interval_s=1.0, reader=reader, nvml_loader=lambda: None)
telemetry.start(Resource.create({"training.local_rank": 0}))
rows = []
for rm in reader.get_metrics_data().resource_metrics:
    for scope in rm.scope_metrics:
        for metric in scope.metrics:
            if metric.name.startswith("training.qdisc."):
                for point in metric.data.data_points:
                    rows.append([metric.name, dict(point.attributes), point.value])
telemetry.shutdown(1000)
print(json.dumps({"rows": rows, "failures": telemetry.failures}))
"""

UDP_BURST = """
import socket
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3000):
    try:
        sock.sendto(b"x" * 1400, ("10.254.7.2", 9))
    except OSError:
        pass  # ENOBUFS once the qdisc drops: that is the point
"""


@pytest.fixture
def shaped_namespace(namespaces: None) -> Iterator[str]:
    """A namespace of the test's own with a veth whose egress is a 1 Mbit/s tbf."""
    from skewtrace.cluster import netns

    name = f"skt-test-{os.getpid()}"
    netns.add_namespace(name)
    try:
        for args in (
            ["ip", "-n", name, "link", "add", "skta", "type", "veth", "peer", "name", "sktb"],
            ["ip", "-n", name, "addr", "add", "10.254.7.1/30", "dev", "skta"],
            ["ip", "-n", name, "link", "set", "skta", "up"],
            ["ip", "-n", name, "link", "set", "sktb", "up"],
            # A static neighbour: packets to .2 leave through skta (and its qdisc) without
            # waiting for ARP; sktb has no address, so nothing in the namespace answers.
            ["ip", "-n", name, "neigh", "add", "10.254.7.2", "lladdr", "02:00:00:00:07:02",
             "dev", "skta"],
            ["tc", "-n", name, "qdisc", "add", "dev", "skta", "root", "tbf", "rate", "1mbit",
             "burst", "4kb", "latency", "5ms"],
        ):  # fmt: skip
            netns.run(args)
        yield name
    finally:
        netns.delete_namespace(name)


@pytest.mark.netns
def test_real_tbf_qdisc_counts_drops_inside_a_namespace(shaped_namespace: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    exec_in = ["ip", "netns", "exec", shaped_namespace, sys.executable, "-c"]
    subprocess.run([*exec_in, UDP_BURST], check=True, timeout=60, env=env)
    out = subprocess.run(
        [*exec_in, SAMPLE_IN_NAMESPACE],
        check=True,
        timeout=60,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out)
    assert result["failures"] == {}
    tbf = {
        name: value
        for name, attributes, value in result["rows"]
        if attributes == {semconv.NETWORK_INTERFACE: "skta", semconv.QDISC_KIND: "tbf"}
    }
    assert set(tbf) == {
        semconv.METRIC_QDISC_DROPS,
        semconv.METRIC_QDISC_OVERLIMITS,
        semconv.METRIC_QDISC_BACKLOG,
        semconv.METRIC_QDISC_RATE,
    }
    assert tbf[semconv.METRIC_QDISC_RATE] == 1_000_000 / 8  # "rate 1mbit", in bytes a second
    assert tbf[semconv.METRIC_QDISC_DROPS] > 0
    assert tbf[semconv.METRIC_QDISC_OVERLIMITS] > 0
    # The namespace's own loopback is never reported.
    assert all(attributes[semconv.NETWORK_INTERFACE] != "lo" for _, attributes, _ in result["rows"])


def test_backlog_is_the_mean_of_the_interval_and_counters_are_fresh() -> None:
    """Sampled between collections (here by hand, not by its thread), the backlog reported is
    the mean of those samples and the collection's own; drops and overlimits are the read's."""
    backlogs = iter([0, 3000, 0, 9000, 0])  # a queue that fills and empties
    reads = {"n": 0}

    def read() -> list[QdiscStats]:
        reads["n"] += 1
        return [QdiscStats("eth0", "tbf", reads["n"], 10 * reads["n"], next(backlogs))]

    averager = BacklogAverager(read, period_s=0.1)
    for _ in range(4):
        averager.sample()
    (row,) = averager.read()
    assert row.backlog == 2400  # (0 + 3000 + 0 + 9000 + 0) / 5
    assert (row.drops, row.overlimits) == (5, 50)

    # A failed sample is skipped and counted; the next read starts a new interval.
    def failing() -> list[QdiscStats]:
        raise OSError("netlink")

    averager = BacklogAverager(failing, 0.1)
    averager.sample()
    assert averager.failed_samples == 1
    with pytest.raises(OSError):
        averager.read()


def test_backlog_sampler_thread_runs_and_stops() -> None:
    samples: list[float] = []

    def read() -> list[QdiscStats]:
        samples.append(time.monotonic())
        return [QdiscStats("eth0", "tbf", 0, 0, 100)]

    averager = BacklogAverager(read, period_s=0.02)
    averager.start()
    deadline = time.monotonic() + 5
    while len(samples) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    averager.close()
    taken = len(samples)
    assert taken >= 5
    assert averager.read()[0].backlog == 100
    time.sleep(0.1)
    assert len(samples) == taken + 1  # only the read above: the thread has stopped
