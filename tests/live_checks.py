"""What a live run proves: that the pipeline flows, not the diagnosis' fine points.

A live job's verdicts depend on how busy the machine was while it ran, so live tests assert
only what any run must show: the Collector's step summaries came out, and the injected
fault's rank was flagged with its cause at some point after the fault began. Which steps,
exactly, and nothing else flagged: that is decided on recorded spans
(``tests/test_recorded_verdicts.py``), and measured per scenario by ``make eval``.
"""

from __future__ import annotations

from collections.abc import Iterable

from collector_harness import FileSpan
from skewtrace import semconv
from skewtrace.report.collect import parse_summary
from skewtrace.report.model import StepSummary


def summaries_by_step(spans: Iterable[FileSpan]) -> dict[int, StepSummary]:
    """The Collector's step summaries (``train.step.summary``) by step."""
    out: dict[int, StepSummary] = {}
    for span in spans:
        if span.name == semconv.SPAN_STEP_SUMMARY and (summary := parse_summary(span)):
            out[summary.step] = summary
    return out


def flagged_by_step(spans: Iterable[FileSpan]) -> dict[int, dict[int, str]]:
    """Per analysed step, the ranks flagged with their causes."""
    return {
        step: {f.rank: f.cause for f in s.flags} for step, s in summaries_by_step(spans).items()
    }


def suspected_by_step(spans: Iterable[FileSpan]) -> dict[int, set[str]]:
    """Per analysed step, the fabric elements suspected."""
    return {step: {x.key for x in s.suspects} for step, s in summaries_by_step(spans).items()}


def assert_flagged_at_some_point(
    spans: Iterable[FileSpan], rank: int, cause: str, from_step: int = 0
) -> None:
    """The rank was flagged for the cause in at least one analysed step from ``from_step``."""
    flags = flagged_by_step(spans)
    assert flags, "no step summary came out"
    hits = [s for s, f in flags.items() if s >= from_step and f.get(rank) == cause]
    assert hits, f"rank {rank} never flagged for {cause} from step {from_step}: {flags}"


def assert_suspected_at_some_point(spans: Iterable[FileSpan], key: str, from_step: int = 0) -> None:
    """The fabric element was suspected in at least one analysed step from ``from_step``."""
    suspects = suspected_by_step(spans)
    assert suspects, "no step summary came out"
    hits = [s for s, k in suspects.items() if s >= from_step and key in k]
    assert hits, f"{key} never suspected from step {from_step}: {suspects}"
