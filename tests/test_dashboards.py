"""Validates the "Training fabric" dashboard and the Grafana provisioning under ``grafana/``.

Grafana itself cannot run here (no Docker, and its Go module is AGPL), so these tests check
what Grafana would trip over, with a validator whose own negative tests show it catches a
broken dashboard: required fields, panel ids, grid, targets, datasource uids that the
provisioning defines, variables that exist, provisioning files Grafana's env interpolation
would not mangle, and that the committed JSON is what ``grafana/generate_dashboard.py`` makes.
The PromQL is parsed by ``promtool`` here and run against a real Prometheus in
``test_dashboard_promql.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import needs
from prometheus_harness import (
    dashboard_queries,
    grafana_regex_value,
    iter_panels,
    metric_names,
    promtool_check,
    substitute_variables,
)
from skewtrace import semconv

REPO_ROOT = Path(__file__).resolve().parent.parent
GRAFANA_DIR = REPO_ROOT / "grafana"
DASHBOARD_PATH = GRAFANA_DIR / "dashboards" / "training-fabric.json"
DATASOURCES_DIR = GRAFANA_DIR / "provisioning" / "datasources"
DASHBOARD_PROVIDERS_DIR = GRAFANA_DIR / "provisioning" / "dashboards"
SEMCONV_PATH = REPO_ROOT / "docs" / "semantic-conventions.md"

DASHBOARD_UID = "skewtrace-training-fabric"
GRID_COLUMNS = 24

# Prometheus labels of the attributes the panels group by.
JOB, RANK, HOST, SWITCH, NIC, PG, CAUSE = map(
    semconv.prometheus_label,
    (semconv.JOB_ID, semconv.RANK, semconv.HOST_NAME, semconv.SWITCH, semconv.NIC,
     semconv.COLLECTIVE_PG, semconv.STRAGGLER_CAUSE),
)  # fmt: skip

# Variables Grafana defines itself (global variables, data link and trace-to-X variables).
GRAFANA_BUILTINS = frozenset(
    {
        "__all", "__auto", "__cell", "__dashboard", "__data", "__field", "__from", "__interval",
        "__interval_ms", "__name", "__org", "__range", "__range_ms", "__range_s",
        "__rate_interval", "__rate_interval_ms", "__series", "__span", "__tags", "__timeFilter",
        "__timezone", "__to", "__trace", "__url", "__url_time_range", "__user", "__value",
    }
)  # fmt: skip

# ${name}, ${name:format}, ${name.path...}, $name, [[name]]
_REFERENCE = re.compile(r"\$\{([A-Za-z_]\w*)[^}]*\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]")


# --------------------------------------------------------------------------- the validator


def _strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(json path, string) for every string value under node."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{path}[{index}]")


def variable_references(text: str) -> set[str]:
    return {next(g for g in match.groups() if g) for match in _REFERENCE.finditer(text)}


def _uid_of(node: Mapping[str, Any]) -> str | None:
    datasource = node.get("datasource")
    if isinstance(datasource, Mapping):
        uid = datasource.get("uid")
        return None if uid is None else str(uid)
    if isinstance(datasource, str):
        # A bare string is a datasource *name* in old dashboards: it breaks when renamed.
        return f"<name {datasource!r}>"
    return None


def validate_dashboard(
    dashboard: Mapping[str, Any], datasource_uids: Mapping[str, str]
) -> list[str]:
    """Every problem Grafana would have with ``dashboard``; [] when there are none.

    ``datasource_uids`` maps the provisioned datasource uids to their types.
    """
    errors: list[str] = []
    for key in ("uid", "title", "panels", "schemaVersion", "templating"):
        if key not in dashboard or dashboard[key] in (None, "", []):
            errors.append(f"dashboard: missing {key}")
    if len(str(dashboard.get("uid", ""))) > 40:
        errors.append("dashboard: uid longer than Grafana's 40 characters")

    variables = dashboard.get("templating", {}).get("list", [])
    defined: list[str] = []
    for variable in variables:
        name = variable.get("name")
        if not name:
            errors.append("templating: variable without a name")
            continue
        if name in defined:
            errors.append(f"templating: variable {name!r} defined twice")
        uid = _uid_of(variable)
        if variable.get("type") == "query":
            if uid not in datasource_uids:
                errors.append(f"variable {name!r}: datasource uid {uid!r} is not provisioned")
            query = variable.get("query")
            text = query.get("query", "") if isinstance(query, Mapping) else str(query or "")
            if not text:
                errors.append(f"variable {name!r}: empty query")
            # A variable's query may only use variables defined before it (Grafana resolves
            # them in order).
            for ref in variable_references(text) - GRAFANA_BUILTINS:
                if ref not in defined:
                    errors.append(f"variable {name!r}: uses ${ref}, not defined before it")
        defined.append(name)

    known = set(defined) | GRAFANA_BUILTINS
    for path, text in _strings({k: v for k, v in dashboard.items() if k != "templating"}):
        for ref in sorted(variable_references(text) - known):
            errors.append(f"{path}: undefined variable ${ref}")

    seen_ids: set[int] = set()
    for panel in iter_panels(dashboard):
        panel_id = panel.get("id")
        where = f"panel {panel_id} {panel.get('title', '')!r}"
        if not isinstance(panel_id, int):
            errors.append(f"{where}: id must be an integer")
        elif panel_id in seen_ids:
            errors.append(f"{where}: duplicate panel id {panel_id}")
        else:
            seen_ids.add(panel_id)
        for key in ("type", "title", "gridPos"):
            if not panel.get(key):
                errors.append(f"{where}: missing {key}")
        grid = panel.get("gridPos", {})
        if grid:
            if any(not isinstance(grid.get(k), int) for k in ("x", "y", "w", "h")):
                errors.append(f"{where}: gridPos needs integer x, y, w, h")
            elif grid["x"] < 0 or grid["w"] < 1 or grid["x"] + grid["w"] > GRID_COLUMNS:
                errors.append(f"{where}: gridPos outside the {GRID_COLUMNS}-column grid")
        if panel.get("type") == "row":
            continue
        panel_uid = _uid_of(panel)
        if panel_uid is not None and panel_uid not in datasource_uids:
            errors.append(f"{where}: datasource uid {panel_uid!r} is not provisioned")
        targets = panel.get("targets") or []
        if not targets:
            errors.append(f"{where}: no targets")
        ref_ids = [target.get("refId") for target in targets]
        if len(set(ref_ids)) != len(ref_ids) or None in ref_ids:
            errors.append(f"{where}: refIds must be present and unique, got {ref_ids}")
        for target in targets:
            uid = _uid_of(target) or panel_uid
            label = f"{where} target {target.get('refId')}"
            kind = datasource_uids.get(uid or "")
            if kind is None:
                errors.append(f"{label}: datasource uid {uid!r} is not provisioned")
                continue
            if kind == "prometheus" and not str(target.get("expr", "")).strip():
                errors.append(f"{label}: empty PromQL expr")
            if kind == "tempo" and not str(target.get("query", "")).strip():
                errors.append(f"{label}: empty TraceQL query")
    return errors


def provisioned_datasources(directory: Path = DATASOURCES_DIR) -> dict[str, str]:
    """uid -> type of every datasource in the provisioning files."""
    uids: dict[str, str] = {}
    for path in sorted(directory.glob("*.y*ml")):
        for datasource in yaml.safe_load(path.read_text()).get("datasources", []):
            uids[str(datasource.get("uid"))] = str(datasource.get("type"))
    return uids


def validate_datasource_provisioning(document: Mapping[str, Any], raw_text: str) -> list[str]:
    """Problems in one datasources provisioning file."""
    errors: list[str] = []
    if document.get("apiVersion") != 1:
        errors.append("apiVersion must be 1")
    datasources = document.get("datasources") or []
    if not datasources:
        errors.append("no datasources")
    uids = [str(ds.get("uid")) for ds in datasources]
    if len(set(uids)) != len(uids):
        errors.append(f"duplicate uids {uids}")
    for datasource in datasources:
        name = datasource.get("name")
        for key in ("name", "uid", "type", "url"):
            if not datasource.get(key):
                errors.append(f"datasource {name!r}: missing {key}")
        json_data = datasource.get("jsonData") or {}
        linked = [d.get("datasourceUid") for d in json_data.get("exemplarTraceIdDestinations", [])]
        for key in ("tracesToMetrics", "tracesToLogsV2", "serviceMap"):
            if key in json_data:
                linked.append(json_data[key].get("datasourceUid"))
        for uid in linked:
            if uid not in uids:
                errors.append(f"datasource {name!r}: links to uid {uid!r}, not provisioned")
    # Grafana expands $VAR and ${VAR} in provisioning files from its environment before
    # parsing; a literal $ (PromQL's $__tags, ${__span...}) has to be written $$.
    for line_number, line in enumerate(raw_text.splitlines(), 1):
        code = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        for match in re.finditer(r"\$+", code):
            if len(match.group()) % 2 == 1:
                errors.append(f"line {line_number}: unescaped $ (Grafana would expand it)")
    return errors


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD_PATH.read_text()))


@pytest.fixture(scope="module")
def datasource_uids() -> dict[str, str]:
    return provisioned_datasources()


def _load_generator() -> ModuleType:
    # Regenerating the dashboard needs grafana-foundation-sdk (the dev extra); viewing it not.
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        needs.unavailable("grafana-foundation-sdk missing (pip install -e '.[dev]')")
    spec = importlib.util.spec_from_file_location(
        "generate_dashboard", GRAFANA_DIR / "generate_dashboard.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the real files


def test_committed_dashboard_is_what_the_generator_makes() -> None:
    generator = _load_generator()
    assert DASHBOARD_PATH.read_text() == generator.render(), (
        "grafana/dashboards/training-fabric.json is stale: run "
        "python grafana/generate_dashboard.py and commit the result"
    )


def test_dashboard_is_valid(dashboard: dict[str, Any], datasource_uids: dict[str, str]) -> None:
    assert validate_dashboard(dashboard, datasource_uids) == []


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == DASHBOARD_UID
    assert dashboard["title"] == "Training fabric"
    assert "id" not in dashboard or dashboard["id"] is None, "a provisioned dashboard has no id"


def test_datasource_provisioning_is_valid() -> None:
    files = sorted(DATASOURCES_DIR.glob("*.y*ml"))
    assert files
    for path in files:
        text = path.read_text()
        assert validate_datasource_provisioning(yaml.safe_load(text), text) == [], path


def test_datasources_have_the_stable_uids_and_links(datasource_uids: dict[str, str]) -> None:
    assert datasource_uids == {"skewtrace-prometheus": "prometheus", "skewtrace-tempo": "tempo"}
    document = yaml.safe_load((DATASOURCES_DIR / "skewtrace.yaml").read_text())
    by_uid = {ds["uid"]: ds for ds in document["datasources"]}
    prometheus = by_uid["skewtrace-prometheus"]["jsonData"]
    # The Collector's prometheus exporter puts the trace ID on exemplars as label trace_id.
    assert prometheus["exemplarTraceIdDestinations"] == [
        {"name": "trace_id", "datasourceUid": "skewtrace-tempo"}
    ]
    tempo = by_uid["skewtrace-tempo"]["jsonData"]
    assert tempo["tracesToMetrics"]["datasourceUid"] == "skewtrace-prometheus"
    tags = {tag["key"]: tag["value"] for tag in tempo["tracesToMetrics"]["tags"]}
    assert tags == {semconv.JOB_ID: JOB, semconv.RANK: RANK}
    for query in tempo["tracesToMetrics"]["queries"]:
        # After Grafana's $$ unescaping the query must use the tag filter or a span tag.
        unescaped = query["query"].replace("$$", "$")
        assert "$__tags" in unescaped or "${__span.tags" in unescaped, query
        # Hand-written in YAML: its metrics must be registered ones (a rename fails here).
        assert metric_names(unescaped) <= semconv_prometheus_metrics(), query


def test_dashboard_provider_points_at_the_mounted_dashboards() -> None:
    providers = yaml.safe_load((DASHBOARD_PROVIDERS_DIR / "skewtrace.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((GRAFANA_DIR / "docker-compose.yaml").read_text())
    mounts = {
        volume.split(":")[1]: volume.split(":")[0]
        for volume in compose["services"]["grafana"]["volumes"]
    }
    source = mounts.get(provider["options"]["path"])
    assert source is not None, "the provider's path is not a mount of the grafana service"
    assert (GRAFANA_DIR / source / DASHBOARD_PATH.name).is_file()


def test_every_panel_has_a_description(dashboard: dict[str, Any]) -> None:
    missing = [
        p["title"]
        for p in iter_panels(dashboard)
        if p["type"] != "row" and not p.get("description")
    ]
    assert missing == []


def test_variables_for_job_and_process_group(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) >= {"job", "pg"}
    assert JOB in variables["job"]["query"]["query"]
    assert PG in variables["pg"]["query"]["query"]
    # The process group list depends on the chosen job.
    assert "$job" in variables["pg"]["query"]["query"]


def _panels_using(dashboard: Mapping[str, Any], needle: str) -> list[Mapping[str, Any]]:
    return [
        p
        for p in iter_panels(dashboard)
        if any(needle in json.dumps(t) for t in p.get("targets", []))
    ]


def _shows(metric: str, *needles: str, kind: str = "") -> Callable[[Mapping[str, Any]], bool]:
    """A panel (of type ``kind``) reads ``metric`` and its targets contain every needle."""

    def present(dashboard: Mapping[str, Any]) -> bool:
        return any(
            (not kind or p["type"] == kind)
            and all(needle in json.dumps(p["targets"]) for needle in needles)
            for p in _panels_using(dashboard, metric)
        )

    return present


def _straggler_table_with_link(dashboard: Mapping[str, Any]) -> bool:
    return any(
        p["type"] == "table"
        and all(label in p["targets"][0]["expr"] for label in (RANK, HOST, SWITCH, NIC, CAUSE))
        and any("/explore" in link["url"] for link in p["fieldConfig"]["defaults"]["links"])
        for p in _panels_using(dashboard, semconv.PROM_STRAGGLER)
    )


QUANTILES = tuple(f"histogram_quantile({q}," for q in (0.5, 0.95, 0.99))
LATENESS_BUCKETS = semconv.PROM_RANK_LATENESS + "_bucket"

# What issue 5 asks the dashboard to answer; each entry: a name and a test on the panels.
REQUIRED_PANELS: list[tuple[str, Callable[[Mapping[str, Any]], bool]]] = [
    ("step time per rank", _shows(semconv.PROM_STEP_DURATION, f"by ({RANK})")),
    (
        "barrier skew p50/p95/p99 over time",
        _shows(semconv.PROM_BARRIER_SKEW + "_bucket", *QUANTILES, kind="timeseries"),
    ),
    ("per-rank lateness heatmap", _shows(semconv.PROM_RANK_LATENESS, RANK, kind="heatmap")),
    (
        "current stragglers table with rank, node, switch, NIC, cause and a TraceQL link",
        _straggler_table_with_link,
    ),
    ("what each straggler costs", _shows(semconv.PROM_RANK_COST, RANK, kind="table")),
    (
        "suspected NICs, hosts, uplinks and switches with their cost",
        _shows(semconv.PROM_FABRIC_SUSPECT, semconv.PROM_FABRIC_COST, kind="table"),
    ),
    ("what-if slowdown of the job", _shows(semconv.PROM_JOB_SLOWDOWN, kind="stat")),
    ("lateness rolled up by switch", _shows(LATENESS_BUCKETS, SWITCH)),
    ("lateness rolled up by NIC", _shows(LATENESS_BUCKETS, NIC)),
    ("host clock offsets", _shows(semconv.PROM_CLOCK_OFFSET)),
    ("pacing state", _shows(semconv.PROM_PACING_ACTIVE)),
    ("per-rank pacing delays", _shows(semconv.PROM_PACING_DELAY, RANK)),
    # The Collector's own telemetry, by what its names say.
    ("collector pending", _shows("pending")),
    ("collector incomplete", _shows("incomplete")),
    ("collector evicted", _shows("evicted")),
    ("dropped spans", _shows("send_failed_spans")),
]


@pytest.mark.parametrize("name,present", REQUIRED_PANELS, ids=[n for n, _ in REQUIRED_PANELS])
def test_dashboard_answers(
    dashboard: dict[str, Any], name: str, present: Callable[[Mapping[str, Any]], bool]
) -> None:
    assert present(dashboard), f"no panel answers: {name}"


def semconv_prometheus_metrics() -> set[str]:
    """Prometheus names of every metric docs/semantic-conventions.md lists: the Prometheus
    column of its generated metric tables (metric | type | unit | Prometheus | ...), with the
    series of histograms."""
    names: set[str] = set()
    column = None
    for line in SEMCONV_PATH.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            column = None
        elif column is None:
            column = cells.index("Prometheus") if "Prometheus" in cells else -1
        elif column >= 0 and cells[column].startswith("`"):
            base = cells[column].strip("`")
            if cells[1].startswith("histogram"):
                names.update(base + series for series in semconv.HISTOGRAM_SERIES)
            else:
                names.add(base)
    return names


def test_dashboard_metric_names_follow_the_semantic_conventions(dashboard: dict[str, Any]) -> None:
    documented = semconv_prometheus_metrics()
    assert semconv.PROM_BARRIER_SKEW + "_bucket" in documented
    assert semconv.PROM_STRAGGLER in documented
    used = {name for query in dashboard_queries(dashboard) for name in metric_names(query.expr)}
    ours = {name for name in used if name.startswith(("training_", "skewtrace_"))}
    assert len(ours) >= 10
    assert sorted(ours - documented) == []


def test_metric_names_extracts_selectors_only() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, training_rank) (rate(a_bucket{x="y{z}"}[1m])))'
        " / on (training_rank) group_left b or vector(0) + sum(rate(c_total[$__rate_interval]))"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c_total"}


def test_straggler_link_opens_the_flagged_spans_of_the_row(dashboard: dict[str, Any]) -> None:
    (table,) = [p for p in iter_panels(dashboard) if p["title"] == "Current stragglers"]
    (link,) = table["fieldConfig"]["defaults"]["links"]
    # What Grafana does on click: interpolate, then the browser decodes the query string.
    url = (
        link["url"]
        .replace(f"${{__data.fields.{JOB}}}", "job-7")
        .replace(f"${{__data.fields.{RANK}}}", "2")
        .replace("${__from}", "1700000000000")
        .replace("${__to}", "1700000600000")
    )
    assert "${" not in url
    parsed = urllib.parse.urlsplit(url)
    assert parsed.path == "/explore"
    panes = json.loads(urllib.parse.parse_qs(parsed.query)["panes"][0])
    (pane,) = panes.values()
    assert pane["datasource"] == "skewtrace-tempo"
    (query,) = pane["queries"]
    assert query["queryType"] == "traceql"
    assert query["query"] == (
        '{ resource.training.job.id = "job-7" && resource.training.rank = 2 '
        "&& span.training.straggler = true }"
    )
    assert pane["range"] == {"from": "1700000000000", "to": "1700000600000"}


@pytest.mark.prometheus
def test_promql_parses_with_promtool(dashboard: dict[str, Any], promtool_binary: str) -> None:
    """Every PromQL expression (variables substituted as Grafana would) parses."""
    promtool = promtool_binary
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    exprs = [substitute_variables(q.expr, {"job": ".*", "pg": ".*"}) for q in queries]
    assert promtool_check(exprs, promtool) == ""


# --------------------------------------------------------------------------- the validator
# catches broken dashboards (each mutation must produce its error)


def _first_prometheus_target(d: dict[str, Any]) -> Any:
    return next(t for p in iter_panels(d) for t in p.get("targets", []) if "expr" in t)


def _first_non_row(d: dict[str, Any]) -> Any:
    return next(p for p in iter_panels(d) if p["type"] != "row")


def _break_variable(d: dict[str, Any]) -> None:
    _first_prometheus_target(d)["expr"] += ' * on() group_left max(x{a="$nosuchvar"})'


def _break_panel_id(d: dict[str, Any]) -> None:
    panels: list[Any] = list(iter_panels(d))
    panels[2]["id"] = panels[1]["id"]


def _break_datasource(d: dict[str, Any]) -> None:
    _first_prometheus_target(d)["datasource"] = {"type": "prometheus", "uid": "prom-typo"}


def _break_targets(d: dict[str, Any]) -> None:
    _first_non_row(d)["targets"] = []


def _break_title(d: dict[str, Any]) -> None:
    del d["title"]


def _break_grid(d: dict[str, Any]) -> None:
    grid = _first_non_row(d)["gridPos"]
    grid["x"] = 25 - grid["w"]  # one column past the right edge


def _break_ref_ids(d: dict[str, Any]) -> None:
    panel = next(p for p in iter_panels(d) if len(p.get("targets", [])) > 1)
    panel["targets"][1]["refId"] = panel["targets"][0]["refId"]


def _break_variable_order(d: dict[str, Any]) -> None:
    d["templating"]["list"].reverse()


def _break_expr(d: dict[str, Any]) -> None:
    _first_prometheus_target(d)["expr"] = "  "


def _break_link(d: dict[str, Any]) -> None:
    table = next(p for p in iter_panels(d) if p["title"] == "Current stragglers")
    table["fieldConfig"]["defaults"]["links"][0]["url"] += "&var-x=${rank}"


BROKEN_DASHBOARDS = [
    ("dangling variable", _break_variable, "undefined variable $nosuchvar"),
    ("duplicate panel id", _break_panel_id, "duplicate panel id"),
    ("unknown datasource uid", _break_datasource, "'prom-typo' is not provisioned"),
    ("panel without targets", _break_targets, "no targets"),
    ("missing title", _break_title, "dashboard: missing title"),
    ("panel off the grid", _break_grid, "outside the 24-column grid"),
    ("duplicate refId", _break_ref_ids, "refIds must be present and unique"),
    ("variable used before defined", _break_variable_order, "uses $job, not defined before it"),
    ("empty expr", _break_expr, "empty PromQL expr"),
    ("dangling variable in a data link", _break_link, "undefined variable $rank"),
]


@pytest.mark.parametrize(
    "mutate,expected",
    [(m, e) for _, m, e in BROKEN_DASHBOARDS],
    ids=[n for n, _, _ in BROKEN_DASHBOARDS],
)
def test_validator_catches_broken_dashboard(
    dashboard: dict[str, Any],
    datasource_uids: dict[str, str],
    mutate: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    broken = copy.deepcopy(dashboard)
    mutate(broken)
    errors = validate_dashboard(broken, datasource_uids)
    assert any(expected in error for error in errors), errors


BROKEN_PROVISIONING = [
    ("exemplar link to a missing uid", "datasourceUid: skewtrace-tempo", "datasourceUid: tempo-x",
     "links to uid 'tempo-x'"),
    ("unescaped $__tags", "{$$__tags}", "{$__tags}", "unescaped $"),
    ("duplicate uid", "uid: skewtrace-tempo", "uid: skewtrace-prometheus", "duplicate uids"),
]  # fmt: skip


@pytest.mark.parametrize(
    "old,new,expected",
    [(o, n, e) for _, o, n, e in BROKEN_PROVISIONING],
    ids=[name for name, *_ in BROKEN_PROVISIONING],
)
def test_validator_catches_broken_provisioning(old: str, new: str, expected: str) -> None:
    text = (DATASOURCES_DIR / "skewtrace.yaml").read_text()
    assert old in text
    broken = text.replace(old, new, 1)
    errors = validate_datasource_provisioning(yaml.safe_load(broken), broken)
    assert any(expected in error for error in errors), errors


def test_grafana_regex_value_escapes_like_grafana() -> None:
    # In PromQL source: "job\\.1" is the regex job\.1 (a literal dot).
    assert grafana_regex_value(["job.1"]) == "job\\\\.1"
    assert grafana_regex_value(["a", "b-2"]) == "(a|b-2)"


def test_substitute_variables_rejects_unknown_variables() -> None:
    assert substitute_variables('rate(x{j=~"$job"}[$__rate_interval])', {"job": "a"}) == (
        'rate(x{j=~"a"}[30s])'
    )
    with pytest.raises(KeyError, match="nosuch"):
        substitute_variables('x{a="$nosuch"}', {})


# --------------------------------------------------------------------------- TraceQL


def _traceql_snippets() -> list[str]:
    """The TraceQL of docs/viewing.md (fenced blocks that start with `{`) and the dashboard."""
    docs = (REPO_ROOT / "docs" / "viewing.md").read_text()
    blocks = re.findall(r"```\n(\{.*?)```", docs, flags=re.S)
    dashboard = json.loads(DASHBOARD_PATH.read_text())
    generator = _load_generator()
    return [*blocks, generator.STRAGGLER_TRACEQL, generator.RECENT_STRAGGLERS_TRACEQL] + [
        t["query"] for p in iter_panels(dashboard) for t in p.get("targets", []) if "query" in t
    ]


def _semconv_tables() -> tuple[set[str], set[str], set[str]]:
    """(resource attribute keys, span/annotation attribute keys, span names) documented."""
    resource: set[str] = set()
    span: set[str] = set()
    names: set[str] = set()
    section = ""
    for line in SEMCONV_PATH.read_text().splitlines():
        if line.startswith("## "):
            section = line
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cells or not cells[0].startswith("`"):
            continue
        keys = set(re.findall(r"`([a-z_.]+)`", cells[0]))
        if "Resource attributes" in section:
            resource |= keys
        elif "Traces" in section and len(cells) == 4 and "emitted by" not in line:
            # span attribute rows (key | type | on | meaning) and span name rows
            emitters = ("every rank", "rank 0", "every paced rank", "the barrierskew processor")
            (names if cells[1].startswith(emitters) else span).update(keys)
        elif "Annotations" in section:
            span |= keys
    # collective.<op> rows list every op name in the meaning column
    names |= set(re.findall(r"`(collective\.[a-z_]+)`", SEMCONV_PATH.read_text()))
    return resource, span, names


def unknown_traceql_names(snippets: list[str]) -> list[str]:
    """Attributes and span names in TraceQL that docs/semantic-conventions.md does not list."""
    resource, span, names = _semconv_tables()
    unknown = []
    for text in snippets:
        for scope, key in re.findall(r"\b(resource|span)\.([a-z_]+(?:\.[a-z_]+)*)", text):
            if key not in (resource if scope == "resource" else span):
                unknown.append(f"{scope}.{key} in {text.strip()!r}")
        # Span names (`name = ...`), not event names (`event:name = ...`).
        for name in re.findall(r'(?<![:\w.])name\s*=\s*"([^"]+)"', text):
            if name not in names:
                unknown.append(f"span name {name!r} in {text.strip()!r}")
    return unknown


def test_traceql_uses_documented_attributes_and_span_names() -> None:
    resource, span, names = _semconv_tables()
    assert {"training.rank", "host.name", "training.switch"} <= resource
    assert {"training.straggler", "training.barrier.skew", "training.step"} <= span
    assert {"train.step", "pacing.delay", "collective.all_reduce"} <= names
    snippets = _traceql_snippets()
    assert len(snippets) >= 10
    assert unknown_traceql_names(snippets) == []


def test_traceql_check_catches_typos() -> None:
    assert unknown_traceql_names(
        [
            "{ span.training.stragler = true }",  # misspelt annotation
            "{ span.training.rank = 2 }",  # a resource attribute under span.
            '{ name = "train_step" }',  # not a span name
        ]
    ) == [
        "span.training.stragler in '{ span.training.stragler = true }'",
        "span.training.rank in '{ span.training.rank = 2 }'",
        "span name 'train_step' in '{ name = \"train_step\" }'",
    ]
