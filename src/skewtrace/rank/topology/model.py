"""What every topology file format parses into, and the error they raise."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field


class TopologyError(ValueError):
    """A topology file that cannot be used; the message starts with ``<file>:<line>:``."""


@dataclass(frozen=True)
class NodeEntry:
    """One node's (or pattern's) switch and NICs, and the line that gave them."""

    switch: str | None
    nics: tuple[str, ...]
    """One NIC, or one per local rank (indexed by local rank modulo its length)."""
    line: int


@dataclass
class TopologyFile:
    """A parsed topology file: exact node names, glob patterns, and switch parents."""

    path: str
    nodes: dict[str, NodeEntry] = field(default_factory=dict)
    patterns: list[tuple[str, NodeEntry]] = field(default_factory=list)
    parents: dict[str, str] = field(default_factory=dict)

    def lookup(self, names: Sequence[str]) -> NodeEntry | None:
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
