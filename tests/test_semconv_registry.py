"""The name registry (src/semconv/registry.yaml) and the files generated from it."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from skewtrace import semconv
from skewtrace.controller.state import JobWindows

REPO_ROOT = Path(__file__).resolve().parents[1]
# A literal that looks like a training telemetry name must be registered. (`skewtrace.` also
# begins logger names and other keys, so those are only checked against registered names.)
OWN_NAME = re.compile(r"^training\.[a-z0-9_.]+$")
GO_CONST = re.compile(r'^\t(\w+) += "([^"]*)"$', re.M)


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    path = REPO_ROOT / "tools" / "semconvgen" / "generate.py"
    spec = importlib.util.spec_from_file_location("semconvgen", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["semconvgen"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def registry(gen: ModuleType) -> Any:
    return gen.load(REPO_ROOT)


def _named(registry: Any) -> list[Any]:
    """Every entry and value that has constants (all but the components' own metrics)."""
    items = []
    for group in registry.groups:
        if group.kind == "component_metric":
            continue
        for entry in group.entries:
            items += [entry, *entry.values]
    return items


def _value(item: Any) -> str:
    return getattr(item, "value", None) or item.name


def test_generated_files_are_current(gen: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    rc = gen.main(["--check"])
    assert rc == 0, capsys.readouterr().err + "run `make generate` and commit the result"


def _copy_inputs_and_outputs(gen: ModuleType, registry: Any, root: Path) -> None:
    paths = [gen.REGISTRY, gen.PROMNAMES, gen.PYTHON_OUT, gen.GO_OUT, gen.LOADGEN_OUT, gen.DOC]
    paths += [Path(p) for g in registry.groups for p in g.raw.get("metadata", [])]
    for rel in paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, root / rel)


def test_check_names_the_stale_file(gen: ModuleType, registry: Any, tmp_path: Path) -> None:
    _copy_inputs_and_outputs(gen, registry, tmp_path)
    doc = tmp_path / gen.DOC
    doc.write_text(
        doc.read_text().replace("| `training.rank` | int |", "| `training.rank` | str |")
    )
    registry = tmp_path / gen.REGISTRY
    registry.write_text(registry.read_text().replace("go: AttrNIC", "go: AttrNic"))

    completed = _run(gen, "--check", "--root", str(tmp_path))
    assert completed[0] == 1
    for stale in (gen.DOC, gen.GO_OUT, gen.LOADGEN_OUT):
        assert f"{stale} is stale" in completed[1]
    assert str(gen.PYTHON_OUT) not in completed[1]

    assert _run(gen, "--root", str(tmp_path))[0] == 0
    assert _run(gen, "--check", "--root", str(tmp_path))[0] == 0
    assert 'AttrNic = "training.nic"' in (tmp_path / gen.GO_OUT).read_text()


def _run(gen: ModuleType, *argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = gen.main(list(argv))
    return rc, err.getvalue()


def test_registry_errors_name_the_entry(gen: ModuleType, registry: Any, tmp_path: Path) -> None:
    _copy_inputs_and_outputs(gen, registry, tmp_path)
    text = (REPO_ROOT / gen.REGISTRY).read_text()
    for old, new, message in [
        (
            "python: RANK\n",
            "python: JOB_ID\n",
            "JOB_ID is used by training.job.id and training.rank",
        ),
        ("[training.job.id, host.name]", "[training.job.id, host.nmae]", "'host.nmae' is not"),
        ("instrument: histogram", "instrument: histo", "instrument 'histo'"),
    ]:
        (tmp_path / gen.REGISTRY).write_text(text.replace(old, new, 1))
        with pytest.raises(gen.RegistryError, match=re.escape(message)):
            gen.load(tmp_path)


def test_python_constants_are_the_registry(registry: Any) -> None:
    expected = {item.python: _value(item) for item in _named(registry)}
    for group in registry.groups:
        if group.kind == "metric":
            for e in group.entries:
                unit = str(e.get("unit"))
                expected[e.python.replace("METRIC_", "PROM_", 1)] = semconv.prometheus_name(
                    e.name, e.get("instrument"), unit
                )
    actual = {
        name: value
        for name, value in vars(semconv).items()
        if name.isupper() and isinstance(value, str)
    }
    assert actual == expected
    assert semconv.METRIC_RANK_MISSING in semconv.CONNECTOR_METRICS
    assert not hasattr(semconv, "CAUSES")  # the cause values are CAUSE_* now


def test_go_constants_are_the_registry(gen: ModuleType, registry: Any) -> None:
    collector = dict(GO_CONST.findall((REPO_ROOT / gen.GO_OUT).read_text()))
    assert collector == {item.go: _value(item) for item in _named(registry)}
    loadgen = dict(GO_CONST.findall((REPO_ROOT / gen.LOADGEN_OUT).read_text()))
    assert loadgen == {gen.loadgen_name(item): _value(item) for item in _named(registry)}
    # The connector's metric that the Python side once lacked.
    assert collector["MetricRankMissing"] == semconv.METRIC_RANK_MISSING


@pytest.mark.parametrize(
    "otel_name,instrument,unit,expected",
    [
        ("training.barrier.skew", "histogram", "s", "training_barrier_skew_seconds"),
        ("training.straggler", "gauge", "1", "training_straggler_ratio"),
        ("training.collective.incomplete", "counter", "1", "training_collective_incomplete_total"),
        ("skewtrace.pacing.delay", "gauge", "s", "skewtrace_pacing_delay_seconds"),
        ("skewtrace.spans.exported", "counter", "{spans}", "skewtrace_spans_exported_total"),
        ("queue.size", "updowncounter", "By", "queue_size_bytes"),
        ("already_seconds", "gauge", "s", "already_seconds"),
    ],
)
def test_prometheus_name(otel_name: str, instrument: str, unit: str, expected: str) -> None:
    assert semconv.prometheus_name(otel_name, instrument, unit) == expected


def test_prometheus_label() -> None:
    assert semconv.prometheus_label(semconv.RANK) == "training_rank"
    assert semconv.prometheus_label("service.instance.id") == "service_instance_id"


def test_docs_list_prometheus_names_of_every_metric(registry: Any) -> None:
    doc = (REPO_ROOT / "docs" / "semantic-conventions.md").read_text()
    for name, value in vars(semconv).items():
        if name.startswith("PROM_"):
            assert f"`{value}`" in doc, name


def _is_module(name: str) -> bool:
    """skewtrace.rank.pacing_client and the like are logger and module names, not telemetry;
    so are the names of modules that moved (the ``skewtrace.telemetry`` and
    ``skewtrace.config`` loggers and scope kept theirs)."""
    import skewtrace

    path = REPO_ROOT / "src" / Path(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file() or name in skewtrace.MOVED


def test_python_code_uses_registered_names(registry: Any) -> None:
    registered = {_value(item) for item in _named(registry)}
    problems = []
    for path in sorted((REPO_ROOT / "src" / "skewtrace").rglob("*.py")):
        if path.name == "semconv.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            rel = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
            if "." in node.value and node.value in registered and not _is_module(node.value):
                problems.append(f"{rel}: {node.value!r}: use the skewtrace.semconv constant")
            elif OWN_NAME.match(node.value) and not _is_module(node.value):
                problems.append(f"{rel}: {node.value!r} is not in src/semconv/registry.yaml")
    assert problems == []


# The load generator's instrumentation scope: its own, read by nobody.
_LOADGEN_OWN = {"skewtrace.loadgen"}


def test_loadgen_uses_the_generated_names(gen: ModuleType, registry: Any) -> None:
    registered = {_value(item) for item in _named(registry)}
    problems = []
    for path in sorted((REPO_ROOT / "tools" / "loadgen").glob("*.go")):
        if path.name.endswith("_test.go") or path == REPO_ROOT / gen.LOADGEN_OUT:
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*fs\.\w+\(", line):
                continue  # a flag's help text may name the attribute the flag sets
            for literal in re.findall(r'"([^"\\]*)"', line):
                if literal in _LOADGEN_OWN or "/" in literal:
                    continue
                if ("." in literal and literal in registered) or OWN_NAME.match(literal):
                    problems.append(f"{path.name}:{lineno}: {literal!r}")
    assert problems == []


def test_component_telemetry_comes_from_the_metadata_files(registry: Any) -> None:
    (group,) = [g for g in registry.groups if g.kind == "component_metric"]
    names = {e.name for e in group.entries}
    assert "otelcol_processor_barrierskew_collectives_released" in names
    assert "otelcol_connector_barrierskew_series_dropped" in names
    doc = (REPO_ROOT / "docs" / "semantic-conventions.md").read_text()
    assert all(f"`{name}`" in doc for name in names)


def _sum_metric(name: str) -> metrics_pb2.ResourceMetrics:
    point = metrics_pb2.NumberDataPoint(as_int=1, time_unix_nano=1)
    point.attributes.extend(
        [
            KeyValue(key=semconv.JOB_ID, value=AnyValue(string_value="job")),
            KeyValue(key=semconv.RANK, value=AnyValue(int_value=3)),
        ]
    )
    metric = metrics_pb2.Metric(name=name)
    metric.sum.is_monotonic = True
    metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    metric.sum.data_points.append(point)
    rm = metrics_pb2.ResourceMetrics()
    rm.scope_metrics.add().metrics.append(metric)
    return rm


def test_the_pacer_knows_every_connector_metric() -> None:
    windows = JobWindows(window_s=10.0, job_timeout_s=60.0)
    for name in semconv.CONNECTOR_METRICS:
        windows.ingest_request([_sum_metric(name)], now=1.0)
    assert windows.counters.points_unknown_metric == 0


def test_units_and_descriptions_come_from_the_registry_only() -> None:
    """Issue 24: an instrument's unit and description are the registry's (semconv.METRICS,
    semconv.Metrics in Go): a unit written again by hand could change on one side and rename
    its Prometheus series. No instrument in the package or the connector writes its own."""
    root = Path(__file__).resolve().parent.parent
    offenders = []
    for path in sorted((root / "src" / "skewtrace").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            # OpenTelemetry instruments (meter.create_*) and prometheus_client's metrics.
            if name.startswith("create_") or name in ("Gauge", "Counter", "Histogram"):
                literal = [k.arg for k in node.keywords if k.arg in ("unit", "description")
                           and isinstance(k.value, ast.Constant)]  # fmt: skip
                if name in ("Gauge", "Counter", "Histogram") and len(node.args) > 1:
                    literal += ["description"] if isinstance(node.args[1], ast.Constant) else []
                if literal:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno} {literal}")
    literal_go = re.compile(r"\.(SetUnit|SetDescription)\(\"")
    offenders += [
        f"{path.relative_to(root)}:{n}"
        for path in sorted((root / "src" / "collector" / "connector").rglob("*.go"))
        if not path.name.endswith("_test.go")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if literal_go.search(line)
    ]
    assert offenders == []
