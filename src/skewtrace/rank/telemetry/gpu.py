"""The rank's own GPU through NVML (``pynvml``, from the ``gpu`` extra's ``nvidia-ml-py``).

One :meth:`GpuSampler.read` per sample gathers every figure of the rank's GPU. NVML support
varies by GPU and driver: a call that raises ``NVMLError_NotSupported`` is dropped for this
GPU from then on (NVLink counters on a PCIe card, ECC on consumer boards), anything else that
fails is left out of this sample and reported to the caller. PCIe throughput is a rate NVML
samples over about 20 ms; it is integrated over the time between samples into a byte
counter, which is exact only while the rate holds, so it is a trend, not an audit. XID events
are read from an NVML event set without waiting (``timeout 0``), so a sample never blocks.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from skewtrace import semconv

logger = logging.getLogger("skewtrace.telemetry")

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10

KIB = 1024
"""NVML's PCIe throughput is in KB/s and its NVLink data counters in KiB: 1024 bytes."""

THROTTLE_REASONS = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}
"""``training.gpu.throttle.reason`` values and their bits in NVML's clock event reasons."""

ECC_ERROR_TYPES = {
    "corrected": NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
"""``error.type`` values of ``training.gpu.ecc.errors`` and NVML's memory error types."""


def load_nvml() -> Any | None:
    """``pynvml`` initialized, or None (no package, no driver) after one log line."""
    try:
        import pynvml
    except ImportError:
        logger.info("skewtrace: no pynvml (pip install 'skewtrace[gpu]'): GPU telemetry off")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as error:
        logger.info("skewtrace: NVML did not start (%r): GPU telemetry off", error)
        return None
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class GpuSample:
    """One sample of the GPU; a figure NVML did not give is None (or absent)."""

    uuid: str
    utilization: float | None = None
    memory_used: int | None = None
    sm_clock_hz: float | None = None
    throttle: dict[str, int] = field(default_factory=dict)
    power_w: float | None = None
    temperature_c: float | None = None
    ecc_errors: dict[str, int] = field(default_factory=dict)
    xid: dict[int, int] = field(default_factory=dict)
    """Events per XID code since the sampler started (cumulative)."""
    pcie_bytes: dict[str, int] = field(default_factory=dict)
    """Cumulative, keyed by ``semconv.DIRECTION_*``."""
    nvlink_bytes: dict[str, int] = field(default_factory=dict)


class GpuSampler:
    """Samples one GPU, found by its UUID (the rank resource's ``gpu.uuid``)."""

    def __init__(
        self,
        nvml: Any,
        uuid: str,
        *,
        on_error: Callable[[str, BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self.uuid = uuid
        self._handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        self._on_error = on_error
        self._clock = clock
        self.unsupported: set[str] = set()
        self._xid: dict[int, int] = {}
        self._pcie_bytes = {semconv.DIRECTION_TRANSMIT: 0.0, semconv.DIRECTION_RECEIVE: 0.0}
        self._last_sample: float | None = None
        self._events: Any | None = None
        try:
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self._handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, events)
            self._events = events
        except Exception as error:
            if not self._not_supported(error):
                on_error("xid", error)
            self.unsupported.add("xid")

    def _not_supported(self, error: BaseException) -> bool:
        cls = getattr(self._nvml, "NVMLError_NotSupported", None)
        if cls is not None and isinstance(error, cls):
            return True
        return getattr(error, "value", None) == NVML_ERROR_NOT_SUPPORTED

    def _timed_out(self, error: BaseException) -> bool:
        cls = getattr(self._nvml, "NVMLError_Timeout", None)
        if cls is not None and isinstance(error, cls):
            return True
        return getattr(error, "value", None) == NVML_ERROR_TIMEOUT

    def _call(self, name: str, read: Callable[[], Any]) -> Any | None:
        """``read()``, or None: skipped for good once NVML says NotSupported."""
        if name in self.unsupported:
            return None
        try:
            return read()
        except Exception as error:
            if self._not_supported(error):
                self.unsupported.add(name)
            else:
                self._on_error(name, error)
            return None

    def read(self) -> GpuSample:
        nvml, handle = self._nvml, self._handle
        sample = GpuSample(self.uuid)
        now = self._clock()
        elapsed = None if self._last_sample is None else max(0.0, now - self._last_sample)
        self._last_sample = now

        rates = self._call("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        if rates is not None:
            sample.utilization = rates.gpu / 100.0
        memory = self._call("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None:
            sample.memory_used = int(memory.used)
        clock = self._call("sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM))
        if clock is not None:
            sample.sm_clock_hz = clock * 1e6
        reasons = self._call("throttle", lambda: self._clock_event_reasons(handle))
        if reasons is not None:
            sample.throttle = {
                name: int(bool(reasons & bit)) for name, bit in THROTTLE_REASONS.items()
            }
        power = self._call("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        if power is not None:
            sample.power_w = power / 1000.0
        temperature = self._call(
            "temperature", lambda: nvml.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU)
        )
        if temperature is not None:
            sample.temperature_c = float(temperature)
        for error_type, memory_error in ECC_ERROR_TYPES.items():
            count = self._call(
                f"ecc_{error_type}",
                functools.partial(
                    nvml.nvmlDeviceGetTotalEccErrors, handle, memory_error, NVML_VOLATILE_ECC
                ),
            )
            if count is not None:
                sample.ecc_errors[error_type] = int(count)
        self._poll_xid()
        sample.xid = dict(self._xid)
        self._integrate_pcie(elapsed)
        sample.pcie_bytes = {direction: int(total) for direction, total in self._pcie_bytes.items()}
        nvlink = self._call("nvlink", lambda: self._nvlink_bytes(handle))
        if nvlink is not None:
            sample.nvlink_bytes = nvlink
        return sample

    def _clock_event_reasons(self, handle: Any) -> int:
        # Renamed in NVML 12.4 (throttle -> clocks event); older modules have only the old name.
        getter = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is None:
            getter = self._nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(getter(handle))

    def _poll_xid(self) -> None:
        if self._events is None:
            return
        wait = getattr(self._nvml, "nvmlEventSetWait_v2", None) or self._nvml.nvmlEventSetWait
        for _ in range(64):  # bounded: a storm of events waits for the next sample
            try:
                event = wait(self._events, 0)
            except Exception as error:
                if not self._timed_out(error):
                    self._on_error("xid", error)
                return
            code = int(event.eventData)
            self._xid[code] = self._xid.get(code, 0) + 1

    def _integrate_pcie(self, elapsed: float | None) -> None:
        for direction, counter in (
            (semconv.DIRECTION_TRANSMIT, NVML_PCIE_UTIL_TX_BYTES),
            (semconv.DIRECTION_RECEIVE, NVML_PCIE_UTIL_RX_BYTES),
        ):
            rate = self._call(
                f"pcie_{direction}",
                functools.partial(self._nvml.nvmlDeviceGetPcieThroughput, self._handle, counter),
            )
            if rate is not None and elapsed is not None:
                self._pcie_bytes[direction] += rate * KIB * elapsed

    def _nvlink_bytes(self, handle: Any) -> dict[str, int]:
        values = self._nvml.nvmlDeviceGetFieldValues(
            handle, [NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        )
        found: dict[str, int] = {}
        for direction, value in zip(
            (semconv.DIRECTION_TRANSMIT, semconv.DIRECTION_RECEIVE), values, strict=True
        ):
            status = int(value.nvmlReturn)
            if status == NVML_ERROR_NOT_SUPPORTED:
                raise _NotSupported()
            if status != NVML_SUCCESS:
                raise RuntimeError(f"NVML field value status {status}")
            found[direction] = int(value.value.ullVal) * KIB
        return found

    def close(self) -> None:
        if self._events is not None:
            try:
                self._nvml.nvmlEventSetFree(self._events)
            except Exception:
                logger.debug("skewtrace: nvmlEventSetFree failed", exc_info=True)
            self._events = None


class _NotSupported(Exception):
    """A field value NVML answered with NOT_SUPPORTED (not raised by NVML itself)."""

    value = NVML_ERROR_NOT_SUPPORTED
