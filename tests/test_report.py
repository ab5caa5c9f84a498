"""The HTML report (skewtrace.report).

Unit tests run on synthetic file-exporter output (tests/report_fixtures.py): clock
alignment, the choice of the worst step, malformed lines, errors, the CLI, the page's
structure. The end-to-end test runs scenarios through the real otelcol-skewtrace with the
file exporter, builds the report from the Collector's own file and renders it in headless
Chromium: the DOM has one waterfall row per rank, exactly the expected straggler's row is
flagged, the verdict table names it with its cause, and the screenshot is not blank and
shows the flagged colour.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

import needs
from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess
from prometheus_harness import find_binary
from report_fixtures import MS, SyntheticJob, line
from skewtrace import semconv
from skewtrace.cli import main
from skewtrace.report import (
    InfoTable,
    ReportError,
    RunInfo,
    build_report,
    choose_worst_step,
    collect,
    write_report,
)
from skewtrace.report.align import estimate_offsets
from skewtrace.report.spans import SpanFileReader
from skewtrace.report.svg import FLAGGED

# -- reading the page back ---------------------------------------------------------------------


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text (for simple checks)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_page(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


def with_class(page: _Elements, tag: str, cls: str) -> list[dict[str, str]]:
    return [a for t, a in page.elements if t == tag and cls in a.get("class", "").split()]


def rank_rows(page: _Elements) -> list[dict[str, str]]:
    return with_class(page, "g", "rank-row")


# -- clock alignment ---------------------------------------------------------------------------


def _observations(clocks: dict[int, float], groups: dict[str, tuple[int, ...]]):
    """(key, rank, training.clock.offset) as the collector computes it: the member's end
    timestamp minus the members' median end timestamp, for collectives that truly end at 0."""
    out = []
    for pg, members in groups.items():
        median = statistics.median(clocks[m] for m in members)
        out += [(pg, m, clocks[m] - median) for m in members]
    return out


def test_clock_alignment_recovers_host_clocks() -> None:
    # Groups of different membership: each collective's offsets are relative to its own
    # members' median clock, so a rank's median offset mixes references; the walk does not.
    clocks = {0: 0.0, 1: 0.0, 2: 2.0, 3: 2.0, 4: -1.3, 5: 0.4}
    groups = {
        "tp0": (0, 1),
        "tp1": (2, 3),
        "dp0": (0, 2, 4),
        "dp1": (1, 3, 5),
        "world": (0, 1, 2, 3, 4, 5),
    }
    obs = _observations(clocks, groups)
    offsets = estimate_offsets(obs)
    assert set(offsets) == set(clocks)
    shift = offsets[0] - clocks[0]
    for r, clock in clocks.items():
        assert offsets[r] - shift == pytest.approx(clock, abs=1e-9), r
    # The naive estimate (median of a rank's offsets) is off by a lot here.
    naive = {r: statistics.median(o for _, m, o in obs if m == r) for r in clocks}
    errors = [abs((naive[r] - naive[0]) - (clocks[r] - clocks[0])) for r in clocks]
    assert max(errors) > 0.1
    # Anchored where the world group puts it: relative to the median rank's clock.
    world_median = statistics.median(clocks.values())
    assert shift == pytest.approx(-world_median, abs=1e-9)


def test_clock_alignment_fills_ranks_of_the_same_host_only() -> None:
    obs = _observations({0: 0.5, 1: -0.5}, {"world": (0, 1)})
    hosts = {0: "a", 1: "b", 2: "a", 3: "unknown", 4: "unknown"}
    offsets = estimate_offsets([*obs, ("solo", 4, 0.0)], hosts)
    assert offsets[2] == offsets[0]  # same host, same clock
    assert 3 not in offsets  # "unknown" is not one host
    assert offsets[0] - offsets[1] == pytest.approx(1.0)


def test_waterfall_is_drawn_on_aligned_clocks(tmp_path: Path) -> None:
    job = SyntheticJob(clock={"h0": 1.5, "h1": -0.7})
    path = job.write(tmp_path / "spans.jsonl")
    data = collect(path)
    wf = data.waterfall
    assert wf is not None and wf.unaligned_ranks == 0
    assert {row.info.rank for row in wf.rows} == {0, 1, 2, 3}
    # Every member of a collective ends at the same true time: the same x in the waterfall.
    ends: dict[str, list[float]] = {}
    for row in wf.rows:
        for seg in row.segments:
            if seg.kind == "collective":
                pg = re.search(r"pg=(\S+)", seg.label)
                assert pg
                ends.setdefault(pg[1], []).append(seg.end_s)
    assert set(ends) == {"pair0", "pair1", "default"}
    for pg, values in ends.items():
        assert max(values) - min(values) < 1e-6, (pg, values)
    # And the rank's own work sits where it truly was, against the other ranks'.
    forward = {
        row.info.rank: next(s.start_s for s in row.segments if s.kind == "forward")
        for row in wf.rows
    }
    truth = {r: job.truth[(r, wf.step, semconv.SPAN_FORWARD)][0] for r in range(4)}
    for r in range(1, 4):
        assert forward[r] - forward[0] == pytest.approx(truth[r] - truth[0], abs=1e-6)
    # The wait part of a collective: from its start to start + training.barrier.wait.
    straggler = next(row for row in wf.rows if row.info.rank == job.straggler)
    partner = next(row for row in wf.rows if row.info.rank == 0)  # pair0 = (0, 2)
    waits = [s for s in partner.segments if s.kind == "wait" and "pair0" in s.label]
    assert len(waits) == 1
    assert waits[0].end_s - waits[0].start_s == pytest.approx(job.straggler_extra_s, abs=1e-6)
    assert not [s for s in straggler.segments if s.kind == "wait" and "pair0" in s.label]


# -- the worst step ----------------------------------------------------------------------------


def test_worst_step_choice() -> None:
    assert choose_worst_step({1: 0.1, 2: 0.3, 3: 0.3}, {5: 9.0}, {6: 9.0}) == (2, 0.3, "summary")
    assert choose_worst_step({}, {5: 0.2, 6: 0.4}, {7: 9.0}) == (6, 0.4, "root")
    assert choose_worst_step({}, {}, {7: 0.5, 8: 0.1}) == (7, 0.5, "rank")
    assert choose_worst_step({}, {}, {}) is None
    # A summary of a step with no rank spans in the file loses to one that has them.
    assert choose_worst_step({1: 0.1, 2: 0.9}, seen={1}) == (1, 0.1, "summary")


def test_worst_step_is_the_longest_analyzed_step(tmp_path: Path) -> None:
    path = SyntheticJob(slow_step=4).write(tmp_path / "spans.jsonl")
    data = collect(path)
    assert data.waterfall is not None
    assert (data.waterfall.step, data.waterfall.chosen_by) == (4, "summary")
    # Without summaries, the longest train.step decides.
    bare = tmp_path / "bare.jsonl"
    bare.write_text(
        "".join(
            ln + "\n"
            for ln in SyntheticJob(slow_step=3, job="bare").lines()
            if semconv.SPAN_STEP_SUMMARY not in ln
        )
    )
    data = collect(bare)
    assert data.waterfall is not None
    assert (data.waterfall.step, data.waterfall.chosen_by) == (3, "rank")
    assert data.last_summary is None and not data.verdicts
    # A step can be asked for.
    data = collect(path, step=1)
    assert data.waterfall is not None and (data.waterfall.step, data.waterfall.chosen_by) == (
        1,
        "requested",
    )
    with pytest.raises(ReportError, match="no rank spans of step 99"):
        collect(path, step=99)


# -- verdicts, flags over time -----------------------------------------------------------------


def test_verdict_is_the_last_summary_with_first_flag_step(tmp_path: Path) -> None:
    job = SyntheticJob(steps=8, onset=2, flag_after=3)
    data = collect(job.write(tmp_path / "spans.jsonl"))
    assert data.flagged == {2: semconv.CAUSE_COMPUTE}
    (verdict,) = data.verdicts
    assert (verdict.first_step, verdict.since_step) == (4, 4)
    assert verdict.flag.cost_s == pytest.approx(job.straggler_extra_s)
    assert [(c.step, c.what, c.kind) for c in data.changes] == [(4, "rank 2", "set")]
    # Lateness per rank and step, summed over its collectives: the straggler is late to its
    # pair and (with its partner, who waited for it) to the world group.
    extra = job.straggler_extra_s
    assert data.series.lateness_s[2][5] == pytest.approx(2 * extra, abs=1e-6)
    assert data.series.lateness_s[0][5] == pytest.approx(extra, abs=1e-6)
    assert data.series.lateness_s[1][5] == pytest.approx(0.0, abs=1e-6)
    assert data.series.skew_max_s[5] == pytest.approx(job.straggler_extra_s, abs=1e-6)


# -- malformed input and errors ----------------------------------------------------------------


def test_a_summarys_naming_bar_reads_zero_where_it_is_not_a_duration() -> None:
    """``training.step.min_saving`` is read as seconds; a string, a bool, a negative or a
    non-finite value (a forged or damaged summary) reads as 0 (not said), never as a bar."""
    from collector_harness import FileSpan
    from skewtrace.report.collect import parse_summary

    def bar(value: object) -> float:
        attrs = {semconv.STEP: 3, semconv.STEP_MIN_SAVING: value}
        summary = parse_summary(FileSpan(semconv.SPAN_STEP_SUMMARY, "t", "s", 0, 1, attrs, {}))
        assert summary is not None
        return summary.min_saving_s

    assert bar(0.021) == 0.021
    for forged in ("0.5", True, -0.1, float("nan"), float("inf"), None):
        assert bar(forged) == 0.0, forged


def test_malformed_lines_are_counted_skipped_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    job = SyntheticJob()
    nameless = line(job.resource(0), [{"traceId": "ab", "startTimeUnixNano": "1"}])
    SyntheticJob().write(
        path,
        extra_lines=[
            "this is not json",
            "{}",  # no resourceSpans
            "[1, 2]",
            '{"resourceSpans": "nope"}',
            nameless,  # a good line with a bad span: a malformed span
            "",
        ],
    )
    with open(path, "a") as f:
        f.write('{"resourceSpans": [{"resource"')  # cut short, no newline
    html, stats = build_report(path)
    assert stats.malformed_lines == 5
    assert stats.malformed_spans == 1
    assert stats.flagged == {2: semconv.CAUSE_COMPUTE}
    page = parse_page(html)
    (source,) = [a for _, a in page.elements if "data-malformed-lines" in a]
    assert source["data-malformed-lines"] == "5"
    assert "5 malformed lines skipped" in "".join(page.text)
    # A reader following a live file leaves the unterminated line for later.
    live = SpanFileReader(path)
    assert sum(1 for _ in live) == stats.spans_read
    assert live.stats.unterminated_tail and live.stats.malformed_lines == 4


def test_missing_empty_and_wrong_job_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such file"):
        collect(tmp_path / "absent.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ReportError, match="empty"):
        collect(empty)
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("nope\n{}\n")
    with pytest.raises(ReportError, match="2 malformed lines"):
        collect(garbage)
    two = tmp_path / "two.jsonl"
    SyntheticJob(job="job-a").write(two)
    SyntheticJob(job="job-b", straggler=1).write(two)
    with pytest.raises(ReportError, match=r"2 jobs \('job-a', 'job-b'\).*--job"):
        collect(two)
    with pytest.raises(ReportError, match=r"none of job 'job-c'; jobs in it: 'job-a', 'job-b'"):
        collect(two, job_id="job-c")
    data = collect(two, job_id="job-b")
    assert data.job_id == "job-b" and data.flagged == {1: semconv.CAUSE_COMPUTE}


# -- the page ----------------------------------------------------------------------------------


def test_flagged_row_is_marked_and_no_other(tmp_path: Path) -> None:
    html, stats = build_report(SyntheticJob().write(tmp_path / "spans.jsonl"))
    page = parse_page(html)
    rows = rank_rows(page)
    assert [r["data-rank"] for r in rows] == ["0", "1", "2", "3"]
    flagged = [r for r in rows if r["data-flagged"] == "true"]
    assert [r["data-rank"] for r in flagged] == ["2"]
    assert "flagged" in flagged[0]["class"].split()
    assert all("flagged" not in r["class"].split() for r in rows if r["data-rank"] != "2")
    (verdict,) = with_class(page, "tr", "verdict")
    assert (verdict["data-rank"], verdict["data-cause"]) == ("2", "compute")
    assert stats.worst_step == 4 and stats.ranks == 4 and stats.hosts == 2


def test_page_is_self_contained_and_escaped(tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script>'
    job = SyntheticJob(job=hostile, hosts=(hostile, hostile, "h1", "h1"))
    job.switches = {hostile: "s0", "h1": "s1"}
    job.clock = {hostile: 0.2, "h1": -0.1}
    html, _ = build_report(job.write(tmp_path / "spans.jsonl"))
    assert "<script" not in html.lower()
    assert "&lt;script&gt;" in html
    # Nothing fetched from elsewhere: no scripts, links, images, fonts or imports.
    for pattern in (r"<link\b", r"<img\b", r"\bsrc\s*=", r"@import", r"url\(", r"@font-face"):
        assert not re.search(pattern, html, re.I), pattern
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}


def test_run_info_block(tmp_path: Path) -> None:
    info = RunInfo(
        injected=["rank 2: +20 ms compute from step 2"],
        concluded=["rank 2 flagged (compute) after step 4"],
        figures=[("steps to conclude", "3"), ("seconds to conclude", "1.4")],
        tables=[
            InfoTable(
                "Pacing",
                ["pacing", "CV", "throughput"],
                [["off", "0.21", "100%"], ["on", "0.09", "108%"]],
            )
        ],
        notes=["emulated leaf/spine fabric"],
    )
    html, _ = build_report(SyntheticJob().write(tmp_path / "spans.jsonl"), run_info=info)
    text = " ".join(parse_page(html).text)
    for expected in (
        "rank 2: +20 ms compute from step 2",
        "rank 2 flagged (compute) after step 4",
        "steps to conclude",
        "1.4",
        "throughput",
        "108%",
        "emulated leaf/spine fabric",
    ):
        assert expected in text, expected
    with pytest.raises(ValueError, match=r"figures\[0\]"):
        RunInfo(figures=[("only a key",)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"rows\[0\] has 1 cells"):
        InfoTable("t", ["a", "b"], [["x"]])


def test_write_report_returns_stats(tmp_path: Path) -> None:
    out = tmp_path / "out" / "report.html"
    stats = write_report(SyntheticJob().write(tmp_path / "spans.jsonl"), out, job_id=None)
    assert stats.out_path == out and out.stat().st_size == stats.html_bytes
    assert stats.job_id == "synthetic" and stats.steps_analyzed == stats.steps_seen == 6
    assert stats.flagged == {2: "compute"} and stats.suspects == []
    assert stats.worst_step == 4 and stats.worst_step_duration_s and stats.malformed_lines == 0


# -- the CLI -----------------------------------------------------------------------------------


def test_cli_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spans = SyntheticJob().write(tmp_path / "spans.jsonl")
    out = tmp_path / "report.html"
    assert main(["report", str(spans), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "flagged: rank 2 (compute)" in printed
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(spans), "--job", "synthetic", "--step", "1", "-o", str(out)]) == 0
    assert 'data-step="1"' in out.read_text()

    assert main(["report", str(tmp_path / "absent.jsonl"), "-o", str(out)]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["report", str(spans), "--job", "other", "-o", str(out)]) == 1
    assert "none of job 'other'" in capsys.readouterr().err
    with open(spans, "a") as f:
        f.write("garbage\n")
    assert main(["report", str(spans), "-o", str(out)]) == 0
    assert "skipped 1 malformed lines" in capsys.readouterr().err


# -- a big file --------------------------------------------------------------------------------


_MEASURE = """
import json, sys, time
from skewtrace.report import build_report

def hwm_kib():  # VmHWM: this process's peak resident set (ru_maxrss carries the parent's)
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))

base = hwm_kib()
started = time.perf_counter()
html, stats = build_report(sys.argv[1])
elapsed = time.perf_counter() - started
print(json.dumps({"spans": stats.spans_read, "worst": stats.worst_step, "flagged": stats.flagged,
                  "growth_kib": hwm_kib() - base, "seconds": elapsed, "html": len(html)}))
"""


@pytest.mark.slow
def test_large_file_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    """About 100k spans (32 ranks, 450 steps), in a fresh process: the peak resident memory
    grows by a fraction of the file (it is streamed twice, never read whole)."""
    ranks = 32
    hosts = tuple(f"n{r // 4}" for r in range(ranks))
    job = SyntheticJob(
        job="big",
        hosts=hosts,
        switches={h: f"leaf{int(h[1:]) // 2}" for h in hosts},
        clock={h: 0.01 * i for i, h in enumerate(dict.fromkeys(hosts))},
        groups=[(f"tp{g}", tuple(range(g * 4, g * 4 + 4)), 2 * MS) for g in range(ranks // 4)]
        + [("default", tuple(range(ranks)), 4 * MS)],
        steps=450,
        straggler=13,
        onset=100,
        slow_step=300,
    )
    if not Path("/proc/self/status").is_file():
        pytest.skip("needs /proc/self/status (Linux) to read the peak resident memory")
    path = job.write(tmp_path / "big.jsonl")
    size_mib = path.stat().st_size / 2**20
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    growth_mib = got["growth_kib"] / 1024
    print(
        f"report of {got['spans']} spans ({size_mib:.0f} MiB file): {got['seconds']:.1f} s, "
        f"peak RSS growth {growth_mib:.1f} MiB (target: under a third of the file, "
        f"{size_mib / 3:.0f} MiB)"
    )
    assert got["spans"] >= 100_000
    assert got["worst"] == 300 and got["flagged"] == {"13": "compute"}
    assert growth_mib < size_mib / 3
    assert got["html"] < 2_000_000


# -- end to end: the real collector, headless Chromium -----------------------------------------


def _chromium() -> str:
    found = find_binary("chromium") or find_binary("chromium-browser")
    if found is None:
        needs.unavailable("chromium is not installed (apt-get install chromium)")
    return found


def _run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{cmd}\n{result.stderr[-3000:]}"
    return result


def png_rows(path: Path) -> Iterator[bytes]:
    """The rows of an 8-bit RGB(A) non-interlaced PNG, as bytes of RGB triples."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]
        pos += 12 + size
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    assert header is not None
    width, height, depth, color_type, _, _, interlace = header
    assert depth == 8 and color_type in (2, 6) and interlace == 0, header
    bpp = 3 if color_type == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    for y in range(height):
        base = y * (stride + 1)
        kind, row = raw[base], bytearray(raw[base + 1 : base + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 0xFF
        elif kind == 2:
            for i in range(stride):
                row[i] = (row[i] + prev[i]) & 0xFF
        elif kind == 3:
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                row[i] = (row[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                row[i] = (row[i] + pred) & 0xFF
        prev = row
        if bpp == 3:
            yield bytes(row)
        else:
            yield bytes(b for i, b in enumerate(row) if i % 4 != 3)


def _rgb(hex_color: str) -> bytes:
    return bytes.fromhex(hex_color.lstrip("#"))


def screenshot_colors(path: Path, wanted: bytes) -> tuple[int, bool]:
    """(distinct colours seen, whether ``wanted`` was seen), reading rows until both a
    varied picture and the wanted colour were found (the whole image when not)."""
    seen: set[bytes] = set()
    for row in png_rows(path):
        for i in range(0, len(row), 3):
            seen.add(row[i : i + 3])
        if wanted in seen and len(seen) > 50:
            break
    return len(seen), wanted in seen


@pytest.fixture(scope="module")
def collector_file(otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """compute-2d and nic-3x-2d (two jobs) through the real collector's file exporter."""
    from scenario_gen import SCENARIOS
    from scenario_run import run_scenarios

    workdir = tmp_path_factory.mktemp("report-e2e")
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], workdir) as col:
        outcomes = run_scenarios(col, [SCENARIOS["compute-2d"], SCENARIOS["nic-3x-2d"]])
    assert outcomes["compute-2d"].last().flagged == {11: semconv.CAUSE_COMPUTE}
    return col.file_export_path


@pytest.mark.slow
@pytest.mark.collector
def test_report_from_the_collector_in_chromium(collector_file: Path, tmp_path: Path) -> None:
    chromium = _chromium()
    with pytest.raises(ReportError, match="2 jobs"):
        collect(collector_file)
    out = tmp_path / "report.html"
    stats = write_report(collector_file, out, job_id="scn-compute-2d")
    assert stats.flagged == {11: semconv.CAUSE_COMPUTE}
    assert stats.ranks == 16 and stats.malformed_lines == 0

    dom = _run_chromium(chromium, tmp_path / "profile", "--dump-dom", out.as_uri()).stdout
    page = parse_page(dom)
    (svg,) = with_class(page, "svg", "waterfall")
    assert svg["data-step"] == str(stats.worst_step)
    rows = rank_rows(page)
    assert sorted(int(r["data-rank"]) for r in rows) == list(range(16))
    flagged = [r for r in rows if r["data-flagged"] == "true" or "flagged" in r["class"].split()]
    assert [r["data-rank"] for r in flagged] == ["11"]
    assert (flagged[0]["data-host"], flagged[0]["data-switch"]) == ("node5", "leaf2")
    assert len(with_class(page, "rect", "seg-forward")) == 16
    assert with_class(page, "rect", "seg-wait"), "no barrier wait drawn"
    (verdict,) = with_class(page, "tr", "verdict")
    assert (verdict["data-rank"], verdict["data-cause"]) == ("11", "compute")
    assert with_class(page, "g", "flag-marker"), "no flag marker on the charts"
    # The step replayed: fixing rank 11 alone saves the most of any rank, and its work is
    # the kind of work to fix; the heatmap's row of rank 11 costs in most analyzed steps.
    savings = with_class(page, "tr", "saving")
    ranks = [r["data-what"] for r in savings if r["data-kind"] == "rank"]
    work = [r["data-what"] for r in savings if r["data-kind"] == "work"]
    assert ranks[:1] == ["rank 11"] and work[:1] == [semconv.ATTRIBUTION_COMPUTE], savings
    assert [g for g in with_class(page, "g", "heat-row") if g["data-what"] == "rank 11"]
    cells = [r for r in with_class(page, "rect", "heat") if r["data-what"] == "rank 11"]
    assert len(cells) >= stats.steps_analyzed // 2, (len(cells), stats.steps_analyzed)

    png = tmp_path / "report.png"
    _run_chromium(
        chromium,
        tmp_path / "profile",
        f"--screenshot={png}",
        "--window-size=1400,2000",
        out.as_uri(),
    )
    assert png.is_file() and png.stat().st_size > 10_000
    colors, has_flagged = screenshot_colors(png, _rgb(FLAGGED))
    assert colors > 50, f"the screenshot is nearly blank ({colors} colours)"
    assert has_flagged, f"the flagged colour {FLAGGED} is not in the screenshot"


@pytest.mark.slow
@pytest.mark.collector
def test_report_names_a_slow_nic(collector_file: Path) -> None:
    html, stats = build_report(collector_file, job_id="scn-nic-3x-2d")
    assert stats.flagged == {6: semconv.CAUSE_NETWORK, 7: semconv.CAUSE_NETWORK}
    assert stats.suspects == ["nic:node3/eth0"]
    page = parse_page(html)
    assert sorted(r["data-rank"] for r in rank_rows(page) if r["data-flagged"] == "true") == [
        "6",
        "7",
    ]
    (suspect,) = with_class(page, "tr", "suspect")
    assert suspect["data-suspect"] == "nic:node3/eth0"
    # The step replayed: the NIC is the link to fix, and the collectives' transfers (the
    # all-reduces crossing it) the kind of work.
    savings = with_class(page, "tr", "saving")
    assert "nic:node3/eth0" in [r["data-what"] for r in savings if r["data-kind"] == "link"]
    work = [r["data-what"] for r in savings if r["data-kind"] == "work"]
    assert work[:1] == [semconv.OP_ALL_REDUCE], savings
