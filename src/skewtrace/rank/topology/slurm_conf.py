"""Slurm's ``topology.conf``: ``SwitchName=`` lines (a tree) and ``BlockName=`` lines.

Parsed as Slurm's own config reader does: ``#`` comments, ``\\`` continuation lines, hostlist
expressions (``node[01-04]``). A node's switch is the first leaf that lists it; a file with
both a tree and blocks gives switches precedence.
"""

from __future__ import annotations

import re

from skewtrace.rank.topology._hostlist import HostlistError, expand_hostlist
from skewtrace.rank.topology.model import NodeEntry, TopologyError, TopologyFile

_SLURM_KEYS = {"switchname", "switches", "nodes", "linkspeed", "blockname", "blocksizes"}


def logical_lines(text: str) -> list[tuple[int, str]]:
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


def parse(path: str, text: str) -> TopologyFile:
    topology = TopologyFile(path)
    declared: dict[str, int] = {}
    block_nodes: dict[str, NodeEntry] = {}
    child_switches: list[tuple[int, str, str]] = []
    for number, line in logical_lines(text):
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
                    target.setdefault(node, NodeEntry(name, (), number))
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


def looks_like_slurm(text: str) -> bool:
    for _, line in logical_lines(text):
        return re.match(r"(?i)(switchname|blockname|blocksizes)\s*=", line) is not None
    return False
