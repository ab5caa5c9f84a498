"""The HTML report: one file a person opens in a browser after a run.

It is built from the spans the Collector wrote with its file exporter
(``collector-config/file-export.yaml``: every rank's spans, annotated by the barrierskew
processor, and one ``train.step.summary`` per analyzed step) and shows:

- the job: ranks, hosts, switches, steps seen and analysed, and what was read (malformed
  lines are skipped and counted);
- an optional run-info block from the caller (:class:`RunInfo`: what was injected, what
  skewtrace concluded, figures, small tables, notes);
- the verdict after the last analyzed step: flagged ranks with cause, cost per step, domain
  and the step each was first flagged at, and the suspected parts of the fabric;
- the worst step (largest ``training.step.duration``) as a waterfall, one row per rank on
  host clocks aligned by the collectives' ``training.clock.offset`` (:mod:`.align`), the
  flagged ranks' rows marked;
- barrier skew, each rank's lateness and step time against what-if over the run, with
  markers where flags were set and cleared.

The page is self-contained (inline CSS and SVG, no script, no external resource).

From the command line::

    skewtrace report skewtrace-spans.jsonl [--job JOB] [--step N] [-o report.html]

From Python::

    from skewtrace.report import RunInfo, write_report

    stats = write_report(
        Path("skewtrace-spans.jsonl"),
        Path("report.html"),
        job_id=None,  # the file's only job
        run_info=RunInfo(injected=["rank 2: +40 ms compute"], figures=[("steps to flag", "4")]),
    )
    stats.flagged  # {2: "compute"}

The file is streamed twice (see :mod:`.collect`): memory grows with steps x ranks, not with
spans. Modules: :mod:`.spans` reads the file format, :mod:`.collect` turns it into
:class:`~.model.ReportData`, :mod:`.align` aligns clocks, :mod:`.waterfall`, :mod:`.charts`
and :mod:`.page` draw it, :mod:`.command` is the ``skewtrace report`` subcommand.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from skewtrace.report.collect import MAX_ROWS, ReportError, choose_worst_step, collect
from skewtrace.report.model import InfoTable, ReportData, ReportStats, RunInfo
from skewtrace.report.page import render_page

__all__ = [
    "MAX_ROWS",
    "InfoTable",
    "ReportData",
    "ReportError",
    "ReportStats",
    "RunInfo",
    "build_report",
    "choose_worst_step",
    "collect",
    "render_page",
    "write_report",
]


def _stats(data: ReportData, out_path: Path | None, html_bytes: int) -> ReportStats:
    wf = data.waterfall
    suspects = data.last_summary.suspects if data.last_summary else []
    return ReportStats(
        job_id=data.job_id,
        out_path=out_path,
        ranks=len(data.ranks),
        hosts=len(data.hosts),
        switches=len(data.switches),
        steps_seen=data.steps_seen,
        steps_analyzed=len(data.summaries),
        worst_step=wf.step if wf else None,
        worst_step_duration_s=wf.duration_s if wf else None,
        flagged=data.flagged,
        suspects=[s.key for s in suspects],
        spans_read=data.spans_read,
        malformed_lines=data.malformed_lines,
        malformed_spans=data.malformed_spans,
        html_bytes=html_bytes,
    )


def build_report(
    spans_path: Path | str,
    *,
    job_id: str | None = None,
    run_info: RunInfo | None = None,
    step: int | None = None,
    max_rows: int = MAX_ROWS,
) -> tuple[str, ReportStats]:
    """The report's HTML and what it found, without writing anything.

    job_id: the job to report on; None picks the file's only job.
    step: the step drawn as a waterfall; None: the worst.
    max_rows: waterfall rows at most (flagged ranks and root causes first).
    Raises ReportError (missing or empty file, no such job, several jobs and no job_id).
    """
    data = collect(spans_path, job_id=job_id, step=step, run_info=run_info, max_rows=max_rows)
    html = render_page(data)
    return html, _stats(data, None, len(html.encode()))


def write_report(
    spans_path: Path | str,
    out_path: Path | str,
    *,
    job_id: str | None = None,
    run_info: RunInfo | None = None,
    step: int | None = None,
    max_rows: int = MAX_ROWS,
) -> ReportStats:
    """Write the report for ``spans_path`` to ``out_path`` (replaced atomically).

    Arguments as :func:`build_report`; returns what it found (job, ranks, worst step,
    flagged ranks with causes, suspects, malformed lines).
    """
    html, stats = build_report(
        spans_path, job_id=job_id, run_info=run_info, step=step, max_rows=max_rows
    )
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    stats.out_path = out
    return stats
