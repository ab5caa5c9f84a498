"""Shared pytest fixtures: paths to the built binaries and free local ports.

Tests that need a built binary (the Collector distribution, Jaeger) fail under CI when it is
missing, because `make test` builds them first; on a developer machine they skip instead.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _binary(env_var: str, default: Path) -> Path:
    path = Path(os.environ.get(env_var, str(default)))
    if not path.is_file():
        message = f"{path} is not built (run `make collector jaeger`, or set {env_var})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def otelcol_path() -> Path:
    """The otelcol-skewtrace binary built from collector-config/builder-config.yaml."""
    return _binary("SKEWTRACE_OTELCOL", REPO_ROOT / "build" / "otelcol-skewtrace")


@pytest.fixture(scope="session")
def jaeger_path() -> Path:
    """A Jaeger v2 binary built from tools/jaeger (its own Go module)."""
    return _binary("SKEWTRACE_JAEGER", REPO_ROOT / "build" / "jaeger")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def port_factory():
    return free_port
