"""``skewtrace import FILE... [--report OUT.html]``: recorded traces to a Collector, or to a report.

The flags are defined in :mod:`skewtrace.cli` (this module is imported when the subcommand
runs). Exit status: 0 when everything was sent (or the report written), 2 when the input or
the arguments are wrong (every problem named, nothing sent), 1 when the Collector could not
be reached, refused spans, or could not be run for ``--report``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from skewtrace.importer.model import ImportedJob, InputErrors, place_on_epoch

CSV, KINETO, WHATIF = "csv", "kineto", "whatif"
FORMATS = ("auto", CSV, KINETO, WHATIF)
_KINETO_SUFFIXES = (".json", ".json.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_PROG = "skewtrace import"


class UsageError(Exception):
    """Arguments that cannot work; exit status 2."""


def _say(message: str) -> None:
    print(f"{_PROG}: {message}", file=sys.stderr)


def _format_of(path: Path) -> str | None:
    """By name, and for a CSV table by its header: the what-if format's has ``optype`` and
    ``start_ts``. A directory holding parquet or what-if CSV tables is what-if tables,
    any other one profiler traces."""
    from skewtrace.importer.whatif import csv_is_whatif

    name = path.name.lower()
    if path.is_dir():
        if any(
            p.is_file()
            and (
                p.name.lower().endswith(_PARQUET_SUFFIXES)
                or (p.name.lower().endswith(".csv") and csv_is_whatif(p))
            )
            for p in path.iterdir()
        ):
            return WHATIF
        return KINETO
    if name.endswith(_KINETO_SUFFIXES):
        return KINETO
    if name.endswith(_PARQUET_SUFFIXES):
        return WHATIF
    if name.endswith(".csv"):
        return WHATIF if csv_is_whatif(path) else CSV
    return None


def input_files(given: Sequence[str], fmt: str) -> tuple[list[Path], str]:
    """The files to read and their format (a directory stands for its trace files)."""
    paths = [Path(p) for p in given]
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")
    if fmt == "auto":
        found = {_format_of(path) for path in paths}
        if None in found or len(found) != 1:
            unknown = [str(p) for p in paths if _format_of(p) is None]
            raise UsageError(
                f"cannot tell the format of {', '.join(unknown) or 'a mix of formats'}: name "
                "tables *.csv or *.parquet and traces *.json / *.json.gz, or pass "
                "--format csv|kineto|whatif"
            )
        fmt = found.pop() or CSV
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            suffixes = {CSV: (".csv",), WHATIF: (*_PARQUET_SUFFIXES, ".csv")}.get(
                fmt, _KINETO_SUFFIXES
            )
            inside = sorted(
                p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(suffixes)
            )
            if not inside:
                raise UsageError(f"{path}: no {' or '.join(suffixes)} files in the directory")
            files += inside
        else:
            files.append(path)
    return files, fmt


def content_job_id(paths: Sequence[Path]) -> str:
    """The job id of an import without ``--job``: ``import-`` and 12 hex digits of the
    input's sha256, so the same input gets the same id (and trace IDs) every time."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return f"import-{digest.hexdigest()[:12]}"


def _time_unit(args: argparse.Namespace) -> str | None:
    from skewtrace.importer.columnar import TIME_UNITS

    unit: str | None = getattr(args, "time_unit", None)
    if unit is not None and unit not in TIME_UNITS:
        raise UsageError(f"--time-unit {unit!r}: use one of {', '.join(TIME_UNITS)}")
    return unit


def read_input(args: argparse.Namespace) -> ImportedJob:
    """The checked job; raises :class:`UsageError` or :class:`InputErrors`."""
    files, fmt = input_files(args.inputs, args.format)
    job_id = args.job.strip() if args.job and args.job.strip() else None
    meta_arg: str | None = getattr(args, "meta", None)
    if meta_arg is not None and fmt != WHATIF:
        raise UsageError("--meta is the metadata of what-if tables; the input is not one")
    if fmt == CSV:
        from skewtrace.importer.columnar import read_csv

        job = read_csv(
            files,
            job_id=job_id,
            default_job=job_id or content_job_id(files),
            time_unit=_time_unit(args) or "s",
        )
    elif fmt == WHATIF:
        from skewtrace.importer.whatif import find_meta, read_whatif

        meta = Path(meta_arg) if meta_arg is not None else find_meta(files)
        if meta is not None and not meta.is_file():
            raise UsageError(f"--meta {meta}: no such file")
        job = read_whatif(
            files,
            job_id=job_id or content_job_id([*files, *([meta] if meta else [])]),
            meta=meta,
            time_unit=_time_unit(args),
        )
    else:
        from skewtrace.importer.kineto import read_kineto

        job = read_kineto(files, job_id=job_id or content_job_id(files))
    if not job.ranks:
        raise UsageError(f"no rows or events in {', '.join(map(str, files))}")
    if place_on_epoch(job.ranks.values()):
        job.notes.append(
            "the times are not epoch times (they end before 2001): moved so that the last "
            "span ends now"
        )
    return job


def _check_flags(args: argparse.Namespace) -> None:
    if args.report and (args.endpoint or args.protocol):
        raise UsageError("--report runs a Collector of its own: drop --endpoint and --protocol")
    if not args.report and args.keep_spans:
        raise UsageError("--keep-spans keeps the span file of --report: give --report too")


def run(args: argparse.Namespace) -> int:
    try:
        _check_flags(args)
        job = read_input(args)
    except UsageError as exc:
        _say(str(exc))
        return 2
    except InputErrors as exc:
        for problem in exc.problems:
            _say(problem)
        if exc.truncated:
            _say(f"stopped reading after {len(exc.problems)} problems")
        _say("nothing was sent")
        return 2
    for note in job.notes:
        _say(f"note: {note}")
    from skewtrace.importer.spans import spans_by_step

    by_step = spans_by_step(job)
    total = sum(len(spans) for spans in by_step.values())
    ranks, steps, _ = job.counts()
    what = f"job {', '.join(job.jobs())} ({ranks} ranks, {steps} steps)"
    if args.dry_run:
        print(f"{total} spans of {what}: checked, nothing sent (--dry-run)")
        return 0
    batches = list(by_step.values())
    if args.report:
        return _report(args, job, batches, total, what)
    return _send(args, batches, total, what)


def _send(
    args: argparse.Namespace, batches: list[list[ReadableSpan]], total: int, what: str
) -> int:
    from skewtrace.importer.send import SendError, destination, send

    try:
        where = destination(args.endpoint, args.protocol)
    except ValueError as exc:
        _say(f"--protocol: {exc}")
        return 2
    try:
        sent = send(batches, where)
    except SendError as exc:
        _say(str(exc))
        _say(
            "nothing was sent"
            if exc.sent == 0
            else f"{exc.sent} of {total} spans had been sent before the failure"
        )
        return 1
    print(f"sent {sent} spans of {what} to {where}")
    return 0


def _report(
    args: argparse.Namespace,
    job: ImportedJob,
    batches: list[list[ReadableSpan]],
    total: int,
    what: str,
) -> int:
    from skewtrace.importer.collector import (
        CollectorError,
        LocalCollector,
        find_binary,
        summarized_steps,
        wait_for_summaries,
    )
    from skewtrace.importer.send import GRPC, Destination, SendError, send
    from skewtrace.report import ReportError, RunInfo, write_report

    jobs = job.jobs()
    if len(jobs) != 1:
        _say(f"--report needs one job; the input has {len(jobs)} ({', '.join(jobs)}): pass --job")
        return 2
    job_id = jobs[0]
    steps = job.steps_with_collectives(job_id)
    try:
        binary = find_binary(args.otelcol)
    except CollectorError as exc:
        _say(str(exc))
        return 1
    with tempfile.TemporaryDirectory(prefix="skewtrace-import-") as tmp:
        workdir = Path(tmp)
        try:
            with LocalCollector(binary, workdir) as collector:
                where = Destination(GRPC, collector.otlp_endpoint, secure=False)
                sent = send(batches, where)
                wait_for_summaries(collector, job_id, steps, args.wait_millis / 1000)
                log = collector.log_tail()
                if not collector.running():
                    raise CollectorError(f"{binary} stopped during the analysis; its log:\n{log}")
        except (CollectorError, SendError) as exc:
            _say(str(exc))
            return 1
        spans_path = workdir / "spans.jsonl"
        missing = sorted(steps - summarized_steps(spans_path, job_id))
        if missing:
            _say(
                f"no step summary for {len(missing)} of {len(steps)} steps "
                f"({_ranges(missing)}) after {args.wait_millis} ms; the report shows the rest. "
                f"The Collector's log ended with:\n{log}"
            )
        if args.keep_spans:
            shutil.copyfile(spans_path, args.keep_spans)
        info = RunInfo(
            title="Imported",
            figures=[
                ("input", ", ".join(args.inputs)),
                ("spans imported", f"{sent} of {total}"),
                ("steps analysed", f"{len(steps) - len(missing)} of {len(steps)}"),
            ],
            notes=list(job.notes),
        )
        try:
            stats = write_report(spans_path, args.report, job_id=job_id, run_info=info)
        except (ReportError, OSError) as exc:
            _say(str(exc))
            return 1
    flagged = ", ".join(f"rank {r} ({cause})" for r, cause in sorted(stats.flagged.items()))
    print(
        f"wrote {stats.out_path} from {sent} spans of {what}: {stats.steps_analyzed} of "
        f"{stats.steps_seen} "
        f"steps analysed, worst step {stats.worst_step}; flagged: {flagged or 'none'}"
    )
    return 0


def _ranges(steps: list[int]) -> str:
    """``1-3, 7`` for [1, 2, 3, 7]."""
    out: list[str] = []
    for step in steps:
        if out and out[-1].split("-")[-1] == str(step - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{step}"
        else:
            out.append(str(step))
    return ", ".join(out)
