"""The end-of-run summary: what was injected, what skewtrace concluded and how fast, and the
job's iteration-time CV and throughput with pacing off and on. Every figure comes from the
runs (their verdicts, progress and the ranks' own step statistics), none from the faults'
definitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skewtrace import semconv
from skewtrace._options import finite_number
from skewtrace.cluster.job import JobResult, job_figures
from skewtrace.cluster.outcome import Clearing, Outcome
from skewtrace.cluster.scenarios import Placement
from skewtrace.report.spans import SpanFileReader


@dataclass
class RunSummary:
    label: str
    """``pacing off`` / ``pacing on``."""
    result: JobResult
    outcome: Outcome
    figures: dict[str, float] = field(default_factory=dict)


@dataclass
class Summary:
    cluster: str
    injected: list[str]
    runs: list[RunSummary]

    def lines(self) -> list[str]:
        out = [f"cluster: {self.cluster}", "injected:"]
        out += [f"  - {line}" for line in self.injected] or ["  - nothing"]
        for run in self.runs:
            out.append(f"{run.label} (job {run.result.plan.job_id}):")
            out += [f"  {line}" for line in conclusions(run.outcome)]
        figures = [r for r in self.runs if r.figures]
        if figures:
            out.append("iteration time and throughput (the ranks' own measurements):")
            for run in figures:
                f = run.figures
                out.append(
                    f"  {run.label:<11} mean {f.get('step_time_mean_s', math.nan) * 1e3:6.1f} ms"
                    f"  CV {f.get('step_time_cv', math.nan):.3f}"
                    f"  throughput {f.get('throughput', math.nan):8.1f} samples/s"
                    + (f"  (job {run.result.plan.job_id})" if len(figures) > 2 else "")
                )
            comparison = compare(self.runs)
            if comparison is not None:
                out.append(f"  {comparison.line()}")
            paced = [r.figures for r in figures if PACED_STEPS in r.figures]
            if paced:
                total = {
                    PACED_STEPS: sum(f[PACED_STEPS] for f in paced),
                    PACING_DELAY_S: sum(f[PACING_DELAY_S] for f in paced),
                }
                runs = "" if len(paced) == 1 else f" ({len(paced)} runs)"
                out.append(f"  pacing on{runs}: {_delays(total)}")
        return out

    def as_dict(self) -> dict[str, Any]:
        comparison = compare(self.runs)
        return {
            "cluster": self.cluster,
            "injected": self.injected,
            "runs": [
                {
                    "label": run.label,
                    "job_id": run.result.plan.job_id,
                    "right": run.outcome.right,
                    "steps_analysed": run.outcome.steps_analysed,
                    "phases": [
                        {
                            "steps": [p.first, p.last],
                            "expected": p.expected.describe(),
                            "concluded": p.concluded,
                            "onset_step": p.onset_step,
                            "flag_step": p.flag_step,
                            "steps_to_flag": p.steps_to_flag,
                            "seconds_to_flag": p.flag_seconds,
                            "right": p.right,
                            "held_share": p.held_share,
                        }
                        for p in run.outcome.phases
                    ],
                    "clearings": [
                        {
                            "fault": str(c.fault),
                            "end_step": c.end_step,
                            "steps_to_clear": c.steps_to_clear,
                        }
                        for c in run.outcome.clearings
                    ],
                    "false_flags": {str(k): v for k, v in run.outcome.false_flags.items()},
                    "false_flag_steps": {
                        str(k): v for k, v in run.outcome.false_flag_steps.items()
                    },
                    "figures": run.figures,
                    "pacing": run.result.pacing,
                }
                for run in self.runs
            ],
            "comparison": None if comparison is None else comparison.as_dict(),
        }


def _clearing(c: Clearing) -> dict[str, Any]:
    return {"fault": str(c.fault), "end_step": c.end_step, "steps_to_clear": c.steps_to_clear}


def conclusions(outcome: Outcome) -> list[str]:
    out = []
    for p in outcome.phases:
        span = f"steps {p.first}-{p.last}"
        if p.expected.quiet:
            if p.expected.allowed:
                out.append(f"{span}: nothing to find beyond jitter")
            continue
        mark = "right" if p.right else "WRONG"
        out.append(f"{span}: expected {p.expected.describe()}")
        held = f", held at {p.held_share:.0%} of the steps since" if p.flag_step is not None else ""
        out.append(f"    concluded {p.concluded} [{mark}{held}]")
        if p.flag_step is None:
            out.append("    never concluded within the phase")
        else:
            seconds = "" if p.flag_seconds is None else f", {p.flag_seconds:.1f} s"
            out.append(
                f"    {p.steps_to_flag} steps{seconds} from onset (step {p.onset_step}) "
                f"to the verdict (step {p.flag_step})"
            )
    for c in outcome.clearings:
        if c.steps_to_clear is None:
            out.append(f"{c.fault} ended at step {c.end_step}; its flags did not clear")
        else:
            out.append(
                f"{c.fault} ended at step {c.end_step}; cleared {c.steps_to_clear} steps later"
            )
    if outcome.false_flags:
        shown = ", ".join(f"rank {r} at {n} steps" for r, n in sorted(outcome.false_flags.items()))
        out.append(f"false flags: {shown}")
    else:
        out.append("false flags: none")
    return out


@dataclass(frozen=True)
class Comparison:
    """Pacing on against pacing off over runs of the same job, which ran one after the other.

    Run order is in any comparison of sequential runs (a machine warming up or filling its
    caches and logs makes later runs slower or faster), so the demo runs its pairs in
    alternating order (off, on, then on, off, ...) and the change pools them: a drift that is
    linear in time cancels over each two pairs. The pairs' own changes show the spread."""

    change: float
    """Pacing on's throughput over pacing off's, minus one: each arm's samples over its time."""
    pairs: tuple[float, ...]
    """Each pair's change (consecutive runs, one of each arm), in run order."""
    order: tuple[str, ...]
    """``off`` / ``on`` per run, in run order."""
    cv_off: float
    cv_on: float
    """Each arm's iteration-time CV, the mean over its runs."""

    def line(self) -> str:
        text = f"pacing on vs pacing off: throughput {self.change * 100:+.1f}%"
        if len(self.pairs) > 1:
            spread = ", ".join(f"{p * 100:+.1f}%" for p in self.pairs)
            text += f" over {len(self.pairs)} pairs run {', '.join(self.order)} ({spread})"
        return f"{text}, CV {self.cv_off:.3f} -> {self.cv_on:.3f}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "throughput_change": self.change,
            "pairs": list(self.pairs),
            "order": list(self.order),
            "cv_off": self.cv_off,
            "cv_on": self.cv_on,
        }


def compare(runs: list[RunSummary]) -> Comparison | None:
    """Pacing on against off from runs with figures (None without a run of each arm with a
    throughput). An arm's throughput is its runs' samples over their time: the harmonic mean
    of the runs' throughputs (the runs have the same steps and batch)."""
    usable = [r for r in runs if _positive(r.figures.get("throughput"))]
    arms = {on: [r for r in usable if r.result.plan.pacing is on] for on in (False, True)}
    if not arms[False] or not arms[True]:
        return None

    def pooled(arm: list[RunSummary]) -> float:
        return len(arm) / sum(1 / r.figures["throughput"] for r in arm)

    pairs = []
    for first, second in zip(runs[::2], runs[1::2], strict=False):
        if (
            _positive(first.figures.get("throughput"))
            and _positive(second.figures.get("throughput"))
            and first.result.plan.pacing != second.result.plan.pacing
        ):
            off, on = (first, second) if second.result.plan.pacing else (second, first)
            pairs.append(on.figures["throughput"] / off.figures["throughput"] - 1)
    return Comparison(
        change=pooled(arms[True]) / pooled(arms[False]) - 1,
        pairs=tuple(pairs),
        order=tuple("on" if r.result.plan.pacing else "off" for r in usable),
        cv_off=_mean_cv(arms[False]),
        cv_on=_mean_cv(arms[True]),
    )


def _positive(value: object) -> bool:
    number = finite_number(value)
    return number is not None and number > 0


def _mean_cv(arm: list[RunSummary]) -> float:
    return sum(r.figures.get("step_time_cv", math.nan) for r in arm) / len(arm)


def pacing_order(pairs: int) -> list[bool]:
    """Whether each run is paced, for ``pairs`` pairs in alternating order: off, on, on, off,
    off, on, ... (so that a drift over the runs does not favour either arm)."""
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    return [
        paced for i in range(pairs) for paced in ((False, True) if i % 2 == 0 else (True, False))
    ]


PACED_STEPS = "paced_steps"
"""A paced run's figure: the rank-steps a pacing delay or hold was applied to."""
PACING_DELAY_S = "pacing_delay_s"
"""A paced run's figure: those delays' seconds, summed over ranks."""


def summarize_run(
    label: str, result: JobResult, outcome: Outcome, spans_path: Path | None = None
) -> RunSummary:
    """The run's figures; for a paced run with the Collector's span file, also the delays the
    ranks applied (their ``pacing.delay`` spans)."""
    figures = job_figures(result.stats)
    if result.plan.pacing and spans_path is not None:
        steps, seconds = applied_delays(spans_path, result.plan.job_id)
        figures.update({PACED_STEPS: steps, PACING_DELAY_S: round(seconds, 4)})
    return RunSummary(label, result, outcome, figures)


def applied_delays(spans_path: Path, job_id: str) -> tuple[int, float]:
    """(rank-steps delayed, seconds in all) from ``job_id``'s ``pacing.delay`` spans (a delay
    or an interleave hold above 0); (0, 0.0) without the file."""
    reader = SpanFileReader(
        spans_path,
        job=job_id,
        line_contains=semconv.SPAN_PACING_DELAY.encode(),
        include_unterminated=True,
    )
    steps, seconds = 0, 0.0
    try:
        for span in reader:
            delay = span.attributes.get(semconv.PACING_DELAY)
            if (
                span.name == semconv.SPAN_PACING_DELAY
                and isinstance(delay, (int, float))
                and math.isfinite(delay)
                and delay > 0
            ):
                steps, seconds = steps + 1, seconds + float(delay)
    except FileNotFoundError:
        pass
    return steps, seconds


def _delays(figures: dict[str, float]) -> str:
    """What pacing did in a paced run, beside its figures: a run whose ranks were never
    delayed differs from the unpaced one by the machine's own noise, not by pacing."""
    steps, seconds = int(figures[PACED_STEPS]), figures[PACING_DELAY_S]
    if steps == 0:
        return "no rank was delayed (the pacer published no delay: the runs differ by noise)"
    return f"{steps} rank-steps delayed, {seconds:.2f} s of delay in all"


def injected(faults: list[Any], where: Placement, results: list[JobResult]) -> list[str]:
    out = []
    for fault in faults:
        line = f"{fault}: {fault.describe(where)}"
        for result in results[:1]:
            on = result.switched.get(f"{fault} on")
            off = result.switched.get(f"{fault} off")
            if on is not None:
                line += f" (link switched at step {on[0]}"
                line += f", restored at step {off[0]})" if off is not None else ")"
        out.append(line)
    return out
