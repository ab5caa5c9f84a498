"""The main job's live terminal view (``rich``): one table row per rank, redrawn every second.

Per rank: node, switch and NIC, step time, lateness and wait over the last seconds, and the
verdict (flagged, cause, what it costs per step), and under it what each cause shown means.
Above the table: the job's progress and
step rate, the faults active now, the suspected parts of the fabric, and the pacer's
decision (active or not, the largest delays). Not on a terminal (a CI log, a pipe) it prints
one plain line per tick instead of redrawing.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from skewtrace.cluster.job import Tick
from skewtrace.report.causes import meaning


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.1f}"


def _pacing_text(pacing: dict[str, Any], enabled: bool) -> str:
    if not enabled:
        return "pacing off"
    if not pacing:
        return "pacing on (no decision yet)"
    delays = pacing.get("delays") or {}
    if not pacing.get("active") or not delays:
        return f"pacing on, idle (v{pacing.get('version', 0)})"
    top = sorted(delays.items(), key=lambda kv: -float(kv[1]))[:3]
    shown = ", ".join(f"rank {r} +{float(d) * 1e3:.1f} ms" for r, d in top)
    return f"pacing ACTIVE v{pacing.get('version', 0)}: {shown}"


def render(tick: Tick, pacing_enabled: bool, title: str = "") -> Group:
    head = Text()
    head.append(f"{title or tick.job_id}  ", style="bold")
    head.append(f"step {max(tick.step, 0) + 1}/{tick.steps}  ")
    head.append(f"{tick.steps_per_s:.1f} steps/s  ")
    head.append(_pacing_text(tick.pacing, pacing_enabled), style="cyan")
    lines = [head]
    if tick.active:
        lines.append(Text("injected now: " + "; ".join(tick.active), style="magenta"))
    suspects = sorted(k.split(":", 1)[1] for k in tick.job if k.startswith("suspect:"))
    if suspects:
        lines.append(Text("suspected fabric: " + ", ".join(suspects), style="bold red"))
    slowdown = tick.job.get("slowdown")
    if slowdown and slowdown > 1.0:
        lines.append(
            Text(
                f"what-if: steps {(1 - 1 / slowdown) * 100:.0f}% shorter with every rank's "
                f"work and transfers at their reference (slowdown {slowdown:.2f})"
            )
        )
    table = Table(expand=False, header_style="bold")
    for col, justify in (
        ("rank", "right"),
        ("node", "left"),
        ("switch", "left"),
        ("nic", "left"),
        ("step ms", "right"),
        ("late ms", "right"),
        ("wait ms", "right"),
        ("delay ms", "right"),
        ("verdict", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    delays = (tick.pacing.get("delays") or {}) if tick.pacing.get("active") else {}
    for rank in sorted(tick.ranks):
        r = tick.ranks[rank]
        verdict = Text("ok", style="green")
        if r.straggler:
            verdict = Text(
                f"STRAGGLER ({r.cause}) costs {r.cost * 1e3:.1f} ms/step", style="bold red"
            )
        delay = delays.get(str(rank))
        table.add_row(
            str(rank),
            r.host,
            r.switch,
            r.nic,
            _ms(r.step_mean),
            _ms(r.lateness_mean),
            _ms(r.wait_mean),
            "-" if delay is None else f"{float(delay) * 1e3:.1f}",
            verdict,
            style="on grey15" if r.straggler else None,
        )
    causes = sorted({r.cause for r in tick.ranks.values() if r.straggler and r.cause})
    legend = [Text(f"{cause}: {meaning(cause)}", style="dim") for cause in causes]
    return Group(Panel(Group(*lines), title="skewtrace", expand=False), table, *legend)


def plain_line(tick: Tick) -> str:
    flagged = [f"{r}({rep.cause})" for r, rep in sorted(tick.ranks.items()) if rep.straggler]
    suspects = sorted(k.split(":", 1)[1] for k in tick.job if k.startswith("suspect:"))
    return (
        f"  step {max(tick.step, 0) + 1}/{tick.steps}  {tick.steps_per_s:.1f} steps/s  "
        f"flagged: {', '.join(flagged) or '-'}  suspects: {', '.join(suspects) or '-'}"
        + (f"  injected: {'; '.join(tick.active)}" if tick.active else "")
    )


class LiveView:
    """``with LiveView(console, pacing) as view: run_job(..., on_tick=view.update)``."""

    def __init__(self, console: Console, pacing_enabled: bool, title: str = "") -> None:
        self.console = console
        self.pacing_enabled = pacing_enabled
        self.title = title
        self._live: Live | None = None
        self._last_plain = ""

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def update(self, tick: Tick) -> None:
        if self._live is not None:
            self._live.update(render(tick, self.pacing_enabled, self.title))
            return
        line = plain_line(tick)
        if line != self._last_plain:
            self.console.print(line, highlight=False, soft_wrap=True)
            self._last_plain = line

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
