"""The first component to change before a job's step time regressed.

1. The regression: each rank's mean step time (``training.step.duration``: rate of its sum
   over rate of its count) and, per sample, the job's step time as the maximum over ranks
   (synchronous training waits for the slowest). Every sustained rise of that series in the
   window is found (:func:`~.changepoint.detect`, each search starting once the previous
   rise's new level holds); the largest is the regression, the others are named in the
   notes (a host busy for a while, then the fault). The ranks whose own step time rose
   within ``slack_s`` of it are the regressed ranks.
2. The suspects: every series of :data:`~.signals.SIGNALS` on the regressed ranks' hosts (the
   collective transfer of every process group of the job, and every rank's data-loader wait:
   the job's own waits) whose level shifted with an onset
   from ``lookback_s`` before the regression to ``slack_s`` after it, and is still at its new
   level when the regression starts (a burst that ended before does not explain it). A
   change in the job's first ``startup_s`` (from its first step-time sample in the window)
   is the job starting (traffic beginning, start-up writes ending), not a cause.
3. The order: by onset. Onsets within one sampling interval (``tie_s``) cannot be ordered by
   time (targets are scraped at different phases, rates smear over their window), so such
   ties are ordered by what feeds what: switch, then NIC, host, disk and GPU signals, then
   data loader, then collective transfer, then throughput figures, the step last; then by
   the change's strength. Node telemetry reads its figures once per interval while the
   span-derived series (data loader, collectives, step) carry the time things happened, so
   a node figure's onset is compared less one telemetry interval: a throttled NIC's rate
   sampled 1.3 s after the first slow transfer through it still comes first.
4. Switches: when NIC or host signals of every node behind one switch (at least two of the
   job's nodes) change within one sampling interval of each other, they become one change
   named after the switch.

The regression itself is the last change (kind ``step``). The step number of its onset is
the regressed rank's cumulative step count at that time (approximate: the count the
Collector has seen, sampled at the scrape interval).
"""

from __future__ import annotations

import datetime
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from skewtrace import semconv
from skewtrace.timeline import signals as sig
from skewtrace.timeline.changepoint import (
    ZERO_BASELINE_RATIO,
    Change,
    DetectorParams,
    counter_rate,
    detect,
    level_ratio,
)
from skewtrace.timeline.path import Diagnosis, JobPath, agreement, read_diagnosis
from skewtrace.timeline.source import Form, Query, Series, SeriesSource

DEFAULT_LOOKBACK_S = 300.0


@dataclass(frozen=True)
class ComponentChange:
    """One component whose signal changed before (or with) the regression."""

    kind: str
    """``training.component.kind``."""
    component: str
    """``training.component``."""
    signal: str
    """``training.signal``."""
    onset: float
    before: float
    after: float
    score: float = 0.0
    order: int = 0
    """``training.change.order``: 0 for the first."""
    members: tuple[str, ...] = ()
    """For a switch: the components behind it that changed."""
    effect: bool = False
    """A throughput figure (:mod:`.signals`): not a cause on its own."""
    precedence: int = sig.EFFECT_PRECEDENCE
    """Its place among changes of one sampling interval (:func:`.signals.precedence`)."""
    lag_s: float = 0.0
    """How late its series can show a change (:func:`.signals.sample_lag_s`): the order
    compares ``onset - lag_s``; the reported onset stays the observed one."""
    per_step_ratio: float | None = None
    """For a counter: its level per step (rate over the job's step rate) after the change
    over before; None when not read."""
    why: str = ""
    """Why the job could have waited on it (:mod:`.path`); empty: it is off the job's path
    (listed in :attr:`Report.also_changed`)."""

    @property
    def ratio(self) -> float:
        return level_ratio(self.before, self.after)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "order": self.order,
            "kind": self.kind,
            "component": self.component,
            "signal": self.signal,
            "onset": self.onset,
            "ratio": self.ratio,
            "before": self.before,
            "after": self.after,
        }
        out["effect"] = self.effect
        if self.per_step_ratio is not None:
            out["per_step_ratio"] = self.per_step_ratio
        out["on_path"] = bool(self.why)
        if self.why:
            out["why"] = self.why
        if self.members:
            out["members"] = list(self.members)
        return out

    def attributes(self) -> dict[str, Any]:
        """The change as ``training.*`` attributes (span event, span)."""
        return {
            semconv.COMPONENT_KIND: self.kind,
            semconv.COMPONENT: self.component,
            semconv.SIGNAL: self.signal,
            semconv.CHANGE_ORDER: self.order,
            semconv.CHANGE_ONSET: self.onset,
            semconv.CHANGE_RATIO: self.ratio,
            semconv.CHANGE_EFFECT: self.effect,
        }


@dataclass(frozen=True)
class Regression:
    """When the job's step time rose, by how much, on which ranks."""

    onset: float
    before: float
    after: float
    ranks: tuple[int, ...]
    step: int | None = None
    """The step running at the onset (approximate), when it could be read."""

    @property
    def ratio(self) -> float:
        return level_ratio(self.before, self.after)

    def to_json(self) -> dict[str, Any]:
        return {
            "onset": self.onset,
            "ratio": self.ratio,
            "before": self.before,
            "after": self.after,
            "ranks": list(self.ranks),
            "step": self.step,
        }


@dataclass(frozen=True)
class Report:
    job: str
    start: float
    end: float
    resolution: float
    regression: Regression | None
    changes: tuple[ComponentChange, ...] = ()
    """The changes on the job's path, in order: causes, then effects, the step last."""
    notes: tuple[str, ...] = field(default=())
    also_changed: tuple[ComponentChange, ...] = ()
    """Changes of components the job did not wait on (:mod:`.path`), by onset."""
    diagnosis: Diagnosis | None = None
    """The Collector's verdicts over the same window."""
    agrees: bool | None = None
    """Whether the first cause is what the Collector concluded (None: it concluded nothing)."""
    agreement: str = ""

    @property
    def first(self) -> ComponentChange | None:
        return self.changes[0] if self.changes else None

    @property
    def first_cause(self) -> ComponentChange | None:
        """The first change that is a cause (not an effect, not the step)."""
        return next(
            (c for c in self.changes if not c.effect and c.kind != semconv.COMPONENT_STEP),
            None,
        )

    def summary(self) -> str:
        """One line: what changed first, then what followed, the step last."""
        if self.regression is None:
            return (
                f"job {self.job}: no step-time regression between {_clock(self.start)} "
                f"and {_clock(self.end)}"
            )
        return ", ".join(_describe(change) for change in self.changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "start": self.start,
            "end": self.end,
            "resolution": self.resolution,
            "regression": self.regression.to_json() if self.regression else None,
            "changes": [change.to_json() for change in self.changes],
            "also_changed": [change.to_json() for change in self.also_changed],
            "summary": self.summary(),
            "notes": list(self.notes),
            "diagnosis": None
            if self.diagnosis is None
            else {**self.diagnosis.to_json(), "agrees": self.agrees, "note": self.agreement},
        }


def _clock(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s).strftime("%H:%M:%S")


def _amount(ratio: float) -> str:
    """``+240%``; empty for a level that was zero (``... from 11:42:10`` says it started)."""
    if abs(ratio) >= ZERO_BASELINE_RATIO:
        return ""
    return f" {(ratio - 1) * 100:+.0f}%"


def _describe(change: ComponentChange) -> str:
    when = f"from {_clock(change.onset)}"
    if change.kind == semconv.COMPONENT_STEP:
        return f"step time x{change.ratio:.1f} {when}"
    if change.kind == semconv.COMPONENT_COLLECTIVE:
        return f"collective transfer {change.component}{_amount(change.ratio)} {when}"
    return f"{change.component} {change.signal}{_amount(change.ratio)} {when}"


@dataclass(frozen=True)
class Settings:
    lookback_s: float = DEFAULT_LOOKBACK_S
    """How long before the regression a change may start."""
    startup_s: float = 10.0
    """A change this soon after the job's first step-time sample is its start-up."""
    slack_s: float | None = None
    """How long after the regression's onset a change still counts (default: two samples)."""
    tie_s: float | None = None
    """Onsets this close are simultaneous (default: one sample)."""
    material_fraction: float = 0.05
    """A signal in seconds per observation (a data loader's wait per batch, a collective's
    transfer) is a suspect only when its shift, times the observations per step, is at least
    this fraction of the step time's rise."""
    telemetry_interval_s: float = 1.0
    """The ranks' node telemetry interval (``SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS``): its
    figures are read once per interval, so they can show a change up to that much late."""
    detector: DetectorParams = field(default_factory=DetectorParams)


def _job_max(per_rank: Sequence[Series]) -> tuple[list[float], list[float]]:
    """Per timestamp, the largest value over the series (timestamps of a range query align)."""
    worst: dict[float, float] = {}
    for series in per_rank:
        for t, v in zip(series.times, series.values, strict=True):
            if math.isfinite(v):
                key = round(t, 3)
                worst[key] = max(worst.get(key, -math.inf), v)
    stamps = sorted(worst)
    return stamps, [worst[t] for t in stamps]


def _rank_of(labels: Mapping[str, str]) -> int | None:
    try:
        return int(labels.get(sig.RANK, ""))
    except ValueError:
        return None


def _still_changed(series: Series, change: Change, at: float, points: int) -> bool:
    """Whether the series is past the midpoint of ``change`` from ``at`` on."""
    after = [v for t, v in zip(series.times, series.values, strict=True) if t >= at][:points]
    if not after:
        return True  # no samples after: nothing says it went back
    midpoint = (change.before + change.after) / 2
    after.sort()
    middle = after[len(after) // 2]
    return (middle - midpoint) * (change.after - change.before) > 0


# A counter's level per step must move by at least this much (as a ratio) for its change to
# be a cause: otherwise it moved with the step rate, and is the slowdown's effect.
PER_STEP_CHANGE = 0.2
# Samples on each side of a change the per-step levels are read from.
PER_STEP_SAMPLES = 10


def per_step_ratio(
    series: Series,
    onset: float,
    regression_onset: float,
    step_rate: Mapping[float, float],
    smear_s: float,
) -> float | None:
    """A counter's level per step after its change over before: its rate over the job's step
    rate, before the change's onset and once both the change and the regression are in (from
    the later onset plus the rate window). None without the job's step rate on both sides."""
    per_step = [
        (t, v / rate)
        for t, v in zip(series.times, series.values, strict=True)
        if math.isfinite(v) and (rate := step_rate.get(round(t, 3), 0.0)) > 0
    ]
    settled = max(onset, regression_onset) + smear_s
    before = [v for t, v in per_step if t < onset][-PER_STEP_SAMPLES:]
    after = [v for t, v in per_step if t >= settled][:PER_STEP_SAMPLES]
    if len(before) < 3 or len(after) < 3:
        return None
    return level_ratio(statistics.median(before), statistics.median(after))


def _job_step_rate(source: SeriesSource, job: str, start: float, end: float) -> dict[float, float]:
    """Per timestamp, the job's steps per second (the median over its ranks)."""
    per_time: dict[float, list[float]] = {}
    for series in source.series(sig.STEP_COUNT, job, start, end):
        times, rates = counter_rate(series.times, series.values)
        for t, r in zip(times, rates, strict=True):
            per_time.setdefault(round(t, 3), []).append(r)
    return {t: statistics.median(rates) for t, rates in per_time.items()}


def _per_step(
    series: Series, observations: Sequence[Series], step_rate: Mapping[float, float]
) -> float | None:
    """How many observations of ``series`` (fetches, collectives) a step has: the median over
    time of their rate over the job's step rate. None when unknown (no materiality bound)."""
    labels = {k: v for k, v in series.labels.items() if k != "__name__"}
    for candidate in observations:
        if {k: v for k, v in candidate.labels.items() if k != "__name__"} != labels:
            continue
        ratios = [
            v / step_rate[key]
            for t, v in zip(candidate.times, candidate.values, strict=True)
            if math.isfinite(v) and step_rate.get(key := round(t, 3), 0.0) > 0
        ]
        return statistics.median(ratios) if ratios else None
    return None


def _step_at(source: SeriesSource, job: str, rank: int, at: float, step_s: float) -> int | None:
    query = Query(sig.STEP_COUNT.metric, sig.STEP_COUNT.form, labels=((sig.RANK, str(rank)),))
    found = source.series(query, job, at - 4 * step_s, at)
    samples = [(t, v) for s in found for t, v in zip(s.times, s.values, strict=True) if t <= at]
    if not samples:
        return None
    return int(max(samples)[1])


def _switch_changes(
    changes: list[ComponentChange], switch_of: Mapping[str, str], tie_s: float
) -> list[ComponentChange]:
    """NIC/host changes covering every node behind a switch (2+ nodes) become one switch change."""
    nodes_behind: dict[str, set[str]] = {}
    for host, switch in switch_of.items():
        if switch and switch != semconv.UNKNOWN:
            nodes_behind.setdefault(switch, set()).add(host)
    out = list(changes)
    for switch, nodes in sorted(nodes_behind.items()):
        if len(nodes) < 2:
            continue
        network = [
            c
            for c in out
            if c.kind in (semconv.COMPONENT_NIC, semconv.COMPONENT_HOST)
            and not c.effect
            and c.component.split("/")[0] in nodes
        ]
        network.sort(key=lambda c: c.onset)
        # The earliest group of such changes, within one sampling interval, that covers all nodes.
        for i, first in enumerate(network):
            group = [c for c in network[i:] if c.onset - first.onset <= tie_s]
            if {c.component.split("/")[0] for c in group} == nodes:
                members = tuple(sorted({c.component for c in group}))
                merged = ComponentChange(
                    kind=semconv.COMPONENT_SWITCH,
                    component=switch,
                    signal=first.signal,
                    onset=first.onset,
                    before=first.before,
                    after=first.after,
                    score=first.score,
                    members=members,
                    precedence=sig.PRECEDENCE[semconv.COMPONENT_SWITCH],
                )
                out = [c for c in out if c not in group] + [merged]
                break
    return out


def _earliest_per_component(
    changes: Iterable[ComponentChange], tie_s: float
) -> list[ComponentChange]:
    """One change per component: its first signal to change (the report names components)."""
    best: dict[tuple[str, str], ComponentChange] = {}
    for change in order_changes(changes, tie_s):
        best.setdefault((change.kind, change.component), change)
    return list(best.values())


def order_changes(changes: Iterable[ComponentChange], tie_s: float) -> list[ComponentChange]:
    """Causes, then effects, then the step; each by onset, and within one sampling interval
    of a group's first onset by precedence, then onset, then strength. Numbers them from 0.
    Onsets are compared less each change's ``lag_s`` (a sampled gauge shows a change late).

    An effect (a throughput figure, or a signal that changed the way that does not hurt)
    never leads: whenever it changed, it cannot be what made the step slower."""
    changes = list(changes)
    ordered: list[ComponentChange] = []
    for part in (
        [c for c in changes if not c.effect and c.kind != semconv.COMPONENT_STEP],
        [c for c in changes if c.effect and c.kind != semconv.COMPONENT_STEP],
        [c for c in changes if c.kind == semconv.COMPONENT_STEP],
    ):
        remaining = sorted(part, key=lambda c: (c.onset - c.lag_s, c.precedence, -c.score))
        while remaining:
            anchor = remaining[0].onset - remaining[0].lag_s
            group = [c for c in remaining if c.onset - c.lag_s - anchor <= tie_s + 1e-9]
            group.sort(key=lambda c: (c.precedence, c.onset - c.lag_s, -c.score))
            ordered.extend(group)
            remaining = remaining[len(group) :]
    return [replace(c, order=i) for i, c in enumerate(ordered)]


LINK_INTERVALS = 4
"""A component is on the job's path through a wait (a disk through a rank's loader wait) only
when the two changes are dated within this many sampling intervals (plus one telemetry
interval of sampling lag) of each other."""

MAX_STEP_RISES = 16
"""At most this many step-time rises are told apart in one window."""


def _step_rises(
    times: Sequence[float],
    values: Sequence[float],
    detector: DetectorParams,
    smear_s: float,
    step_s: float,
) -> list[Change]:
    """Every sustained rise of the job's step time in the window, earliest first."""
    rises: list[Change] = []
    not_before: float | None = None
    while len(rises) < MAX_STEP_RISES:
        change = detect(
            times, values, detector, direction=1, not_before=not_before, smear_s=smear_s
        )
        if change is None:
            break
        rises.append(change)
        # The next one starts once this one's new level is established.
        not_before = change.onset + detector.min_after * step_s + smear_s
    return rises


def _is_read(series: Series) -> bool:
    return series.labels.get(sig.DISK_DIRECTION) == semconv.DIRECTION_READ


def _reads(series: Series, since: float, floor: float, samples: int) -> bool:
    """Whether ``series`` (a rank's ``process.io`` reads) was at ``floor`` or more in at
    least ``samples`` samples from ``since``: a rank that reads from storage, not one whose
    start-up or a stray file read moved it once."""
    pairs = zip(series.times, series.values, strict=True)
    at_floor = sum(1 for t, v in pairs if t >= since and v >= floor)
    return at_floor >= samples


def first_change(
    source: SeriesSource,
    job: str,
    start: float,
    end: float | None = None,
    settings: Settings | None = None,
) -> Report:
    """The report for ``job`` over [start, end] (end: now)."""
    cfg = settings or Settings()
    end = time.time() if end is None else end
    step_s = source.resolution(start, end)
    slack_s = 2 * step_s if cfg.slack_s is None else cfg.slack_s
    tie_s = step_s if cfg.tie_s is None else cfg.tie_s
    detector = cfg.detector

    per_rank = [s for s in source.series(sig.STEP_TIME, job, start, end) if s.times]
    if not per_rank:
        return Report(
            job,
            start,
            end,
            step_s,
            None,
            notes=(f"no {semconv.PROM_STEP_DURATION} series for the job",),
        )
    times, values = _job_max(per_rank)
    step_smear = source.smear_s(sig.STEP_TIME, start, end)
    rises = _step_rises(times, values, detector, step_smear, step_s)
    if not rises:
        return Report(job, start, end, step_s, None)
    # Several rises in the window (a busy host for a while, then the fault): the largest is
    # the regression; the others are named in the notes.
    step_change = max(rises, key=lambda c: c.ratio)
    onset = step_change.onset

    ranks: list[int] = []
    hosts: set[str] = set()
    switch_of: dict[str, str] = {}
    for series in per_rank:
        host = series.labels.get(sig.HOST, "")
        switch_of[host] = series.labels.get(sig.SWITCH, "")
        own = detect(
            series.times,
            series.values,
            detector,
            direction=1,
            not_before=onset - slack_s,
            not_after=onset + slack_s,
            smear_s=step_smear,
        )
        rank = _rank_of(series.labels)
        if own is not None and rank is not None:
            ranks.append(rank)
            hosts.add(host)
    notes: list[str] = [
        f"a smaller step-time rise x{c.ratio:.2g} from {_clock(c.onset)} is not explained here"
        for c in rises
        if c is not step_change
    ]
    if not hosts:  # the job's maximum rose but no single rank clearly did: look everywhere
        hosts = set(switch_of)
        notes.append("no single rank's step time rose clearly; all the job's hosts examined")

    # A wait or transfer whose growth, over a step's worth of them, is less than this cannot
    # explain the rise.
    material_s = cfg.material_fraction * abs(step_change.after - step_change.before)
    step_rate = _job_step_rate(source, job, start, end)
    # Traffic beginning and start-up writes ending move every series as the job starts.
    not_before = max(onset - cfg.lookback_s, min(s.times[0] for s in per_rank) + cfg.startup_s)
    changes: list[ComponentChange] = []
    # Per host with the ranks' process I/O series: whether any of its ranks reads from storage.
    reads_on: dict[str, bool] = {}
    for signal in sig.SIGNALS:
        smear_s = source.smear_s(signal.query, start, end)
        observations = (
            [] if signal.observations is None
            else source.series(signal.observations, job, start, end)
        )  # fmt: skip
        for series in source.series(signal.query, job, start, end):
            if signal.name == semconv.METRIC_PROCESS_IO and _is_read(series):
                host = series.labels.get(sig.HOST, "")
                floor = signal.floor_per_step / step_s
                reads_on[host] = reads_on.get(host, False) or _reads(
                    series, not_before, floor, detector.min_after
                )
            if signal.per_host and series.labels.get(sig.HOST, "") not in hosts:
                continue
            per_step = _per_step(series, observations, step_rate)
            change = detect(
                series.times,
                series.values,
                detector,
                not_before=not_before,
                not_after=onset + slack_s,
                min_shift=material_s / per_step if per_step else 0.0,
                min_level=signal.floor_per_step / step_s,
                smear_s=smear_s,
            )
            if change is None or not _still_changed(series, change, onset, detector.after_points):
                continue
            effect = signal.is_effect(change.before, change.after, series.labels)
            ratio_per_step = None
            if signal.query.form == Form.RATE and step_rate:
                # Work per step, not only per second: a counter whose level per step held
                # while its rate moved moved with the steps (an effect); one whose level per
                # step moved the way that hurts is a cause, whatever its rate did.
                ratio_per_step = per_step_ratio(series, change.onset, onset, step_rate, smear_s)
                worse = signal.worse_direction(series.labels)
                if ratio_per_step is not None and not signal.effect and worse != 0:
                    # Where either direction can hurt (a volume's reads: fewer when it is
                    # throttled, more when something else reads it), a level per step that
                    # held says nothing: a throttled volume slows the reads and the steps
                    # alike. There the direction rule stands (docs/timeline.md, "Limits").
                    hurts = (
                        ratio_per_step >= 1 + PER_STEP_CHANGE
                        if worse > 0
                        else ratio_per_step <= 1 / (1 + PER_STEP_CHANGE)
                    )
                    effect = not hurts
            changes.append(
                ComponentChange(
                    kind=signal.kind,
                    component=signal.component(series.labels),
                    signal=signal.signal_name(series.labels),
                    onset=change.onset,
                    before=change.before,
                    after=change.after,
                    score=change.score,
                    effect=effect,
                    per_step_ratio=ratio_per_step,
                    precedence=sig.precedence(signal, effect),
                    lag_s=sig.sample_lag_s(signal, cfg.telemetry_interval_s),
                )
            )
    changes = _switch_changes(_earliest_per_component(changes, tie_s), switch_of, tie_s)
    # Only what the job could have waited on is a candidate; the rest is listed apart.
    regressed_hosts = {
        series.labels.get(sig.HOST, "") for series in per_rank if _rank_of(series.labels) in ranks
    }
    diagnosis = read_diagnosis(source, job, not_before, end)
    rise_s = step_change.after - step_change.before
    path = JobPath.of(
        changes,
        regressed_hosts,
        diagnosis,
        switch_of,
        rise_s,
        link_s=LINK_INTERVALS * tie_s + cfg.telemetry_interval_s,
        unread_hosts=[host for host, reads in reads_on.items() if not reads],
    )
    on_path: list[ComponentChange] = []
    also: list[ComponentChange] = []
    for candidate in changes:
        why = path.why(candidate)
        if why:
            on_path.append(replace(candidate, why=why))
        else:
            also.append(candidate)
    changes = on_path
    changes.append(
        ComponentChange(
            kind=semconv.COMPONENT_STEP,
            component=job,
            signal=semconv.METRIC_STEP_DURATION,
            onset=onset,
            before=step_change.before,
            after=step_change.after,
            score=step_change.score,
            precedence=sig.STEP_PRECEDENCE,
            why="the regression",
        )
    )
    step = _step_at(source, job, min(ranks), onset, step_s) if ranks else None
    regression = Regression(
        onset, step_change.before, step_change.after, tuple(sorted(ranks)), step
    )
    ordered = tuple(order_changes(changes, tie_s))
    report = Report(
        job,
        start,
        end,
        step_s,
        regression,
        ordered,
        tuple(notes),
        # Off the path: in no order of causes (order -1).
        also_changed=tuple(replace(c, order=-1) for c in sorted(also, key=lambda c: c.onset)),
        diagnosis=diagnosis,
    )
    agrees, text = agreement(report.first_cause, diagnosis, rise_s)
    return replace(report, agrees=agrees, agreement=text)
