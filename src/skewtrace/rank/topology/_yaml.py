"""YAML and JSON read as nodes, so that every error can name its line.

Shared by the two YAML formats (Slurm's ``topology.yaml`` and skewtrace's own file).
"""

from __future__ import annotations

import json

import yaml

from skewtrace.rank.topology.model import TopologyError


def compose(path: str, text: str, is_json: bool) -> yaml.Node:
    """The document's root node; raises :class:`TopologyError` for bad syntax or no document."""
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
    return root


def mark(node: yaml.Node) -> int:
    """The node's 1-based line."""
    return int(node.start_mark.line) + 1


def mapping(path: str, node: yaml.Node, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
    """The (key, value) pairs of a mapping node without duplicate keys."""
    if not isinstance(node, yaml.MappingNode):
        raise TopologyError(f"{path}:{mark(node)}: {what} must be a mapping")
    seen: dict[str, int] = {}
    for key, _ in node.value:
        text = scalar(path, key, f"a key of {what}")
        if text in seen:
            raise TopologyError(
                f"{path}:{mark(key)}: duplicate key {text!r} in {what} (first on line {seen[text]})"
            )
        seen[text] = mark(key)
    return list(node.value)


def scalar(path: str, node: yaml.Node, what: str) -> str:
    # Any scalar names a thing (a switch may be called 7), but null or blank names none.
    if (
        not isinstance(node, yaml.ScalarNode)
        or node.tag == "tag:yaml.org,2002:null"
        or not str(node.value).strip()
    ):
        raise TopologyError(f"{path}:{mark(node)}: {what} must be a non-empty string")
    return str(node.value).strip()


def field(path: str, item: yaml.Node, key: str) -> yaml.Node | None:
    """The value of ``key`` in the mapping ``item``, None when absent."""
    if not isinstance(item, yaml.MappingNode):
        raise TopologyError(f"{path}:{mark(item)}: expected a mapping")
    for item_key, value in item.value:
        if isinstance(item_key, yaml.ScalarNode) and item_key.value == key:
            return value
    return None
