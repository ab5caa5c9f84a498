"""Node telemetry as OTel observable instruments: who samples what, once per collection.

Local rank 0 of a node samples what the node's ranks share (interfaces, RDMA ports,
qdiscs, block devices, TCP retransmits), so each node's figures are exported once; every
rank samples its own GPU, its own process tree's storage I/O and its data-loader wait. The
series carry the rank's resource (``training.job.id``, ``training.rank``, ``host.name``,
``training.switch``, ``training.nic``), which the Collector's Prometheus exporter turns into
labels, so they line up with the rank's spans and the connector's metrics.

Each source is read once per collection however many instruments it feeds (the interface
statistics feed four), from the first callback of the pass. A source that raises is skipped
for that pass, counted in :attr:`NodeTelemetry.failures` and logged at most once per ten
minutes per source (:class:`skewtrace._log_limit.RepeatLimitFilter`); nothing raises into
the SDK's reader thread, let alone into training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from opentelemetry.sdk.resources import Resource

from skewtrace import semconv
from skewtrace._log_limit import RepeatLimitFilter
from skewtrace._registry_instruments import observable
from skewtrace.rank.telemetry.dataloader import FetchCountingRecorder
from skewtrace.rank.telemetry.gpu import GpuSample, GpuSampler, load_nvml
from skewtrace.rank.telemetry.network import (
    LOOPBACK,
    InterfaceCounters,
    PortCounter,
    nic_signal,
    read_interfaces,
    read_link_speeds,
    read_rdma_ports,
    read_tcp_retransmits,
)
from skewtrace.rank.telemetry.qdisc import SUBSAMPLES, BacklogAverager, QdiscReader, QdiscStats
from skewtrace.rank.telemetry.storage import DiskCounters, ProcessIO, ProcessTreeIO, read_diskstats
from skewtrace.version import __version__

logger = logging.getLogger("skewtrace.telemetry")

FAILURE_LOG_INTERVAL_S = 600.0
"""A failing source is logged once per this long (with the count held back)."""

T = TypeVar("T")

Attributes = dict[str, str | int]
Observed = list[tuple[float, Attributes]]


class SourceHealth:
    """Failure counts per source, and their rate-limited log lines."""

    def __init__(self) -> None:
        self.failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def failed(self, source: str, detail: object) -> None:
        with self._lock:
            self.failures[source] = self.failures.get(source, 0) + 1
        # One template per source: the repeat filter keys on it, so sources do not mute
        # each other.
        logger.warning(
            f"skewtrace: node telemetry source {source} failed (%s); skipped, counted", detail
        )


class Passes:
    """Which collection pass is running: a pass ends when an instrument is observed again.

    Order-independent, so it holds with several readers and with instruments of other
    libraries on a shared MeterProvider.
    """

    def __init__(self) -> None:
        self.number = 0
        self._seen: set[str] = set()

    def observe(self, instrument: str) -> int:
        if instrument in self._seen:
            self.number += 1
            self._seen.clear()
        self._seen.add(instrument)
        return self.number


class Source(Generic[T]):
    """One reading per pass; None (counted by ``health``) when the reading raised."""

    def __init__(self, name: str, read: Callable[[], T], health: SourceHealth) -> None:
        self.name = name
        self._read = read
        self._health = health
        self._pass = -1
        self._value: T | None = None

    def get(self, pass_number: int) -> T | None:
        if pass_number != self._pass:
            self._pass = pass_number
            try:
                self._value = self._read()
            except Exception as error:
                self._value = None
                self._health.failed(self.name, repr(error))
        return self._value


class NodeTelemetry:
    """Registers the node-telemetry instruments and owns their MeterProvider when it has to.

    ``meter_provider``: a MeterProvider passed to ``instrument()``; without one, a private
    provider with the rank's resource and a periodic reader every ``interval_s`` per exporter
    of ``OTEL_METRICS_EXPORTER`` (OTLP by default; or ``reader``, for tests). ``root``
    prefixes ``/proc`` and ``/sys``. ``nvml_loader`` returns an initialized ``pynvml`` (or a
    stand-in) or None; ``qdisc_reader`` replaces the netlink dump (the dump reads the live
    kernel whatever ``root`` is); ``clock`` (monotonic seconds) times the PCIe integration.
    """

    def __init__(
        self,
        *,
        interval_s: float,
        root: str = "/",
        meter_provider: Any | None = None,
        reader: Any | None = None,
        fetches: FetchCountingRecorder | None = None,
        nvml_loader: Callable[[], Any | None] = load_nvml,
        qdisc_reader: Callable[[], list[QdiscStats]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.root = root
        self._meter_provider = meter_provider
        self._reader = reader
        self._fetches = fetches
        self._nvml_loader = nvml_loader
        self._qdisc_reader = qdisc_reader
        self._clock = clock
        self._own_qdisc: QdiscReader | None = None
        self._backlog: BacklogAverager | None = None
        self.health = SourceHealth()
        self._passes = Passes()
        self._own_provider: Any | None = None
        self._gpu: GpuSampler | None = None
        self._nvml: Any | None = None
        self._log_filter = RepeatLimitFilter(FAILURE_LOG_INTERVAL_S)
        self._lock = threading.Lock()
        self.started = False
        self._closed = False
        self.samples_node = False

    @property
    def failures(self) -> dict[str, int]:
        return dict(self.health.failures)

    # ------------------------------------------------------------------ lifecycle

    def start(self, resource: Resource) -> None:
        """Start sampling for the rank ``resource`` describes (idempotent; no-op once shut)."""
        with self._lock:
            if self.started or self._closed:
                return
            self.started = True
        logger.addFilter(self._log_filter)
        attributes = resource.attributes
        local_rank = attributes.get(semconv.LOCAL_RANK, 0)
        self.samples_node = local_rank == 0
        provider = self._meter_provider
        if provider is None:
            from opentelemetry.sdk.metrics import MeterProvider

            from skewtrace.rank._export.exporters import metric_readers

            readers = (
                [self._reader]
                if self._reader is not None
                else metric_readers(self.interval_s * 1000.0)
            )
            provider = MeterProvider(metric_readers=readers, resource=resource)
            self._own_provider = provider
        uuid = attributes.get(semconv.GPU_UUID)
        if isinstance(uuid, str) and uuid:
            self._gpu = self._gpu_sampler(uuid)
        self._register(provider.get_meter("skewtrace.telemetry", __version__))

    def _gpu_sampler(self, uuid: str) -> GpuSampler | None:
        try:
            self._nvml = self._nvml_loader()
            if self._nvml is None:
                return None
            return GpuSampler(self._nvml, uuid, on_error=self._gpu_failed, clock=self._clock)
        except Exception as error:
            logger.warning(
                "skewtrace: GPU %s not found through NVML (%r): GPU telemetry off", uuid, error
            )
            return None

    def _gpu_failed(self, call: str, error: BaseException) -> None:
        self.health.failed(f"gpu.{call}", repr(error))

    def shutdown(self, timeout_millis: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        provider, self._own_provider = self._own_provider, None
        try:
            if provider is not None:
                provider.shutdown(timeout_millis=timeout_millis)
        finally:
            if self._gpu is not None:
                self._gpu.close()
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:
                    logger.debug("skewtrace: nvmlShutdown failed", exc_info=True)
            if self._backlog is not None:
                self._backlog.close()
            if self._own_qdisc is not None:
                self._own_qdisc.close()
            logger.removeFilter(self._log_filter)

    # ------------------------------------------------------------------ instruments

    def _register(self, meter: Any) -> None:
        self._meter = meter
        if self.samples_node:
            self._register_node()
        self._register_rank()
        if self._gpu is not None:
            self._register_gpu(self._gpu)

    def _instrument(
        self, name: str, observe: Callable[[int], Iterable[tuple[float, Attributes]]]
    ) -> None:
        """The registry's instrument ``name`` (its kind, unit and description from
        :data:`skewtrace.semconv.METRICS`), observed by ``observe``."""
        from opentelemetry.metrics import CallbackOptions, Observation

        def callback(_options: CallbackOptions) -> list[Observation]:
            pass_number = self._passes.observe(name)
            try:
                return [Observation(value, attrs) for value, attrs in observe(pass_number)]
            except Exception as error:  # a bug in a mapping, not a source: still never raise
                self.health.failed(name, repr(error))
                return []

        observable(self._meter, name, [callback])

    def _register_node(self) -> None:
        health, root = self.health, self.root
        interfaces = Source(
            "interfaces",
            lambda: read_interfaces(root, lambda path: health.failed("interfaces", path)),
            health,
        )
        for name, statistic in (
            (semconv.METRIC_NETWORK_IO, "bytes"),
            (semconv.METRIC_NETWORK_PACKETS, "packets"),
            (semconv.METRIC_NETWORK_ERRORS, "errors"),
            (semconv.METRIC_NETWORK_DROPPED, "dropped"),
        ):
            self._instrument(name, _interface_view(interfaces, statistic))

        speeds = Source("link_speed", lambda: read_link_speeds(root), health)
        self._instrument(
            semconv.METRIC_NETWORK_SPEED,
            lambda n: [
                (speed, {semconv.NETWORK_INTERFACE: interface})
                for interface, speed in speeds.get(n) or ()
            ],
        )

        ports = Source(
            "rdma_ports",
            lambda: read_rdma_ports(root, lambda path: health.failed("rdma_ports", path)),
            health,
        )
        self._instrument(
            semconv.METRIC_NIC_PORT_COUNTER,
            lambda n: [_port_point(port) for port in ports.get(n) or ()],
        )

        retransmits = Source("tcp", lambda: read_tcp_retransmits(root), health)
        self._instrument(semconv.METRIC_TCP_RETRANSMITS, lambda n: _single(retransmits.get(n)))

        qdiscs = Source("qdisc", self._read_qdiscs, health)
        for name, field in (
            (semconv.METRIC_QDISC_DROPS, "drops"),
            (semconv.METRIC_QDISC_OVERLIMITS, "overlimits"),
            (semconv.METRIC_QDISC_BACKLOG, "backlog"),
            (semconv.METRIC_QDISC_RATE, "rate"),
        ):
            self._instrument(name, _qdisc_view(qdiscs, field))

        disks = Source(
            "disks", lambda: read_diskstats(root, lambda path: health.failed("disks", path)), health
        )
        for name, fields in (
            (semconv.METRIC_DISK_IO, ("read_bytes", "write_bytes")),
            (semconv.METRIC_DISK_OPERATIONS, ("reads", "writes")),
            (semconv.METRIC_DISK_OPERATION_TIME, ("read_time_s", "write_time_s")),
        ):
            self._instrument(name, _disk_view(disks, *fields))

    def _read_qdiscs(self) -> list[QdiscStats]:
        if self._qdisc_reader is not None:
            return self._qdisc_reader()
        if self._backlog is None:
            self._own_qdisc = QdiscReader()
            self._backlog = BacklogAverager(
                self._own_qdisc.read, max(0.05, self.interval_s / SUBSAMPLES)
            )
            if not self._closed:
                self._backlog.start()
        return self._backlog.read()

    def _register_rank(self) -> None:
        tree = ProcessTreeIO(self.root)
        process_io = Source("process_io", tree.read, self.health)
        self._instrument(semconv.METRIC_PROCESS_IO, lambda n: _process_points(process_io.get(n)))
        fetches = self._fetches
        if fetches is None:
            return
        self._instrument(
            semconv.METRIC_DATALOADER_WAIT, lambda _n: [(fetches.fetch_wait_ns / 1e9, {})]
        )
        self._instrument(semconv.METRIC_DATALOADER_FETCHES, lambda _n: [(fetches.fetches, {})])

    def _register_gpu(self, sampler: GpuSampler) -> None:
        gpu = Source("gpu", sampler.read, self.health)
        uuid: Attributes = {semconv.GPU_UUID: sampler.uuid}

        def scalar(pick: Callable[[GpuSample], float | None]) -> Callable[[int], Observed]:
            def view(n: int) -> Observed:
                sample = gpu.get(n)
                value = None if sample is None else pick(sample)
                return [] if value is None else [(value, uuid)]

            return view

        def keyed(
            pick: Callable[[GpuSample], dict[Any, int]], key: str
        ) -> Callable[[int], Observed]:
            def view(n: int) -> Observed:
                sample = gpu.get(n)
                if sample is None:
                    return []
                return [(value, {**uuid, key: k}) for k, value in pick(sample).items()]

            return view

        for name, view in (
            (semconv.METRIC_GPU_UTILIZATION, scalar(lambda s: s.utilization)),
            (semconv.METRIC_GPU_MEMORY_USAGE, scalar(lambda s: s.memory_used)),
            (semconv.METRIC_GPU_SM_CLOCK, scalar(lambda s: s.sm_clock_hz)),
            (semconv.METRIC_GPU_THROTTLE, keyed(lambda s: s.throttle, semconv.GPU_THROTTLE_REASON)),
            (semconv.METRIC_GPU_POWER, scalar(lambda s: s.power_w)),
            (semconv.METRIC_GPU_TEMPERATURE, scalar(lambda s: s.temperature_c)),
            (semconv.METRIC_GPU_ECC_ERRORS, keyed(lambda s: s.ecc_errors, semconv.ERROR_TYPE)),
            (semconv.METRIC_GPU_XID, keyed(lambda s: s.xid, semconv.GPU_XID_CODE)),
            (semconv.METRIC_GPU_PCIE_IO, keyed(lambda s: s.pcie_bytes, semconv.NETWORK_DIRECTION)),
            (
                semconv.METRIC_GPU_NVLINK_IO,
                keyed(lambda s: s.nvlink_bytes, semconv.NETWORK_DIRECTION),
            ),
        ):
            self._instrument(name, view)


# ---------------------------------------------------------------------- views: reading -> points


def _single(value: float | None) -> Observed:
    return [] if value is None else [(value, {})]


def _interface_view(
    source: Source[list[InterfaceCounters]], statistic: str
) -> Callable[[int], Observed]:
    def view(n: int) -> Observed:
        return [
            (
                row.value,
                {
                    semconv.NETWORK_INTERFACE: row.interface,
                    semconv.NETWORK_DIRECTION: row.direction,
                },
            )
            for row in source.get(n) or ()
            if row.statistic == statistic
        ]

    return view


def _port_point(port: PortCounter) -> tuple[float, Attributes]:
    return port.value, {
        semconv.NIC_DEVICE: port.device,
        semconv.NIC_PORT: port.port,
        semconv.NIC_COUNTER: port.counter,
        semconv.NIC_SIGNAL: nic_signal(port.counter),
    }


def _qdisc_view(source: Source[list[QdiscStats]], field: str) -> Callable[[int], Observed]:
    def view(n: int) -> Observed:
        return [
            (
                getattr(row, field),
                {semconv.NETWORK_INTERFACE: row.interface, semconv.QDISC_KIND: row.kind},
            )
            for row in source.get(n) or ()
            if row.interface != LOOPBACK and (field != "rate" or row.rate > 0)
        ]

    return view


def _disk_view(
    source: Source[list[DiskCounters]], read_field: str, write_field: str
) -> Callable[[int], Observed]:
    def view(n: int) -> Observed:
        points: Observed = []
        for row in source.get(n) or ():
            for direction, field in (
                (semconv.DIRECTION_READ, read_field),
                (semconv.DIRECTION_WRITE, write_field),
            ):
                points.append(
                    (
                        getattr(row, field),
                        {semconv.SYSTEM_DEVICE: row.device, semconv.DISK_DIRECTION: direction},
                    )
                )
        return points

    return view


def _process_points(io: ProcessIO | None) -> Observed:
    if io is None:
        return []
    return [
        (io.read_bytes, {semconv.DISK_DIRECTION: semconv.DIRECTION_READ}),
        (io.write_bytes, {semconv.DISK_DIRECTION: semconv.DIRECTION_WRITE}),
    ]
