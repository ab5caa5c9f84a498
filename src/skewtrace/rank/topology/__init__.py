"""Where a rank sits in the fabric: its leaf switch, its NIC and its GPU.

These become the resource attributes ``training.switch``, ``training.nic`` and ``gpu.*``,
so the collector can say that the stragglers of a window share a switch or a NIC.

Switch, first match wins:

1. ``SKEWTRACE_SWITCH``;
2. the topology file named by ``SKEWTRACE_TOPOLOGY``, else Slurm's own: ``topology.yaml``
   or ``topology.conf`` in the directory of ``SLURM_CONF`` (default ``/etc/slurm``); a
   missing default file is not an error. The file is a Slurm ``topology.conf``, a Slurm
   ``topology.yaml`` or a YAML/JSON file of skewtrace's own format, told apart by
   extension and content (see ``docs/topology.md``);
3. ``unknown``. A node the file does not list is ``unknown`` with one warning per process.

NIC, first match wins (never raises): ``SKEWTRACE_NIC``; the first entry of
``NCCL_IB_HCA``/``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``; the node's ``nic`` in the
topology file; the interface that routes to ``MASTER_ADDR``; ``unknown`` (see :mod:`.nic`).

GPU: ``gpu.*`` attributes from NVML (see :mod:`.gpu`).

A malformed topology file raises :class:`TopologyError` naming the file and line: it is a
configuration mistake better seen at start-up than as a silent ``unknown``.

The package, one concern a module: :mod:`.model` (what a file parses into), one module per
file format (:mod:`.slurm_conf`, :mod:`.slurm_yaml`, :mod:`.skewtrace_file`), :mod:`.files`
(format detection and cache), :mod:`.nic`, :mod:`.gpu`; this module holds the order of the
sources.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skewtrace.rank.topology.files import load_topology_file
from skewtrace.rank.topology.gpu import gpu_attributes
from skewtrace.rank.topology.model import NodeEntry, TopologyError, TopologyFile
from skewtrace.rank.topology.nic import SKEWTRACE_NIC, discover_nic
from skewtrace.semconv import UNKNOWN

__all__ = [
    "DEFAULT_SLURM_TOPOLOGY",
    "SKEWTRACE_NIC",
    "SKEWTRACE_SWITCH",
    "SKEWTRACE_TOPOLOGY",
    "TopologyError",
    "TopologyInfo",
    "discover_nic",
    "discover_topology",
    "gpu_attributes",
    "load_topology_file",
]

_logger = logging.getLogger(__name__)

SKEWTRACE_SWITCH = "SKEWTRACE_SWITCH"
"""The node's switch; wins over any topology file."""

SKEWTRACE_TOPOLOGY = "SKEWTRACE_TOPOLOGY"
"""Path of a Slurm ``topology.conf``/``topology.yaml`` or a YAML/JSON topology file."""

DEFAULT_SLURM_TOPOLOGY = "/etc/slurm/topology.conf"

_LOCAL_RANK_ENV_VARS = ("LOCAL_RANK", "SLURM_LOCALID")


@dataclass(frozen=True)
class TopologyInfo:
    """The node's place in the fabric, as resource attributes want it."""

    switch: str
    """Leaf switch of the node, ``unknown`` when not known."""

    nic: str
    """NIC the rank's collectives use, ``unknown`` when not known."""

    switch_path: tuple[str, ...] = ()
    """The leaf and the switches above it, leaf first (Slurm ``Switches=`` lines or the
    ``switches`` map of a YAML/JSON file); empty when not known."""

    source: str = UNKNOWN
    """Where the switch came from: ``env``, ``file:<path>`` or ``unknown``."""


def _topology_path(env: Mapping[str, str]) -> tuple[str, bool]:
    """(path, explicitly configured). Slurm keeps its topology file next to slurm.conf
    and reads topology.yaml in preference to topology.conf."""
    explicit = env.get(SKEWTRACE_TOPOLOGY, "").strip()
    if explicit:
        return explicit, True
    slurm_conf = env.get("SLURM_CONF", "").strip()
    directory = Path(slurm_conf).parent if slurm_conf else Path(DEFAULT_SLURM_TOPOLOGY).parent
    yaml_file = directory / "topology.yaml"
    if yaml_file.is_file():
        return str(yaml_file), False
    return str(directory / "topology.conf"), False


_warned_lock = threading.Lock()
_warned_unknown: set[tuple[str, str]] = set()


def _warn_unknown_once(host_name: str, path: str) -> None:
    with _warned_lock:
        if (host_name, path) in _warned_unknown:
            return
        _warned_unknown.add((host_name, path))
    _logger.warning(
        "skewtrace: node %r is not in topology file %s; training.switch is %r",
        host_name,
        path,
        UNKNOWN,
    )


def _node_names(host_name: str, env: Mapping[str, str]) -> list[str]:
    """Names a topology file may list this node under: the host name, its short form,
    and Slurm's node name (which may differ from the host name)."""
    names = [host_name]
    short = host_name.split(".", 1)[0]
    if short and short != host_name:
        names.append(short)
    slurm_name = env.get("SLURMD_NODENAME", "").strip()
    if slurm_name and slurm_name not in names:
        names.append(slurm_name)
    return names


def _local_rank(env: Mapping[str, str]) -> int:
    for name in _LOCAL_RANK_ENV_VARS:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def discover_topology(
    host_name: str,
    env: Mapping[str, str] | None = None,
    *,
    local_rank: int | None = None,
) -> TopologyInfo:
    """The switch and NIC of this rank (see the module docstring for the order).

    ``env`` defaults to ``os.environ``. ``local_rank`` picks the NIC when the topology
    file lists one per local rank; it defaults to ``LOCAL_RANK``/``SLURM_LOCALID``.
    Raises :class:`TopologyError` for a malformed topology file, or one named by
    ``SKEWTRACE_TOPOLOGY`` that cannot be read; never for the NIC.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    path, explicit = _topology_path(environ)
    env_switch = environ.get(SKEWTRACE_SWITCH, "").strip()
    entry: NodeEntry | None = None
    parsed: TopologyFile | None = None
    # With the switch given, only a file the user named is worth reading (for its NICs);
    # Slurm's default file then cannot fail a start-up it has nothing to add to.
    if explicit or not env_switch:
        try:
            parsed = load_topology_file(path)
        except FileNotFoundError:
            if explicit:
                raise TopologyError(
                    f"{path}:0: {SKEWTRACE_TOPOLOGY} names a file that does not exist"
                ) from None
            _logger.debug("skewtrace: no topology file at %s", path)
        except TopologyError:
            raise
        except OSError as error:
            if explicit:
                raise TopologyError(f"{path}:0: cannot read: {error.strerror}") from None
            _logger.warning("skewtrace: cannot read topology file %s: %s", path, error)
        if parsed is not None:
            entry = parsed.lookup(_node_names(host_name, environ))

    switch = env_switch
    source = "env"
    switch_path: tuple[str, ...] = ()
    if not switch:
        if parsed is not None and entry is not None and entry.switch:
            switch = entry.switch
            source = f"file:{parsed.path}"
            switch_path = parsed.switch_path(switch)
        else:
            if parsed is not None and entry is None:
                _warn_unknown_once(host_name, parsed.path)
            switch = UNKNOWN
            source = UNKNOWN
    elif parsed is not None:
        switch_path = parsed.switch_path(switch) if switch in parsed.parents else (switch,)
    else:
        switch_path = (switch,)

    file_nic: str | None = None
    if entry is not None and entry.nics:
        rank = _local_rank(environ) if local_rank is None else local_rank
        file_nic = entry.nics[rank % len(entry.nics)]
    nic = discover_nic(environ, file_nic=file_nic)
    return TopologyInfo(switch=switch, nic=nic, switch_path=switch_path, source=source)
