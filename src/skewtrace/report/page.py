"""The report page: one self-contained HTML document (inline CSS and SVG, no script, no
external font, image or stylesheet), so it opens from a file on an offline machine.

Order, most useful first: what the job is and what was read; the caller's run info; the
verdict (flagged ranks and fabric suspects after the last analyzed step); the step replayed
(actual against ideal, what fixing each rank, stage, link or kind of work saves, a heatmap;
:mod:`.replay`); the worst step as a waterfall; skew, lateness and step time over the run.

Machine-checkable hooks: ``section#verdicts table.flagged-ranks tr.verdict[data-rank]``
(with ``data-cause``), ``section#waterfall svg.waterfall g.rank-row[data-rank]`` (see
:mod:`.waterfall`), ``[data-malformed-lines]`` on the header.
"""

from __future__ import annotations

import datetime as _dt
import statistics

from skewtrace.report.balance import balance_html
from skewtrace.report.causes import meaning
from skewtrace.report.charts import lateness_chart, skew_chart, step_time_chart
from skewtrace.report.model import (
    Imbalance,
    InfoTable,
    ReportData,
    RunInfo,
    StepSummary,
    Waterfall,
)
from skewtrace.report.replay import replay_html
from skewtrace.report.svg import CLEARED, FLAGGED, FLAGGED_BAND, esc, fmt_ms
from skewtrace.report.waterfall import legend_html, waterfall_svg
from skewtrace.version import __version__

__all__ = ["render_page"]

_DASH = "\u2013"

CSS = f"""
:root {{ --ink:#1f2933; --muted:#6b7785; --line:#e3e7ed; --flag:{FLAGGED};
  --flag-bg:{FLAGGED_BAND}; --ok:{CLEARED}; --card:#f6f8fb; }}
* {{ box-sizing: border-box; }}
body {{ margin: 0; color: var(--ink); background: #fff;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }}
main {{ max-width: 1360px; margin: 0 auto; padding: 20px 20px 40px; }}
h1 {{ font-size: 22px; margin: 0 0 2px; }}
h1 .job {{ font-family: ui-monospace, "DejaVu Sans Mono", monospace; }}
h2 {{ font-size: 17px; margin: 28px 0 6px; padding-top: 14px; border-top: 1px solid var(--line); }}
h3 {{ font-size: 14px; margin: 14px 0 6px; }}
.sub {{ color: var(--muted); margin: 0 0 12px; }}
.facts {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr));
  gap: 8px; margin: 12px 0; }}
.fact {{ background: var(--card); border-radius: 6px; padding: 8px 10px; }}
.fact .k {{ color: var(--muted); font-size: 12px; }}
.fact .v {{ font-size: 19px; font-weight: 600; }}
.fact.bad .v {{ color: var(--flag); }}
.fact.good .v {{ color: var(--ok); }}
.source {{ color: var(--muted); font-size: 12px; }}
.source .warn {{ color: #b26b00; font-weight: 600; }}
.callout {{ border-radius: 6px; padding: 10px 14px; margin: 8px 0 12px; font-size: 15px; }}
.callout.bad {{ background: var(--flag-bg); border-left: 5px solid var(--flag); }}
.callout.good {{ background: #e8f5ec; border-left: 5px solid var(--ok); }}
table {{ border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }}
th, td {{ text-align: left; padding: 5px 12px 5px 0; border-bottom: 1px solid var(--line);
  vertical-align: top; }}
th {{ color: var(--muted); font-weight: 600; font-size: 12px; }}
td.num, th.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
tr.verdict td:first-child {{ color: var(--flag); font-weight: 700; }}
.cause {{ display: inline-block; padding: 0 8px; border-radius: 9px; color: #fff;
  background: var(--flag); font-size: 12px; font-weight: 600; }}
.runinfo {{ background: var(--card); border-radius: 6px; padding: 4px 16px 10px; margin: 12px 0; }}
.runinfo ul {{ margin: 4px 0 8px; padding-left: 20px; }}
.runinfo dl {{ display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px;
  margin: 4px 0; }}
.runinfo dt {{ color: var(--muted); }}
.runinfo dd {{ margin: 0; font-weight: 600; }}
.legend {{ display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 8px 0; font-size: 12px; }}
.legend-item {{ display: inline-flex; align-items: center; gap: 6px; }}
.swatch {{ display: inline-block; width: 18px; height: 11px; border-radius: 2px; }}
.figure {{ overflow-x: auto; margin: 6px 0 4px; }}
.note {{ color: var(--muted); font-size: 12px; margin: 2px 0 8px; }}
svg text {{ font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }}
svg .tick {{ font-size: 11px; fill: var(--muted); }}
svg .axis-title {{ font-size: 12px; fill: var(--muted); }}
svg .chart-title {{ font-size: 14px; font-weight: 600; }}
svg .legend-text {{ font-size: 12px; fill: var(--ink); }}
svg .marker-label {{ font-size: 11px; font-weight: 600; paint-order: stroke;
  stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }}
svg .rank-label {{ font-size: 12.5px; font-weight: 700; fill: var(--ink); }}
svg .rank-row.flagged .rank-label {{ fill: var(--flag); }}
svg .rank-meta {{ font-size: 11px; fill: var(--muted); }}
svg .badge-text {{ font-size: 10.5px; font-weight: 700; }}
svg .row-late {{ font-size: 11.5px; fill: var(--ink); font-variant-numeric: tabular-nums; }}
svg .rank-row.flagged .row-late {{ fill: var(--flag); font-weight: 700; }}
svg .seg:hover {{ stroke: var(--ink); stroke-width: 1; }}
footer {{ margin-top: 30px; color: var(--muted); font-size: 12px; }}
"""


def _fact(key: str, value: str, cls: str = "") -> str:
    return (
        f'<div class="fact {cls}"><div class="k">{esc(key)}</div>'
        f'<div class="v">{esc(value)}</div></div>'
    )


def _ms(seconds: float) -> str:
    return f"{fmt_ms(seconds)} ms"


def _header(data: ReportData) -> str:
    flagged = data.verdicts
    last = data.last_summary
    steps = f"{data.first_step}\u2013{data.last_step}" if data.first_step is not None else "none"
    facts = [
        _fact("ranks", str(len(data.ranks))),
        _fact("hosts", str(len(data.hosts))),
        _fact("switches", str(len(data.switches))),
        _fact("steps seen", f"{data.steps_seen} ({steps})"),
        _fact("steps analysed", str(len(data.summaries))),
        _fact(
            "flagged ranks now",
            ", ".join(str(v.flag.rank) for v in flagged) or "none",
            "bad" if flagged else "good",
        ),
    ]
    if last is not None:
        facts.append(
            _fact(
                "job slowdown (avg)",
                f"{last.slowdown:.2f}\u00d7",
                "bad" if last.slowdown >= 1.05 else "",
            )
        )
    if data.waterfall is not None:
        facts.append(
            _fact("worst step", f"{data.waterfall.step} ({_ms(data.waterfall.duration_s)})")
        )
    malformed = data.malformed_lines
    source = (
        f'<p class="source" data-malformed-lines="{malformed}" '
        f'data-malformed-spans="{data.malformed_spans}" data-spans="{data.spans_read}">'
        f"Read {data.spans_read} spans of this job from <code>{esc(data.source)}</code>; "
        + (
            f'<span class="warn">{malformed} malformed line{"s" if malformed != 1 else ""} '
            "skipped</span>"
            if malformed
            else "0 malformed lines"
        )
        + (
            f'; <span class="warn">{data.malformed_spans} malformed spans skipped</span>'
            if data.malformed_spans
            else ""
        )
        + (f"; {len(data.other_jobs)} other jobs in the file" if data.other_jobs else "")
        + ".</p>"
    )
    hosts = ", ".join(data.hosts[:12]) + (" \u2026" if len(data.hosts) > 12 else "")
    switches = ", ".join(data.switches[:12]) + (" \u2026" if len(data.switches) > 12 else "")
    return (
        f'<header><h1>skewtrace report \u00b7 job <span class="job">{esc(data.job_id)}</span>'
        f'</h1><p class="sub">Hosts: {esc(hosts)} \u00b7 switches: {esc(switches)}</p>'
        f'<div class="facts">{"".join(facts)}</div>{source}</header>'
    )


def _info_table(table: InfoTable) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in table.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in table.rows
    )
    return f"<h3>{esc(table.title)}</h3><table><tr>{head}</tr>{rows}</table>"


def _run_info(info: RunInfo | None) -> str:
    if info is None or info.empty():
        return ""
    parts = [f'<section id="run-info" class="runinfo"><h2 style="border:0">{esc(info.title)}</h2>']
    for heading, items in (("Injected", info.injected), ("Concluded", info.concluded)):
        if items:
            parts.append(
                f"<h3>{heading}</h3><ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"
            )
    if info.figures:
        parts.append(
            "<dl>"
            + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in info.figures)
            + "</dl>"
        )
    parts.extend(_info_table(t) for t in info.tables)
    parts.extend(f'<p class="note">{esc(n)}</p>' for n in info.notes)
    parts.append("</section>")
    return "".join(parts)


def _since(first: int, since: int) -> str:
    return str(first) if first == since else f"{first} (again since {since})"


def _worker(data: ReportData, rank: int) -> str:
    """``: stage 1, replica 1, GPUs 40-47`` after a rank that stands for an imported worker."""
    info = data.ranks.get(rank)
    return f": {esc(info.worker)}" if info is not None and info.worker else ""


def _verdicts(data: ReportData) -> str:
    parts = ['<section id="verdicts"><h2>Verdict</h2>']
    last = data.last_summary
    if last is None:
        parts.append(
            '<p class="callout">No step summary in the file: the Collector\'s barrierskew '
            "processor analyses steps and writes <code>train.step.summary</code> spans; "
            "without them there is no verdict (the charts below still show skew and "
            "lateness).</p></section>"
        )
        return "".join(parts)
    if data.verdicts:
        lead = data.verdicts[0].flag
        others = len(data.verdicts) - 1
        parts.append(
            f'<p class="callout bad"><b>Rank {lead.rank}</b>{_worker(data, lead.rank)} '
            f"({esc(lead.host)} \u00b7 "
            f"{esc(lead.switch)} \u00b7 {esc(lead.nic)}) is a straggler: cause "
            f"<b>{esc(lead.cause)}</b> ({esc(meaning(lead.cause, lead.before))}), costing "
            f"about <b>{_ms(lead.cost_s)}</b> per step, "
            f"flagged since step {data.verdicts[0].since_step}"
            + (f"; and {others} more rank{'s' if others > 1 else ''} below" if others else "")
            + f". After step {last.step}.</p>"
        )
    else:
        parts.append(
            f'<p class="callout good">No rank is flagged after step {last.step}'
            + (", and no part of the fabric is suspected." if not data.suspects else ".")
            + "</p>"
        )
    parts.append(f"<h3>Flagged ranks after step {last.step}</h3>")
    if data.verdicts:
        parts.append(
            '<table class="flagged-ranks"><tr><th>rank</th><th>host</th><th>switch</th>'
            '<th>NIC</th><th>cause</th><th class="num">cost per step</th><th>domain</th>'
            '<th class="num">first flagged at step</th></tr>'
        )
        for v in data.verdicts:
            f = v.flag
            parts.append(
                f'<tr class="verdict" data-rank="{f.rank}" data-cause="{esc(f.cause)}">'
                f"<td>rank {f.rank}{_worker(data, f.rank)}</td><td>{esc(f.host)}</td>"
                f"<td>{esc(f.switch)}</td>"
                f'<td>{esc(f.nic)}</td><td><span class="cause" '
                f'title="{esc(meaning(f.cause, f.before))}">{esc(f.cause)}</span></td>'
                f'<td class="num">{_ms(f.cost_s)}</td><td>{esc(f.domain) or _DASH}</td>'
                f'<td class="num">{_since(v.first_step, v.since_step)}</td></tr>'
            )
        parts.append("</table>")
        parts.append(
            '<p class="note">Cost per step: the moving average of what the rank\'s own work '
            "added to the step time (the step replayed with that rank at its peers' median). "
            "Domain: the fabric suspect the rank belongs to.</p>"
        )
    else:
        parts.append('<p class="note">none</p>')
    parts.append(_imbalances_html(last))
    parts.append(f"<h3>Fabric suspects after step {last.step}</h3>")
    if data.suspects:
        parts.append(
            '<table class="fabric-suspects"><tr><th>kind</th><th>name</th><th>host</th>'
            '<th class="num">cost per step</th><th>how</th>'
            '<th class="num">first suspected at step</th></tr>'
        )
        for sv in data.suspects:
            s = sv.suspect
            how = "flagged ranks share it" if s.derived else "located by slow transfers"
            parts.append(
                f'<tr class="suspect" data-suspect="{esc(s.key)}"><td>{esc(s.kind)}</td>'
                f"<td>{esc(s.name)}</td><td>{esc(s.host) or _DASH}</td>"
                f'<td class="num">{_ms(s.cost_s)}</td><td>{how}</td>'
                f'<td class="num">{_since(sv.first_step, sv.since_step)}</td></tr>'
            )
        parts.append("</table>")
    else:
        parts.append('<p class="note">none</p>')
    parts.append("</section>")
    return "".join(parts)


def _imbalances_html(last: StepSummary) -> str:
    """The job's flagged imbalances after the last step: a pipeline stage longer than the
    mean stage, or work split unevenly across data-parallel replicas, with the fix."""
    parts = [f"<h3>Imbalances after step {last.step}</h3>"]
    if not last.imbalances:
        parts.append('<p class="note">none</p>')
        return "".join(parts)
    parts.append(
        '<table class="imbalances"><tr><th>cause</th><th>stage</th><th>ranks</th>'
        '<th class="num">excess</th><th class="num">cost per step</th><th>fix</th></tr>'
    )
    for im in last.imbalances:
        stage = _DASH if im.stage is None else str(im.stage)
        parts.append(
            f'<tr class="imbalance" data-cause="{esc(im.cause)}"><td>{esc(im.cause)}</td>'
            f"<td>{stage}</td><td>{esc(im.ranks) or _DASH}</td>"
            f'<td class="num">{100 * im.excess:.0f}%</td><td class="num">{_ms(im.cost_s)}</td>'
            f"<td>{esc(im.fix)}{_partition_html(im)}</td></tr>"
        )
    parts.append("</table>")
    parts.append(
        '<p class="note">Cost per step: the moving average of how much shorter the replayed '
        "step is with the work balanced (stages at the mean stage, or each global batch split "
        "evenly over the replicas). Pacing cannot level an imbalance; repartitioning or "
        "rebalancing the batch can.</p>"
    )
    return "".join(parts)


def _partition_html(im: Imbalance) -> str:
    """The advised partition beside a stage's fix (``skewtrace advise`` prints it whole)."""
    p = im.partition
    if p is None:
        return ""
    layers = "/".join(map(str, p.layers))
    points = ",".join(map(str, p.split_points))
    return (
        f'<div class="partition">advised: {esc(layers)} layers per stage (now '
        f"{esc('/'.join(map(str, p.current)))}), <code>--split-points {esc(points)}</code>, "
        f"slowest stage {_ms(max(p.before_s))} &rarr; {_ms(max(p.after_s))}, saves "
        f"{_ms(p.saving_s)} per step</div>"
    )


def _waterfall(data: ReportData) -> str:
    wf = data.waterfall
    parts = ['<section id="waterfall">']
    if wf is None:
        parts.append(
            '<h2>Worst step</h2><p class="note">No step with rank spans in the file.</p></section>'
        )
        return "".join(parts)
    why = {
        "summary": f"the largest training.step.duration among {len(data.summaries)} analysed "
        "steps (the analysis' step time, free of host clocks)",
        "root": "the longest train.step.root (no step summaries in the file)",
        "rank": "the longest train.step of any rank (no step summaries in the file)",
        "requested": "the step asked for",
    }[wf.chosen_by]
    parts.append(f"<h2>Worst step: step {wf.step} \u00b7 {_ms(wf.duration_s)}</h2>")
    parts.append(f'<p class="sub">Chosen as {esc(why)}.</p>')
    summary = data.summaries.get(wf.step)
    if summary is not None and (
        summary.root_causes or summary.link_causes or summary.imbalance_causes
    ):
        causes = (
            [f"rank {c.rank} ({esc(c.cause)}, {_ms(c.cost_s)})" for c in summary.root_causes]
            + [f"{esc(c.key)} ({_ms(c.cost_s)})" for c in summary.link_causes]
            + [
                f"{esc(c.cause)}{'' if c.stage is None else f' of stage {c.stage}'} "
                f"({_ms(c.cost_s)})"
                for c in summary.imbalance_causes
            ]
        )
        parts.append(
            f"<p>Root causes of this step: {', '.join(causes)}; what-if step time "
            f"{_ms(summary.whatif_s)}.</p>"
        )
    elif summary is not None:
        parts.append("<p>No root cause in this step.</p>")
    parts.append(_alignment_note(wf))
    kinds = {seg.kind for row in wf.rows for seg in row.segments}
    parts.append(legend_html(kinds))
    causes_by_rank = {v.flag.rank: v.flag.cause for v in data.verdicts}
    parts.append(f'<div class="figure">{waterfall_svg(wf, causes_by_rank)}</div>')
    if wf.hidden_ranks:
        parts.append(
            f'<p class="note">{wf.hidden_ranks} more ranks of this step are not drawn '
            f"(at most {len(wf.rows)} rows: flagged ranks and root causes first).</p>"
        )
    parts.append(
        '<p class="note">Top lane: the rank\'s own work; bottom lane: its collectives, pale '
        "while it waited for the group's last member, dark for the transfer after it. "
        "Right: the rank's lateness in this step (summed over its collectives). Hover a bar "
        "for its times.</p></section>"
    )
    return "".join(parts)


def _alignment_note(wf: Waterfall) -> str:
    offsets = [abs(r.clock_offset_s) for r in wf.rows if r.clock_offset_s is not None]
    if not offsets:
        return (
            '<p class="note">Host clocks not aligned: no collective of this step carries '
            "training.clock.offset (raw timestamps shown).</p>"
        )
    text = (
        f"Host clocks aligned from the collectives' training.clock.offset: median "
        f"|offset| {_ms(statistics.median(offsets))}, largest {_ms(max(offsets))}"
    )
    if wf.unaligned_ranks:
        text += f"; {wf.unaligned_ranks} ranks without an annotated collective left as stamped"
    return f'<p class="note">{esc(text)}.</p>'


def _charts(data: ReportData) -> str:
    flagged = {v.flag.rank for v in data.verdicts}
    earlier = {f.rank for s in data.summaries.values() for f in s.flags}
    parts = ['<section id="over-time"><h2>Over the run</h2>']
    parts.append(
        '<p class="sub">Markers: <span style="color:var(--flag)">\u25b2 flagged</span> and '
        '<span style="color:var(--ok)">\u25bc cleared</span> after the step they point at.</p>'
    )
    parts.append(f'<div class="figure">{skew_chart(data.series, data.changes)}</div>')
    parts.append(
        '<div class="figure">'
        + lateness_chart(data.series, flagged, earlier - flagged, data.changes)
        + "</div>"
    )
    if data.series.step_duration_s:
        parts.append(f'<div class="figure">{step_time_chart(data.series, data.changes)}</div>')
    parts.append("</section>")
    return "".join(parts)


def render_page(data: ReportData, *, generated_at: _dt.datetime | None = None) -> str:
    """The whole HTML document."""
    when = (generated_at or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%d %H:%M:%S %Z")
    body = "".join(
        [
            _header(data),
            _run_info(data.run_info),
            _verdicts(data),
            replay_html(data),
            balance_html(data),
            _waterfall(data),
            _charts(data),
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>skewtrace report \u00b7 {esc(data.job_id)}</title>"
        f'<style>{CSS}</style></head><body><main data-job="{esc(data.job_id)}">'
        f"{body}"
        f"<footer>Generated by skewtrace {esc(__version__)} at {esc(when)} from the "
        "Collector's file export. Verdicts are the barrierskew processor's step summaries "
        "(docs/architecture.md, 'The step analysis').</footer>"
        "</main></body></html>\n"
    )
