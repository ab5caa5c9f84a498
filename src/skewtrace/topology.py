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

NIC, first match wins (never raises):

1. ``SKEWTRACE_NIC``;
2. ``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``: the first entry, with
   ``=`` and ``:port`` stripped; exclusion lists (``^...``) name NICs *not* used, so they
   are skipped;
3. the node's ``nic`` in the topology file;
4. the interface whose address routes to ``MASTER_ADDR`` (a UDP socket ``connect`` picks
   the source address without sending anything);
5. ``unknown``.

A malformed topology file raises :class:`TopologyError` naming the file and line: it is a
configuration mistake better seen at start-up than as a silent ``unknown``.
"""

from __future__ import annotations

import array
import fcntl
import fnmatch
import ipaddress
import json
import logging
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from skewtrace._hostlist import HostlistError, expand_hostlist
from skewtrace.semconv import GPU_NAME, GPU_NUMA_NODE, GPU_PCI_BUS_ID, GPU_UUID, UNKNOWN

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

SKEWTRACE_NIC = "SKEWTRACE_NIC"
"""The rank's NIC; wins over every other source."""

SKEWTRACE_TOPOLOGY = "SKEWTRACE_TOPOLOGY"
"""Path of a Slurm ``topology.conf`` or a YAML/JSON topology file."""

DEFAULT_SLURM_TOPOLOGY = "/etc/slurm/topology.conf"

_NIC_ENV_VARS = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
_LOCAL_RANK_ENV_VARS = ("LOCAL_RANK", "SLURM_LOCALID")


class TopologyError(ValueError):
    """A topology file that cannot be used; the message starts with ``<file>:<line>:``."""


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


@dataclass(frozen=True)
class _NodeEntry:
    switch: str | None
    nics: tuple[str, ...]
    line: int


@dataclass
class _TopologyFile:
    """A parsed topology file: exact node names, glob patterns, and switch parents."""

    path: str
    nodes: dict[str, _NodeEntry] = field(default_factory=dict)
    patterns: list[tuple[str, _NodeEntry]] = field(default_factory=list)
    parents: dict[str, str] = field(default_factory=dict)

    def lookup(self, names: Sequence[str]) -> _NodeEntry | None:
        for name in names:
            entry = self.nodes.get(name)
            if entry is not None:
                return entry
        for name in names:
            for pattern, entry in self.patterns:
                if fnmatch.fnmatchcase(name, pattern):
                    return entry
        return None

    def switch_path(self, leaf: str) -> tuple[str, ...]:
        path = [leaf]
        # A cycle in the file would loop forever; stop at the first repeat.
        while path[-1] in self.parents and self.parents[path[-1]] not in path:
            path.append(self.parents[path[-1]])
        return tuple(path)


# --------------------------------------------------------------------------------------
# Slurm topology.conf


_SLURM_KEYS = {"switchname", "switches", "nodes", "linkspeed", "blockname", "blocksizes"}


def _slurm_logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, text) with comments removed and ``\\`` continuations
    joined, as Slurm's config parser does."""
    logical: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(?<!\\)#.*", "", raw).replace("\\#", "#").rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        # Slurm glues a continued line on as it stands: "Nodes=a[1-2],\" + "b3" is
        # "Nodes=a[1-2],b3".
        joined = "".join(pending).strip()
        pending = []
        if joined:
            logical.append((start, joined))
    if pending and "".join(pending).strip():
        logical.append((start, "".join(pending).strip()))
    return logical


def _slurm_pairs(path: str, number: int, line: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for match in re.finditer(r'\s*([^=\s]+)(=("[^"]*"|\S*))?', line):
        key, has_value, value = match.group(1), match.group(2), match.group(3)
        if not has_value:
            raise TopologyError(f"{path}:{number}: expected Key=Value, got {key!r}")
        if key.lower() not in _SLURM_KEYS:
            raise TopologyError(f"{path}:{number}: unknown key {key!r}")
        value = value.strip('"')
        if not value:
            raise TopologyError(f"{path}:{number}: {key} has no value")
        pairs.append((key.lower(), value))
    return pairs


def _parse_slurm(path: str, text: str) -> _TopologyFile:
    topology = _TopologyFile(path)
    declared: dict[str, int] = {}
    block_nodes: dict[str, _NodeEntry] = {}
    child_switches: list[tuple[int, str, str]] = []
    for number, line in _slurm_logical_lines(text):
        pairs = _slurm_pairs(path, number, line)
        keys = dict(pairs)
        head = pairs[0][0]
        if head == "blocksizes":
            continue
        if head not in ("switchname", "blockname"):
            raise TopologyError(
                f"{path}:{number}: a line must start with SwitchName= or BlockName=, "
                f"not {pairs[0][0]}="
            )
        name = keys[head]
        if name in declared:
            raise TopologyError(
                f"{path}:{number}: {name!r} already defined on line {declared[name]}"
            )
        declared[name] = number
        try:
            if "nodes" in keys:
                # A file may hold both a tree and a block topology; a leaf switch says
                # more about the fabric than a block, so switches win.
                target = topology.nodes if head == "switchname" else block_nodes
                for node in expand_hostlist(keys["nodes"]):
                    # The first leaf that lists a multi-homed node is its switch.
                    target.setdefault(node, _NodeEntry(name, (), number))
            if "switches" in keys:
                for child in expand_hostlist(keys["switches"]):
                    child_switches.append((number, child, name))
        except HostlistError as error:
            raise TopologyError(f"{path}:{number}: {error}") from None
    for node, entry in block_nodes.items():
        topology.nodes.setdefault(node, entry)
    for number, child, parent in child_switches:
        if child not in declared:
            raise TopologyError(f"{path}:{number}: switch {child!r} is not defined")
        topology.parents.setdefault(child, parent)
    return topology


# --------------------------------------------------------------------------------------
# skewtrace's YAML/JSON format
#
#   nodes:                      # node name or Slurm hostlist -> switch and/or nic
#     node[01-04]: {switch: leaf1, nic: mlx5_0}
#     node05: {switch: leaf2, nic: [mlx5_0, mlx5_1]}   # a list is indexed by local rank
#   patterns:                   # optional, tried in order after exact names
#     - {match: "gpu-b*", switch: leaf3}
#   switches:                   # optional, child -> parent, for switch_path
#     leaf1: spine1


def _mark(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _mapping(path: str, node: yaml.Node, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise TopologyError(f"{path}:{_mark(node)}: {what} must be a mapping")
    seen: dict[str, int] = {}
    for key, _ in node.value:
        text = _scalar(path, key, f"a key of {what}")
        if text in seen:
            raise TopologyError(
                f"{path}:{_mark(key)}: duplicate key {text!r} in {what} "
                f"(first on line {seen[text]})"
            )
        seen[text] = _mark(key)
    return list(node.value)


def _scalar(path: str, node: yaml.Node, what: str) -> str:
    # Any scalar names a thing (a switch may be called 7), but null or blank names none.
    if (
        not isinstance(node, yaml.ScalarNode)
        or node.tag == "tag:yaml.org,2002:null"
        or not str(node.value).strip()
    ):
        raise TopologyError(f"{path}:{_mark(node)}: {what} must be a non-empty string")
    return str(node.value).strip()


def _entry(path: str, node: yaml.Node, what: str, allowed: set[str]) -> _NodeEntry:
    switch: str | None = None
    nics: tuple[str, ...] = ()
    for key, value in _mapping(path, node, what):
        name = _scalar(path, key, "a key")
        if name not in allowed:
            raise TopologyError(
                f"{path}:{_mark(key)}: unknown key {name!r} in {what} "
                f"(expected {', '.join(sorted(allowed))})"
            )
        if name == "switch":
            switch = _scalar(path, value, f"switch of {what}")
        elif name == "nic":
            if isinstance(value, yaml.SequenceNode):
                nics = tuple(_scalar(path, item, f"nic of {what}") for item in value.value)
                if not nics:
                    raise TopologyError(f"{path}:{_mark(value)}: nic list of {what} is empty")
            else:
                nics = (_scalar(path, value, f"nic of {what}"),)
    if switch is None and not nics:
        raise TopologyError(f"{path}:{_mark(node)}: {what} needs a switch or a nic")
    return _NodeEntry(switch, nics, _mark(node))


def _parse_structured(path: str, text: str, is_json: bool) -> _TopologyFile:
    if is_json:
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            raise TopologyError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None
        # Valid JSON has tabs only between tokens (never raw inside strings), and YAML
        # does not take tabs there.
        text = text.replace("\t", " ")
    try:
        # compose() keeps line numbers, so later errors can point at the line. JSON is
        # read the same way: the syntax was checked above, and YAML reads JSON documents.
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        line = error.problem_mark.line + 1 if error.problem_mark else 1
        raise TopologyError(f"{path}:{line}: invalid YAML: {error.problem}") from None
    except yaml.YAMLError as error:
        raise TopologyError(f"{path}:1: invalid YAML: {error}") from None
    if root is None:
        raise TopologyError(f"{path}:1: the file is empty")
    if isinstance(root, yaml.SequenceNode):
        return _parse_slurm_yaml(path, root)
    topology = _TopologyFile(path)
    sections = _mapping(path, root, "the top level")
    for key, value in sections:
        section = _scalar(path, key, "a key")
        if section == "nodes":
            for node_key, node_value in _mapping(path, value, "nodes"):
                expression = _scalar(path, node_key, "a node name")
                entry = _entry(path, node_value, f"node {expression!r}", {"switch", "nic"})
                try:
                    names = expand_hostlist(expression)
                except HostlistError as error:
                    raise TopologyError(f"{path}:{_mark(node_key)}: {error}") from None
                for name in names:
                    if name in topology.nodes:
                        first = topology.nodes[name].line
                        raise TopologyError(
                            f"{path}:{_mark(node_key)}: node {name!r} listed twice "
                            f"(first on line {first})"
                        )
                    topology.nodes[name] = entry
        elif section == "patterns":
            if not isinstance(value, yaml.SequenceNode):
                raise TopologyError(f"{path}:{_mark(value)}: patterns must be a list")
            for item in value.value:
                pattern = None
                for item_key, item_value in _mapping(path, item, "a pattern"):
                    if _scalar(path, item_key, "a key") == "match":
                        pattern = _scalar(path, item_value, "match")
                if pattern is None:
                    raise TopologyError(f"{path}:{_mark(item)}: a pattern needs match:")
                entry = _entry(path, item, f"pattern {pattern!r}", {"match", "switch", "nic"})
                topology.patterns.append((pattern, entry))
        elif section == "switches":
            for child_key, parent_value in _mapping(path, value, "switches"):
                child = _scalar(path, child_key, "a switch name")
                topology.parents[child] = _scalar(path, parent_value, f"parent of {child!r}")
        else:
            raise TopologyError(
                f"{path}:{_mark(key)}: unknown section {section!r} "
                "(expected nodes, patterns, switches)"
            )
    return topology


# --------------------------------------------------------------------------------------
# Slurm's topology.yaml (Slurm 24.11+): a list of named topologies
#
#   - topology: fabric
#     cluster_default: true
#     tree:
#       switches:
#         - {switch: s0, children: "s[1-2]"}
#         - {switch: s1, nodes: "node[01-04]"}
#   - topology: blocks
#     block: {block_sizes: [4], blocks: [{block: b1, nodes: "node[01-04]"}]}


def _slurm_yaml_field(path: str, item: yaml.Node, key: str) -> yaml.Node | None:
    if not isinstance(item, yaml.MappingNode):
        raise TopologyError(f"{path}:{_mark(item)}: expected a mapping")
    for item_key, value in item.value:
        if isinstance(item_key, yaml.ScalarNode) and item_key.value == key:
            return value
    return None


def _pick_slurm_topology(path: str, root: yaml.SequenceNode) -> tuple[str, yaml.Node] | None:
    """The topology whose leaves say most about the fabric: a tree before blocks, the
    cluster default first within each kind."""
    candidates: list[tuple[int, int, str, yaml.Node]] = []
    for item in root.value:
        if _slurm_yaml_field(path, item, "topology") is None:
            raise TopologyError(f"{path}:{_mark(item)}: a topology entry needs topology:")
        default_node = _slurm_yaml_field(path, item, "cluster_default")
        is_default = isinstance(default_node, yaml.ScalarNode) and default_node.value.lower() in (
            "true",
            "yes",
            "on",
        )
        for rank, kind in enumerate(("tree", "block")):
            body = _slurm_yaml_field(path, item, kind)
            if body is not None:
                candidates.append((rank, 0 if is_default else 1, kind, body))
                break
    if not candidates:
        return None
    candidates.sort(key=lambda candidate: candidate[:2])
    return candidates[0][2], candidates[0][3]


def _parse_slurm_yaml(path: str, root: yaml.SequenceNode) -> _TopologyFile:
    topology = _TopologyFile(path)
    picked = _pick_slurm_topology(path, root)
    if picked is None:
        return topology  # only flat topologies: no switches to report
    kind, body = picked
    list_key, name_key = ("switches", "switch") if kind == "tree" else ("blocks", "block")
    items = _slurm_yaml_field(path, body, list_key)
    if not isinstance(items, yaml.SequenceNode):
        raise TopologyError(f"{path}:{_mark(body)}: {kind} needs a list under {list_key}:")
    declared: dict[str, int] = {}
    children: list[tuple[int, str, str]] = []
    for item in items.value:
        name_node = _slurm_yaml_field(path, item, name_key)
        if name_node is None:
            raise TopologyError(f"{path}:{_mark(item)}: each entry needs {name_key}:")
        name = _scalar(path, name_node, name_key)
        if name in declared:
            raise TopologyError(
                f"{path}:{_mark(item)}: {name!r} already defined on line {declared[name]}"
            )
        declared[name] = _mark(item)
        for field_name in ("nodes", "children"):
            value = _slurm_yaml_field(path, item, field_name)
            if value is None:
                continue
            try:
                members = expand_hostlist(_scalar(path, value, field_name))
            except HostlistError as error:
                raise TopologyError(f"{path}:{_mark(value)}: {error}") from None
            for member in members:
                if field_name == "nodes":
                    topology.nodes.setdefault(member, _NodeEntry(name, (), _mark(item)))
                else:
                    children.append((_mark(value), member, name))
    for line, child, parent in children:
        if child not in declared:
            raise TopologyError(f"{path}:{line}: switch {child!r} is not defined")
        topology.parents.setdefault(child, parent)
    return topology


# --------------------------------------------------------------------------------------
# Loading, with the format told apart by extension and content


def _looks_like_slurm(text: str) -> bool:
    for _, line in _slurm_logical_lines(text):
        return re.match(r"(?i)(switchname|blockname|blocksizes)\s*=", line) is not None
    return False


_cache_lock = threading.Lock()
_cache: dict[str, tuple[tuple[int, int], _TopologyFile]] = {}


def load_topology_file(path: str | os.PathLike[str]) -> _TopologyFile:
    """Parse a topology file (cached by path, size and modification time).

    Raises :class:`TopologyError` for a malformed file and ``OSError`` when it cannot be
    read.
    """
    name = os.fspath(path)
    stat = os.stat(name)
    key = (stat.st_mtime_ns, stat.st_size)
    with _cache_lock:
        cached = _cache.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
    try:
        text = Path(name).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise TopologyError(f"{name}:1: not UTF-8 text ({error.reason})") from None
    suffix = Path(name).suffix.lower()
    if suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip().startswith("{")):
        parsed = _parse_structured(name, text, is_json=True)
    elif suffix in (".yaml", ".yml") or not _looks_like_slurm(text):
        parsed = _parse_structured(name, text, is_json=False)
    else:
        parsed = _parse_slurm(name, text)
    with _cache_lock:
        _cache[name] = (key, parsed)
    return parsed


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
    entry: _NodeEntry | None = None
    parsed: _TopologyFile | None = None
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


# --------------------------------------------------------------------------------------
# NIC


def _first_nic_entry(value: str, interfaces: Sequence[str]) -> str | None:
    """First NIC of an NCCL/Gloo list; None for an exclusion list or an empty value."""
    value = value.strip()
    if not value or value.startswith("^"):
        return None
    exact = value.startswith("=")
    first = value.lstrip("=").split(",")[0].strip()
    # NCCL_IB_HCA entries may carry a port: mlx5_0:1.
    first = first.split(":")[0].strip()
    if not first:
        return None
    if exact or first in interfaces:
        return first
    # NCCL treats a plain entry as a prefix (eth -> eth0, eth1...): name the real interface.
    matches = sorted(name for name in interfaces if name.startswith(first))
    return matches[0] if matches else first


def _interface_names() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


_SIOCGIFADDR = 0x8915
_SIOCGIFFLAGS = 0x8913
_IFF_LOOPBACK = 0x8


def _ioctl_ifreq(sock: socket.socket, request: int, name: str) -> bytes:
    ifreq = array.array("B", struct.pack("256s", name.encode()[:15]))
    fcntl.ioctl(sock.fileno(), request, ifreq)
    return ifreq.tobytes()


def _ipv4_interface(address: str, interfaces: Sequence[str]) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in interfaces:
            try:
                ifreq = _ioctl_ifreq(sock, _SIOCGIFADDR, name)
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(ifreq[20:24]) == address:
                return name
    return None


def _ipv6_interface(address: str, if_inet6: str = "/proc/net/if_inet6") -> str | None:
    wanted = ipaddress.IPv6Address(address).exploded.replace(":", "")
    try:
        lines = Path(if_inet6).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[0] == wanted:
            return fields[5]
    return None


def _route_interface(destination: str, route_table: str = "/proc/net/route") -> str | None:
    """Longest-prefix match of an IPv4 destination in the kernel's main route table."""
    try:
        lines = Path(route_table).read_text().splitlines()[1:]
    except OSError:
        return None
    target = struct.unpack("<I", socket.inet_aton(destination))[0]
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        network, mask = int(fields[1], 16), int(fields[7], 16)
        if target & mask == network:
            prefix = bin(mask).count("1")
            if best is None or prefix > best[0]:
                best = (prefix, fields[0])
    return best[1] if best else None


def _loopback_interface(interfaces: Sequence[str]) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in interfaces:
            try:
                flags = struct.unpack("H", _ioctl_ifreq(sock, _SIOCGIFFLAGS, name)[16:18])[0]
            except OSError:
                continue
            if flags & _IFF_LOOPBACK:
                return name
    return "lo"


def _nic_towards(host: str, port: int, interfaces: Sequence[str]) -> str | None:
    """The interface whose address the kernel picks to reach host:port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    # Prefer IPv4: that is what torch's rendezvous uses for a name with both families.
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(sockaddr)  # UDP connect only picks a route; no packet leaves
        local = sock.getsockname()[0]
    source = ipaddress.ip_address(local.split("%")[0])
    if isinstance(source, ipaddress.IPv4Address):
        name = _ipv4_interface(str(source), interfaces) or _route_interface(str(sockaddr[0]))
    else:
        name = _ipv6_interface(str(source))
    if name is None and source.is_loopback:
        name = _loopback_interface(interfaces)
    return name


def discover_nic(env: Mapping[str, str] | None = None, *, file_nic: str | None = None) -> str:
    """The rank's NIC name, or ``unknown``; never raises (see the module docstring)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    try:
        explicit = environ.get(SKEWTRACE_NIC, "").strip()
        if explicit:
            return explicit
        interfaces = _interface_names()
        for name in _NIC_ENV_VARS:
            nic = _first_nic_entry(environ.get(name, ""), interfaces)
            if nic:
                return nic
        if file_nic:
            return file_nic
        master = environ.get("MASTER_ADDR", "").strip()
        if master:
            port_text = environ.get("MASTER_PORT", "").strip()
            port = int(port_text) if port_text.isdigit() else 29500
            nic = _nic_towards(master, port, interfaces)
            if nic:
                return nic
    except Exception as error:  # a NIC name is never worth failing training over
        _logger.debug("skewtrace: NIC discovery failed: %r", error)
    return UNKNOWN


# --------------------------------------------------------------------------------------
# GPU


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
    import sys

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
