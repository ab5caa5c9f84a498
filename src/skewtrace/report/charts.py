"""Per-step charts as SVG: barrier skew, each rank's lateness, step time against what-if.

x is the step, y milliseconds. Vertical markers show where a rank or a fabric suspect was
flagged (red, ``flagged``) or cleared (green, ``cleared``) after a step. A series longer than
``MAX_POINTS`` is reduced to each bucket's largest value, so peaks survive and the page stays
small for long runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from skewtrace.report.model import FlagChange, Series
from skewtrace.report.svg import (
    ACCENTS,
    CLEARED,
    FLAGGED,
    GRID,
    INK,
    MUTED,
    OTHER_RANK,
    Scale,
    downsample,
    esc,
    line,
    nice_max,
    nice_ticks,
    num,
    text,
)

__all__ = ["Line", "lateness_chart", "line_chart", "skew_chart", "step_time_chart"]

WIDTH = 1320
HEIGHT = 300
MAX_POINTS = 1200
# Past this many ranks the lateness chart draws flagged ranks alone and the others as two
# summary lines (their max and median per step).
MAX_RANK_LINES = 64
_M_LEFT, _M_RIGHT, _M_TOP, _M_BOTTOM = 64, 24, 58, 44


@dataclass
class Line:
    """One series of a chart."""

    name: str
    points: list[tuple[int, float]]
    """(step, seconds), sorted by step."""
    color: str
    width: float = 1.5
    area: bool = False
    dash: str = ""
    cls: str = ""
    legend: bool = True


def _markers(
    changes: list[FlagChange], x: Scale, y_top: float, y_bottom: float, steps: tuple[int, int]
) -> str:
    out = ['<g class="flag-markers">']
    at_step: dict[int, int] = {}
    for change in changes:
        if not steps[0] <= change.step <= steps[1]:
            continue
        px = x(change.step)
        color = FLAGGED if change.kind == "set" else CLEARED
        level = at_step.get(change.step, 0)
        at_step[change.step] = level + 1
        symbol, verb = ("\u25b2", "flagged") if change.kind == "set" else ("\u25bc", "cleared")
        out.append(
            f'<g class="flag-marker {change.kind}" data-step="{change.step}" '
            f'data-what="{esc(change.what)}">'
            + line(px, y_top, px, y_bottom, color, stroke_dasharray="4 3", stroke_width="1.2")
            + text(
                px + 4,
                y_top + 11 + 12 * (level % 4),
                f"{symbol} {change.what} {verb} after step {change.step}",
                cls="marker-label",
                fill=color,
            )
            + "</g>"
        )
    out.append("</g>")
    return "".join(out)


def line_chart(
    *,
    cls: str,
    title: str,
    y_label: str,
    lines: list[Line],
    changes: list[FlagChange],
) -> str:
    """A chart of per-step series in milliseconds, with flag markers and a legend."""
    steps = [s for ln in lines for s, _ in ln.points]
    if not steps:
        return f'<p class="empty">{esc(title)}: no data in the file.</p>'
    s0, s1 = min(steps), max(steps)
    if s1 == s0:
        s1 = s0 + 1
    # Headroom above the largest value for the flag markers' labels.
    top_ms = nice_max(max((v for ln in lines for _, v in ln.points), default=0.0) * 1e3 * 1.2)
    x = Scale(s0, s1, _M_LEFT, WIDTH - _M_RIGHT)
    y = Scale(0.0, top_ms, HEIGHT - _M_BOTTOM, _M_TOP)
    out = [
        f'<svg class="chart {cls}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(title)}">'
    ]
    out.append(text(_M_LEFT, 20, title, cls="chart-title", fill=INK))
    for t in nice_ticks(0.0, top_ms, 6):
        py = y(t)
        out.append(line(_M_LEFT, py, WIDTH - _M_RIGHT, py, GRID))
        out.append(text(_M_LEFT - 8, py + 4, f"{t:g}", cls="tick", anchor="end"))
    for t in nice_ticks(s0, s1, 12):
        if t != int(t):
            continue
        px = x(t)
        out.append(line(px, HEIGHT - _M_BOTTOM, px, HEIGHT - _M_BOTTOM + 4, MUTED))
        out.append(text(px, HEIGHT - _M_BOTTOM + 17, f"{int(t)}", cls="tick", anchor="middle"))
    out.append(line(_M_LEFT, HEIGHT - _M_BOTTOM, WIDTH - _M_RIGHT, HEIGHT - _M_BOTTOM, MUTED))
    out.append(line(_M_LEFT, _M_TOP - 6, _M_LEFT, HEIGHT - _M_BOTTOM, MUTED))
    out.append(
        text(
            (_M_LEFT + WIDTH - _M_RIGHT) / 2, HEIGHT - 8, "step", cls="axis-title", anchor="middle"
        )
    )
    mid_y = num((HEIGHT - _M_BOTTOM + _M_TOP) / 2)
    out.append(
        f'<text class="axis-title" transform="translate(16,{mid_y}) rotate(-90)" '
        f'text-anchor="middle">{esc(y_label)}</text>'
    )
    for ln in lines:
        pts = downsample(ln.points, MAX_POINTS)
        if not pts:
            continue
        coords = " ".join(f"{num(x(s))},{num(y(v * 1e3))}" for s, v in pts)
        name = esc(ln.name)
        if ln.area:
            base = y(0.0)
            area = f"{num(x(pts[0][0]))},{num(base)} {coords} {num(x(pts[-1][0]))},{num(base)}"
            out.append(
                f'<polygon class="area {ln.cls}" points="{area}" fill="{ln.color}" '
                'fill-opacity="0.18" stroke="none"/>'
            )
        dash = f' stroke-dasharray="{ln.dash}"' if ln.dash else ""
        out.append(
            f'<polyline class="series {ln.cls}" data-name="{name}" points="{coords}" '
            f'fill="none" stroke="{ln.color}" stroke-width="{ln.width}"{dash} '
            f'stroke-linejoin="round"><title>{name}</title></polyline>'
        )
        if len(pts) <= 200 and ln.width >= 2:
            for s, v in pts:
                out.append(
                    f'<circle cx="{num(x(s))}" cy="{num(y(v * 1e3))}" r="2.2" fill="{ln.color}">'
                    f"<title>{name}, step {s}: {v * 1e3:.2f} ms</title></circle>"
                )
    out.append(_markers(changes, x, _M_TOP - 6, HEIGHT - _M_BOTTOM, (min(steps), max(steps))))
    legend_x = float(WIDTH - _M_RIGHT)
    items = [ln for ln in lines if ln.legend]
    for ln in reversed(items):
        width = 7.0 * len(ln.name) + 30
        legend_x -= width
        dash = f' stroke-dasharray="{ln.dash}"' if ln.dash else ""
        out.append(
            f'<line x1="{num(legend_x)}" y1="36" x2="{num(legend_x + 18)}" y2="36" '
            f'stroke="{ln.color}" stroke-width="{max(ln.width, 2)}"{dash}/>'
        )
        out.append(text(legend_x + 23, 40, ln.name, cls="legend-text"))
    out.append("</svg>")
    return "".join(out)


def skew_chart(series: Series, changes: list[FlagChange]) -> str:
    return line_chart(
        cls="skew-chart",
        title="Barrier skew per step: the largest skew among the step's collectives",
        y_label="skew, ms",
        lines=[
            Line(
                "max barrier skew",
                sorted(series.skew_max_s.items()),
                "#5e3c99",
                width=2,
                area=True,
                cls="skew",
            )
        ],
        changes=changes,
    )


def lateness_chart(
    series: Series, flagged: set[int], highlighted: set[int], changes: list[FlagChange]
) -> str:
    """Each rank's lateness per step (summed over the step's collectives).

    flagged ranks are red and thick; ``highlighted`` ranks (flagged earlier in the run, cleared
    since) get an accent colour; every other rank is a thin grey line.
    """
    lines: list[Line] = []
    ranks = sorted(series.lateness_s)
    many = len(ranks) > MAX_RANK_LINES
    others = [r for r in ranks if r not in flagged and r not in highlighted]
    if many:
        steps = sorted({s for r in others for s in series.lateness_s[r]})
        maxes, medians = [], []
        for s in steps:
            values = sorted(series.lateness_s[r].get(s, 0.0) for r in others)
            maxes.append((s, values[-1]))
            medians.append((s, values[len(values) // 2]))
        lines.append(Line(f"max of {len(others)} other ranks", maxes, OTHER_RANK, 1.2))
        lines.append(Line("median of the others", medians, MUTED, 1.2, dash="4 3"))
    else:
        for i, r in enumerate(others):
            lines.append(
                Line(
                    "other ranks",
                    sorted(series.lateness_s[r].items()),
                    OTHER_RANK,
                    1.0,
                    cls=f"rank-line rank-{r}",
                    legend=i == 0,
                )
            )
    accents = iter(ACCENTS * 8)
    for r in sorted(highlighted - flagged):
        if r in series.lateness_s and len(lines) < MAX_RANK_LINES + 16:
            lines.append(
                Line(
                    f"rank {r} (flagged earlier)",
                    sorted(series.lateness_s[r].items()),
                    next(accents),
                    1.6,
                    cls=f"rank-line rank-{r}",
                )
            )
    for r in sorted(flagged):
        if r in series.lateness_s:
            lines.append(
                Line(
                    f"rank {r} (flagged)",
                    sorted(series.lateness_s[r].items()),
                    FLAGGED,
                    2.6,
                    cls=f"rank-line flagged rank-{r}",
                )
            )
    return line_chart(
        cls="lateness-chart",
        title="Lateness per rank and step: the sum of the rank's barrier lateness in the step",
        y_label="lateness, ms",
        lines=lines,
        changes=changes,
    )


def step_time_chart(series: Series, changes: list[FlagChange]) -> str:
    lines = [
        Line(
            "step time (analysis)",
            sorted(series.step_duration_s.items()),
            "#0072b2",
            2,
            cls="step-time",
        )
    ]
    if series.step_whatif_s:
        lines.append(
            Line(
                "what-if: root causes at their peers' median",
                sorted(series.step_whatif_s.items()),
                "#009e73",
                1.6,
                dash="6 4",
                cls="whatif",
            )
        )
    return line_chart(
        cls="step-time-chart",
        title="Step time per step, and without the step's root causes (what-if)",
        y_label="step time, ms",
        lines=lines,
        changes=changes,
    )
