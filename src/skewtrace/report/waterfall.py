"""The worst step as a waterfall: one row per rank on one (aligned) time axis, as SVG.

Each row has two lanes: the rank's own work on top (fetch, forward, backward, optimizer,
pacing delay) and its collectives below, where the part of a collective spent waiting for
the group's last member (its start to start + ``training.barrier.wait``) is drawn pale and
what remains (the transfer) dark. The rank's ``train.step`` is the grey band behind both.

Machine-checkable structure, for tests and scripts reading the report:

    <g class="rank-row flagged" data-rank="11" data-flagged="true" data-root-cause="true" ...>
      <rect class="seg seg-forward" ...><title>forward ...</title></rect>
    </g>

Rows of ranks flagged in the last summary carry the class ``flagged`` and
``data-flagged="true"``, a red band, a red edge and a STRAGGLER badge; every other row has
``data-flagged="false"``.
"""

from __future__ import annotations

from skewtrace import semconv
from skewtrace.report.model import SEGMENT_KINDS, RankRow, Segment, Waterfall
from skewtrace.report.svg import (
    COLORS,
    FLAGGED,
    FLAGGED_BAND,
    GRID,
    MUTED,
    Scale,
    esc,
    fmt_ms,
    line,
    nice_ticks,
    num,
    text,
)

__all__ = ["legend_html", "waterfall_svg"]

WIDTH = 1320
LABEL_W = 250
RIGHT_W = 96
AXIS_H = 30
_LEGEND = {
    "step": "train.step (the rank's iteration)",
    "fetch": semconv.SPAN_DATALOADER_FETCH,
    "forward": "forward",
    "backward": "backward",
    "optimizer": semconv.SPAN_OPTIMIZER_STEP,
    "pacing": semconv.SPAN_PACING_DELAY,
    "other": "other spans",
    "collective": "collective: transfer",
    "wait": "collective: barrier wait",
}


def legend_html(kinds: set[str] | None = None) -> str:
    """Swatches for the segment kinds (those in ``kinds``, or all)."""
    items = []
    for kind in SEGMENT_KINDS:
        if kinds is not None and kind not in kinds:
            continue
        items.append(
            f'<span class="legend-item"><span class="swatch" '
            f'style="background:{COLORS[kind]}"></span>{esc(_LEGEND[kind])}</span>'
        )
    items.append(
        f'<span class="legend-item"><span class="swatch" style="background:{FLAGGED}"></span>'
        "flagged straggler (row)</span>"
    )
    return '<div class="legend">' + "".join(items) + "</div>"


def _truncate(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


def _segment(seg: Segment, x: Scale, y: float, h: float) -> str:
    x0 = x(seg.start_s)
    w = max(x(seg.end_s) - x0, 0.8)
    tip = f"{seg.label}: {fmt_ms(seg.start_s)}-{fmt_ms(seg.end_s)} ms"
    if seg.detail:
        tip += f" ({seg.detail})"
    return (
        f'<rect class="seg seg-{seg.kind}" x="{num(x0)}" y="{num(y)}" width="{num(w)}" '
        f'height="{num(h)}" fill="{COLORS.get(seg.kind, COLORS["other"])}" rx="1.5">'
        f"<title>{esc(tip)}</title></rect>"
    )


def _band(row: RankRow, index: int, y: float, row_h: float) -> str:
    """The row's background, in a layer under the grid (the row's bars go over the grid)."""
    if not row.flagged and index % 2 == 0:
        return ""
    fill = FLAGGED_BAND if row.flagged else "#f6f7f9"
    return (
        f'<rect class="row-band" data-rank="{row.info.rank}" x="0" y="{num(y)}" '
        f'width="{WIDTH}" height="{num(row_h)}" fill="{fill}"/>'
    )


def _row(row: RankRow, y: float, row_h: float, x: Scale, cause: str) -> str:
    info = row.info
    classes = (
        "rank-row" + (" flagged" if row.flagged else "") + (" root-cause" if row.root_cause else "")
    )
    offset = (
        "not aligned (no annotated collective)"
        if row.clock_offset_s is None
        else f"clock offset {fmt_ms(row.clock_offset_s)} ms subtracted"
    )
    out = [
        f'<g class="{classes}" data-rank="{info.rank}" '
        f'data-flagged="{"true" if row.flagged else "false"}" '
        f'data-root-cause="{"true" if row.root_cause else "false"}" '
        f'data-host="{esc(info.host)}" data-switch="{esc(info.switch)}" '
        f'data-nic="{esc(info.nic)}" transform="translate(0,{num(y)})">'
    ]
    if row.flagged:
        out.append(f'<rect x="0" y="0" width="5" height="{num(row_h)}" fill="{FLAGGED}"/>')
    compact = row_h < 26
    label_y = row_h / 2 + 4 if compact else 13
    out.append(
        text(
            12,
            label_y,
            f"rank {info.rank}",
            cls="rank-label",
            fill=FLAGGED if row.flagged else None,
        )
    )
    meta = f"{info.host} \u00b7 {info.switch} \u00b7 {info.nic}"
    if info.worker:  # an imported what-if worker: which one first
        meta = f"{info.worker} \u00b7 {meta}"
    # One line per row when compact: the badge is shortened and the topology cut to fit.
    badge_room = 80 if row.flagged or row.root_cause else 0
    if compact:
        out.append(
            text(78, label_y, _truncate(meta, (LABEL_W - 90 - badge_room) // 6), cls="rank-meta")
        )
    else:
        out.append(text(12, 26, _truncate(meta, 38), cls="rank-meta"))
    if row.flagged:
        badge = f"STRAGGLER \u00b7 {cause}" if cause and not compact else "STRAGGLER"
        bw = 7.0 * len(badge) + 12
        bx = LABEL_W - bw - 8
        out.append(
            f'<g class="badge flagged-badge"><rect x="{num(bx)}" y="{num(label_y - 11)}" '
            f'width="{num(bw)}" height="15" rx="7.5" fill="{FLAGGED}"/>'
            + text(bx + bw / 2, label_y, badge, cls="badge-text", anchor="middle", fill="#fff")
            + "</g>"
        )
    elif row.root_cause:
        badge = "root cause"
        bw = 6.2 * len(badge) + 12
        bx = LABEL_W - bw - 8
        out.append(
            f'<g class="badge"><rect x="{num(bx)}" y="{num(label_y - 11)}" width="{num(bw)}" '
            f'height="15" rx="7.5" fill="none" stroke="#b26b00"/>'
            + text(bx + bw / 2, label_y, badge, cls="badge-text", anchor="middle", fill="#b26b00")
            + "</g>"
        )
    out.append(f"<title>rank {info.rank} on {esc(meta)}; {esc(offset)}</title>")
    pad = 2.0
    lane_h = (row_h - 3 * pad) / 2
    by_kind = {kind: [s for s in row.segments if s.kind == kind] for kind in SEGMENT_KINDS}
    for seg in by_kind["step"]:
        out.append(_segment(seg, x, pad, row_h - 2 * pad))
    for kind in ("fetch", "forward", "backward", "optimizer", "pacing", "other"):
        for seg in by_kind[kind]:
            out.append(_segment(seg, x, pad + 1, lane_h - 1))
    for kind in ("collective", "wait"):
        for seg in by_kind[kind]:
            out.append(_segment(seg, x, 2 * pad + lane_h, lane_h - 1))
    late = f"+{fmt_ms(row.lateness_s)} ms" if row.lateness_s > 0 else "0 ms"
    out.append(
        text(
            WIDTH - 10,
            row_h / 2 + 4,
            late,
            cls="row-late",
            anchor="end",
            fill=FLAGGED if row.flagged else None,
        )
    )
    out.append("</g>")
    return "".join(out)


def waterfall_svg(waterfall: Waterfall, causes: dict[int, str]) -> str:
    """The SVG of the waterfall; ``causes`` gives the flagged ranks' causes for their badges."""
    rows = waterfall.rows
    row_h = 30.0 if len(rows) <= 48 else 20.0
    plot_x0, plot_x1 = LABEL_W + 8, WIDTH - RIGHT_W - 8
    extent_ms = max(waterfall.extent_s * 1e3, 1e-3)
    ticks = nice_ticks(0.0, extent_ms, 10)
    x = Scale(0.0, extent_ms / 1e3, plot_x0, plot_x1)
    top = AXIS_H
    height = top + row_h * len(rows) + AXIS_H + 6
    bottom = top + row_h * len(rows)
    out = [
        f'<svg class="waterfall" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{num(height)}" viewBox="0 0 {WIDTH} {num(height)}" role="img" '
        f'aria-label="waterfall of step {waterfall.step}" data-step="{waterfall.step}">'
    ]
    out.append(text(12, 18, "rank \u00b7 host \u00b7 switch \u00b7 NIC", cls="axis-title"))
    out.append(text(WIDTH - 10, 18, "lateness", cls="axis-title", anchor="end"))
    grid = []
    for t in ticks:
        px = x(t / 1e3)
        grid.append(line(px, top, px, bottom, GRID))
        label = f"{t:g}"
        grid.append(text(px, top - 8, label, cls="tick", anchor="middle"))
        grid.append(text(px, bottom + 16, label, cls="tick", anchor="middle"))
    out.append(
        text(
            (plot_x0 + plot_x1) / 2,
            bottom + 30,
            "time since the step's first span, ms (host clocks aligned)",
            cls="axis-title",
            anchor="middle",
        )
    )
    out.append('<g class="row-bands">')
    out.extend(_band(row, i, top + i * row_h, row_h) for i, row in enumerate(rows))
    out.append("</g>")
    out.append('<g class="grid">' + "".join(grid) + "</g>")
    out.extend(
        _row(row, top + i * row_h, row_h, x, causes.get(row.info.rank, ""))
        for i, row in enumerate(rows)
    )
    out.append(line(plot_x0, top, plot_x0, bottom, MUTED))
    out.append("</svg>")
    return "".join(out)
