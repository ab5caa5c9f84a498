"""Reading the Collector's file exporter output (``format: json``), one line at a time.

``collector-config/file-export.yaml`` makes the Collector append every span it forwards to a
file, one OTLP/JSON ``TracesData`` object per line (``{"resourceSpans": [...]}``). This is the
one reader of that format: the HTML report and the test harness both use it.

    reader = SpanFileReader(path)
    for span in reader:              # FileSpan, streamed: the file is never read whole
        ...
    reader.stats.malformed_lines     # lines that were not a TracesData object, skipped

The file is read line by line, so memory is bounded by the longest line (one export batch),
not by the file. Two filters keep the cost of a second look at a big file low:
``line_contains`` skips, before JSON parsing, every line that lacks a byte string (a trace
ID), and ``job`` skips the resources of other jobs before their spans are converted.

OTLP/JSON details handled here: 64-bit integers (``intValue``, timestamps) are strings, IDs
are hex, attribute values are ``AnyValue`` objects (``arrayValue``/``kvlistValue`` nest).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skewtrace import semconv

__all__ = [
    "FileSpan",
    "ReadStats",
    "SpanFileReader",
    "iter_file_export",
    "read_file_export",
]


@dataclass(frozen=True)
class FileSpan:
    """One span of the file, with its resource's attributes."""

    name: str
    trace_id: str
    span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    parent_span_id: str = ""
    # {"name": ..., "attributes": {...}} per span event
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class ReadStats:
    """What a pass over the file saw and skipped."""

    lines: int = 0
    """Newline-terminated lines read (blank ones included)."""
    malformed_lines: int = 0
    """Lines that were not JSON, or not a TracesData object: skipped whole."""
    malformed_spans: int = 0
    """Spans inside good lines without a name or with unreadable timestamps: skipped."""
    filtered_lines: int = 0
    """Lines skipped unparsed by ``line_contains``."""
    unterminated_tail: bool = False
    """The file ended in a line without a newline (a write in progress)."""
    spans: int = 0
    """Spans yielded."""


def _json_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])  # OTLP/JSON writes 64-bit ints as strings
    if "doubleValue" in value:
        # NaN and infinities are written as strings ("NaN", "Infinity").
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_json_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return _json_attributes((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def _json_attributes(kvs: Any) -> dict[str, Any]:
    if not isinstance(kvs, list):
        return {}
    out: dict[str, Any] = {}
    for kv in kvs:
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"]] = _json_value(kv.get("value", {}))
    return out


def _span(raw: Any, resource: dict[str, Any]) -> FileSpan | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    try:
        start = int(raw.get("startTimeUnixNano", 0))
        end = int(raw.get("endTimeUnixNano", 0))
    except (TypeError, ValueError):
        return None
    events = raw.get("events") or []
    return FileSpan(
        name=raw["name"],
        trace_id=str(raw.get("traceId", "")),
        span_id=str(raw.get("spanId", "")),
        start_ns=start,
        end_ns=end,
        attributes=_json_attributes(raw.get("attributes", [])),
        resource=resource,
        parent_span_id=str(raw.get("parentSpanId", "")),
        events=[
            {"name": str(ev.get("name", "")), "attributes": _json_attributes(ev.get("attributes"))}
            for ev in events
            if isinstance(ev, dict)
        ],
    )


class SpanFileReader:
    """An iterable over the spans of one file exporter output; each iteration rereads it.

    path: the JSONL file. A missing file is an error (``FileNotFoundError``) when iterated.
    job: only spans whose resource has this ``training.job.id``.
    line_contains: only lines containing these bytes are parsed (e.g. a trace ID in hex).
    include_unterminated: also parse a last line without a newline. The file exporter ends
    every line with one, so a line without it is a write in progress: a reader following a
    live file (the tests) leaves it for the next read; a reader of a finished file parses it
    (and counts it malformed when it is cut short).
    """

    def __init__(
        self,
        path: Path | str,
        *,
        job: str | None = None,
        line_contains: bytes | None = None,
        include_unterminated: bool = False,
    ) -> None:
        self.path = Path(path)
        self.job = job
        self.line_contains = line_contains
        self.include_unterminated = include_unterminated
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[FileSpan]:
        self.stats = stats = ReadStats()
        with open(self.path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    stats.unterminated_tail = True
                    if not self.include_unterminated:
                        continue
                stats.lines += 1
                if not line.strip():
                    continue
                if self.line_contains is not None and self.line_contains not in line:
                    stats.filtered_lines += 1
                    continue
                yield from self._line(line, stats)

    def _line(self, line: bytes, stats: ReadStats) -> Iterator[FileSpan]:
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            stats.malformed_lines += 1
            return
        resource_spans = data.get("resourceSpans") if isinstance(data, dict) else None
        if not isinstance(resource_spans, list):
            stats.malformed_lines += 1
            return
        for rs in resource_spans:
            try:
                resource = _json_attributes((rs.get("resource") or {}).get("attributes", []))
            except (TypeError, ValueError, AttributeError):
                stats.malformed_spans += 1  # the resource's spans cannot be attributed
                continue
            if self.job is not None and resource.get(semconv.JOB_ID) != self.job:
                continue
            for ss in rs.get("scopeSpans") or []:
                for raw in (ss.get("spans") if isinstance(ss, dict) else None) or []:
                    try:
                        span = _span(raw, resource)
                    except (TypeError, ValueError, AttributeError):
                        span = None
                    if span is None:
                        stats.malformed_spans += 1
                        continue
                    stats.spans += 1
                    yield span


def iter_file_export(path: Path | str) -> Iterator[FileSpan]:
    """Spans of a file that may still be written to: nothing when it does not exist yet, and
    a last line without its newline is left for the next read. Malformed lines are skipped."""
    try:
        yield from SpanFileReader(path)
    except FileNotFoundError:
        return


def read_file_export(path: Path | str) -> list[FileSpan]:
    return list(iter_file_export(path))
