"""Loading a topology file, its format told apart by extension and content, cached."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import yaml

from skewtrace.rank.topology import skewtrace_file, slurm_conf, slurm_yaml
from skewtrace.rank.topology._yaml import compose
from skewtrace.rank.topology.model import TopologyError, TopologyFile


def _parse_yaml(path: str, text: str, is_json: bool) -> TopologyFile:
    root = compose(path, text, is_json)
    if isinstance(root, yaml.SequenceNode):
        return slurm_yaml.parse(path, root)
    return skewtrace_file.parse(path, root)


_cache_lock = threading.Lock()
_cache: dict[str, tuple[tuple[int, int], TopologyFile]] = {}


def load_topology_file(path: str | os.PathLike[str]) -> TopologyFile:
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
        parsed = _parse_yaml(name, text, is_json=True)
    elif suffix in (".yaml", ".yml") or not slurm_conf.looks_like_slurm(text):
        parsed = _parse_yaml(name, text, is_json=False)
    else:
        parsed = slurm_conf.parse(name, text)
    with _cache_lock:
        _cache[name] = (key, parsed)
    return parsed
