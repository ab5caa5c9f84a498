"""GPU resource attributes (``gpu.uuid``, ``gpu.name``, ``gpu.pci_bus_id``, ``gpu.numa_node``)
from NVML, for the local CUDA device index a rank uses."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from skewtrace.semconv import GPU_NAME, GPU_NUMA_NODE, GPU_PCI_BUS_ID, GPU_UUID

_logger = logging.getLogger(__name__)


_nvml_lock = threading.Lock()
_nvml_state: dict[str, Any] = {}


def _nvml() -> Any | None:
    """pynvml, initialized once; None without the package or a driver (logged once)."""
    with _nvml_lock:
        if "module" in _nvml_state:
            return _nvml_state["module"]
        module: Any | None
        try:
            import pynvml

            pynvml.nvmlInit()
            module = pynvml
        except Exception as error:  # ImportError, or NVMLError without a driver
            _logger.debug("skewtrace: NVML unavailable, no gpu.* attributes: %r", error)
            module = None
        _nvml_state["module"] = module
        return module


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs names it: ``0000:3b:00.0``."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest}".lower()


def _torch_uuid(device_index: int) -> str | None:
    """The device's UUID from torch, only when torch already initialized CUDA: that one
    follows CUDA's own device order and CUDA_VISIBLE_DEVICES, whatever they are."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
    except Exception:
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _nvml_handle(nvml: Any, device_index: int, env: Mapping[str, str]) -> Any:
    uuid = _torch_uuid(device_index)
    if uuid is not None:
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nvml.nvmlDeviceGetHandleByIndex(device_index)
    entries = [item.strip() for item in visible.split(",") if item.strip()]
    if device_index >= len(entries):
        raise IndexError(f"device {device_index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[device_index]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    # CUDA accepts a unique prefix of a UUID; NVML wants the whole one.
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        if _text(nvml.nvmlDeviceGetUUID(handle)).startswith(entry):
            return handle
    raise LookupError(f"no GPU matches CUDA_VISIBLE_DEVICES entry {entry!r}")


def _numa_node(nvml: Any, handle: Any, bus_id: str, sysfs_root: str) -> int | None:
    getter: Callable[[Any], int] | None = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
    if getter is not None:
        try:
            node = int(getter(handle))
            if node >= 0:
                return node
        except Exception:
            pass  # older drivers: NVML_ERROR_NOT_SUPPORTED; sysfs knows it anyway
    numa_file = Path(sysfs_root) / "bus/pci/devices" / _sysfs_bus_id(bus_id) / "numa_node"
    try:
        node = int(numa_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def gpu_attributes(
    device_index: int | None,
    *,
    env: Mapping[str, str] | None = None,
    sysfs_root: str = "/sys",
) -> dict[str, str | int]:
    """``gpu.uuid``, ``gpu.name``, ``gpu.pci_bus_id`` and ``gpu.numa_node`` of a local
    CUDA device index; ``{}`` without a GPU, pynvml or driver. Never raises.

    The local index is mapped to the physical GPU through ``CUDA_VISIBLE_DEVICES``
    (indices or UUIDs), or through torch's own UUID once torch has initialized CUDA.
    ``gpu.numa_node`` is left out when neither NVML nor sysfs knows it (``-1``).
    """
    if device_index is None or device_index < 0:
        return {}
    nvml = _nvml()
    if nvml is None:
        return {}
    environ: Mapping[str, str] = os.environ if env is None else env
    try:
        handle = _nvml_handle(nvml, device_index, environ)
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        attributes: dict[str, str | int] = {
            GPU_UUID: _text(nvml.nvmlDeviceGetUUID(handle)),
            GPU_NAME: _text(nvml.nvmlDeviceGetName(handle)),
            GPU_PCI_BUS_ID: bus_id,
        }
        numa = _numa_node(nvml, handle, bus_id, sysfs_root)
        if numa is not None:
            attributes[GPU_NUMA_NODE] = numa
        return attributes
    except Exception as error:
        _logger.warning("skewtrace: no gpu.* attributes for device %s: %r", device_index, error)
        return {}
