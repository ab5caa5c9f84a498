"""skewtrace's own topology file, YAML or JSON::

nodes:                      # node name or Slurm hostlist -> switch and/or nic
  node[01-04]: {switch: leaf1, nic: mlx5_0}
  node05: {switch: leaf2, nic: [mlx5_0, mlx5_1]}   # a list is indexed by local rank
patterns:                   # optional, tried in order after exact names
  - {match: "gpu-b*", switch: leaf3}
switches:                   # optional, child -> parent, for switch_path
  leaf1: spine1
"""

from __future__ import annotations

import yaml

from skewtrace.rank.topology._hostlist import HostlistError, expand_hostlist
from skewtrace.rank.topology._yaml import mapping, mark, scalar
from skewtrace.rank.topology.model import NodeEntry, TopologyError, TopologyFile


def _entry(path: str, node: yaml.Node, what: str, allowed: set[str]) -> NodeEntry:
    switch: str | None = None
    nics: tuple[str, ...] = ()
    for key, value in mapping(path, node, what):
        name = scalar(path, key, "a key")
        if name not in allowed:
            raise TopologyError(
                f"{path}:{mark(key)}: unknown key {name!r} in {what} "
                f"(expected {', '.join(sorted(allowed))})"
            )
        if name == "switch":
            switch = scalar(path, value, f"switch of {what}")
        elif name == "nic":
            if isinstance(value, yaml.SequenceNode):
                nics = tuple(scalar(path, item, f"nic of {what}") for item in value.value)
                if not nics:
                    raise TopologyError(f"{path}:{mark(value)}: nic list of {what} is empty")
            else:
                nics = (scalar(path, value, f"nic of {what}"),)
    if switch is None and not nics:
        raise TopologyError(f"{path}:{mark(node)}: {what} needs a switch or a nic")
    return NodeEntry(switch, nics, mark(node))


def parse(path: str, root: yaml.Node) -> TopologyFile:
    """skewtrace's format, from the document's root node (see the module docstring)."""
    topology = TopologyFile(path)
    sections = mapping(path, root, "the top level")
    for key, value in sections:
        section = scalar(path, key, "a key")
        if section == "nodes":
            for node_key, node_value in mapping(path, value, "nodes"):
                expression = scalar(path, node_key, "a node name")
                entry = _entry(path, node_value, f"node {expression!r}", {"switch", "nic"})
                try:
                    names = expand_hostlist(expression)
                except HostlistError as error:
                    raise TopologyError(f"{path}:{mark(node_key)}: {error}") from None
                for name in names:
                    if name in topology.nodes:
                        first = topology.nodes[name].line
                        raise TopologyError(
                            f"{path}:{mark(node_key)}: node {name!r} listed twice "
                            f"(first on line {first})"
                        )
                    topology.nodes[name] = entry
        elif section == "patterns":
            if not isinstance(value, yaml.SequenceNode):
                raise TopologyError(f"{path}:{mark(value)}: patterns must be a list")
            for item in value.value:
                pattern = None
                for item_key, item_value in mapping(path, item, "a pattern"):
                    if scalar(path, item_key, "a key") == "match":
                        pattern = scalar(path, item_value, "match")
                if pattern is None:
                    raise TopologyError(f"{path}:{mark(item)}: a pattern needs match:")
                entry = _entry(path, item, f"pattern {pattern!r}", {"match", "switch", "nic"})
                topology.patterns.append((pattern, entry))
        elif section == "switches":
            for child_key, parent_value in mapping(path, value, "switches"):
                child = scalar(path, child_key, "a switch name")
                topology.parents[child] = scalar(path, parent_value, f"parent of {child!r}")
        else:
            raise TopologyError(
                f"{path}:{mark(key)}: unknown section {section!r} "
                "(expected nodes, patterns, switches)"
            )
    return topology
