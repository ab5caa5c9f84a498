"""Small SVG helpers shared by the waterfall and the charts: escaping, scales, ticks, colours.

Everything returns strings; nothing here knows about spans.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

# Okabe-Ito-like colours, told apart with the common colour-vision deficiencies; the flagged
# red is used for nothing else, so a reader (and a test) can find flagged things by it.
COLORS: dict[str, str] = {
    "step": "#e9edf3",
    "fetch": "#e69f00",
    "forward": "#56b4e9",
    "backward": "#0072b2",
    "optimizer": "#009e73",
    "pacing": "#cc79a7",
    "other": "#9a9a9a",
    "collective": "#5e3c99",
    "wait": "#cfc6e6",
}
FLAGGED = "#d62839"
FLAGGED_BAND = "#fde7ea"
CLEARED = "#1a9850"
INK = "#1f2933"
MUTED = "#6b7785"
GRID = "#e3e7ed"
OTHER_RANK = "#b4bcc7"
# Lines of ranks that are not flagged but are drawn apart (root causes of some step).
ACCENTS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#8c6d31")


def esc(value: object) -> str:
    """Text and attribute values: every span-derived string goes through this."""
    return html.escape(str(value), quote=True)


def num(value: float) -> str:
    """A coordinate: short and without exponent."""
    return f"{value:.2f}".rstrip("0").rstrip(".") if math.isfinite(value) else "0"


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds with a sensible number of digits (no unit)."""
    ms = seconds * 1e3
    if abs(ms) >= 100:
        return f"{ms:.0f}"
    if abs(ms) >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^n steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def nice_max(value: float) -> float:
    """The smallest round number at or above value (the top of a y axis)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    mag = 10 ** math.floor(math.log10(value))
    return next(m * mag for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * mag >= value)


@dataclass(frozen=True)
class Scale:
    """A linear map from a domain to pixels."""

    d0: float
    d1: float
    r0: float
    r1: float

    def __call__(self, value: float) -> float:
        if self.d1 == self.d0:
            return self.r0
        return self.r0 + (value - self.d0) * (self.r1 - self.r0) / (self.d1 - self.d0)


def text(
    x: float,
    y: float,
    content: str,
    *,
    cls: str = "",
    anchor: str = "start",
    fill: str | None = None,
    weight: str | None = None,
) -> str:
    attrs = f'x="{num(x)}" y="{num(y)}"'
    if cls:
        attrs += f' class="{cls}"'
    if anchor != "start":
        attrs += f' text-anchor="{anchor}"'
    if fill:
        attrs += f' fill="{fill}"'
    if weight:
        attrs += f' font-weight="{weight}"'
    return f"<text {attrs}>{esc(content)}</text>"


def line(x1: float, y1: float, x2: float, y2: float, stroke: str, **extra: str) -> str:
    more = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in extra.items())
    return (
        f'<line x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" '
        f'stroke="{stroke}"{more}/>'
    )


def downsample(points: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    """At most about ``limit`` points, keeping each bucket's largest value (peaks survive)."""
    if len(points) <= limit:
        return points
    size = math.ceil(len(points) / limit)
    out = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        out.append(max(bucket, key=lambda p: p[1]))
    return out
