"""Files ``skewtrace demo`` needs from outside the Python package, and the collector binary.

The wheel carries, under ``skewtrace/_data/`` and with the checkout's layout (see
``pyproject.toml``), the collector configs, ``examples/train_ddp.py``,
``examples/train_2d.py`` (with ``examples/_faults.py``, which it imports), and the
collector's Go module with its build manifest and ``build.sh``. From a checkout (an editable
install) the same paths are the checkout's own. :func:`shipped` finds either.

``otelcol-skewtrace`` is looked for in this order (:func:`find_otelcol`):

1. ``$SKEWTRACE_OTELCOL``;
2. ``build/otelcol-skewtrace`` of the checkout skewtrace runs from, if it does (``make
   collector``): a developer's fresh build wins over anything installed or cached;
3. ``otelcol-skewtrace`` on ``PATH``;
4. the cache, ``$XDG_CACHE_HOME/skewtrace/collector/<version>/otelcol-skewtrace`` (default
   ``~/.cache/...``), one binary per skewtrace version, so an upgrade never runs a collector
   built from older sources.

When none exists and Go is installed, :func:`build_otelcol` builds it with the shipped
``build.sh`` (OpenTelemetry Collector Builder, then ``go build``: minutes the first time):
from a checkout into its ``build/``, from an installed package into the cache, after copying
the sources there (site-packages may be read-only, and the build writes next to them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skewtrace.version import __version__

OTELCOL = "otelcol-skewtrace"
SKEWTRACE_OTELCOL = "SKEWTRACE_OTELCOL"

_PACKAGE_DIR = Path(__file__).resolve().parent
_DATA_DIR = _PACKAGE_DIR / "_data"
# What a build needs, relative to the source root (the build writes build/ next to them).
_BUILD_INPUTS = ("collector-config/builder-config.yaml", "collector-config/build.sh")
_GO_MODULE = "src/collector"


def checkout() -> Path | None:
    """The checkout skewtrace is imported from (src layout), None for an installed package."""
    root = _PACKAGE_DIR.parents[1]
    if (root / "pyproject.toml").is_file() and (root / _BUILD_INPUTS[0]).is_file():
        return root
    return None


def source_root() -> Path | None:
    """Where the shipped files are: the installed package's copy, else the checkout."""
    if (_DATA_DIR / _BUILD_INPUTS[0]).is_file():
        return _DATA_DIR
    return checkout()


def shipped(relative: str) -> Path | None:
    """A file the demo needs (``collector-config/otelcol.yaml``, ...), None when missing."""
    root = source_root()
    path = root / relative if root else None
    return path if path is not None and path.is_file() else None


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "skewtrace" / "collector" / __version__


@dataclass(frozen=True)
class Lookup:
    """What :func:`find_otelcol` found, and where it looked (for an error that says so)."""

    found: Path | None
    tried: tuple[str, ...]


def find_otelcol(env: Mapping[str, str] | None = None) -> Lookup:
    """The first ``otelcol-skewtrace`` in the module docstring's order."""
    env = os.environ if env is None else env
    explicit = env.get(SKEWTRACE_OTELCOL, "").strip()
    if explicit:
        # Set but wrong is an error, not a reason to run some other binary.
        path = Path(explicit)
        return Lookup(path if path.is_file() else None, (f"${SKEWTRACE_OTELCOL}={explicit}",))
    tried = [f"${SKEWTRACE_OTELCOL} (unset)"]
    root = checkout()
    if root is not None:
        local = root / "build" / OTELCOL
        if local.is_file():
            return Lookup(local, (*tried, str(local)))
        tried.append(str(local))
    on_path = shutil.which(OTELCOL, path=env.get("PATH"))
    if on_path:
        return Lookup(Path(on_path), (*tried, f"{OTELCOL} on PATH"))
    tried.append(f"{OTELCOL} on PATH")
    cached = cache_dir(env) / OTELCOL
    if cached.is_file():
        return Lookup(cached, (*tried, str(cached)))
    tried.append(str(cached))
    return Lookup(None, tuple(tried))


class BuildError(RuntimeError):
    """otelcol-skewtrace could not be built; the message says what to do instead."""


def build_target(env: Mapping[str, str] | None = None) -> Path:
    """Where :func:`build_otelcol` puts the binary."""
    root = checkout()
    if root is not None and source_root() == root:
        return root / "build" / OTELCOL
    return cache_dir(env) / OTELCOL


def build_otelcol(env: Mapping[str, str] | None = None) -> Path:
    """Build ``otelcol-skewtrace`` from the shipped Go sources; prints what it does."""
    env = os.environ if env is None else env
    root = source_root()
    if root is None or not all(
        (root / p).is_file() for p in (*_BUILD_INPUTS, _GO_MODULE + "/go.mod")
    ):
        raise BuildError("the collector's Go sources are not in this installation of skewtrace")
    go = shutil.which("go", path=env.get("PATH"))
    if go is None:
        raise BuildError("Go is not installed (need Go >= 1.26 on PATH to build the collector)")
    out = build_target(env)
    if root != checkout():
        root = _copy_sources(root, out.parent / "src")
    print(
        f"skewtrace: building {OTELCOL} from the Go sources in {root} into {out} "
        "(OpenTelemetry Collector Builder and go build; minutes the first time)",
        file=sys.stderr,
        flush=True,
    )
    result = subprocess.run(
        ["bash", str(root / "collector-config" / "build.sh"), str(out)],
        env=dict(env),
        check=False,
    )
    if result.returncode != 0 or not out.is_file():
        raise BuildError(f"building {OTELCOL} failed (exit {result.returncode}; output above)")
    return out


def _copy_sources(root: Path, dest: Path) -> Path:
    """A writable copy of the build inputs (the build writes build/ beside them)."""
    for relative in _BUILD_INPUTS:
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / relative, target)
    shutil.copytree(root / _GO_MODULE, dest / _GO_MODULE, dirs_exist_ok=True)
    return dest


def how_to_get_otelcol(lookup: Lookup, problem: str, env: Mapping[str, str] | None = None) -> str:
    """The error for a missing collector: where it looked, why it was not built, what to do."""
    return (
        f"{OTELCOL} not found (looked at: {', '.join(lookup.tried)}), and {problem}.\n"
        f"Install Go >= 1.26 and run this again to build it into {build_target(env)}, "
        f"or build it from a checkout (`make collector`, or the image of "
        f"collector-config/Dockerfile) and pass --otelcol PATH or set {SKEWTRACE_OTELCOL}."
    )
