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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import needs
from skewtrace._ports import free_port as free_port

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
    _leave_out_eval(config, items)
    _longest_files_first(config, items)


def _leave_out_eval(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``eval`` run where ``-m`` names eval (`make eval`: ``-m eval``), not in
    `make test` (``-m "not alone"``, then ``-m alone``) nor in a run without ``-m``."""
    if "eval" in (config.getoption("markexpr") or ""):
        return
    left_out = [item for item in items if item.get_closest_marker("eval") is not None]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item.get_closest_marker("eval") is None]


# -- the order of files: longest first -----------------------------------------------------
#
# With TEST_WORKERS, `make test` runs test files on several pytest-xdist workers (--dist
# loadfile), each file on one worker, handed out in collection order. A long file handed out
# last keeps one worker busy after the others are done, so the files go longest first: by the
# seconds each took in the last run here (pytest's cache, .pytest_cache/), else by an
# estimate from their markers.
_DURATIONS_KEY = "skewtrace/file_durations"
_ESTIMATE_S = {"netns": 40.0, "prometheus": 20.0, "slow": 10.0}
_UNMARKED_ESTIMATE_S = 0.2


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _estimate(item: pytest.Item) -> float:
    for marker, seconds in _ESTIMATE_S.items():
        if item.get_closest_marker(marker) is not None:
            return seconds
    return _UNMARKED_ESTIMATE_S


def _longest_files_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # a serial run keeps the collection order
    cache = getattr(config, "cache", None)
    measured: dict[str, float] = cache.get(_DURATIONS_KEY, {}) if cache is not None else {}
    estimated: dict[str, float] = {}
    for item in items:
        path = _file_of(item.nodeid)
        estimated[path] = estimated.get(path, 0.0) + _estimate(item)
    length = {path: measured.get(path, guess) for path, guess in estimated.items()}
    order = {path: i for i, path in enumerate(estimated)}

    def key(item: pytest.Item) -> tuple[float, int]:
        path = _file_of(item.nodeid)
        return (-length[path], order[path])

    items.sort(key=key)  # stable: a file's tests keep their order, and stay together


_ran: dict[str, float] = {}
# Selections that run whole files: `make test`'s two parts (test files are marked alone
# whole; eval tests are left out of both, _leave_out_eval).
_WHOLE_FILES = ("", "alone", "not alone")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = _file_of(report.nodeid)
    _ran[path] = _ran.get(path, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    cache = getattr(config, "cache", None)
    if cache is None or not _ran or hasattr(config, "workerinput"):
        return
    if config.getoption("keyword") or config.getoption("markexpr") not in _WHOLE_FILES:
        return  # a selection of a file's tests is not how long the file takes
    known: dict[str, float] = cache.get(_DURATIONS_KEY, {})
    known.update({path: round(seconds, 2) for path, seconds in _ran.items()})
    cache.set(_DURATIONS_KEY, known)


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
