"""Generates ``grafana/dashboards/training-fabric.json``, the "Training fabric" dashboard.

The JSON is committed (Grafana provisioning reads it); this script is its source. After an
edit here, regenerate and commit both::

    python grafana/generate_dashboard.py            # rewrites the JSON
    python grafana/generate_dashboard.py --check    # exits 1 when the JSON is stale

``tests/test_dashboards.py`` fails when the committed JSON differs from what this produces.

Metric names are the Prometheus forms of the OTel names in ``docs/semantic-conventions.md``:
the Collector's Prometheus exporter turns dots into underscores and appends the unit
(``_seconds``), ``_total`` on counters and ``_ratio`` on gauges whose unit is ``1``.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from pathlib import Path
from typing import Any

DASHBOARD_UID = "skewtrace-training-fabric"
DASHBOARD_TITLE = "Training fabric"
PROMETHEUS_UID = "skewtrace-prometheus"
TEMPO_UID = "skewtrace-tempo"
OUTPUT_PATH = Path(__file__).resolve().parent / "dashboards" / "training-fabric.json"

PROMETHEUS = {"type": "prometheus", "uid": PROMETHEUS_UID}
TEMPO = {"type": "tempo", "uid": TEMPO_UID}

# Prometheus names of the barrierskew connector's metrics.
SKEW = "training_barrier_skew_seconds"
LATENESS = "training_rank_lateness_seconds"
WAIT = "training_rank_wait_seconds"
STRAGGLER = "training_straggler_ratio"
STRAGGLER_DOMAIN = "training_straggler_domain_ratio"
INCOMPLETE = "training_collective_incomplete_total"
CLOCK_OFFSET = "training_clock_offset_seconds"
STEP_DURATION = "training_step_duration_seconds"
# The pacer's own metrics (it pushes them to the Collector over OTLP).
PACING_ACTIVE = "skewtrace_pacing_active_ratio"
PACING_DELAY = "skewtrace_pacing_delay_seconds"
# The training ranks' own counters.
EVENTS_DROPPED = "skewtrace_events_dropped_total"
SPANS_EXPORT_FAILED = "skewtrace_spans_export_failed_total"
# The Collector's internal telemetry (service::telemetry::metrics, port 8888): the barrierskew
# processor's own instruments (src/collector/internal/selftel; units in braces add no suffix)
# and the Collector's standard pipeline counters. Its Prometheus endpoint serves counters
# without the _total suffix (checked against the built binary, Collector v0.165.0).
COLLECTOR_PENDING = "otelcol_processor_barrierskew_pending_collectives"
COLLECTOR_BUFFERED_SPANS = "otelcol_processor_barrierskew_buffered_spans"
COLLECTOR_RELEASED = "otelcol_processor_barrierskew_collectives_released"
COLLECTOR_EVICTED = "otelcol_processor_barrierskew_collectives_evicted"
COLLECTOR_MALFORMED = "otelcol_processor_barrierskew_spans_malformed"
RECEIVER_REFUSED = "otelcol_receiver_refused_spans"
EXPORTER_SEND_FAILED = "otelcol_exporter_send_failed_spans"
EXPORTER_ENQUEUE_FAILED = "otelcol_exporter_enqueue_failed_spans"

# Label selectors. `$job` and `$pg` are multi-value variables whose "All" is `.*`.
JOB = 'training_job_id=~"$job"'
JOB_PG = 'training_job_id=~"$job", training_collective_pg=~"$pg"'

# The rank labels every per-rank series carries (the topology of the rank).
RANK_LABELS = "training_job_id, training_rank, host_name, training_switch, training_nic"


def _traceql_explore_url(traceql: str) -> str:
    """A Grafana Explore URL that runs ``traceql`` against Tempo over the dashboard's range.

    Grafana interpolates ``${...}`` in data link URLs before following them, so those tokens
    are left unencoded; everything else is percent-encoded JSON (Explore's ``panes`` state).
    """
    panes = {
        "traceql": {
            "datasource": TEMPO_UID,
            "queries": [
                {
                    "refId": "A",
                    "datasource": TEMPO,
                    "queryType": "traceql",
                    "query": traceql,
                    "limit": 50,
                    "tableType": "spans",
                }
            ],
            "range": {"from": "${__from}", "to": "${__to}"},
        }
    }
    encoded = urllib.parse.quote(json.dumps(panes, separators=(",", ":")), safe="")
    # Undo the encoding of the interpolation tokens only.
    for token in _interpolation_tokens(json.dumps(panes)):
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


# Straggler spans of the rank in the clicked row: the spans the processor flagged.
STRAGGLER_TRACEQL = (
    '{ resource.training.job.id = "${__data.fields.training_job_id}"'
    " && resource.training.rank = ${__data.fields.training_rank}"
    " && span.training.straggler = true }"
)


# The dashboard's Tempo panel: flagged collective spans of the selected jobs.
RECENT_STRAGGLERS_TRACEQL = (
    '{ resource.training.job.id =~ "${job:regex}" && span.training.straggler = true }'
)


class _PanelIds:
    def __init__(self) -> None:
        self._next = 1

    def take(self) -> int:
        panel_id = self._next
        self._next += 1
        return panel_id


def _prom_target(
    ref_id: str,
    expr: str,
    legend: str = "",
    *,
    instant: bool = False,
    table: bool = False,
    exemplar: bool = False,
) -> dict[str, Any]:
    target: dict[str, Any] = {
        "refId": ref_id,
        "datasource": PROMETHEUS,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "exemplar": exemplar,
    }
    if table:
        target["format"] = "table"
    return target


def _grid(x: int, y: int, w: int, h: int) -> dict[str, int]:
    return {"x": x, "y": y, "w": w, "h": h}


def _row(ids: _PanelIds, title: str, y: int) -> dict[str, Any]:
    return {
        "id": ids.take(),
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": _grid(0, y, 24, 1),
        "panels": [],
    }


def _timeseries(
    ids: _PanelIds,
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    grid: dict[str, int],
    unit: str = "s",
    *,
    draw_style: str = "line",
) -> dict[str, Any]:
    return {
        "id": ids.take(),
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": PROMETHEUS,
        "gridPos": grid,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {
                    "drawStyle": draw_style,
                    "lineWidth": 1,
                    "fillOpacity": 0,
                    "showPoints": "never",
                    "spanNulls": False,
                },
            },
            "overrides": [],
        },
        "options": {
            "legend": {
                "displayMode": "table",
                "placement": "right",
                "showLegend": True,
                "calcs": ["mean", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def _stat(
    ids: _PanelIds,
    title: str,
    description: str,
    target: dict[str, Any],
    grid: dict[str, int],
    unit: str,
    thresholds: list[tuple[float | None, str]],
) -> dict[str, Any]:
    return {
        "id": ids.take(),
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": PROMETHEUS,
        "gridPos": grid,
        "targets": [target],
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {
                    "mode": "absolute",
                    "steps": [{"value": value, "color": color} for value, color in thresholds],
                },
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "area",
            "textMode": "auto",
        },
    }


def _table(
    ids: _PanelIds,
    title: str,
    description: str,
    target: dict[str, Any],
    grid: dict[str, int],
    rename: dict[str, str],
    links: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "id": ids.take(),
        "type": "table",
        "title": title,
        "description": description,
        "datasource": PROMETHEUS,
        "gridPos": grid,
        "targets": [target],
        "transformations": [
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value": True},
                    "indexByName": {name: index for index, name in enumerate(rename)},
                    "renameByName": rename,
                },
            },
        ],
        "fieldConfig": {"defaults": {"links": links or []}, "overrides": []},
        "options": {
            "showHeader": True,
            "cellHeight": "sm",
            "footer": {"show": False, "reducer": ["sum"], "fields": ""},
        },
    }


def _rate(metric: str, selector: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[$__rate_interval]))"


def _quantile(q: float, metric: str, selector: str, by: str = "") -> str:
    group = f"le, {by}" if by else "le"
    return (
        f"histogram_quantile({q}, sum by ({group}) "
        f"(rate({metric}_bucket{{{selector}}}[$__rate_interval])))"
    )


def _mean(metric: str, selector: str, by: str) -> str:
    return f"{_rate(metric + '_sum', selector, by)}\n/\n{_rate(metric + '_count', selector, by)}"


def _variables() -> list[dict[str, Any]]:
    def query_variable(name: str, label: str, query: str, description: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "description": description,
            "type": "query",
            "datasource": PROMETHEUS,
            "query": {"query": query, "refId": f"{name}-variable"},
            "definition": query,
            "refresh": 2,
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [],
            "regex": "",
            "hide": 0,
        }

    return [
        query_variable(
            "job",
            "Job",
            f"label_values({SKEW}_count, training_job_id)",
            "training.job.id: one training run (all of its ranks)",
        ),
        query_variable(
            "pg",
            "Process group",
            f'label_values({SKEW}_count{{training_job_id=~"$job"}}, training_collective_pg)',
            "training.collective.pg: the process group of the collectives (default = world)",
        ),
    ]


def _fabric_panels(ids: _PanelIds, y: int) -> tuple[list[dict[str, Any]], int]:
    panels: list[dict[str, Any]] = [_row(ids, "Barrier skew and stragglers", y)]
    y += 1
    panels.append(
        _stat(
            ids,
            "Barrier skew p95",
            "95th percentile of barrier skew (latest minus earliest arrival) over the last "
            "interval.",
            _prom_target("A", _quantile(0.95, SKEW, JOB_PG), "p95"),
            _grid(0, y, 6, 4),
            "s",
            [(None, "green"), (0.005, "yellow"), (0.05, "red")],
        )
    )
    panels.append(
        _stat(
            ids,
            "Stragglers now",
            "Ranks the processor flags as stragglers right now.",
            _prom_target(
                "A",
                f"count(max by ({RANK_LABELS}) ({STRAGGLER}{{{JOB}}}) > 0) or vector(0)",
                "stragglers",
                instant=True,
            ),
            _grid(6, y, 6, 4),
            "none",
            [(None, "green"), (1, "red")],
        )
    )
    panels.append(
        _stat(
            ids,
            "Pacing",
            "1 while the pacer delays early ranks of the job.",
            _prom_target(
                "A", f"max({PACING_ACTIVE}{{{JOB}}}) or vector(0)", "active", instant=True
            ),
            _grid(12, y, 6, 4),
            "bool_on_off",
            [(None, "text"), (1, "blue")],
        )
    )
    panels.append(
        _stat(
            ids,
            "Incomplete collectives",
            "Collectives released with ranks missing (per second): a rank that never arrived.",
            _prom_target(
                "A",
                f"sum(rate({INCOMPLETE}{{{JOB_PG}}}[$__rate_interval])) or vector(0)",
                "incomplete/s",
            ),
            _grid(18, y, 6, 4),
            "cps",
            [(None, "green"), (0.001, "red")],
        )
    )
    y += 4
    panels.append(
        _timeseries(
            ids,
            "Step time per rank",
            "Mean iteration time of each rank. In synchronous training every rank's step ends at "
            "the same barrier, so these lines differ little; a rank whose compute or data is slow "
            "shows in lateness, not here.",
            [
                _prom_target(
                    "A", _mean(STEP_DURATION, JOB, "training_rank"), "rank {{training_rank}}"
                )
            ],
            _grid(0, y, 12, 8),
        )
    )
    panels.append(
        _timeseries(
            ids,
            "Barrier skew p50 / p95 / p99",
            "Skew = latest minus earliest arrival at each collective, from durations (not clocks). "
            "Exemplars link to the step's trace.",
            [
                _prom_target("A", _quantile(0.5, SKEW, JOB_PG), "p50", exemplar=True),
                _prom_target("B", _quantile(0.95, SKEW, JOB_PG), "p95", exemplar=True),
                _prom_target("C", _quantile(0.99, SKEW, JOB_PG), "p99", exemplar=True),
            ],
            _grid(12, y, 12, 8),
        )
    )
    y += 8
    panels.append(
        {
            "id": ids.take(),
            "type": "heatmap",
            "title": "Lateness per rank",
            "description": "Mean lateness of each rank (its arrival minus the earliest) per "
            "interval: one row per rank, a hot row is a straggler.",
            "datasource": PROMETHEUS,
            "gridPos": _grid(0, y, 12, 9),
            "targets": [
                _prom_target("A", _mean(LATENESS, JOB, "training_rank"), "{{training_rank}}")
            ],
            "fieldConfig": {"defaults": {"unit": "s"}, "overrides": []},
            "options": {
                "calculate": False,
                "yAxis": {"axisPlacement": "left", "reverse": False, "axisLabel": "rank"},
                "rowsFrame": {"layout": "auto", "value": "lateness"},
                "color": {
                    "mode": "scheme",
                    "scheme": "Oranges",
                    "fill": "dark-orange",
                    "scale": "exponential",
                    "exponent": 0.5,
                    "steps": 64,
                    "reverse": False,
                },
                "cellGap": 1,
                "cellValues": {"unit": "s"},
                "showValue": "never",
                "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
                "legend": {"show": True},
                "exemplars": {"color": "rgba(255,0,255,0.7)"},
            },
        }
    )
    panels.append(
        _table(
            ids,
            "Current stragglers",
            "Ranks flagged now, where they sit and why they were late. Click a row for the rank's "
            "flagged spans in Tempo.",
            _prom_target(
                "A",
                f"max by ({RANK_LABELS}, training_straggler_cause) ({STRAGGLER}{{{JOB}}}) > 0",
                instant=True,
                table=True,
            ),
            _grid(12, y, 12, 9),
            {
                "training_rank": "rank",
                "host_name": "node",
                "training_switch": "switch",
                "training_nic": "NIC",
                "training_straggler_cause": "cause",
                "training_job_id": "job",
            },
            links=[
                {
                    "title": "Flagged spans of rank ${__data.fields.training_rank} in Tempo",
                    "url": _traceql_explore_url(STRAGGLER_TRACEQL),
                    "targetBlank": False,
                }
            ],
        )
    )
    y += 9
    panels.append(
        _timeseries(
            ids,
            "Lateness p95 by switch",
            "Lateness of the ranks behind each leaf switch. One switch high while the others stay "
            "low points at that switch (contention or a bad link), not at a rank.",
            [
                _prom_target(
                    "A",
                    _quantile(0.95, LATENESS, JOB, "training_switch"),
                    "{{training_switch}}",
                    exemplar=True,
                )
            ],
            _grid(0, y, 12, 8),
        )
    )
    panels.append(
        _timeseries(
            ids,
            "Lateness p95 by NIC",
            "Lateness of the ranks using each NIC: a NIC shared by the late ranks is the suspect.",
            [
                _prom_target(
                    "A",
                    _quantile(0.95, LATENESS, JOB, "host_name, training_nic"),
                    "{{host_name}} {{training_nic}}",
                    exemplar=True,
                )
            ],
            _grid(12, y, 12, 8),
        )
    )
    y += 8
    panels.append(
        _timeseries(
            ids,
            "Wait p95 per rank",
            "Time each rank spent waiting at barriers for the latest one: the cost stragglers "
            "impose on everyone else (what pacing trades against).",
            [
                _prom_target(
                    "A",
                    _quantile(0.95, WAIT, JOB, "training_rank"),
                    "rank {{training_rank}}",
                    exemplar=True,
                )
            ],
            _grid(0, y, 12, 8),
        )
    )
    panels.append(
        _table(
            ids,
            "Flagged switches and NICs",
            "A switch or NIC that the ranks flagged in the recent window share (1 = flagged).",
            _prom_target(
                "A",
                f"max by (training_job_id, training_switch, training_nic) "
                f"({STRAGGLER_DOMAIN}{{{JOB}}}) > 0",
                instant=True,
                table=True,
            ),
            _grid(12, y, 12, 8),
            {"training_job_id": "job", "training_switch": "switch", "training_nic": "NIC"},
        )
    )
    y += 8
    panels.append(
        _timeseries(
            ids,
            "Host clock offsets",
            "Each host's collective end time minus the members' median end time. Skew does not "
            "use clocks; offsets beyond a few ms mean NTP/PTP trouble and make raw timestamps in "
            "the trace view misleading.",
            [_prom_target("A", f"max by (host_name) ({CLOCK_OFFSET}{{{JOB}}})", "{{host_name}}")],
            _grid(0, y, 12, 8),
        )
    )
    panels.append(
        _timeseries(
            ids,
            "Incomplete collectives by op",
            "Collectives released after wait_timeout with members missing, per second.",
            [
                _prom_target(
                    "A",
                    _rate(INCOMPLETE, JOB_PG, "training_collective_pg, training_collective_op"),
                    "{{training_collective_pg}} {{training_collective_op}}",
                )
            ],
            _grid(12, y, 12, 8),
            "cps",
        )
    )
    y += 8
    return panels, y


def _pacing_panels(ids: _PanelIds, y: int) -> tuple[list[dict[str, Any]], int]:
    panels: list[dict[str, Any]] = [_row(ids, "Pacing", y)]
    y += 1
    panels.append(
        {
            "id": ids.take(),
            "type": "state-timeline",
            "title": "Pacing state",
            "description": "When the pacer had pacing on for each job (it turns on when arrival "
            "dispersion passes its threshold and off when stable).",
            "datasource": PROMETHEUS,
            "gridPos": _grid(0, y, 8, 8),
            "targets": [
                _prom_target(
                    "A",
                    f"max by (training_job_id) ({PACING_ACTIVE}{{{JOB}}})",
                    "{{training_job_id}}",
                )
            ],
            "fieldConfig": {
                "defaults": {
                    "mappings": [
                        {
                            "type": "value",
                            "options": {
                                "0": {"text": "off", "color": "transparent"},
                                "1": {"text": "pacing", "color": "blue"},
                            },
                        }
                    ],
                    "thresholds": {
                        "mode": "absolute",
                        "steps": [{"value": None, "color": "transparent"}],
                    },
                },
                "overrides": [],
            },
            "options": {
                "showValue": "never",
                "mergeValues": True,
                "rowHeight": 0.8,
                "legend": {"showLegend": False},
            },
        }
    )
    panels.append(
        _timeseries(
            ids,
            "Pacing delay per rank",
            "The delay the pacer currently asks each early rank to add before its step. Never "
            "applied to the latest rank, bounded by each rank's own maximum.",
            [
                _prom_target(
                    "A",
                    f"max by (training_rank) ({PACING_DELAY}{{{JOB}}})",
                    "rank {{training_rank}}",
                )
            ],
            _grid(8, y, 16, 8),
            draw_style="line",
        )
    )
    y += 8
    return panels, y


def _collector_panels(ids: _PanelIds, y: int) -> tuple[list[dict[str, Any]], int]:
    panels: list[dict[str, Any]] = [_row(ids, "Collector health", y)]
    y += 1
    panels.append(
        _timeseries(
            ids,
            "Pending collectives",
            "Collectives waiting for all their members, and the spans held with them. Both are "
            "bounded (max_pending, max_buffered_spans); at the bound the oldest is evicted.",
            [
                _prom_target("A", f"sum({COLLECTOR_PENDING})", "pending collectives"),
                _prom_target("B", f"sum({COLLECTOR_BUFFERED_SPANS})", "buffered spans"),
            ],
            _grid(0, y, 8, 8),
            "short",
        )
    )
    panels.append(
        _timeseries(
            ids,
            "Incomplete and evicted",
            "Collectives released per second by outcome (complete, or incomplete: a member "
            "missing at timeout, eviction or shutdown), and those evicted early because the "
            "pending bound was reached.",
            [
                _prom_target(
                    "A",
                    f"sum by (outcome) (rate({COLLECTOR_RELEASED}[$__rate_interval]))",
                    "released {{outcome}}",
                ),
                _prom_target("B", f"sum(rate({COLLECTOR_EVICTED}[$__rate_interval]))", "evicted"),
            ],
            _grid(8, y, 8, 8),
            "cps",
        )
    )
    panels.append(
        _timeseries(
            ids,
            "Dropped and rejected spans",
            "Spans lost or left out on the way: collective spans the processor forwarded without "
            "a join (malformed, duplicate, late), spans refused by the receiver, failed or not "
            "queued by an exporter, or dropped by a rank's full event buffer.",
            [
                _prom_target(
                    "A",
                    f"sum by (reason) (rate({COLLECTOR_MALFORMED}[$__rate_interval]))",
                    "not joined {{reason}}",
                ),
                _prom_target(
                    "B",
                    f"sum by (receiver) (rate({RECEIVER_REFUSED}[$__rate_interval]))",
                    "refused {{receiver}}",
                ),
                _prom_target(
                    "C",
                    f"sum by (exporter) (rate({EXPORTER_SEND_FAILED}[$__rate_interval]))",
                    "send failed {{exporter}}",
                ),
                _prom_target(
                    "D",
                    f"sum by (exporter) (rate({EXPORTER_ENQUEUE_FAILED}[$__rate_interval]))",
                    "not queued {{exporter}}",
                ),
                _prom_target(
                    "E",
                    f"sum by (reason) (rate({EVENTS_DROPPED}[$__rate_interval]))",
                    "rank buffer {{reason}}",
                ),
                _prom_target(
                    "F", f"sum(rate({SPANS_EXPORT_FAILED}[$__rate_interval]))", "rank export failed"
                ),
            ],
            _grid(16, y, 8, 8),
            "cps",
        )
    )
    y += 8
    panels.append(
        {
            "id": ids.take(),
            "type": "table",
            "title": "Recent straggler spans (Tempo)",
            "description": "The latest collective spans the processor flagged, straight from "
            "Tempo. Click a trace ID for the step's waterfall.",
            "datasource": TEMPO,
            "gridPos": _grid(0, y, 24, 8),
            "targets": [
                {
                    "refId": "A",
                    "datasource": TEMPO,
                    "queryType": "traceql",
                    "query": RECENT_STRAGGLERS_TRACEQL,
                    "limit": 20,
                    "tableType": "spans",
                }
            ],
            "fieldConfig": {"defaults": {}, "overrides": []},
            "options": {"showHeader": True},
        }
    )
    y += 8
    return panels, y


def build_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (what provisioning loads)."""
    ids = _PanelIds()
    panels: list[dict[str, Any]] = []
    y = 0
    for section in (_fabric_panels, _pacing_panels, _collector_panels):
        section_panels, y = section(ids, y)
        panels.extend(section_panels)
    return {
        "uid": DASHBOARD_UID,
        "title": DASHBOARD_TITLE,
        "description": "skewtrace: barrier skew, stragglers and their causes across the ranks "
        "of synchronous training; pacing; the Collector's own health.",
        "tags": ["skewtrace", "training"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": _variables()},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build_dashboard(), indent=2, sort_keys=False) + "\n"


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
