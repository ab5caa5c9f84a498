"""The report's work-balance section: the job's step time with each global batch split by work
against split by count, for a job that ran both (``WorkBalancedSampler``, its mode switched by
configuration or by the controller).

Each step's mode is the ``training.balance.mode`` its ranks' ``dataloader.fetch`` spans carry;
its time is the longest ``train.step`` of any rank (synchronous ranks end a step together).
The job's first step (start-up) and steps whose ranks disagree on the mode are left out.

Machine-checkable hooks: ``section#balance table.balance tr.balance-mode[data-mode]`` with
``td.mean[data-seconds]``, and ``p.balance-change[data-ratio]`` (balanced over count
throughput) when the job has both.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from skewtrace import semconv
from skewtrace.report.model import ReportData
from skewtrace.report.svg import esc, fmt_ms

__all__ = ["BalanceRow", "balance_html", "balance_rows"]

_MODES = (semconv.BALANCE_COUNT, semconv.BALANCE_WORK)


@dataclass(frozen=True)
class BalanceRow:
    mode: str
    steps: int
    mean_s: float
    median_s: float
    first_step: int
    last_step: int


def balance_rows(modes: Mapping[int, str], step_s: Mapping[int, float]) -> list[BalanceRow]:
    """One row per mode (count, then work) that has steps with a time."""
    timed = sorted(s for s in modes if s in step_s and step_s[s] > 0)
    if timed and min(step_s) == timed[0]:
        timed = timed[1:]  # the job's first step: start-up, not the split
    rows = []
    for mode in _MODES:
        steps = [s for s in timed if modes[s] == mode]
        if steps:
            times = [step_s[s] for s in steps]
            rows.append(
                BalanceRow(
                    mode,
                    len(steps),
                    statistics.fmean(times),
                    statistics.median(times),
                    steps[0],
                    steps[-1],
                )
            )
    return rows


def balance_html(data: ReportData) -> str:
    """The section, or "" when no step ran under a work-balanced sampler."""
    rows = balance_rows(data.balance_modes, data.step_time_s)
    if not rows:
        return ""
    parts = ['<section id="balance"><h2>Work-balanced batches</h2>']
    by_mode = {row.mode: row for row in rows}
    count, work = by_mode.get(semconv.BALANCE_COUNT), by_mode.get(semconv.BALANCE_WORK)
    if count is not None and work is not None and work.mean_s > 0:
        ratio = count.mean_s / work.mean_s
        parts.append(
            f'<p class="sub balance-change" data-ratio="{ratio:.4f}">With each global batch split '
            f"by work the step took <b>{fmt_ms(work.mean_s)} ms</b> on average, against "
            f"<b>{fmt_ms(count.mean_s)} ms</b> split by count: <b>{ratio:.2f}x</b> the "
            f"throughput ({100 * (ratio - 1):+.1f}%).</p>"
        )
    else:
        only = rows[0]
        parts.append(
            f'<p class="sub">Every step split by <b>{esc(only.mode)}</b>; no steps of the other '
            "mode to compare with.</p>"
        )
    parts.append(
        '<table class="balance"><tr><th>split by</th><th class="num">steps</th>'
        '<th class="num">mean step</th><th class="num">median step</th><th>steps</th></tr>'
    )
    for row in rows:
        parts.append(
            f'<tr class="balance-mode" data-mode="{esc(row.mode)}"><td>{esc(row.mode)}</td>'
            f'<td class="num">{row.steps}</td>'
            f'<td class="num mean" data-seconds="{row.mean_s:.6f}">{fmt_ms(row.mean_s)} ms</td>'
            f'<td class="num">{fmt_ms(row.median_s)} ms</td>'
            f"<td>{row.first_step}-{row.last_step}</td></tr>"
        )
    parts.append(
        "</table><p class=\"note\">A step's mode is its <code>dataloader.fetch</code> spans' "
        "<code>training.balance.mode</code>, its time the longest <code>train.step</code> of any "
        "rank; the job's first step is left out. Steps of either mode at other times of the run "
        "also differ in whatever else changed between them (the machine's load, the data): "
        "compare modes that alternate, as the controller's effect guard does.</p></section>"
    )
    return "".join(parts)
