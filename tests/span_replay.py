"""Play recorded or generated spans through the built Collector and read its verdicts back,
deterministically.

    requests = requests_of_job(job)                  # an ImportedJob (skewtrace import)
    requests = read_recording(path)                  # or a recording kept in tests/data/recorded
    summaries = replay(otelcol_path, requests, tmp_path)
    summaries[job_id][step].flags, .imbalances, .duration_s / .whatif_s ...

What decides a verdict here is the spans and nothing else:

- the requests go one after the other, each answered before the next is sent (the
  Collector's processor has taken a request in before it answers), in the order given;
- a step is analysed once every rank of the job's world ended it (``training.world_size``;
  ``src/collector/internal/diagnosis``), never because some time passed, and a job's steps
  in order;
- the Collector is then stopped (SIGTERM): it analyses whatever is still open and its file
  exporter writes every summary out before it exits. No summary is waited for by the clock.

So a busy machine makes a replay slower, not different. ``spread_s`` sends each rank's
spans of a step in a request of its own over that many seconds (the OpenTelemetry SDK's
batch processor exports each rank on its own schedule): the verdicts must be the same.

A recording is gzipped OTLP/JSON, one ``ExportTraceServiceRequest`` a line (the file
exporter's lines of the rank spans a live run sent, the Collector's own summaries left out;
``tests/data/recorded/README.md`` says how each was made). The Collector's settings that a
test compares with are read from its Go sources (:func:`collector_default`), never copied.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, REPO_ROOT, CollectorProcess
from skewtrace import semconv
from skewtrace.importer.model import ImportedJob
from skewtrace.importer.spans import spans_by_step
from skewtrace.rank._export.otlp_wire import FastSpanEncoder
from skewtrace.report.collect import parse_summary
from skewtrace.report.model import StepSummary
from skewtrace.report.spans import read_file_export

PROTOBUF, JSON = "application/x-protobuf", "application/json"

REPLAY_YAML = REPO_ROOT / "tests" / "data" / "replay-collector.yaml"
"""Traces to the file export alone, metrics to Prometheus alone (no exporter to a port that
nothing listens on)."""

MAX_SPANS_PER_REQUEST = 2048


@dataclass(frozen=True)
class Request:
    """One OTLP/HTTP trace request: its body and content type, and the rank and step whose
    spans it carries (-1 when it carries several)."""

    body: bytes
    content_type: str = PROTOBUF
    rank: int = -1
    step: int = -1


def requests_of_job(job: ImportedJob, *, per_rank: bool = False) -> list[Request]:
    """The job's spans as the ranks' own encoder writes them: all ranks' spans of step 0,
    then of step 1, ... (per_rank: one request per rank and step, ranks in order)."""
    encoder = FastSpanEncoder()
    out: list[Request] = []
    for (_, step), spans in spans_by_step(job).items():
        groups: Iterable[tuple[int, Sequence[ReadableSpan]]]
        if per_rank:
            by_rank: dict[int, list[ReadableSpan]] = defaultdict(list)
            for span in spans:
                rank = span.resource.attributes.get(semconv.RANK, -1)
                by_rank[int(rank)].append(span)  # type: ignore[arg-type]
            groups = sorted(by_rank.items())
        else:
            groups = [(-1, spans)]
        for rank, group in groups:
            for first in range(0, len(group), MAX_SPANS_PER_REQUEST):
                chunk = group[first : first + MAX_SPANS_PER_REQUEST]
                out.append(Request(encoder.encode(chunk), PROTOBUF, rank, step))
    return out


def otlp_json(request: Request) -> bytes:
    """A protobuf request as one line of OTLP/JSON (IDs in hex, as the file exporter and
    the Collector's JSON receiver write and read them)."""
    if request.content_type == JSON:
        return request.body
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    message = ExportTraceServiceRequest()
    message.ParseFromString(request.body)
    data = MessageToDict(message)
    for resource_spans in data.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        if key in link:
                            link[key] = base64.b64decode(link[key]).hex()
    return json.dumps(data, separators=(",", ":")).encode()


def write_recording(requests: Iterable[Request], path: Path) -> None:
    """Writes the requests as a recording (gzipped OTLP/JSON lines, in order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=9) as out:
        for request in requests:
            out.write(otlp_json(request) + b"\n")


_ANNOTATIONS = frozenset(
    {
        semconv.BARRIER_SKEW,
        semconv.BARRIER_LATENESS,
        semconv.BARRIER_WAIT,
        semconv.BARRIER_TRANSFER,
        semconv.BARRIER_MISSING_RANKS,
        semconv.BARRIER_MISSING,
        semconv.BARRIER_RELEASED,
        semconv.BARRIER_UNJOINED,
        semconv.CLOCK_OFFSET,
        semconv.COLLECTIVE_SLOWDOWN,
        semconv.STRAGGLER,
        semconv.STRAGGLER_CAUSE,
        semconv.STRAGGLER_DOMAIN,
    }
)
"""What the barrierskew processor writes on the collective spans it joins."""


def recording_of_file_export(path: Path, job: str) -> list[Request]:
    """The rank spans of ``job`` in a Collector's file export (``file-export.yaml``), as
    requests to play again: the Collector's own step summaries left out and the processor's
    annotations taken off, in the order the file holds them (each line one request)."""
    out: list[Request] = []
    with open(path, "rb") as lines:
        for line in lines:
            if not line.strip():
                continue
            data = json.loads(line)
            kept = []
            for resource_spans in data.get("resourceSpans", []):
                attrs = {
                    a["key"]: a.get("value", {})
                    for a in resource_spans.get("resource", {}).get("attributes", [])
                }
                if attrs.get(semconv.JOB_ID, {}).get("stringValue") != job:
                    continue
                if semconv.RANK not in attrs:  # the Collector's summaries have no rank
                    continue
                for scope_spans in resource_spans.get("scopeSpans", []):
                    for span in scope_spans.get("spans", []):
                        span["attributes"] = [
                            a for a in span.get("attributes", []) if a["key"] not in _ANNOTATIONS
                        ]
                kept.append(resource_spans)
            if kept:
                body = json.dumps({"resourceSpans": kept}, separators=(",", ":")).encode()
                out.append(Request(body, JSON))
    return out


def read_recording(path: Path) -> list[Request]:
    """A recording's requests, in their order (gzipped OTLP/JSON lines)."""
    with gzip.open(path, "rb") as lines:
        return [Request(line.rstrip(b"\n"), JSON) for line in lines if line.strip()]


def replay(
    otelcol_path: Path,
    requests: Sequence[Request],
    workdir: Path,
    *,
    spread_s: float = 0.0,
    env: dict[str, str] | None = None,
) -> dict[str, dict[int, StepSummary]]:
    """Sends the requests in order to a fresh Collector (``otelcol.yaml`` with the file
    export), stops it, and returns every job's step summaries by step. With ``spread_s``
    the requests of each step are spread evenly over that many seconds."""
    workdir.mkdir(parents=True, exist_ok=True)
    with CollectorProcess(
        otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML, REPLAY_YAML], workdir, env=env
    ) as collector:
        url = f"http://127.0.0.1:{collector.ports.otlp_http}/v1/traces"
        per_step: dict[int, int] = defaultdict(int)
        for request in requests:
            per_step[request.step] += 1
        for request in requests:
            post(url, request)
            if spread_s > 0:
                time.sleep(spread_s / max(1, per_step[request.step]))
        code = collector.stop(timeout_s=120)
        if code != 0:
            raise RuntimeError(f"the Collector exited with {code}:\n{collector.log_tail()}")
        spans = read_file_export(collector.file_export_path)
    out: dict[str, dict[int, StepSummary]] = defaultdict(dict)
    for span in spans:
        if span.name != semconv.SPAN_STEP_SUMMARY:
            continue
        summary = parse_summary(span)
        if summary is not None:
            out[str(span.resource.get(semconv.JOB_ID, ""))][summary.step] = summary
    return dict(out)


def post(url: str, request: Request, timeout_s: float = 60.0) -> None:
    """One request; raises unless the Collector accepted it."""
    http = urllib.request.Request(
        url, data=request.body, headers={"Content-Type": request.content_type}, method="POST"
    )
    with urllib.request.urlopen(http, timeout=timeout_s) as response:
        if response.status != 200:
            raise RuntimeError(f"the Collector answered {response.status} to a request")


_DEFAULTS = REPO_ROOT / "src" / "collector" / "internal" / "diagnosis" / "config.go"
_CONSTANTS = REPO_ROOT / "src" / "collector" / "internal" / "diagnosis"


def collector_default(field: str) -> float:
    """A default of the step analysis' config (``FlagK``, ``FlagWindow``, ``ClearSteps``,
    ``MinCostFraction``, ``MinCost`` in seconds, ...), read from ``DefaultConfig`` in its Go
    source, so that no test copies it."""
    text = _DEFAULTS.read_text()
    body = text[text.index("func DefaultConfig()") :]
    match = re.search(
        rf"^\s*{field}:\s*([0-9.]+)(?:\s*\*\s*time\.(Millisecond|Second))?\s*,",
        body,
        re.MULTILINE,
    )
    if match is None:
        raise KeyError(f"{field} is not a plain number in DefaultConfig ({_DEFAULTS})")
    unit = {None: 1.0, "Millisecond": 1e-3, "Second": 1.0}[match.group(2)]
    return float(match.group(1)) * unit


def collector_constant(name: str) -> float:
    """A numeric constant of the step analysis (``warmupSteps``, ...), read from its Go
    sources."""
    for path in sorted(_CONSTANTS.glob("*.go")):
        if path.name.endswith("_test.go"):
            continue
        match = re.search(
            rf"^\s*(?:const\s+)?{name}\s*=\s*([0-9.]+)\s*$", path.read_text(), re.MULTILINE
        )
        if match is not None:
            return float(match.group(1))
    raise KeyError(f"no numeric constant {name} in {_CONSTANTS}")
