"""Did skewtrace conclude the right thing, and how fast: a run's verdicts against its faults.

The verdicts are the Collector's own, per step: the ``train.step.summary`` spans in the file
export (flags after the processor's hysteresis and the suspected parts of the fabric). The
faults say what should be concluded at each step (:func:`~skewtrace.cluster.scenarios.expected_at`).
A run is cut into phases where the set of active faults is constant; for each phase with
something to find:

- the step at which the expected verdict first held, counted from the phase's first step
  (for a network fault, the step the link was really switched at), and the wall time from
  the onset until the Collector's *metrics* showed it (what a person or the pacer sees);
- on what share of the phase's steps from the first match on it held (a verdict that comes
  and goes is not one to act on): the phase was concluded right when that share is at least
  :data:`HOLD_SHARE`;
- after a fault ends, how many steps until its flags cleared.

A false flag is a rank flagged at a step where no fault explains it: none active, none that
involved it within the last ``clear_grace`` steps, and none that ended with it still flagged
and has not cleared yet (that lingering is the fault's clearing, measured in steps to clear;
flagged again after its clearing, the rank is a false flag).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skewtrace import semconv
from skewtrace.cluster.job import JobResult
from skewtrace.cluster.scenarios import Expected, Fault, Placement, expected_at
from skewtrace.report.collect import parse_summary
from skewtrace.report.model import StepSummary
from skewtrace.report.spans import FileSpan, SpanFileReader


@dataclass
class StepVerdict:
    """The Collector's verdict after one analysed step, as the outcome compares it: the
    flagged ranks with their causes and costs, the suspected parts of the fabric."""

    step: int
    flagged: dict[int, str] = field(default_factory=dict)
    suspects: set[str] = field(default_factory=set)
    costs: dict[int, float] = field(default_factory=dict)
    slowdown: float = math.nan

    @classmethod
    def of(cls, summary: StepSummary) -> StepVerdict:
        """From a step summary as the package's one reader of them parsed it."""
        return cls(
            summary.step,
            flagged={f.rank: f.cause for f in summary.flags},
            suspects={s.key for s in summary.suspects},
            costs={f.rank: f.cost_s for f in summary.flags},
            slowdown=summary.slowdown,
        )

    def matches(self, expected: Expected) -> bool:
        if expected.quiet:
            return not self.flagged and not self.suspects
        return self.flagged == expected.flagged and expected.suspects <= self.suspects


def verdicts_of(spans: Iterable[FileSpan]) -> dict[str, dict[int, StepVerdict]]:
    """Per job, the Collector's verdict after each analysed step, from the
    ``train.step.summary`` spans among ``spans`` (read by
    :func:`skewtrace.report.collect.parse_summary`)."""
    out: dict[str, dict[int, StepVerdict]] = {}
    for span in spans:
        if span.name != semconv.SPAN_STEP_SUMMARY:
            continue
        summary = parse_summary(span)
        if summary is not None:
            job = str(span.resource.get(semconv.JOB_ID, ""))
            out.setdefault(job, {})[summary.step] = StepVerdict.of(summary)
    return out


def read_verdicts(spans_path: Path, job_id: str) -> dict[int, StepVerdict]:
    """The Collector's verdict after each analysed step of ``job_id``."""
    reader = SpanFileReader(
        spans_path, job=job_id, line_contains=semconv.SPAN_STEP_SUMMARY.encode()
    )
    try:
        return verdicts_of(reader).get(job_id, {})
    except FileNotFoundError:
        return {}


HOLD_SHARE = 0.75
"""Share of a phase's steps from the first right verdict on that must keep it."""


@dataclass
class Phase:
    """Steps [first, last] with one set of active faults."""

    first: int
    last: int
    expected: Expected
    onset_step: int
    onset_t: float
    flag_step: int | None = None
    flag_seconds: float | None = None
    """Onset to the first scrape of the Collector's metrics that showed the verdict."""
    held_share: float = 0.0
    """Share of the steps from ``flag_step`` to ``last`` at which the verdict held."""
    concluded: str = ""

    @property
    def right(self) -> bool:
        """Concluded right: found, and held on at least HOLD_SHARE of the steps since."""
        return self.flag_step is not None and self.held_share >= HOLD_SHARE

    @property
    def steps_to_flag(self) -> int | None:
        return None if self.flag_step is None else self.flag_step - self.onset_step


@dataclass
class Clearing:
    fault: Fault
    end_step: int
    clear_step: int | None

    @property
    def steps_to_clear(self) -> int | None:
        return None if self.clear_step is None else self.clear_step - self.end_step


@dataclass
class Outcome:
    faults: list[Fault]
    phases: list[Phase]
    clearings: list[Clearing]
    false_flag_steps: dict[int, list[int]]
    """Rank -> the steps at which it was flagged with nothing to explain it."""
    steps_analysed: int

    @property
    def false_flags(self) -> dict[int, int]:
        """Rank -> how many steps it was flagged with nothing to explain it."""
        return {rank: len(steps) for rank, steps in self.false_flag_steps.items()}

    @property
    def right(self) -> bool:
        """Every phase with something to find was concluded right, and
        nothing was flagged that should not have been."""
        return not self.false_flags and all(p.right for p in self.phases if not p.expected.quiet)


def _describe(v: StepVerdict) -> str:
    if not v.flagged and not v.suspects:
        return "nothing flagged"
    parts = [
        f"rank {r} {cause} ({v.costs.get(r, 0.0) * 1e3:.1f} ms/step)"
        for r, cause in sorted(v.flagged.items())
    ]
    return ", ".join(parts + sorted(v.suspects))


def _most_common(verdicts: dict[int, StepVerdict], phase: Phase) -> StepVerdict:
    """The verdict the phase's steps from its first right one (else all) gave most often."""
    start = phase.first if phase.flag_step is None else phase.flag_step
    counts: dict[str, tuple[int, StepVerdict]] = {}
    for s in range(start, phase.last + 1):
        v = verdicts.get(s)
        if v is None:
            continue
        key = f"{sorted(v.flagged.items())}{sorted(v.suspects)}"
        n, _ = counts.get(key, (0, v))
        counts[key] = (n + 1, v)
    return max(counts.values(), key=lambda nv: nv[0])[1]


def _onset(result: JobResult, faults: Sequence[Fault], step: int) -> tuple[int, float]:
    """The step a phase really began at (a network fault switched late begins later) and
    its wall time."""
    actual = step
    for fault in faults:
        if fault.needs_network and fault.active(step):
            switched = result.switched.get(f"{fault} on")
            if switched is not None and fault.start == step:
                actual = max(actual, switched[0])
    return actual, result.step_start(actual)


def evaluate(
    result: JobResult,
    verdicts: dict[int, StepVerdict],
    where: Placement,
    *,
    clear_grace: int = 6,
) -> Outcome:
    faults = list(result.plan.faults)
    steps = sorted(verdicts)
    phases: list[Phase] = []
    for step in steps:
        exp = expected_at(faults, step, where)
        if phases and phases[-1].expected == exp:
            phases[-1].last = step
            continue
        onset_step, onset_t = _onset(result, faults, step)
        phases.append(Phase(step, step, exp, onset_step, onset_t))
    for phase in phases:
        if phase.expected.quiet:
            continue
        for step in range(phase.onset_step, phase.last + 1):
            v = verdicts.get(step)
            if v is not None and v.matches(phase.expected):
                phase.flag_step = step
                break
        if phase.flag_step is not None:
            since = [verdicts[s] for s in range(phase.flag_step, phase.last + 1) if s in verdicts]
            phase.held_share = sum(v.matches(phase.expected) for v in since) / len(since)
        phase.concluded = _describe(_most_common(verdicts, phase))
        for obs in result.observations:
            if obs.t < phase.onset_t or obs.step > phase.last + 2:
                continue
            seen = StepVerdict(obs.step, dict(obs.flagged), set(obs.suspects))
            if seen.matches(phase.expected):
                phase.flag_seconds = obs.t - phase.onset_t
                break
    clearings = []
    for fault in faults:
        if fault.end is None or fault.kind == "jitter" or fault.end > (steps[-1] if steps else 0):
            continue
        end = fault.end
        switched = result.switched.get(f"{fault} off")
        if switched is not None:
            end = max(end, switched[0])
        ranks = set(fault.expected(where).flagged)
        suspects = set(fault.expected(where).suspects)
        clear = None
        for step in steps:
            if step < end:
                continue
            v = verdicts[step]
            if not (ranks & set(v.flagged)) and not (suspects & v.suspects):
                clear = step  # the first step without its flags; a later one is a false flag
                break
        clearings.append(Clearing(fault, end, clear))
    # A fault's own ranks still flagged after it ended are its clearing (counted above, in
    # steps to clear), not false flags; so are the ranks of the last clear_grace steps'
    # expectations (a verdict is a few steps behind the job).
    lingering = [
        (range(c.end_step, c.clear_step if c.clear_step is not None else steps[-1] + 1),
         set(c.fault.expected(where).flagged))
        for c in clearings
    ]  # fmt: skip
    false_steps: dict[int, list[int]] = {}
    for step in steps:
        window = range(max(0, step - clear_grace), step + 1)
        explained: set[int] = set()
        for s in window:
            exp = expected_at(faults, s, where)
            explained |= set(exp.flagged) | set(exp.allowed)
        for span, ranks in lingering:
            if step in span:
                explained |= ranks
        for rank in verdicts[step].flagged:
            if rank not in explained:
                false_steps.setdefault(rank, []).append(step)
    return Outcome(faults, phases, clearings, false_steps, len(steps))
