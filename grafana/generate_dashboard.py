"""Generates ``grafana/dashboards/training-fabric.json``, the "Training fabric" dashboard.

The JSON is committed (Grafana provisioning reads it); this script is its source. After an
edit here, regenerate and commit both::

    python grafana/generate_dashboard.py            # rewrites the JSON
    python grafana/generate_dashboard.py --check    # exits 1 when the JSON is stale

``tests/test_dashboards.py`` fails when the committed JSON differs from what this produces.

Built with Grafana's ``grafana-foundation-sdk``: typed builders for the dashboard, the panel
types and the Prometheus and Tempo queries (a misspelt option or enum value is a type error,
and Grafana's defaults are written out), with its row-by-row layout. Only regenerating needs
it (the ``dev`` extra). Its releases are numbered ``<build>!<Grafana version>`` and the
highest build is not the newest Grafana, so the pin names the build: ``1769699379!11.6.0``,
the types of Grafana 11.6 (schemaVersion 41; ``docker-compose.yaml`` runs Grafana 12.1).
Written here by hand, because the SDK does not model them: the Explore URL of the straggler
table's data link (a URL, not dashboard JSON; the query in it is the SDK's Tempo query) and
the panel ids (numbered in order after the build; the SDK leaves them to Grafana). Two things
the SDK writes differently from Grafana's own export, both ignored by Grafana: data links are
typed as dashboard links (so they carry ``type``, ``icon``, ``includeVars``, ...), and
variables have no ``definition`` (the text the variable list shows; the query is ``query``).

Names: every metric and label is a ``skewtrace.semconv`` constant (``PROM_*`` for the
Prometheus name of a registered metric, ``prometheus_label()`` of a registered attribute key),
so a rename in ``src/semconv/registry.yaml`` changes this dashboard. The barrierskew
components' own instruments are the ones the registry's ``component_metric`` groups point at
(the components' mdatagen ``metadata.yaml``), looked up by name so a renamed instrument fails
here; the Collector's standard pipeline counters (``otelcol_receiver_*``, ``otelcol_exporter_*``)
are not skewtrace names and are written out.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import (
    dashboard,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    tempo,
    timeseries,
)
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models import prometheus as prometheus_model
from grafana_foundation_sdk.models import tempo as tempo_model

from skewtrace import semconv

ROOT = Path(__file__).resolve().parent.parent
REGISTRY_PATH = ROOT / "src" / "semconv" / "registry.yaml"
OUTPUT_PATH = Path(__file__).resolve().parent / "dashboards" / "training-fabric.json"

DASHBOARD_UID = "skewtrace-training-fabric"
DASHBOARD_TITLE = "Training fabric"
PROMETHEUS_UID = "skewtrace-prometheus"
TEMPO_UID = "skewtrace-tempo"

PROMETHEUS = model.DataSourceRef(type_val="prometheus", uid=PROMETHEUS_UID)
TEMPO = model.DataSourceRef(type_val="tempo", uid=TEMPO_UID)

# Prometheus labels of the data point attributes the panels group and filter by.
JOB = semconv.prometheus_label(semconv.JOB_ID)
RANK = semconv.prometheus_label(semconv.RANK)
HOST = semconv.prometheus_label(semconv.HOST_NAME)
SWITCH = semconv.prometheus_label(semconv.SWITCH)
NIC = semconv.prometheus_label(semconv.NIC)
PG = semconv.prometheus_label(semconv.COLLECTIVE_PG)
OP = semconv.prometheus_label(semconv.COLLECTIVE_OP)
CAUSE = semconv.prometheus_label(semconv.STRAGGLER_CAUSE)
STAGE = semconv.prometheus_label(semconv.PIPELINE_STAGE)
KIND = semconv.prometheus_label(semconv.SUSPECT_KIND)
ATTRIBUTION_KIND = semconv.prometheus_label(semconv.ATTRIBUTION_KIND)
NAME = semconv.prometheus_label(semconv.SUSPECT_NAME)
REASON = semconv.prometheus_label(semconv.REASON)
IFACE = semconv.prometheus_label(semconv.NETWORK_INTERFACE)
NET_DIRECTION = semconv.prometheus_label(semconv.NETWORK_DIRECTION)
DEVICE = semconv.prometheus_label(semconv.SYSTEM_DEVICE)
DISK_DIRECTION = semconv.prometheus_label(semconv.DISK_DIRECTION)
QDISC = semconv.prometheus_label(semconv.QDISC_KIND)
NIC_DEVICE = semconv.prometheus_label(semconv.NIC_DEVICE)
NIC_SIGNAL = semconv.prometheus_label(semconv.NIC_SIGNAL)
THROTTLE = semconv.prometheus_label(semconv.GPU_THROTTLE_REASON)
COMPONENT_KIND = semconv.prometheus_label(semconv.COMPONENT_KIND)
COMPONENT = semconv.prometheus_label(semconv.COMPONENT)
SIGNAL = semconv.prometheus_label(semconv.SIGNAL)
CHANGE_ORDER = semconv.prometheus_label(semconv.CHANGE_ORDER)
CHANGE_EFFECT = semconv.prometheus_label(semconv.CHANGE_EFFECT)
BUCKET = "le"  # Prometheus's own label on histogram buckets

# The rank labels every per-rank series carries (the topology of the rank).
RANK_LABELS = ", ".join((JOB, RANK, HOST, SWITCH, NIC))

# Label selectors. `$job` and `$pg` are multi-value variables whose "All" is `.*`.
IN_JOBS = f'{JOB}=~"$job"'
IN_JOBS_AND_PGS = f'{JOB}=~"$job", {PG}=~"$pg"'


def _component_instruments() -> dict[str, list[str]]:
    """Prometheus name -> label names of the barrierskew components' own instruments.

    The registry's ``component_metric`` groups name the mdatagen ``metadata.yaml`` files that
    declare them and the ``prefix`` that makes the Collector's name (``otelcol_<key>``, also its
    name on the Collector's Prometheus endpoint: units in braces add no suffix, and that
    endpoint serves counters without ``_total``, checked against Collector v0.165.0).
    """
    instruments: dict[str, list[str]] = {}
    for group in yaml.safe_load(REGISTRY_PATH.read_text())["groups"]:
        if group["kind"] != "component_metric":
            continue
        for path in group["metadata"]:
            metadata = yaml.safe_load((ROOT / path).read_text())
            for key, instrument in metadata["telemetry"]["metrics"].items():
                instruments[group["prefix"] + key] = instrument.get("attributes", [])
    return instruments


_INSTRUMENTS = _component_instruments()


def _instrument(name: str, *labels: str) -> str:
    """``name``, after checking the registry declares it (with ``labels``)."""
    if name not in _INSTRUMENTS:
        raise LookupError(f"{name} is not a barrierskew instrument the registry declares")
    missing = set(labels) - set(_INSTRUMENTS[name])
    if missing:
        raise LookupError(f"{name} has no attribute {sorted(missing)}")
    return name


# Labels of those instruments (attributes in their metadata.yaml).
OUTCOME = "outcome"
NOT_JOINED_REASON = "reason"

PENDING = _instrument("otelcol_processor_barrierskew_pending_collectives")
BUFFERED_SPANS = _instrument("otelcol_processor_barrierskew_buffered_spans")
RELEASED = _instrument("otelcol_processor_barrierskew_collectives_released", OUTCOME)
EVICTED = _instrument("otelcol_processor_barrierskew_collectives_evicted")
MALFORMED = _instrument("otelcol_processor_barrierskew_spans_malformed", NOT_JOINED_REASON)
NOT_STORED = _instrument("otelcol_processor_traceshape_spans_dropped", NOT_JOINED_REASON)
# The Collector's standard pipeline counters, labelled by component id (receiver, exporter).
RECEIVER_REFUSED = "otelcol_receiver_refused_spans"
EXPORTER_SEND_FAILED = "otelcol_exporter_send_failed_spans"
EXPORTER_ENQUEUE_FAILED = "otelcol_exporter_enqueue_failed_spans"


def _legend(label: str) -> str:
    """A legend's reference to a series' value of ``label``."""
    return f"{{{{{label}}}}}"


def _fields(label: str) -> str:
    """A data link's reference to the clicked row's value of ``label``."""
    return f"${{__data.fields.{label}}}"


# Straggler spans of the rank in the clicked row: the spans the processor flagged.
STRAGGLER_TRACEQL = (
    f'{{ resource.{semconv.JOB_ID} = "{_fields(JOB)}"'
    f" && resource.{semconv.RANK} = {_fields(RANK)}"
    f" && span.{semconv.STRAGGLER} = true }}"
)

# The dashboard's Tempo panel: flagged collective spans of the selected jobs.
RECENT_STRAGGLERS_TRACEQL = (
    f'{{ resource.{semconv.JOB_ID} =~ "${{job:regex}}" && span.{semconv.STRAGGLER} = true }}'
)


def _traceql(ref_id: str, traceql: str, limit: int) -> tempo.TempoQuery:
    return (
        tempo.TempoQuery()
        .ref_id(ref_id)
        .datasource(TEMPO)
        .query_type("traceql")
        .query(traceql)
        .limit(limit)
        .table_type(tempo_model.SearchTableType.SPANS)
    )


def _traceql_explore_url(traceql: str) -> str:
    """A Grafana Explore URL that runs ``traceql`` against Tempo over the dashboard's range.

    Grafana interpolates ``${...}`` in data link URLs before following them, so those tokens
    are left unencoded; everything else is percent-encoded JSON (Explore's ``panes`` state).
    """
    panes = {
        "traceql": {
            "datasource": TEMPO_UID,
            "queries": [_traceql("A", traceql, 50).build()],
            "range": {"from": "${__from}", "to": "${__to}"},
        }
    }
    text = json.dumps(panes, cls=JSONEncoder, separators=(",", ":"))
    encoded = urllib.parse.quote(text, safe="")
    # Undo the encoding of the interpolation tokens only.
    for token in _interpolation_tokens(text):
        encoded = encoded.replace(urllib.parse.quote(token, safe=""), token)
    return f"/explore?schemaVersion=1&orgId=1&panes={encoded}"


def _interpolation_tokens(text: str) -> list[str]:
    tokens = []
    start = text.find("${")
    while start != -1:
        end = text.index("}", start)
        tokens.append(text[start : end + 1])
        start = text.find("${", end)
    return tokens


# --------------------------------------------------------------------------- PromQL


def _rate(metric: str, selector: str = "", by: str = "") -> str:
    matchers = f"{{{selector}}}" if selector else ""
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({metric}{matchers}[$__rate_interval]))"


def _quantile(q: float, metric: str, selector: str, by: str = "") -> str:
    group = f"{BUCKET}, {by}" if by else BUCKET
    return (
        f"histogram_quantile({q}, sum by ({group}) "
        f"(rate({metric}_bucket{{{selector}}}[$__rate_interval])))"
    )


def _mean(metric: str, selector: str, by: str) -> str:
    return f"{_rate(metric + '_sum', selector, by)}\n/\n{_rate(metric + '_count', selector, by)}"


def _promql(
    ref_id: str,
    expr: str,
    legend: str = "__auto",
    *,
    instant: bool = False,
    table_format: bool = False,
    exemplar: bool = False,
) -> prometheus.Dataquery:
    query = (
        prometheus.Dataquery()
        .ref_id(ref_id)
        .datasource(PROMETHEUS)
        .expr(expr)
        .legend_format(legend)
        .exemplar(exemplar)
    )
    query = query.instant() if instant else query.range()
    if table_format:
        query = query.format(prometheus_model.PromQueryFormat.TABLE)
    return query


# --------------------------------------------------------------------------- panels


def _thresholds(steps: list[tuple[float | None, str]]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def _timeseries(
    title: str,
    description: str,
    targets: list[Builder[Dataquery]],
    width: int,
    height: int = 8,
    unit: str = "s",
) -> timeseries.Panel:
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .span(width)
        .height(height)
        .targets(targets)
        .unit(unit)
        .draw_style(common.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(0)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["mean", "max"])
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )


def _stat(
    title: str,
    description: str,
    target: prometheus.Dataquery,
    unit: str,
    thresholds: list[tuple[float | None, str]],
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .span(4)
        .height(4)
        .with_target(target)
        .unit(unit)
        .thresholds(_thresholds(thresholds))
        .reduce_options(
            common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
        )
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
        .text_mode(common.BigValueTextMode.AUTO)
    )


def _table(
    title: str,
    description: str,
    target: prometheus.Dataquery,
    height: int,
    columns: dict[str, str],
    value: tuple[str, str] | None = None,
) -> table.Panel:
    """A table of an instant query's labels, ``columns`` (label -> header) in order, and its
    value as the last column when ``value`` = (header, unit) is given."""
    shown = dict(columns)
    if value is not None:
        shown["Value"] = value[0]
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .span(12)
        .height(height)
        .with_target(target)
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": value is None},
                    "indexByName": {label: index for index, label in enumerate(shown)},
                    "renameByName": shown,
                },
            )
        )
        .unit(value[1] if value is not None else "none")
        .show_header(True)
        .cell_height(common.TableCellHeight.SM)
        .footer(common_builders.TableFooterOptions().show(False).reducer(["sum"]))
    )


def _variable(name: str, label: str, query: str, description: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(PROMETHEUS)
        .query({"query": query, "refId": f"{name}-variable"})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .options([])
        .regex("")
        .hide(model.VariableHide.DONT_HIDE)
    )


def _variables() -> list[Builder[model.VariableModel]]:
    skew_count = f"{semconv.PROM_BARRIER_SKEW}_count"
    return [
        _variable(
            "job",
            "Job",
            f"label_values({skew_count}, {JOB})",
            f"{semconv.JOB_ID}: one training run (all of its ranks)",
        ),
        _variable(
            "pg",
            "Process group",
            f"label_values({skew_count}{{{IN_JOBS}}}, {PG})",
            f"{semconv.COLLECTIVE_PG}: the process group of the collectives (default = world)",
        ),
    ]


def _fabric_row(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("Barrier skew and stragglers"))
    board.with_panel(
        _stat(
            "Barrier skew p95",
            "95th percentile of barrier skew (latest minus earliest arrival) over the last "
            "interval.",
            _promql("A", _quantile(0.95, semconv.PROM_BARRIER_SKEW, IN_JOBS_AND_PGS), "p95"),
            "s",
            [(None, "green"), (0.005, "yellow"), (0.05, "red")],
        )
    )
    board.with_panel(
        _stat(
            "Stragglers now",
            "Ranks the processor flags as stragglers right now.",
            _promql(
                "A",
                f"count(max by ({RANK_LABELS}) ({semconv.PROM_STRAGGLER}{{{IN_JOBS}}}) > 0)"
                " or vector(0)",
                "stragglers",
                instant=True,
            ),
            "none",
            [(None, "green"), (1, "red")],
        )
    )
    board.with_panel(
        _stat(
            "What-if slowdown",
            "The job's step time over what it would be with the root causes of its steps (the "
            "flagged ranks' own work, suspected links) at their references: 1.25 means steps "
            "would be 20% shorter.",
            _promql(
                "A",
                f"max({semconv.PROM_JOB_SLOWDOWN}{{{IN_JOBS}}})",
                "slowdown",
                instant=True,
            ),
            "none",
            [(None, "green"), (1.05, "yellow"), (1.2, "red")],
        )
    )
    board.with_panel(
        _stat(
            "Suspected fabric now",
            "Parts of the fabric (NICs, hosts, uplinks, switches) suspected right now.",
            _promql(
                "A",
                f"count(max by ({JOB}, {KIND}, {NAME}, {HOST}) "
                f"({semconv.PROM_FABRIC_SUSPECT}{{{IN_JOBS}}}) > 0) or vector(0)",
                "suspects",
                instant=True,
            ),
            "none",
            [(None, "green"), (1, "red")],
        )
    )
    board.with_panel(
        _stat(
            "Pacing",
            "1 while the pacer delays early ranks of the job.",
            _promql(
                "A",
                f"max({semconv.PROM_PACING_ACTIVE}{{{IN_JOBS}}}) or vector(0)",
                "active",
                instant=True,
            ),
            "bool_on_off",
            [(None, "text"), (1, "blue")],
        )
    )
    board.with_panel(
        _stat(
            "Incomplete collectives",
            "Collectives released with ranks missing (per second): a rank that never arrived.",
            _promql(
                "A",
                f"{_rate(semconv.PROM_COLLECTIVE_INCOMPLETE, IN_JOBS_AND_PGS)} or vector(0)",
                "incomplete/s",
            ),
            "cps",
            [(None, "green"), (0.001, "red")],
        )
    )
    board.with_panel(
        _timeseries(
            "Step time per rank",
            "Mean iteration time of each rank. In synchronous training every rank's step ends at "
            "the same barrier, so these lines differ little; a rank whose compute or data is slow "
            "shows in lateness, not here.",
            [
                _promql(
                    "A",
                    _mean(semconv.PROM_STEP_DURATION, IN_JOBS, RANK),
                    f"rank {_legend(RANK)}",
                )
            ],
            12,
        )
    )
    board.with_panel(
        _timeseries(
            "Barrier skew p50 / p95 / p99",
            "Skew = latest minus earliest arrival at each collective, from durations (not clocks). "
            "Exemplars link to the step's trace.",
            [
                _promql(
                    ref_id,
                    _quantile(q, semconv.PROM_BARRIER_SKEW, IN_JOBS_AND_PGS),
                    f"p{q * 100:g}",
                    exemplar=True,
                )
                for ref_id, q in (("A", 0.5), ("B", 0.95), ("C", 0.99))
            ],
            12,
        )
    )
    board.with_panel(
        heatmap.Panel()
        .title("Lateness per rank")
        .description(
            "Mean lateness of each rank (its arrival minus the earliest) per interval: one row "
            "per rank, a hot row is a straggler."
        )
        .datasource(PROMETHEUS)
        .span(12)
        .height(9)
        .with_target(_promql("A", _mean(semconv.PROM_RANK_LATENESS, IN_JOBS, RANK), _legend(RANK)))
        .unit("s")
        .calculate(False)
        .y_axis(
            heatmap.YAxisConfig()
            .axis_placement(common.AxisPlacement.LEFT)
            .reverse(False)
            .axis_label("rank")
        )
        .rows_frame(
            heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.AUTO).value("lateness")
        )
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_model.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            .scale(heatmap_model.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
            .reverse(False)
        )
        .cell_gap(1)
        .cell_values(heatmap.CellValues().unit("s"))
        .show_value(common.VisibilityMode.NEVER)
        .mode(common.TooltipDisplayMode.SINGLE)
        .hide_y_histogram()
        .show_color_scale(True)
        .show_legend()
        .exemplars_color("rgba(255,0,255,0.7)")
    )
    board.with_panel(
        _table(
            "Current stragglers",
            "Ranks flagged now (the root cause of most recent steps, not the ranks that only "
            "waited for one), where they sit, what made them late, and what each costs the job "
            "per step (how much shorter a step would be with the rank's own work at its peers' "
            "median). Fix the most expensive first. Click a row for the rank's flagged spans "
            "in Tempo.",
            _promql(
                "A",
                f"max by ({RANK_LABELS}, {CAUSE}) ({semconv.PROM_STRAGGLER}{{{IN_JOBS}}} > 0)"
                f" * on ({RANK_LABELS}) group_left"
                f" max by ({RANK_LABELS}) ({semconv.PROM_RANK_COST}{{{IN_JOBS}}})",
                instant=True,
                table_format=True,
            ),
            9,
            {RANK: "rank", HOST: "node", SWITCH: "switch", NIC: "NIC", CAUSE: "cause", JOB: "job"},
            value=("cost per step", "s"),
        ).data_links(
            [
                dashboard.DashboardLink(f"Flagged spans of rank {_fields(RANK)} in Tempo")
                .url(_traceql_explore_url(STRAGGLER_TRACEQL))
                .target_blank(False)
            ]
        )
    )
    board.with_panel(
        _timeseries(
            "Lateness p95 by switch",
            "Lateness of the ranks behind each leaf switch. One switch high while the others stay "
            "low points at that switch (contention or a bad link), not at a rank.",
            [
                _promql(
                    "A",
                    _quantile(0.95, semconv.PROM_RANK_LATENESS, IN_JOBS, SWITCH),
                    _legend(SWITCH),
                    exemplar=True,
                )
            ],
            12,
        )
    )
    board.with_panel(
        _timeseries(
            "Lateness p95 by NIC",
            "Lateness of the ranks using each NIC: a NIC shared by the late ranks is the suspect.",
            [
                _promql(
                    "A",
                    _quantile(0.95, semconv.PROM_RANK_LATENESS, IN_JOBS, f"{HOST}, {NIC}"),
                    f"{_legend(HOST)} {_legend(NIC)}",
                    exemplar=True,
                )
            ],
            12,
        )
    )
    board.with_panel(
        _timeseries(
            "Wait p95 per rank",
            "Time each rank spent waiting at barriers for the latest one: the cost stragglers "
            "impose on everyone else (what pacing trades against).",
            [
                _promql(
                    "A",
                    _quantile(0.95, semconv.PROM_RANK_WAIT, IN_JOBS, RANK),
                    f"rank {_legend(RANK)}",
                    exemplar=True,
                )
            ],
            12,
        )
    )
    board.with_panel(
        _table(
            "Suspected fabric",
            "Parts of the fabric suspected of making the job's steps late, with what each costs "
            "per step: a host's NIC or a leaf's uplink that every slow process group crosses "
            "and no healthy one does, or a switch (host) that flagged ranks on two or more of "
            "its hosts (two or more of its ranks) share.",
            _promql(
                "A",
                f"max by ({JOB}, {KIND}, {NAME}, {HOST}) "
                f"({semconv.PROM_FABRIC_SUSPECT}{{{IN_JOBS}}} > 0)"
                f" * on ({JOB}, {KIND}, {NAME}, {HOST}) group_left"
                f" max by ({JOB}, {KIND}, {NAME}, {HOST})"
                f" ({semconv.PROM_FABRIC_COST}{{{IN_JOBS}}})",
                instant=True,
                table_format=True,
            ),
            8,
            {KIND: "kind", NAME: "name", HOST: "host (of a NIC)", JOB: "job"},
            value=("cost per step", "s"),
        )
    )
    board.with_panel(
        _table(
            "Imbalances",
            "Work no single rank explains, with what it costs per step (the replayed step minus "
            "the replayed step with the work balanced): a pipeline stage longer than the mean "
            "stage on every replica (stage_imbalance: repartition its layers), or work split "
            "unevenly across data-parallel replicas from step to step (data_imbalance: split "
            "each global batch by tokens). Pacing cannot level either. The fix in words is on "
            "the step summaries' training.imbalance events.",
            _promql(
                "A",
                f"max by ({JOB}, {CAUSE}, {STAGE}) ({semconv.PROM_IMBALANCE}{{{IN_JOBS}}} > 0)"
                f" * on ({JOB}, {CAUSE}, {STAGE}) group_left"
                f" max by ({JOB}, {CAUSE}, {STAGE}) ({semconv.PROM_IMBALANCE_COST}{{{IN_JOBS}}})",
                instant=True,
                table_format=True,
            ),
            8,
            {CAUSE: "cause", STAGE: "stage (-1: data)", JOB: "job"},
            value=("cost per step", "s"),
        )
    )
    board.with_panel(
        _timeseries(
            "Where the step's time goes",
            "What fixing one kind of work alone would save per step (the step replayed with "
            "every instance of that kind at its reference, moving average): compute (every "
            "rank's own work between its collectives: data, forward, backward, optimizer) or "
            "a collective op's transfers (send_recv: pipeline messages). Savings do not add up.",
            [
                _promql(
                    "A",
                    f"max by ({JOB}, {ATTRIBUTION_KIND}) ({semconv.PROM_ATTRIBUTION}{{{IN_JOBS}}})",
                    f"{_legend(ATTRIBUTION_KIND)} ({_legend(JOB)})",
                )
            ],
            12,
            unit="s",
        )
    )
    board.with_panel(
        _timeseries(
            "Replay self-check",
            "How far the step replay, fed the measured durations, is from the measured step "
            "(moving average, a fraction). Above 0.02 the job's spans do not form the "
            "dependencies the replay assumes, and costs and the slowdown are less sure.",
            [
                _promql(
                    "A",
                    f"max by ({JOB}) ({semconv.PROM_REPLAY_ERROR}{{{IN_JOBS}}})",
                    _legend(JOB),
                )
            ],
            12,
        )
    )
    board.with_panel(
        _timeseries(
            "Host clock offsets",
            "Each host's collective end time minus the members' median end time. Skew does not "
            "use clocks; offsets beyond a few ms mean NTP/PTP trouble and make raw timestamps in "
            "the trace view misleading.",
            [
                _promql(
                    "A",
                    f"max by ({HOST}) ({semconv.PROM_CLOCK_OFFSET}{{{IN_JOBS}}})",
                    _legend(HOST),
                )
            ],
            12,
        )
    )
    board.with_panel(
        _timeseries(
            "Incomplete collectives by op",
            "Collectives released after wait_timeout with members missing, per second.",
            [
                _promql(
                    "A",
                    _rate(semconv.PROM_COLLECTIVE_INCOMPLETE, IN_JOBS_AND_PGS, f"{PG}, {OP}"),
                    f"{_legend(PG)} {_legend(OP)}",
                )
            ],
            12,
            unit="cps",
        )
    )


# Onsets of the first changes in milliseconds, what Grafana's time units and annotations read.
FIRST_CHANGE_MILLIS = (
    f"max by ({JOB}, {CHANGE_ORDER}, {COMPONENT_KIND}, {COMPONENT}, {SIGNAL}, {CHANGE_EFFECT}) "
    f"({semconv.PROM_FIRST_CHANGE}{{{IN_JOBS}}}) * 1000"
)


def _annotations() -> list[dict[str, Any]]:
    """Verdicts and first changes as annotations on every time-series panel.

    Written as Grafana's JSON (the SDK's AnnotationQuery has no Prometheus fields):
    ``titleFormat``/``textFormat`` take legend templates; ``useValueForTime`` puts a first
    change at its onset (the series' value, in ms) rather than when it was found.
    """

    def prometheus_annotation(name: str, color: str, expr: str, **fields: Any) -> dict[str, Any]:
        return {
            "datasource": {"type": "prometheus", "uid": PROMETHEUS_UID},
            "enable": True,
            "hide": False,
            "iconColor": color,
            "name": name,
            "expr": expr,
            "step": "10s",
            **fields,
        }

    return [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        },
        prometheus_annotation(
            "Stragglers flagged",
            "red",
            f"max by ({JOB}, {RANK}, {HOST}, {CAUSE}) ({semconv.PROM_STRAGGLER}{{{IN_JOBS}}}) == 1",
            titleFormat=f"straggler: rank {_legend(RANK)} ({_legend(CAUSE)})",
            textFormat=f"{_legend(JOB)} on {_legend(HOST)}",
            useValueForTime=False,
        ),
        prometheus_annotation(
            "First change",
            "orange",
            FIRST_CHANGE_MILLIS,
            titleFormat=f"change {_legend(CHANGE_ORDER)}: {_legend(COMPONENT)}",
            textFormat=f"{_legend(SIGNAL)} ({_legend(COMPONENT_KIND)})",
            useValueForTime=True,
        ),
    ]


def _timeline_row(board: dashboard.Dashboard) -> None:
    """Step time, collectives, data loading, network, GPU and storage of the selected jobs on
    the dashboard's shared time axis (crosshair shared across panels), with the first changes
    ``skewtrace timeline watch`` found. Node series carry the ranks' resource labels, so
    ``$job`` selects the hosts, NICs and volumes the job's ranks use."""
    board.with_row(dashboard.Row("Timeline: what changed first"))
    board.with_panel(
        _timeseries(
            "Step time (slowest and median rank)",
            "The job's step time: the slowest rank's mean iteration time and the median over "
            "ranks. A regression starts here; the panels below say which component changed "
            "before it.",
            [
                _promql(
                    "A",
                    f"max by ({JOB}) ({_mean(semconv.PROM_STEP_DURATION, IN_JOBS, RANK)})",
                    f"slowest {_legend(JOB)}",
                ),
                _promql(
                    "B",
                    f"quantile by ({JOB}) (0.5, "
                    f"{_mean(semconv.PROM_STEP_DURATION, IN_JOBS, RANK)})",
                    f"median {_legend(JOB)}",
                ),
            ],
            12,
        )
    )
    board.with_panel(
        _timeseries(
            "Collective transfer per process group",
            "Mean time each group's collectives took after their last member arrived: what the "
            "network took. It rises with a slow link or a congested switch, not with a slow rank.",
            [
                _promql(
                    "A",
                    _mean(semconv.PROM_COLLECTIVE_TRANSFER, IN_JOBS_AND_PGS, PG),
                    _legend(PG),
                )
            ],
            12,
        )
    )
    board.with_panel(
        _timeseries(
            "Data-loader wait per batch",
            "Mean time each rank's training loop waited for a batch (its dataloader.fetch spans): "
            "a slow volume or an overloaded data pipeline shows here first.",
            [
                _promql(
                    "A",
                    f"{_rate(semconv.PROM_DATALOADER_WAIT, IN_JOBS, RANK)}\n/\n"
                    f"{_rate(semconv.PROM_DATALOADER_FETCHES, IN_JOBS, RANK)}",
                    f"rank {_legend(RANK)}",
                )
            ],
            8,
        )
    )
    board.with_panel(
        _timeseries(
            "Network interfaces",
            "Bytes per second through each interface of the job's hosts, by direction.",
            [
                _promql(
                    "A",
                    _rate(semconv.PROM_NETWORK_IO, IN_JOBS, f"{HOST}, {IFACE}, {NET_DIRECTION}"),
                    f"{_legend(HOST)}/{_legend(IFACE)} {_legend(NET_DIRECTION)}",
                )
            ],
            8,
            unit="Bps",
        )
    )
    board.with_panel(
        _timeseries(
            "Network errors, drops and retransmits",
            "Per second: interface errors and drops, qdisc drops (a full shaping queue), TCP "
            "retransmits, and InfiniBand/RoCE port signals other than traffic (link errors, "
            "discards, xmit wait, retransmits, congestion marks).",
            [
                _promql(
                    "A",
                    _rate(semconv.PROM_NETWORK_ERRORS, IN_JOBS, f"{HOST}, {IFACE}"),
                    f"errors {_legend(HOST)}/{_legend(IFACE)}",
                ),
                _promql(
                    "B",
                    _rate(semconv.PROM_NETWORK_DROPPED, IN_JOBS, f"{HOST}, {IFACE}"),
                    f"dropped {_legend(HOST)}/{_legend(IFACE)}",
                ),
                _promql(
                    "C",
                    _rate(semconv.PROM_QDISC_DROPS, IN_JOBS, f"{HOST}, {IFACE}, {QDISC}"),
                    f"qdisc drops {_legend(HOST)}/{_legend(IFACE)} {_legend(QDISC)}",
                ),
                _promql(
                    "D",
                    _rate(semconv.PROM_TCP_RETRANSMITS, IN_JOBS, HOST),
                    f"TCP retransmits {_legend(HOST)}",
                ),
                _promql(
                    "E",
                    _rate(
                        semconv.PROM_NIC_PORT_COUNTER,
                        f'{IN_JOBS}, {NIC_SIGNAL}!="{semconv.NIC_SIGNAL_TRAFFIC}"',
                        f"{HOST}, {NIC_DEVICE}, {NIC_SIGNAL}",
                    ),
                    f"{_legend(NIC_SIGNAL)} {_legend(HOST)}/{_legend(NIC_DEVICE)}",
                ),
            ],
            8,
            unit="short",
        )
    )
    board.with_panel(
        _timeseries(
            "Qdisc backlog",
            "Bytes waiting in each interface's queueing discipline: a shaped or congested link "
            "fills it before it drops.",
            [
                _promql(
                    "A",
                    f"max by ({HOST}, {IFACE}, {QDISC}) "
                    f"({semconv.PROM_QDISC_BACKLOG}{{{IN_JOBS}}})",
                    f"{_legend(HOST)}/{_legend(IFACE)} {_legend(QDISC)}",
                )
            ],
            8,
            unit="bytes",
        )
    )
    board.with_panel(
        _timeseries(
            "GPU utilization and throttling",
            "Each rank's GPU: the fraction of time a kernel ran, and 1 per clock-throttle reason "
            "while NVML reports it (power cap, thermal, hardware slowdown). Empty without GPUs.",
            [
                _promql(
                    "A",
                    f"max by ({RANK}) ({semconv.PROM_GPU_UTILIZATION}{{{IN_JOBS}}})",
                    f"utilization rank {_legend(RANK)}",
                ),
                _promql(
                    "B",
                    f"max by ({RANK}, {THROTTLE}) ({semconv.PROM_GPU_THROTTLE}{{{IN_JOBS}}}) > 0",
                    f"throttled rank {_legend(RANK)} {_legend(THROTTLE)}",
                ),
            ],
            8,
            unit="percentunit",
        )
    )
    board.with_panel(
        _timeseries(
            "Storage latency and rank I/O",
            "Mean time per operation of each block device of the job's hosts (left), and the "
            "bytes per second each rank and its data-loader workers read.",
            [
                _promql(
                    "A",
                    f"{_rate(semconv.PROM_DISK_OPERATION_TIME, IN_JOBS, f'{HOST}, {DEVICE}')}"
                    f"\n/\n{_rate(semconv.PROM_DISK_OPERATIONS, IN_JOBS, f'{HOST}, {DEVICE}')}",
                    f"latency {_legend(HOST)}/{_legend(DEVICE)}",
                ),
                _promql(
                    "B",
                    _rate(
                        semconv.PROM_PROCESS_IO,
                        f'{IN_JOBS}, {DISK_DIRECTION}="{semconv.DIRECTION_READ}"',
                        RANK,
                    ),
                    f"read rank {_legend(RANK)} (B/s)",
                ),
            ],
            8,
        )
    )
    board.with_panel(
        _table(
            "First changes before the latest regression",
            "From `skewtrace timeline watch`: the components whose signals changed before the "
            "job's step time regressed, order 0 first, with the onset of each change (Unix "
            "seconds). Empty while no regression is explained.",
            _promql(
                "A",
                f"{FIRST_CHANGE_MILLIS}",
                instant=True,
                table_format=True,
            ),
            6,
            {
                JOB: "Job",
                CHANGE_ORDER: "Order",
                COMPONENT_KIND: "Kind",
                COMPONENT: "Component",
                SIGNAL: "Signal",
                CHANGE_EFFECT: "Effect (not a cause)",
            },
            ("Onset", "dateTimeAsIso"),
        ).span(24)
    )


def _pacing_row(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("Pacing"))
    board.with_panel(
        statetimeline.Panel()
        .title("Pacing state")
        .description(
            "When the pacer had pacing on for each job (it turns on when arrival dispersion "
            "passes its threshold and off when stable)."
        )
        .datasource(PROMETHEUS)
        .span(8)
        .height(8)
        .with_target(
            _promql(
                "A",
                f"max by ({JOB}) ({semconv.PROM_PACING_ACTIVE}{{{IN_JOBS}}})",
                _legend(JOB),
            )
        )
        .mappings(
            [
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="off", color="transparent"),
                        "1": model.ValueMappingResult(text="pacing", color="blue"),
                    }
                )
            ]
        )
        .thresholds(_thresholds([(None, "transparent")]))
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .row_height(0.8)
        .legend(common_builders.VizLegendOptions().show_legend(False))
    )
    board.with_panel(
        _timeseries(
            "Pacing delay per rank",
            "The delay the pacer currently asks each early rank to add before its step. Never "
            "applied to the latest rank, bounded by each rank's own maximum.",
            [
                _promql(
                    "A",
                    f"max by ({RANK}) ({semconv.PROM_PACING_DELAY}{{{IN_JOBS}}})",
                    f"rank {_legend(RANK)}",
                )
            ],
            16,
        )
    )


def _collector_row(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("Collector health"))
    board.with_panel(
        _timeseries(
            "Pending collectives",
            "Collectives waiting for all their members, and the spans held with them. Both are "
            "bounded (max_pending, max_buffered_spans); at the bound the oldest is evicted.",
            [
                _promql("A", f"sum({PENDING})", "pending collectives"),
                _promql("B", f"sum({BUFFERED_SPANS})", "buffered spans"),
            ],
            8,
            unit="short",
        )
    )
    board.with_panel(
        _timeseries(
            "Incomplete and evicted",
            "Collectives released per second by outcome (complete, or incomplete: a member "
            "missing at timeout, eviction or shutdown), and those evicted early because the "
            "pending bound was reached.",
            [
                _promql("A", _rate(RELEASED, by=OUTCOME), f"released {_legend(OUTCOME)}"),
                _promql("B", _rate(EVICTED), "evicted"),
            ],
            8,
            unit="cps",
        )
    )
    board.with_panel(
        _timeseries(
            "Dropped and rejected spans",
            "Spans lost or left out on the way: collective spans the processor forwarded without "
            "a join (malformed, duplicate, late), spans refused by the receiver, failed or not "
            "queued by an exporter, dropped by a rank's full event buffer, or not stored by "
            "traceshape (a large job's healthy ranks, a full trace: still in the metrics).",
            [
                _promql(
                    "A",
                    _rate(MALFORMED, by=NOT_JOINED_REASON),
                    f"not joined {_legend(NOT_JOINED_REASON)}",
                ),
                _promql("B", _rate(RECEIVER_REFUSED, by="receiver"), "refused {{receiver}}"),
                _promql(
                    "C", _rate(EXPORTER_SEND_FAILED, by="exporter"), "send failed {{exporter}}"
                ),
                _promql(
                    "D", _rate(EXPORTER_ENQUEUE_FAILED, by="exporter"), "not queued {{exporter}}"
                ),
                _promql(
                    "E",
                    _rate(semconv.PROM_EVENTS_DROPPED, by=REASON),
                    f"rank buffer {_legend(REASON)}",
                ),
                _promql("F", _rate(semconv.PROM_SPANS_EXPORT_FAILED), "rank export failed"),
                _promql(
                    "G",
                    _rate(NOT_STORED, by=NOT_JOINED_REASON),
                    f"not stored {_legend(NOT_JOINED_REASON)}",
                ),
            ],
            8,
            unit="cps",
        )
    )
    board.with_panel(
        table.Panel()
        .title("Recent straggler spans (Tempo)")
        .description(
            "The latest collective spans the processor flagged, straight from Tempo. Click a "
            "trace ID for the step's waterfall."
        )
        .datasource(TEMPO)
        .span(24)
        .height(8)
        .with_target(_traceql("A", RECENT_STRAGGLERS_TRACEQL, 20))
        .show_header(True)
    )


def build_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (what provisioning loads)."""
    board = (
        dashboard.Dashboard(DASHBOARD_TITLE)
        .uid(DASHBOARD_UID)
        .description(
            "skewtrace: barrier skew, stragglers and their causes across the ranks of "
            "synchronous training; pacing; the Collector's own health."
        )
        .tags(["skewtrace", "training"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .version(1)
        .time("now-30m", "now")
        .timezone("")
        .variables(_variables())
    )
    # Rows and panels are laid out left to right, wrapping at 24 columns; each row's widths
    # add up to 24, so every line starts at x=0.
    for section in (_fabric_row, _timeline_row, _pacing_row, _collector_row):
        section(board)
    built = board.build()
    for panel_id, panel in enumerate(built.panels or [], start=1):
        panel.id_val = panel_id
    model_json = dict(json.loads(json.dumps(built, cls=JSONEncoder)))
    model_json["annotations"] = {"list": _annotations()}
    return model_json


def render() -> str:
    return json.dumps(build_dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the committed JSON differs from the generated one",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT_PATH)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(
                f"{args.output} is stale: run python grafana/generate_dashboard.py", file=sys.stderr
            )
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
