"""Every PromQL expression of the "Training fabric" dashboard, run against real data.

Starts, on 127.0.0.1 with free ports:

- the built ``otelcol-skewtrace`` with ``collector-config/otelcol.yaml`` (what docker-compose
  runs),
- ``skewtrace pacer`` (its metrics go to the Collector, the Collector's to it), without
  its effect guard (``--effect-pairs 0``: the guard withholds a policy's first 10 s, and
  the pacing panels need delays within this short job),
- a real Prometheus (Debian's package) scraping the Collector's exporter and its own telemetry,
- ``examples/train_ddp.py --nprocs 4 --straggler 2:compute:0.05`` (gloo, CPU) sending to the
  Collector,

then runs each panel's expressions with the dashboard's variables filled in the way Grafana
fills them. Each must parse and evaluate; the skew, lateness and straggler panels must return
series, and those about ranks must include the straggling rank 2. What Grafana would draw is
printed per panel. Only Grafana is missing (it cannot run here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from conftest import free_port
from prometheus_harness import (
    PanelQuery,
    PrometheusError,
    PrometheusServer,
    dashboard_queries,
    grafana_regex_value,
    metric_names,
    promtool_check,
    substitute_variables,
)
from skewtrace import semconv
from test_jaeger_backend import _stop, _wait_http, collector_env

pytestmark = [pytest.mark.slow, pytest.mark.collector, pytest.mark.prometheus]

REPO_ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_PATH = REPO_ROOT / "grafana" / "dashboards" / "training-fabric.json"
COLLECTOR_CONFIGS = [REPO_ROOT / "collector-config" / "otelcol.yaml"]
STRAGGLER_RANK = "2"
WORLD_SIZE = 4
STEPS = 40

JOB = semconv.prometheus_label(semconv.JOB_ID)
RANK = semconv.prometheus_label(semconv.RANK)

# Panels whose data come from the skew join itself: they must show data for this run.
REQUIRED_DATA = (semconv.PROM_BARRIER_SKEW, semconv.PROM_RANK_LATENESS, semconv.PROM_STRAGGLER)


@dataclass
class Stack:
    prometheus: PrometheusServer
    job_id: str
    run_started: float
    run_output: str
    collector_log: Path
    pacer_log: Path


@pytest.fixture(scope="module")
def stack(
    otelcol_path: Path, prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    for config in COLLECTOR_CONFIGS:
        if not config.is_file():
            pytest.fail(f"{config} missing")
    workdir = tmp_path_factory.mktemp("promql")
    names = ("grpc", "http", "prometheus", "telemetry", "health", "pacer", "pacer_http")
    ports = {name: free_port() for name in names}
    job_id = f"promql-{uuid.uuid4().hex[:8]}"
    processes: list[subprocess.Popen[bytes]] = []
    collector_log, pacer_log = workdir / "otelcol.log", workdir / "pacer.log"
    try:
        # Traces go to a port where nothing listens: this test is about metrics, and the
        # exporter's failures must not hold the pipeline up (they are counted, which the
        # "Dropped and rejected spans" panel shows).
        env = {**os.environ, **collector_env(f"127.0.0.1:{free_port()}", ports)}
        with collector_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [str(otelcol_path), *(f"--config={c}" for c in COLLECTOR_CONFIGS)],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        _wait_http(f"http://127.0.0.1:{ports['prometheus']}/metrics", processes[-1],
                   collector_log, 60)  # fmt: skip

        with pacer_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "skewtrace.cli", "pacer",
                 "--otlp-grpc", f"127.0.0.1:{ports['pacer']}",
                 "--http", f"127.0.0.1:{ports['pacer_http']}",
                 "--metrics-endpoint", f"127.0.0.1:{ports['grpc']}",
                 "--metrics-interval-millis", "1000", "--effect-pairs", "0"],
                stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        _wait_http(f"http://127.0.0.1:{ports['pacer_http']}/v1/pacing?job={job_id}",
                   processes[-1], pacer_log, 30)  # fmt: skip

        prometheus = PrometheusServer(
            prometheus_binary,
            free_port(),
            {
                "skewtrace": [f"127.0.0.1:{ports['prometheus']}"],
                "otelcol-skewtrace": [f"127.0.0.1:{ports['telemetry']}"],
            },
            workdir / "prometheus",
        )
        with prometheus:
            run_env = {
                **os.environ,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['grpc']}",
                "SKEWTRACE_JOB_ID": job_id,
                "SKEWTRACE_PACER_URL": f"http://127.0.0.1:{ports['pacer_http']}",
            }
            run_started = time.time()
            run = subprocess.run(
                [sys.executable, str(REPO_ROOT / "examples" / "train_ddp.py"),
                 "--nprocs", str(WORLD_SIZE), "--steps", str(STEPS),
                 "--straggler", f"{STRAGGLER_RANK}:compute:0.05", "--job-id", job_id],
                env=run_env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr[-4000:]
            # Flagged at some point of the run: on a busy machine the flag may already have
            # cleared (its last steps) by the time the run is over.
            flagged = prometheus.wait_for(
                f"max_over_time({semconv.PROM_STRAGGLER}"
                f'{{{JOB}="{job_id}", {RANK}="{STRAGGLER_RANK}"}}[15m]) == 1',
                timeout_s=30,
            )
            assert flagged, (
                f"rank {STRAGGLER_RANK} never flagged; series: {prometheus.series_names()}\n"
                f"collector log: {collector_log.read_text()[-3000:]}"
            )
            # A few more scrapes so rate() over $__rate_interval has several points.
            time.sleep(5)
            yield Stack(prometheus, job_id, run_started, run.stdout + run.stderr,
                        collector_log, pacer_log)  # fmt: skip
    finally:
        for process in reversed(processes):
            _stop(process)


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD_PATH.read_text()))


def _variables(job_id: str) -> dict[str, str]:
    # What Grafana sends for a single selected job and "All" process groups (allValue .*).
    return {"job": grafana_regex_value([job_id]), "pg": ".*"}


def _evaluate(stack: Stack, query: PanelQuery) -> list[dict[str, Any]]:
    expr = substitute_variables(query.expr, _variables(stack.job_id))
    if query.instant:
        return stack.prometheus.query(expr)
    # Grafana's range query over the dashboard's time range (here: since the run started).
    return stack.prometheus.query_range(expr, stack.run_started - 60, time.time(), 2.0)


def test_every_expression_parses_with_promtool(promtool_binary: str) -> None:
    promtool = promtool_binary
    queries = dashboard_queries(_dashboard())
    # A job id with regex metacharacters and two selected jobs, as Grafana escapes them.
    exprs = [
        substitute_variables(q.expr, {"job": grafana_regex_value(values), "pg": ".*"})
        for q in queries
        for values in (["job.1+x"], ["a-1", "b(2)"])
    ]
    assert promtool_check(exprs, promtool) == ""


def test_every_panel_query_runs(stack: Stack) -> None:
    """Each expression evaluates in Prometheus; prints what each panel would draw."""
    failures, report = [], []
    for query in dashboard_queries(_dashboard()):
        try:
            result = _evaluate(stack, query)
        except PrometheusError as exc:
            failures.append(f"{query.label}: {exc}")
            continue
        ranks = sorted({s["metric"].get(RANK) for s in result} - {None}, key=int)
        report.append(f"{len(result):3d} series  ranks={ranks or '-'}  {query.label}")
    print("\n".join(report))
    assert failures == []


@pytest.mark.parametrize(
    "needle", REQUIRED_DATA, ids=[n.removeprefix("training_") for n in REQUIRED_DATA]
)
def test_skew_lateness_and_straggler_panels_show_the_straggler(stack: Stack, needle: str) -> None:
    queries = [q for q in dashboard_queries(_dashboard()) if needle in q.expr]
    assert queries
    empty, without_rank = [], []
    for query in queries:
        result = _evaluate(stack, query)
        if not result:
            empty.append(query.label)
            continue
        ranks = {series["metric"].get(RANK) for series in result}
        if ranks != {None} and STRAGGLER_RANK not in ranks:
            without_rank.append(f"{query.label}: ranks {sorted(ranks - {None})}")
    assert empty == [], "no data"
    assert without_rank == [], f"rank {STRAGGLER_RANK} missing"


def test_current_stragglers_table_lists_rank_2_with_its_topology(stack: Stack) -> None:
    (query,) = [q for q in dashboard_queries(_dashboard()) if q.panel_title == "Current stragglers"]
    rows = [series["metric"] for series in _evaluate(stack, query)]
    assert STRAGGLER_RANK in {row[RANK] for row in rows}, rows
    row = next(row for row in rows if row[RANK] == STRAGGLER_RANK)
    for key in (semconv.HOST_NAME, semconv.SWITCH, semconv.NIC, semconv.STRAGGLER_CAUSE):
        column = semconv.prometheus_label(key)
        assert row.get(column), f"{column} missing from {row}"
    # The job spins extra compute in rank 2's forward.
    print(f"rank {STRAGGLER_RANK} row: {row}")


def test_skew_exemplars_carry_the_trace_id_label_grafana_links(stack: Stack) -> None:
    """The datasource's exemplarTraceIdDestinations name (trace_id) is the label Prometheus
    actually stores on the Collector's exemplars."""
    exemplars = stack.prometheus.query_exemplars(
        f'{semconv.PROM_BARRIER_SKEW}_bucket{{{JOB}="{stack.job_id}"}}',
        stack.run_started - 60,
        time.time(),
    )
    labels = [e["labels"] for series in exemplars for e in series.get("exemplars", [])]
    assert labels, "no exemplars stored"
    assert all(re.fullmatch(r"[0-9a-f]{32}", label.get("trace_id", "")) for label in labels)


# Series that exist only after something went wrong (or a rare condition): a short healthy
# run does not create them, so their panels may be empty here.
ONLY_ON_TROUBLE = {
    semconv.PROM_COLLECTIVE_INCOMPLETE,  # a collective released with members missing
    semconv.PROM_FABRIC_SUSPECT,  # a NIC, host, uplink or switch is suspected
    semconv.PROM_FABRIC_COST,  # what a suspect costs
    "otelcol_processor_barrierskew_collectives_evicted",  # the pending bound was reached
    "otelcol_processor_barrierskew_spans_malformed",  # a collective span could not be joined
    "otelcol_processor_traceshape_spans_dropped",  # a large job's healthy ranks, a full trace
    "otelcol_receiver_refused_spans",  # the memory limiter refused data
    "otelcol_exporter_send_failed_spans",  # the trace backend failed (here: none listens)
    "otelcol_exporter_enqueue_failed_spans",  # an exporter queue was full
    semconv.PROM_EVENTS_DROPPED,  # a rank's event buffer was full
    semconv.PROM_FIRST_CHANGE,  # `skewtrace timeline watch` explained a regression
    semconv.PROM_IMBALANCE,  # a pipeline stage or the data split is flagged imbalanced
    semconv.PROM_IMBALANCE_COST,  # what an imbalance costs
    semconv.PROM_ATTRIBUTION,  # a step had a root cause (what each kind of work would save)
}
# Node telemetry of hardware this machine may not have: a GPU (NVML), RDMA ports, a qdisc that
# keeps statistics (an interface with only `noqueue` has none).
ONLY_WITH_HARDWARE = {
    semconv.PROM_GPU_THROTTLE,
    semconv.PROM_GPU_UTILIZATION,
    semconv.PROM_NIC_PORT_COUNTER,
    semconv.PROM_QDISC_BACKLOG,
    semconv.PROM_QDISC_DROPS,
}
NOT_ALWAYS_PRESENT = ONLY_ON_TROUBLE | ONLY_WITH_HARDWARE


def test_dashboard_metric_names_exist(stack: Stack) -> None:
    """Every metric the dashboard reads is one Prometheus scraped, except those that appear
    only on trouble or with hardware this machine may lack; and every panel target built on
    the others returns data."""
    present = set(stack.prometheus.series_names())
    queries = dashboard_queries(_dashboard())
    used = {name for query in queries for name in metric_names(query.expr)}
    print(f"present: {sorted(used & present)}\nabsent:  {sorted(used - present)}")
    assert sorted(used - present - NOT_ALWAYS_PRESENT) == []
    assert _targets_without_data(stack, queries) == []


def _targets_without_data(stack: Stack, queries: list[PanelQuery]) -> list[str]:
    """Labels of the targets that should draw something here and do not, do not run, or
    read a metric Prometheus does not have (which `... or vector(0)` would hide)."""
    present = set(stack.prometheus.series_names())
    problems = []
    for query in queries:
        expected = metric_names(query.expr) - NOT_ALWAYS_PRESENT
        if not expected:
            continue
        if expected - present:
            problems.append(f"{query.label}: no series named {sorted(expected - present)}")
            continue
        try:
            if not _evaluate(stack, query):
                problems.append(f"{query.label}: no data")
        except PrometheusError as exc:
            problems.append(f"{query.label}: {exc}")
    return problems


@pytest.mark.parametrize(
    "old,new",
    [
        # The gauge under its OTel name: the exporter appends _ratio for unit "1".
        (semconv.PROM_STRAGGLER + "{", "training_straggler{"),
        # A counter of the Collector's telemetry with a suffix it does not have.
        ("otelcol_processor_barrierskew_pending_collectives", "otelcol_pending_total"),
        # A syntax error.
        ("histogram_quantile(0.95,", "histogram_quantile(0.95"),
    ],
    ids=["wrong-gauge-name", "wrong-telemetry-name", "syntax-error"],
)
def test_a_broken_panel_query_is_caught(stack: Stack, old: str, new: str) -> None:
    """The data check above fails for the mistakes it exists to catch."""
    queries = dashboard_queries(_dashboard())
    broken = [replace(q, expr=q.expr.replace(old, new)) for q in queries if old in q.expr]
    assert broken
    assert len(_targets_without_data(stack, broken)) == len(broken)
