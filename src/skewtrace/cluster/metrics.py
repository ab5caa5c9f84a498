"""What the Collector's Prometheus endpoint says about a job, per rank and job-wide.

``summarize`` turns the exporter's samples into per-rank means (lateness, wait, step time),
verdicts and costs, and job-wide figures. A live view calls it on every scrape and takes
differences between scrapes (:func:`window`) for figures over the last few seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from skewtrace import semconv


def parse_prometheus_text(text: str) -> list[Sample]:
    """The samples of a Prometheus text or OpenMetrics page (``prometheus_client``'s parsers:
    label values unescaped, exemplars kept on the OpenMetrics samples)."""
    is_openmetrics = text.rstrip().endswith("# EOF")
    families = (openmetrics_families if is_openmetrics else text_string_to_metric_families)(text)
    return [sample for family in families for sample in family.samples]


@dataclass
class RankReport:
    rank: int
    host: str = ""
    switch: str = ""
    nic: str = ""
    lateness_mean: float = math.nan
    wait_mean: float = math.nan
    step_mean: float = math.nan
    straggler: bool = False
    cause: str = ""
    cost: float = 0.0
    """Seconds per step the flagged rank costs the job (what-if)."""
    totals: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per histogram (its Prometheus name): (sum, count) since the job started."""


def summarize(samples: list[Sample], job_id: str) -> tuple[dict[int, RankReport], dict[str, float]]:
    """Per-rank lateness/wait/step means, verdicts and costs, plus job-wide figures: skew, the
    what-if slowdown, and ``suspect:<kind>:<name>`` = 1 for each suspected part of the fabric."""
    ranks: dict[int, RankReport] = {}
    sums: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, int], float] = {}
    job: dict[str, float] = {}
    label = semconv.prometheus_label
    rank_label, job_label = label(semconv.RANK), label(semconv.JOB_ID)
    per_rank = (semconv.PROM_RANK_LATENESS, semconv.PROM_RANK_WAIT, semconv.PROM_STEP_DURATION)
    for s in samples:
        if s.labels.get(job_label) not in (None, job_id):
            continue
        if s.name == semconv.PROM_BARRIER_SKEW + "_sum":
            job["skew_sum"] = job.get("skew_sum", 0.0) + s.value
        elif s.name == semconv.PROM_BARRIER_SKEW + "_count":
            job["collectives"] = job.get("collectives", 0.0) + s.value
        elif s.name == semconv.PROM_COLLECTIVE_INCOMPLETE:
            job["incomplete"] = job.get("incomplete", 0.0) + s.value
        elif s.name == semconv.PROM_JOB_SLOWDOWN:
            job["slowdown"] = s.value
        elif s.name == semconv.PROM_FABRIC_SUSPECT and s.value >= 1:
            kind = s.labels.get(label(semconv.SUSPECT_KIND), "")
            name = s.labels.get(label(semconv.SUSPECT_NAME), "")
            host = s.labels.get(label(semconv.HOST_NAME), "")
            job[f"suspect:{kind}:{host + '/' if host else ''}{name}"] = 1.0
        if rank_label not in s.labels:
            continue
        rank = int(s.labels[rank_label])
        report = ranks.setdefault(rank, RankReport(rank))
        report.host = s.labels.get(label(semconv.HOST_NAME), report.host)
        report.switch = s.labels.get(label(semconv.SWITCH), report.switch)
        report.nic = s.labels.get(label(semconv.NIC), report.nic)
        for metric in per_rank:
            if s.name == metric + "_sum":
                sums[(metric, rank)] = sums.get((metric, rank), 0.0) + s.value
            elif s.name == metric + "_count":
                counts[(metric, rank)] = counts.get((metric, rank), 0.0) + s.value
        if s.name == semconv.PROM_STRAGGLER and s.value >= 1:
            report.straggler = True
            report.cause = s.labels.get(label(semconv.STRAGGLER_CAUSE), "")
        elif s.name == semconv.PROM_RANK_COST:
            report.cost = s.value
    for (metric, rank), total in sums.items():
        ranks[rank].totals[metric] = (total, counts.get((metric, rank), 0.0))
    for report in ranks.values():
        _set_means(report, report.totals)
    return ranks, job


def _set_means(report: RankReport, totals: dict[str, tuple[float, float]]) -> None:
    def mean(metric: str) -> float:
        total, n = totals.get(metric, (0.0, 0.0))
        return total / n if n > 0 else math.nan

    report.lateness_mean = mean(semconv.PROM_RANK_LATENESS)
    report.wait_mean = mean(semconv.PROM_RANK_WAIT)
    report.step_mean = mean(semconv.PROM_STEP_DURATION)


def window(before: dict[int, RankReport], now: dict[int, RankReport]) -> dict[int, RankReport]:
    """The ranks' means over what happened between two scrapes (verdicts and costs as of
    ``now``); a rank without new observations keeps NaN means."""
    out: dict[int, RankReport] = {}
    for rank, report in now.items():
        prior = before.get(rank)
        delta = {
            metric: (total - (prior.totals.get(metric, (0.0, 0.0))[0] if prior else 0.0),
                     n - (prior.totals.get(metric, (0.0, 0.0))[1] if prior else 0.0))
            for metric, (total, n) in report.totals.items()
        }  # fmt: skip
        recent = replace(report, totals=delta)
        _set_means(recent, delta)
        out[rank] = recent
    return out
