"""Slurm's ``topology.yaml`` (Slurm 24.11+): a list of named topologies::

    - topology: fabric
      cluster_default: true
      tree:
        switches:
          - {switch: s0, children: "s[1-2]"}
          - {switch: s1, nodes: "node[01-04]"}
    - topology: blocks
      block: {block_sizes: [4], blocks: [{block: b1, nodes: "node[01-04]"}]}

The topology whose leaves say most about the fabric is used: a tree before blocks, the
cluster default first within each kind.
"""

from __future__ import annotations

import yaml

from skewtrace.rank.topology._hostlist import HostlistError, expand_hostlist
from skewtrace.rank.topology._yaml import field, mark, scalar
from skewtrace.rank.topology.model import NodeEntry, TopologyError, TopologyFile


def _pick_topology(path: str, root: yaml.SequenceNode) -> tuple[str, yaml.Node] | None:
    """The topology whose leaves say most about the fabric: a tree before blocks, the
    cluster default first within each kind."""
    candidates: list[tuple[int, int, str, yaml.Node]] = []
    for item in root.value:
        if field(path, item, "topology") is None:
            raise TopologyError(f"{path}:{mark(item)}: a topology entry needs topology:")
        default_node = field(path, item, "cluster_default")
        is_default = isinstance(default_node, yaml.ScalarNode) and default_node.value.lower() in (
            "true",
            "yes",
            "on",
        )
        for rank, kind in enumerate(("tree", "block")):
            body = field(path, item, kind)
            if body is not None:
                candidates.append((rank, 0 if is_default else 1, kind, body))
                break
    if not candidates:
        return None
    candidates.sort(key=lambda candidate: candidate[:2])
    return candidates[0][2], candidates[0][3]


def parse(path: str, root: yaml.SequenceNode) -> TopologyFile:
    topology = TopologyFile(path)
    picked = _pick_topology(path, root)
    if picked is None:
        return topology  # only flat topologies: no switches to report
    kind, body = picked
    list_key, name_key = ("switches", "switch") if kind == "tree" else ("blocks", "block")
    items = field(path, body, list_key)
    if not isinstance(items, yaml.SequenceNode):
        raise TopologyError(f"{path}:{mark(body)}: {kind} needs a list under {list_key}:")
    declared: dict[str, int] = {}
    children: list[tuple[int, str, str]] = []
    for item in items.value:
        name_node = field(path, item, name_key)
        if name_node is None:
            raise TopologyError(f"{path}:{mark(item)}: each entry needs {name_key}:")
        name = scalar(path, name_node, name_key)
        if name in declared:
            raise TopologyError(
                f"{path}:{mark(item)}: {name!r} already defined on line {declared[name]}"
            )
        declared[name] = mark(item)
        for field_name in ("nodes", "children"):
            value = field(path, item, field_name)
            if value is None:
                continue
            try:
                members = expand_hostlist(scalar(path, value, field_name))
            except HostlistError as error:
                raise TopologyError(f"{path}:{mark(value)}: {error}") from None
            for member in members:
                if field_name == "nodes":
                    topology.nodes.setdefault(member, NodeEntry(name, (), mark(item)))
                else:
                    children.append((mark(value), member, name))
    for line, child, parent in children:
        if child not in declared:
            raise TopologyError(f"{path}:{line}: switch {child!r} is not defined")
        topology.parents.setdefault(child, parent)
    return topology
