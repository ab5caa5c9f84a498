"""From the Collector's span file to :class:`~.model.ReportData`, in two streaming passes.

Pass 1 reads every line once and keeps only what the charts need, per step: the largest
barrier skew, each rank's summed lateness, the step summaries, the longest ``train.step``
and ``train.step.root``, and the step's trace IDs. Memory is O(steps x ranks) numbers plus one
small record per summary, whatever the number of spans.

The worst step is then chosen (:func:`choose_worst_step`), and pass 2 rereads the file for
that step's spans only: lines without the step's trace ID are skipped before JSON parsing
(every rank derives the same trace ID for a step), resources of other jobs before their
spans are converted, and of the ranks past ``max_rows`` only the collectives' clock
offsets are kept.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skewtrace import semconv
from skewtrace.report.align import estimate_offsets
from skewtrace.report.model import (
    FabricSuspect,
    FlagChange,
    Imbalance,
    Partition,
    RankInfo,
    RankRow,
    RankVerdict,
    ReportData,
    RunInfo,
    Segment,
    Series,
    StepSummary,
    SuspectVerdict,
    Verdict,
    Waterfall,
)
from skewtrace.report.spans import FileSpan, SpanFileReader

__all__ = ["MAX_ROWS", "ReportError", "choose_worst_step", "collect"]

MAX_ROWS = 256
"""Waterfall rows at most: flagged ranks and the step's root causes first, then by rank."""

# More distinct trace IDs than this for one step: the file was not written by skewtrace's
# instrumentation, and pass 2 reads every line instead of filtering by trace ID.
_MAX_TRACE_IDS_PER_STEP = 4

_PHASES = {
    semconv.SPAN_DATALOADER_FETCH: "fetch",
    semconv.SPAN_FORWARD: "forward",
    semconv.SPAN_BACKWARD: "backward",
    semconv.SPAN_OPTIMIZER_STEP: "optimizer",
    semconv.SPAN_PACING_DELAY: "pacing",
    semconv.SPAN_STEP: "step",
}
_P2P_OPS = (semconv.OP_SEND, semconv.OP_RECV)


class ReportError(Exception):
    """The span file cannot make a report: missing, empty, no such job, several jobs."""


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return None


def _float(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def _seconds(value: Any) -> float:
    """A duration in seconds: 0 where it is missing, mistyped, negative or not finite."""
    seconds = _float(value)
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _worker(attrs: Mapping[str, Any]) -> str:
    """Which worker a rank stands for (an imported what-if table: ``stage 1, replica 1, GPUs
    40-47``), else empty."""
    first, gpus = _int(attrs.get(semconv.WORKER_FIRST_GPU)), _int(attrs.get(semconv.WORKER_GPUS))
    if first is None:
        return ""
    parts = []
    stage, replica = _int(attrs.get(semconv.PIPELINE_STAGE)), _int(attrs.get(semconv.DP_RANK))
    if stage is not None:
        parts.append(f"stage {stage}")
    if replica is not None:
        parts.append(f"replica {replica}")
    last = first + (gpus or 1) - 1
    parts.append(f"GPUs {first}-{last}" if last > first else f"GPU {first}")
    return ", ".join(parts)


def _rank_info(rank: int, attrs: Mapping[str, Any]) -> RankInfo:
    return RankInfo(
        rank=rank,
        host=_str(attrs.get(semconv.HOST_NAME)) or semconv.UNKNOWN,
        switch=_str(attrs.get(semconv.SWITCH)) or semconv.UNKNOWN,
        nic=_str(attrs.get(semconv.NIC)) or semconv.UNKNOWN,
        worker=_worker(attrs),
    )


def _rank_verdict(attrs: Mapping[str, Any]) -> RankVerdict | None:
    rank = _int(attrs.get(semconv.RANK))
    if rank is None:
        return None
    info = _rank_info(rank, attrs)
    return RankVerdict(
        rank=rank,
        host=info.host,
        switch=info.switch,
        nic=info.nic,
        cause=_str(attrs.get(semconv.STRAGGLER_CAUSE)) or semconv.CAUSE_UNKNOWN,
        cost_s=_float(attrs.get(semconv.RANK_COST)),
        domain=_str(attrs.get(semconv.STRAGGLER_DOMAIN)),
        before=_str(attrs.get(semconv.STRAGGLER_BEFORE)),
    )


def _suspect(attrs: Mapping[str, Any]) -> FabricSuspect:
    return FabricSuspect(
        kind=_str(attrs.get(semconv.SUSPECT_KIND)) or semconv.UNKNOWN,
        name=_str(attrs.get(semconv.SUSPECT_NAME)) or semconv.UNKNOWN,
        host=_str(attrs.get(semconv.HOST_NAME)),
        cost_s=_float(attrs.get(semconv.FABRIC_COST)),
        derived=attrs.get(semconv.SUSPECT_DERIVED) is True,
    )


_IMBALANCE_CAUSES = (semconv.CAUSE_STAGE_IMBALANCE, semconv.CAUSE_DATA_IMBALANCE)


def _imbalance(attrs: Mapping[str, Any]) -> Imbalance:
    return Imbalance(
        cause=_str(attrs.get(semconv.STRAGGLER_CAUSE)),
        stage=_int(attrs.get(semconv.PIPELINE_STAGE)),
        ranks=_str(attrs.get(semconv.IMBALANCE_RANKS)),
        excess=_float(attrs.get(semconv.IMBALANCE_EXCESS)),
        cost_s=_float(attrs.get(semconv.IMBALANCE_COST)),
        fix=_str(attrs.get(semconv.IMBALANCE_FIX)),
        partition=_partition(attrs),
    )


def _partition(attrs: Mapping[str, Any]) -> Partition | None:
    """``training.imbalance.partition*`` (None unless every list is there, of one length,
    the counts positive integers and the times finite)."""

    def ints(key: str) -> tuple[int, ...] | None:
        v = attrs.get(key)
        if not isinstance(v, list) or not all(type(x) is int and x > 0 for x in v):
            return None
        return tuple(v)

    def floats(key: str) -> tuple[float, ...] | None:
        v = attrs.get(key)
        if not isinstance(v, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v
        ):
            return None
        return tuple(float(x) for x in v)

    layers, current = ints(semconv.IMBALANCE_PARTITION), ints(semconv.IMBALANCE_PARTITION_CURRENT)
    before = floats(semconv.IMBALANCE_PARTITION_BEFORE)
    after = floats(semconv.IMBALANCE_PARTITION_AFTER)
    if layers is None or current is None or before is None or after is None:
        return None
    if not layers or not len(layers) == len(current) == len(before) == len(after):
        return None
    return Partition(
        layers=layers,
        current=current,
        before_s=before,
        after_s=after,
        saving_s=_seconds(attrs.get(semconv.IMBALANCE_PARTITION_SAVING)),
    )


def parse_summary(span: FileSpan) -> StepSummary | None:
    """A ``train.step.summary`` span as a StepSummary (None without a step)."""
    a = span.attributes
    step = _int(a.get(semconv.STEP))
    if step is None:
        return None
    summary = StepSummary(
        step=step,
        trace_id=span.trace_id,
        duration_s=_float(a.get(semconv.STEP_DURATION), span.duration_s),
        whatif_s=_float(a.get(semconv.STEP_WHATIF)),
        slowdown=_float(a.get(semconv.JOB_SLOWDOWN), 1.0),
        ranks=_int(a.get(semconv.STEP_RANKS)) or 0,
        slow_collectives=_int(a.get(semconv.STEP_SLOW_COLLECTIVES)) or 0,
        min_saving_s=_seconds(a.get(semconv.STEP_MIN_SAVING)),
    )
    for event in span.events:
        attrs = event.get("attributes") or {}
        name = event.get("name")
        if name == semconv.EVENT_ROOT_CAUSE and attrs.get(semconv.STRAGGLER_CAUSE) in (
            _IMBALANCE_CAUSES
        ):
            summary.imbalance_causes.append(_imbalance(attrs))
        elif name == semconv.EVENT_IMBALANCE:
            summary.imbalances.append(_imbalance(attrs))
        elif name == semconv.EVENT_ROOT_CAUSE:
            verdict = _rank_verdict(attrs)
            if verdict is not None:
                summary.root_causes.append(verdict)
            else:
                summary.link_causes.append(_suspect(attrs))
        elif name == semconv.EVENT_STRAGGLER:
            verdict = _rank_verdict(attrs)
            if verdict is not None:
                summary.flags.append(verdict)
        elif name == semconv.EVENT_SUSPECT:
            summary.suspects.append(_suspect(attrs))
        elif name == semconv.EVENT_ATTRIBUTION:
            kind = _str(attrs.get(semconv.ATTRIBUTION_KIND))
            saves = _float(attrs.get(semconv.ATTRIBUTION_SAVES))
            if kind and math.isfinite(saves) and saves > 0:
                summary.attribution[kind] = summary.attribution.get(kind, 0.0) + saves
    return summary


def choose_worst_step(
    summaries: Mapping[int, float],
    roots: Mapping[int, float] | None = None,
    rank_steps: Mapping[int, float] | None = None,
    *,
    seen: set[int] | None = None,
) -> tuple[int, float, str] | None:
    """(step, duration, chosen_by) of the longest step, or None without any.

    summaries: step -> ``training.step.duration`` (the analysis' step time, free of host
    clocks): used when there is any. Else roots: step -> ``train.step.root`` duration (rank
    0's iteration). Else rank_steps: step -> longest ``train.step`` of any rank. Among
    summaries, steps in ``seen`` (steps with rank spans in the file) win over steps without;
    ties go to the earlier step.
    """
    for source, by_step in (("summary", summaries), ("root", roots), ("rank", rank_steps)):
        if not by_step:
            continue
        candidates = by_step
        if seen is not None and any(s in seen for s in by_step):
            candidates = {s: d for s, d in by_step.items() if s in seen}
        step = min(candidates, key=lambda s: (-candidates[s], s))
        return step, candidates[step], source
    return None


@dataclass
class _JobPass:
    """Pass 1's figures of one job."""

    job: str
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    steps: set[int] = field(default_factory=set)
    skew_max: dict[int, float] = field(default_factory=dict)
    lateness: dict[int, dict[int, float]] = field(default_factory=dict)
    summaries: dict[int, StepSummary] = field(default_factory=dict)
    roots: dict[int, float] = field(default_factory=dict)
    rank_steps: dict[int, float] = field(default_factory=dict)
    trace_ids: dict[int, set[str]] = field(default_factory=dict)
    balance: dict[int, str] = field(default_factory=dict)
    spans: int = 0

    def add(self, span: FileSpan) -> None:
        self.spans += 1
        if span.name == semconv.SPAN_STEP_SUMMARY:
            summary = parse_summary(span)
            if summary is not None:
                self.summaries[summary.step] = summary
            return
        step = _int(span.attributes.get(semconv.STEP))
        if step is None:
            return
        ids = self.trace_ids.setdefault(step, set())
        if len(ids) <= _MAX_TRACE_IDS_PER_STEP:
            ids.add(span.trace_id)
        if span.name == semconv.SPAN_STEP_ROOT:
            self.roots[step] = max(self.roots.get(step, 0.0), span.duration_s)
            return
        rank = _int(span.resource.get(semconv.RANK))
        if rank is None:
            return
        self.steps.add(step)
        if rank not in self.ranks:
            self.ranks[rank] = _rank_info(rank, span.resource)
        if span.name == semconv.SPAN_STEP:
            self.rank_steps[step] = max(self.rank_steps.get(step, 0.0), span.duration_s)
        elif span.name == semconv.SPAN_DATALOADER_FETCH:
            mode = span.attributes.get(semconv.BALANCE_MODE)
            if isinstance(mode, str):
                known = self.balance.setdefault(step, mode)
                if known != mode:
                    self.balance[step] = "mixed"
        elif span.name.startswith(semconv.SPAN_COLLECTIVE_PREFIX):
            a = span.attributes
            skew = a.get(semconv.BARRIER_SKEW)
            if skew is not None:
                self.skew_max[step] = max(self.skew_max.get(step, 0.0), _float(skew))
            late = a.get(semconv.BARRIER_LATENESS)
            if late is not None:
                per_rank = self.lateness.setdefault(rank, {})
                per_rank[step] = per_rank.get(step, 0.0) + _float(late)


def _first_pass(path: Path, job_id: str | None) -> tuple[_JobPass, SpanFileReader, list[str]]:
    reader = SpanFileReader(path, job=job_id, include_unterminated=True)
    chosen: _JobPass | None = None
    others: set[str] = set()
    for span in reader:
        job = span.resource.get(semconv.JOB_ID)
        if not isinstance(job, str) or not job:
            continue
        if chosen is None:
            chosen = _JobPass(job)
        if job != chosen.job:
            others.add(job)
            continue
        chosen.add(span)
    if chosen is None:
        where = f"{path}: {reader.stats.lines} lines, {reader.stats.spans} spans"
        if reader.stats.malformed_lines:
            where += f", {reader.stats.malformed_lines} malformed lines"
        if job_id is not None:
            raise ReportError(f"{where}, none of job {job_id!r}{_jobs_hint(path)}")
        raise ReportError(f"{where}, none with a {semconv.JOB_ID} resource attribute")
    if job_id is None and others:
        jobs = sorted({chosen.job, *others})
        raise ReportError(
            f"{path} holds {len(jobs)} jobs ({', '.join(map(repr, jobs[:20]))}"
            f"{', ...' if len(jobs) > 20 else ''}): choose one (--job)"
        )
    return chosen, reader, sorted(others)


def _jobs_hint(path: Path) -> str:
    jobs: set[str] = set()
    for span in SpanFileReader(path, include_unterminated=True):
        job = span.resource.get(semconv.JOB_ID)
        if isinstance(job, str) and job:
            jobs.add(job)
            if len(jobs) > 20:
                break
    if not jobs:
        return ""
    return "; jobs in it: " + ", ".join(map(repr, sorted(jobs)[:20]))


@dataclass
class _StepSpans:
    """Pass 2: the chosen step's spans of the shown ranks, and every member's offset."""

    spans: dict[int, list[FileSpan]] = field(default_factory=dict)
    offsets: list[tuple[Hashable, int, float]] = field(default_factory=list)
    ranks_in_step: set[int] = field(default_factory=set)
    infos: dict[int, RankInfo] = field(default_factory=dict)


def _second_pass(
    path: Path, job: str, step: int, trace_ids: set[str], shown: set[int] | None
) -> _StepSpans:
    needle = None
    if len(trace_ids) == 1 and all(trace_ids):
        needle = next(iter(trace_ids)).encode()
    out = _StepSpans()
    for span in SpanFileReader(path, job=job, line_contains=needle, include_unterminated=True):
        if span.name in (semconv.SPAN_STEP_SUMMARY, semconv.SPAN_STEP_ROOT):
            continue
        if _int(span.attributes.get(semconv.STEP)) != step:
            continue
        rank = _int(span.resource.get(semconv.RANK))
        if rank is None:
            continue
        out.ranks_in_step.add(rank)
        a = span.attributes
        if span.name.startswith(semconv.SPAN_COLLECTIVE_PREFIX):
            offset = a.get(semconv.CLOCK_OFFSET)
            op = a.get(semconv.COLLECTIVE_OP)
            if offset is not None and op not in _P2P_OPS:
                key = (a.get(semconv.COLLECTIVE_PG), a.get(semconv.COLLECTIVE_SEQ), op)
                out.offsets.append((key, rank, _float(offset)))
        if shown is None or rank in shown:
            out.spans.setdefault(rank, []).append(span)
            if rank not in out.infos:
                out.infos[rank] = _rank_info(rank, span.resource)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _segments(spans: list[FileSpan], offset_s: float) -> list[Segment]:
    out: list[Segment] = []
    for span in sorted(spans, key=lambda s: (s.start_ns, s.end_ns)):
        start = span.start_ns / 1e9 - offset_s
        end = max(span.end_ns / 1e9 - offset_s, start)
        a = span.attributes
        if span.name.startswith(semconv.SPAN_COLLECTIVE_PREFIX):
            pg, seq = a.get(semconv.COLLECTIVE_PG), a.get(semconv.COLLECTIVE_SEQ)
            label = f"{span.name} pg={pg} seq={seq}"
            facts = [f"duration {_ms(end - start)}"]
            for key, what in (
                (semconv.BARRIER_WAIT, "wait"),
                (semconv.BARRIER_LATENESS, "lateness"),
                (semconv.BARRIER_TRANSFER, "transfer"),
                (semconv.BARRIER_SKEW, "skew"),
            ):
                if key in a:
                    facts.append(f"{what} {_ms(_float(a[key]))}")
            if a.get(semconv.STRAGGLER) is True:
                facts.append(f"straggler ({a.get(semconv.STRAGGLER_CAUSE, '?')})")
            if a.get(semconv.BARRIER_MISSING):
                facts.append(f"missing ranks {a[semconv.BARRIER_MISSING]}")
            detail = ", ".join(facts)
            out.append(Segment("collective", start, end, label, detail))
            wait = _float(a.get(semconv.BARRIER_WAIT))
            if wait > 0:
                out.append(
                    Segment(
                        "wait",
                        start,
                        min(start + wait, end),
                        f"{span.name} pg={pg}: waiting for the last member",
                        f"barrier wait {_ms(wait)}",
                    )
                )
        else:
            kind = _PHASES.get(span.name, "other")
            detail = f"duration {_ms(end - start)}"
            if span.name == semconv.SPAN_PACING_DELAY and semconv.PACING_DELAY in a:
                detail += f", pacing delay {_ms(_float(a[semconv.PACING_DELAY]))}"
            out.append(Segment(kind, start, end, span.name, detail))
    return out


def _shown_ranks(ranks: Mapping[int, RankInfo], first: set[int], max_rows: int) -> set[int] | None:
    if len(ranks) <= max_rows:
        return None
    shown = set(sorted(first)[:max_rows])
    for r in sorted(ranks):
        if len(shown) >= max_rows:
            break
        shown.add(r)
    return shown


def _waterfall(
    path: Path,
    job: _JobPass,
    choice: tuple[int, float, str],
    flagged: set[int],
    max_rows: int,
) -> Waterfall:
    step, duration, chosen_by = choice
    summary = job.summaries.get(step)
    causes = {v.rank for v in summary.root_causes} if summary else set()
    shown = _shown_ranks(job.ranks, flagged | causes, max_rows)
    got = _second_pass(path, job.job, step, job.trace_ids.get(step, set()), shown)
    hosts = {r: info.host for r, info in {**job.ranks, **got.infos}.items()}
    offsets = estimate_offsets(got.offsets, hosts)
    lateness = {r: job.lateness.get(r, {}).get(step, 0.0) for r in got.spans}
    rows: list[RankRow] = []
    for rank in sorted(got.spans):
        offset = offsets.get(rank)
        rows.append(
            RankRow(
                info=got.infos.get(rank) or job.ranks[rank],
                segments=_segments(got.spans[rank], offset or 0.0),
                clock_offset_s=offset,
                flagged=rank in flagged,
                root_cause=rank in causes,
                lateness_s=lateness[rank],
            )
        )
    starts = [seg.start_s for row in rows for seg in row.segments]
    ends = [seg.end_s for row in rows for seg in row.segments]
    origin = min(starts, default=0.0)
    for row in rows:
        row.segments = [
            Segment(s.kind, s.start_s - origin, s.end_s - origin, s.label, s.detail)
            for s in row.segments
        ]
    return Waterfall(
        step=step,
        duration_s=duration,
        chosen_by=chosen_by,
        rows=rows,
        extent_s=max(ends, default=origin) - origin,
        hidden_ranks=len(got.ranks_in_step - set(got.spans)),
        unaligned_ranks=sum(1 for row in rows if row.clock_offset_s is None),
    )


def flag_changes(summaries: Mapping[int, StepSummary]) -> list[FlagChange]:
    """Ranks and suspects flagged or cleared, summary after summary (by step)."""
    changes: list[FlagChange] = []
    prev_ranks: frozenset[int] = frozenset()
    prev_suspects: set[str] = set()
    for step in sorted(summaries):
        s = summaries[step]
        ranks = s.flagged
        for r in sorted(ranks - prev_ranks):
            changes.append(FlagChange(step, f"rank {r}", "set", r))
        for r in sorted(prev_ranks - ranks):
            changes.append(FlagChange(step, f"rank {r}", "cleared", r))
        suspects = {x.key for x in s.suspects}
        for k in sorted(suspects - prev_suspects):
            changes.append(FlagChange(step, k, "set"))
        for k in sorted(prev_suspects - suspects):
            changes.append(FlagChange(step, k, "cleared"))
        prev_ranks, prev_suspects = ranks, suspects
    return changes


def _first_and_since(steps: list[int], holds: Mapping[int, bool]) -> tuple[int, int]:
    first = next(s for s in steps if holds[s])
    since = steps[-1]
    for s in reversed(steps):
        if not holds[s]:
            break
        since = s
    return first, since


def _verdicts(
    summaries: Mapping[int, StepSummary],
) -> tuple[list[Verdict], list[SuspectVerdict], StepSummary | None]:
    if not summaries:
        return [], [], None
    steps = sorted(summaries)
    last = summaries[steps[-1]]
    verdicts = []
    for flag in sorted(last.flags, key=lambda f: (-f.cost_s, f.rank)):
        first, since = _first_and_since(
            steps, {s: flag.rank in summaries[s].flagged for s in steps}
        )
        verdicts.append(Verdict(flag, first, since))
    suspects = []
    for suspect in sorted(last.suspects, key=lambda x: (-x.cost_s, x.key)):
        first, since = _first_and_since(
            steps, {s: any(x.key == suspect.key for x in summaries[s].suspects) for s in steps}
        )
        suspects.append(SuspectVerdict(suspect, first, since))
    return verdicts, suspects, last


def collect(
    spans_path: Path | str,
    *,
    job_id: str | None = None,
    step: int | None = None,
    run_info: RunInfo | None = None,
    max_rows: int = MAX_ROWS,
) -> ReportData:
    """Read the span file (two passes) into the report's data.

    job_id: the job to report on; None: the file's only job (several: ReportError).
    step: the step drawn as a waterfall; None: the worst (:func:`choose_worst_step`).
    Raises ReportError for a missing or empty file, no such job, several jobs, or a
    requested step without spans.
    """
    path = Path(spans_path)
    if not path.exists():
        raise ReportError(f"{path}: no such file")
    if not path.is_file():
        raise ReportError(f"{path}: not a regular file")
    if path.stat().st_size == 0:
        raise ReportError(
            f"{path} is empty: no spans were written (is the Collector's file exporter on? "
            "collector-config/file-export.yaml)"
        )
    job, reader, others = _first_pass(path, job_id)
    stats = reader.stats
    summaries = dict(sorted(job.summaries.items()))
    verdicts, suspects, last = _verdicts(summaries)
    flagged = {v.flag.rank for v in verdicts}

    choice: tuple[int, float, str] | None
    if step is not None:
        if step not in job.steps:
            raise ReportError(f"{path}: job {job.job!r} has no rank spans of step {step}")
        known = summaries.get(step)
        choice = (step, known.duration_s if known else job.rank_steps.get(step, 0.0), "requested")
    else:
        choice = choose_worst_step(
            {s: x.duration_s for s, x in summaries.items()},
            job.roots,
            job.rank_steps,
            seen=job.steps,
        )
    waterfall = _waterfall(path, job, choice, flagged, max_rows) if choice else None

    series = Series(
        skew_max_s=dict(sorted(job.skew_max.items())),
        lateness_s={r: dict(sorted(v.items())) for r, v in sorted(job.lateness.items())},
        step_duration_s={s: x.duration_s for s, x in summaries.items()},
        step_whatif_s={s: x.whatif_s for s, x in summaries.items() if x.whatif_s > 0},
    )
    return ReportData(
        job_id=job.job,
        source=str(path),
        ranks=dict(sorted(job.ranks.items())),
        steps_seen=len(job.steps),
        first_step=min(job.steps, default=None),
        last_step=max(job.steps, default=None),
        summaries=summaries,
        series=series,
        changes=flag_changes(summaries),
        verdicts=verdicts,
        suspects=suspects,
        last_summary=last,
        waterfall=waterfall,
        run_info=run_info,
        spans_read=job.spans,
        malformed_lines=stats.malformed_lines,
        malformed_spans=stats.malformed_spans,
        other_jobs=others,
        balance_modes=dict(sorted(job.balance.items())),
        step_time_s=dict(sorted(job.rank_steps.items())),
    )
