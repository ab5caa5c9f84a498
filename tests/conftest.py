"""Shared pytest fixtures: paths to the built binaries, free local ports, and the in-process
instrumentation tests' gloo world, in-memory TracerProvider and job environment.

Tests that need something of the machine (a built binary, Prometheus, network namespaces)
follow one rule, in ``needs``: they fail under CI when it is missing, because `.ci/run` provides
it, and skip on a developer machine. A test that requests ``otelcol_path``,
``prometheus_binary``, ``promtool_binary`` or ``namespaces`` must carry the matching marker
(collector, prometheus, netns); collection stops with the list of those that do not.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import needs

REPO_ROOT = Path(__file__).resolve().parent.parent


def _binary(env_var: str, default: Path) -> Path:
    path = Path(os.environ.get(env_var, str(default)))
    if not path.is_file():
        needs.unavailable(f"{path} is not built (run `make collector jaeger`, or set {env_var})")
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = needs.unmarked(items)
    if missing:
        raise pytest.UsageError(
            "tests that need a marker they do not carry:\n  " + "\n  ".join(missing)
        )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def otelcol_path() -> Path:
    """The otelcol-skewtrace binary built from collector-config/builder-config.yaml."""
    return _binary("SKEWTRACE_OTELCOL", REPO_ROOT / "build" / "otelcol-skewtrace")


def _prometheus_package(name: str) -> str:
    from prometheus_harness import find_binary

    binary = find_binary(name)
    if binary is None:
        needs.unavailable(f"{name} is not installed (apt-get install prometheus)")
    return binary


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The prometheus server binary (Debian's package; .ci/run installs it)."""
    return _prometheus_package("prometheus")


@pytest.fixture(scope="session")
def promtool_binary() -> str:
    """promtool, from the same package as prometheus."""
    return _prometheus_package("promtool")


@pytest.fixture
def namespaces() -> None:
    """Root and network namespaces (the emulated fabric, node telemetry's qdisc tests)."""
    from skewtrace.cluster import netns

    reason = netns.unavailable_reason()
    if reason is not None:
        needs.unavailable(f"network namespaces: {reason}")


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


@pytest.fixture(scope="module")
def world_of_one() -> Iterator[None]:
    """A one-rank gloo process group for the module."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def memory_provider() -> Iterator[tuple[Any, Any]]:
    """A ``TracerProvider`` exporting to an ``InMemorySpanExporter``: (provider, exporter).
    skewtrace is uninstrumented afterwards."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import skewtrace

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "my-trainer"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    skewtrace.uninstrument()
    provider.shutdown()


@pytest.fixture
def unit_job(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The job id and a short export interval; no collector: a global in-memory MeterProvider
    keeps the private OTLP metrics exporter (and its retries against localhost:4317) out.
    skewtrace is uninstrumented afterwards. Modules use it with
    ``pytestmark = pytest.mark.usefixtures("unit_job")``."""
    from opentelemetry.metrics import _internal as metrics_api
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    import skewtrace

    monkeypatch.setenv("SKEWTRACE_JOB_ID", "unit-job")
    monkeypatch.setenv("SKEWTRACE_EXPORT_INTERVAL_MILLIS", "20")
    reader = InMemoryMetricReader()
    monkeypatch.setattr(metrics_api, "_METER_PROVIDER", MeterProvider(metric_readers=[reader]))
    yield
    skewtrace.uninstrument()
