"""The report's replay section: the step as it ran against the step replayed with every root
cause at its reference, what fixing each rank, stage, link or kind of work alone would save
over the run, and a heatmap of the ranks and stages that cost steps (the what-if analysis'
S_w, S_stage and S_t, from the step summaries' root causes and ``training.attribution``
events).

Machine-checkable hooks: ``section#replay table.savings tr.saving[data-what][data-kind]``,
``section#replay svg.heatmap g.heat-row[data-what]`` with one ``rect.heat[data-what]
[data-step]`` per step the row cost something in.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from skewtrace import semconv
from skewtrace.report.model import ReportData, StepSummary
from skewtrace.report.svg import FLAGGED, GRID, INK, MUTED, esc, fmt_ms, num

__all__ = ["replay_html"]

# Rows of the savings table and the heatmap.
_MAX_SAVINGS = 16
_MAX_HEAT_ROWS = 24
# The heatmap shows the latest steps at most.
_MAX_HEAT_STEPS = 240


def _contributors(summary: StepSummary) -> dict[tuple[str, str], float]:
    """(kind, what) -> seconds fixing it alone saves in one step: each root-cause rank, link,
    imbalanced stage or data, and each kind of work."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for rc in summary.root_causes:
        out["rank", f"rank {rc.rank}"] += rc.cost_s
    for link in summary.link_causes:
        out["link", link.key] += link.cost_s
    for im in summary.imbalance_causes:
        if im.cause == semconv.CAUSE_STAGE_IMBALANCE:
            out["stage", f"stage {im.stage}"] += im.cost_s
        else:
            out["data", "data (per-step imbalance)"] += im.cost_s
    for kind, saves in summary.attribution.items():
        out["work", kind] += saves
    return out


def replay_html(data: ReportData) -> str:
    """The section, or "" without analyzed steps."""
    summaries = [s for _, s in sorted(data.summaries.items()) if s.whatif_s > 0]
    if not summaries:
        return ""
    actual = statistics.fmean(s.duration_s for s in summaries)
    ideal = statistics.fmean(s.whatif_s for s in summaries)
    last = summaries[-1]
    parts = ['<section id="replay"><h2>The step replayed</h2>']
    parts.append(
        f'<p class="sub">Over {len(summaries)} analyzed steps the step took '
        f"<b>{fmt_ms(actual)} ms</b> on average; replayed with every step's root causes at "
        f"their references, <b>{fmt_ms(ideal)} ms</b>: the job runs "
        f"<b>{actual / ideal if ideal > 0 else 1.0:.2f}x</b> slower than it could "
        f"(<code>training.job.slowdown</code> after step {last.step}: {last.slowdown:.2f}).</p>"
    )
    per_step: dict[int, dict[tuple[str, str], float]] = {
        s.step: _contributors(s) for s in summaries
    }
    totals: dict[tuple[str, str], float] = defaultdict(float)
    named: dict[tuple[str, str], int] = defaultdict(int)
    for contributions in per_step.values():
        for key, saves in contributions.items():
            totals[key] += saves
            named[key] += 1
    ranked = sorted(totals, key=lambda k: (-totals[k], k))
    parts.append(_savings_table(ranked[:_MAX_SAVINGS], totals, named, len(summaries), actual))
    rows = [k for k in ranked if k[0] in ("rank", "stage", "link", "data")][:_MAX_HEAT_ROWS]
    if rows:
        steps = sorted(per_step)[-_MAX_HEAT_STEPS:]
        parts.append(f'<div class="figure">{_heatmap(rows, steps, per_step, summaries)}</div>')
    parts.append(
        '<p class="note">Saves per step: how much shorter the replayed step is with only that '
        "contributor at its reference (a rank's work at its peers' median, a stage's at the "
        "mean stage's, a link's transfers at their reference; for a kind of work, every "
        "instance of it), averaged over every analyzed step. Savings do not add up: fixing "
        "one contributor can leave the step waiting on the next.</p></section>"
    )
    return "".join(parts)


def _savings_table(
    keys: list[tuple[str, str]],
    totals: dict[tuple[str, str], float],
    named: dict[tuple[str, str], int],
    steps: int,
    actual: float,
) -> str:
    parts = [
        '<table class="savings"><tr><th>fix only</th><th>what</th>'
        '<th class="num">saves per step</th><th class="num">of the step</th>'
        '<th class="num">steps it costs in</th></tr>'
    ]
    for key in keys:
        kind, what = key
        saves = totals[key] / steps
        share = saves / actual if actual > 0 else 0.0
        parts.append(
            f'<tr class="saving" data-kind="{esc(kind)}" data-what="{esc(what)}">'
            f"<td>{esc(kind)}</td><td>{esc(what)}</td>"
            f'<td class="num">{fmt_ms(saves)} ms</td><td class="num">{100 * share:.1f}%</td>'
            f'<td class="num">{named[key]} of {steps}</td></tr>'
        )
    parts.append("</table>")
    return "".join(parts)


def _heatmap(
    rows: list[tuple[str, str]],
    steps: list[int],
    per_step: dict[int, dict[tuple[str, str], float]],
    summaries: list[StepSummary],
) -> str:
    """Rows: the ranks, stages, links and data that cost steps; columns: steps; a cell's
    strength: the share of the step that fixing it would save."""
    duration = {s.step: s.duration_s for s in summaries}
    label_w, cell_h, top = 170.0, 14.0, 24.0
    cell_w = max(2.0, min(14.0, 900.0 / max(len(steps), 1)))
    width = label_w + cell_w * len(steps) + 10
    height = top + cell_h * len(rows) + 22
    out = [
        f'<svg class="heatmap" width="{num(width)}" height="{num(height)}" '
        f'viewBox="0 0 {num(width)} {num(height)}" role="img" '
        'aria-label="what each rank, stage or link cost, step by step">',
        f'<text class="chart-title" x="0" y="14" fill="{INK}">Cost by step (share of the step '
        "its fix alone saves)</text>",
    ]
    for i, key in enumerate(rows):
        y = top + i * cell_h
        out.append(f'<g class="heat-row" data-what="{esc(key[1])}">')
        out.append(
            f'<text class="tick" x="{num(label_w - 6)}" y="{num(y + cell_h - 3)}" '
            f'text-anchor="end">{esc(key[1])}</text>'
        )
        out.append(
            f'<rect x="{num(label_w)}" y="{num(y)}" width="{num(cell_w * len(steps))}" '
            f'height="{num(cell_h - 1)}" fill="{GRID}" opacity="0.35"/>'
        )
        for j, step in enumerate(steps):
            saves = per_step[step].get(key, 0.0)
            if saves <= 0:
                continue
            share = min(1.0, saves / duration[step]) if duration[step] > 0 else 1.0
            out.append(
                f'<rect class="heat" data-what="{esc(key[1])}" data-step="{step}" '
                f'x="{num(label_w + j * cell_w)}" y="{num(y)}" width="{num(cell_w)}" '
                f'height="{num(cell_h - 1)}" fill="{FLAGGED}" opacity="{0.15 + 0.85 * share:.2f}">'
                f"<title>step {step}: {esc(key[1])} {fmt_ms(saves)} ms "
                f"({100 * share:.0f}% of the step)</title></rect>"
            )
        out.append("</g>")
    y = top + len(rows) * cell_h + 14
    out.append(
        f'<text class="tick" x="{num(label_w)}" y="{num(y)}" fill="{MUTED}">step {steps[0]}'
        f'</text><text class="tick" x="{num(label_w + cell_w * len(steps))}" y="{num(y)}" '
        f'text-anchor="end" fill="{MUTED}">step {steps[-1]}</text>'
    )
    out.append("</svg>")
    return "".join(out)
