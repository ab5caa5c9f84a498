"""Checks of the Collector's verdicts that hold on a busy machine: per analyzed step, against
the job's own evidence (each step's replayed root causes) rather than a share of steps that
depends on how much else the machine ran."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import pairwise
from statistics import median
from typing import Any

from collector_harness import FileSpan
from skewtrace import semconv
from skewtrace.report.collect import parse_summary
from skewtrace.report.model import StepSummary
from span_replay import collector_constant, collector_default

# The Collector's flag hysteresis (diagnosis.Config's defaults, which otelcol.yaml keeps): a
# rank named a root cause in FLAG_K of the last FLAG_WINDOW analyzed steps is flagged, and
# stays flagged while one of the last CLEAR_STEPS names it; the first WARMUP_STEPS analyzed
# steps vote for nothing. A flag's cause is the most common known cause of the rank's last
# CAUSE_MEMORY namings, ties to the latest (diagnosis.track.vote); a rank neither flagged nor
# named in the window is forgotten, its namings with it.
# Read from the Collector's Go sources (tests/span_replay.py), not copied.
FLAG_WINDOW = int(collector_default("FlagWindow"))
FLAG_K = int(collector_default("FlagK"))
CLEAR_STEPS = int(collector_default("ClearSteps"))
WARMUP_STEPS = int(collector_constant("warmupSteps"))
CAUSE_MEMORY = int(collector_constant("causeMemory"))


def root_causes(spans: Iterable[FileSpan]) -> dict[int, dict[int, str]]:
    """Per analyzed step, the ranks its replay named root causes, with their causes."""
    return {s.step: {rc.rank: rc.cause for rc in s.root_causes} for s in _summaries(spans)}


def flagged_by_step(spans: Iterable[FileSpan]) -> dict[int, dict[int, str]]:
    """Per analyzed step, the ranks the Collector flagged after it, with their causes."""
    return {s.step: {f.rank: f.cause for f in s.flags} for s in _summaries(spans)}


def _summaries(spans: Iterable[FileSpan]) -> list[StepSummary]:
    out = []
    for span in spans:
        if span.name != semconv.SPAN_STEP_SUMMARY:
            continue
        summary = parse_summary(span)
        if summary is not None:
            out.append(summary)
    return out


def _voted(namings: list[str]) -> str:
    """The most common known cause among a rank's latest namings, ties to the latest."""
    best, best_count = semconv.CAUSE_UNKNOWN, 0
    for cause in reversed(namings):
        if cause in ("", semconv.CAUSE_UNKNOWN):
            continue
        count = namings.count(cause)
        if count > best_count:
            best, best_count = cause, count
    return best


def expected_flags(named: Mapping[int, Mapping[int, str]], rank: int) -> dict[int, str | None]:
    """Per analyzed step (in step order), the cause the Collector flags ``rank`` for given
    the steps' root causes, or None where it does not flag it: the first WARMUP_STEPS vote
    for nothing; an unflagged rank is flagged in a step that names it with FLAG_K of the last
    FLAG_WINDOW naming it; a flagged one stays flagged while one of the last CLEAR_STEPS names
    it, and forgets its namings when it clears (diagnosis.flagRule); the cause is the vote of
    its last CAUSE_MEMORY namings."""
    hist, flagged, namings, out = 0, False, [], {}
    window, clear = (1 << FLAG_WINDOW) - 1, (1 << CLEAR_STEPS) - 1
    for index, step in enumerate(sorted(named)):
        hist = (hist << 1) & window
        if index >= WARMUP_STEPS and rank in named[step]:
            hist |= 1
            namings = [*namings, named[step][rank]][-CAUSE_MEMORY:]
        if flagged and hist & clear == 0:
            flagged, hist = False, 0  # a flag that clears forgets the namings before it
        elif not flagged:
            flagged = hist & 1 != 0 and bin(hist).count("1") >= FLAG_K
        if not flagged and hist == 0:
            namings = []
        out[step] = _voted(namings) if flagged else None
    return out


def expected_flagged(named: Mapping[int, Mapping[int, str]], rank: int) -> dict[int, bool]:
    """Per analyzed step, whether the Collector's hysteresis flags ``rank`` (for any cause:
    :func:`expected_flags`)."""
    return {step: cause is not None for step, cause in expected_flags(named, rank).items()}


def flags_follow_root_causes(
    named: Mapping[int, Mapping[int, str]],
    flags: Mapping[int, Mapping[int, str]],
    rank: int,
    steps: Iterable[int],
) -> list[int]:
    """The steps of ``steps`` in which the Collector's flag of ``rank`` is not what its
    hysteresis and cause vote make of the steps' root causes (:func:`expected_flags`: not
    flagged, or flagged for the cause most of its recent namings gave). Steps without a
    summary are not judged. Which cause the replay names is the callers' to check: a rank
    descheduled mid-transfer on a busy machine is named for its network in some steps of a
    compute fault, and the flag's cause follows the majority of those."""
    expected = expected_flags(named, rank)
    missed = []
    for step in steps:
        if step not in expected or step not in flags:
            continue
        if flags[step].get(rank) != expected[step]:
            missed.append(step)
    return missed


# A rank's own work was a step's root cause when it added at least the larger of these to the
# step (diagnosis.Config's min_cost and min_cost_fraction defaults).
MIN_COST_S = collector_default("MinCost")
MIN_COST_FRACTION = collector_default("MinCostFraction")

_OWN_WORK = (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD, semconv.SPAN_OPTIMIZER_STEP)


def own_work(spans: Iterable[FileSpan]) -> dict[int, dict[int, float]]:
    """Per step, each rank's time in forward, backward and the optimizer step, less the time
    its own collectives ran inside them, in seconds. FSDP's all-gathers, tensor parallel's
    all-reduces and a pipeline stage's receives run inside forward and backward: there a rank
    that others wait for waits least, and its phases would look the shortest (an FSDP2 x TP
    run beside a CPU hog named rank 1 for compute in the steps where its phases were the
    shortest, and its phases less their collectives the longest)."""
    return _uncovered(spans, _OWN_WORK, ())


def _uncovered(
    spans: Iterable[FileSpan], measured: Iterable[str], also_covering: Iterable[str]
) -> dict[int, dict[int, float]]:
    """Per step, each rank's time in its spans named in ``measured``, less the time its
    collectives (and its spans named in ``also_covering``) ran inside them, in seconds."""
    measured, also_covering = set(measured), set(also_covering)
    timed: list[tuple[int, int, int, int]] = []
    covering: dict[int, list[tuple[int, int]]] = {}
    for span in spans:
        if semconv.RANK not in span.resource:
            continue
        rank = int(span.resource[semconv.RANK])
        if span.name.startswith(semconv.SPAN_COLLECTIVE_PREFIX) or span.name in also_covering:
            covering.setdefault(rank, []).append((span.start_ns, span.end_ns))
            continue
        step = span.attributes.get(semconv.STEP)
        if span.name in measured and isinstance(step, int):
            timed.append((step, rank, span.start_ns, span.end_ns))
    out: dict[int, dict[int, float]] = {}
    for step, rank, start, end in timed:
        by_rank = out.setdefault(step, {})
        waited = _covered(covering.get(rank, ()), start, end)
        by_rank[rank] = by_rank.get(rank, 0.0) + max(end - start - waited, 0) / 1e9
    return out


def _covered(intervals: Iterable[tuple[int, int]], start: int, end: int) -> int:
    """How much of [start, end) the intervals cover (overlapping ones counted once)."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if a < end and b > start)
    covered, reach = 0, start
    for a, b in clipped:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered


def step_durations(spans: Iterable[FileSpan]) -> dict[int, list[float]]:
    """Per step, every rank's ``train.step`` duration, in seconds."""
    out: dict[int, list[float]] = {}
    for span in spans:
        step = span.attributes.get(semconv.STEP)
        if span.name == semconv.SPAN_STEP and isinstance(step, int):
            out.setdefault(step, []).append(span.duration_s)
    return out


def own_time(spans: Iterable[FileSpan]) -> dict[int, dict[int, float]]:
    """Per step, each rank's ``train.step`` less the time its collectives and the pacer's
    holds (``pacing.delay``) covered, in seconds: everything the rank did itself, inside
    its phases or between them (a rank descheduled after its backward, before it launched its
    next collective, spent that time in no phase). The Collector's own work is the same: the
    gaps between a rank's collective launches."""
    return _uncovered(spans, (semconv.SPAN_STEP,), (semconv.SPAN_PACING_DELAY,))


def long_work(
    spans: Iterable[FileSpan], min_saving: Mapping[int, float] | None = None
) -> dict[int, set[int]]:
    """Per step with own work measured, the ranks whose own work was long (none, an empty
    set): their forward, backward and optimizer step ran longer than the step's median rank by
    the root-cause bound (MIN_COST_S, or MIN_COST_FRACTION of the step's median duration), and
    by the step's ``min_saving`` where given (:func:`min_savings`: the Collector's bar with the
    job's step jitter in it)."""
    spans = list(spans)
    return _longer_than_peers(own_work(spans), step_durations(spans), min_saving)


def min_savings(spans: Iterable[FileSpan]) -> dict[int, float]:
    """Per analyzed step, the least a rank had to save to be named a root cause
    (``training.step.min_saving``), where its summary said."""
    return {s.step: s.min_saving_s for s in _summaries(spans) if s.min_saving_s > 0}


def long_own_time(spans: Iterable[FileSpan]) -> dict[int, set[int]]:
    """As :func:`long_work`, of each rank's whole :func:`own_time`."""
    spans = list(spans)
    return _longer_than_peers(own_time(spans), step_durations(spans))


def _longer_than_peers(
    by_step: Mapping[int, Mapping[int, float]],
    durations: Mapping[int, list[float]],
    min_saving: Mapping[int, float] | None = None,
) -> dict[int, set[int]]:
    bars = min_saving or {}
    out: dict[int, set[int]] = {}
    for step, ranks in by_step.items():
        out[step] = set()
        if len(ranks) < 2 or step not in durations:
            continue
        step_s = sorted(durations[step])[len(durations[step]) // 2]
        for rank, mine in ranks.items():
            others = sorted(v for r, v in ranks.items() if r != rank)
            bound = max(MIN_COST_S, MIN_COST_FRACTION * step_s, bars.get(step, 0.0))
            if mine - others[len(others) // 2] >= bound:
                out[step].add(rank)
    return out


_SEND = semconv.SPAN_COLLECTIVE_PREFIX + "send"
_RECV = semconv.SPAN_COLLECTIVE_PREFIX + "recv"


def _transfer_key(span: FileSpan, rank: int) -> tuple[object, ...] | None:
    """What joins one rank's collective span with its peers': the group and sequence number,
    and for a point-to-point transfer its sender and receiver."""
    attrs = span.attributes
    pg, seq = attrs.get(semconv.COLLECTIVE_PG), attrs.get(semconv.COLLECTIVE_SEQ)
    if not isinstance(seq, int):
        return None
    if span.name in (_SEND, _RECV):
        peer = attrs.get(semconv.COLLECTIVE_PEER)
        if not isinstance(peer, int):
            return None
        src, dst = (rank, peer) if span.name == _SEND else (peer, rank)
        return ("p2p", pg, src, dst, seq)
    return (span.name, pg, seq)


def transfers(spans: Iterable[FileSpan]) -> dict[int, dict[int, float]]:
    """Per step, each rank's time in transfers, in seconds, from the spans' own timestamps
    (one clock: the tests' ranks share one kernel), not from the Collector's annotations: every
    collective the rank took part in is joined with its peers' spans, and its transfer is the
    time from the last arrival to the (upper) median end, summed over the rank's collectives
    of the step. A slow link lengthens the transfers of every rank behind it, and so does a
    rank descheduled in the middle of one."""
    joined: dict[tuple[object, ...], list[tuple[int, int, int, int]]] = {}
    for span in spans:
        if not span.name.startswith(semconv.SPAN_COLLECTIVE_PREFIX):
            continue
        step = span.attributes.get(semconv.STEP)
        rank = span.resource.get(semconv.RANK)
        if not isinstance(step, int) or rank is None:
            continue
        key = _transfer_key(span, int(rank))
        if key is not None:
            joined.setdefault(key, []).append((step, int(rank), span.start_ns, span.end_ns))
    out: dict[int, dict[int, float]] = {}
    for members in joined.values():
        if len(members) < 2:
            continue
        last_arrival = max(start for _, _, start, _ in members)
        ends = sorted(end for _, _, _, end in members)
        transfer = max(0, ends[len(ends) // 2] - last_arrival) / 1e9
        for step, rank, _, _ in members:
            by_rank = out.setdefault(step, {})
            by_rank[rank] = by_rank.get(rank, 0.0) + transfer
    return out


# A rank's typical transfer time is this quantile of its per-step times over the run: low, so
# that a fault lasting half the run does not raise it.
_TRANSFER_REFERENCE_QUANTILE = 0.25


def long_transfers(spans: Iterable[FileSpan]) -> dict[int, set[int]]:
    """Per step with transfers measured, the ranks whose transfers were long (none, an empty
    set): longer than the rank's own typical transfer time (a low quantile of its steps) by the
    root-cause bound (MIN_COST_S, or MIN_COST_FRACTION of the step's median duration)."""
    spans = list(spans)
    durations = step_durations(spans)
    by_step = transfers(spans)
    per_rank: dict[int, list[float]] = {}
    for ranks in by_step.values():
        for rank, seconds in ranks.items():
            per_rank.setdefault(rank, []).append(seconds)
    typical = {
        rank: sorted(values)[int(_TRANSFER_REFERENCE_QUANTILE * (len(values) - 1))]
        for rank, values in per_rank.items()
    }
    out: dict[int, set[int]] = {}
    for step, ranks in by_step.items():
        out[step] = set()
        if step not in durations:
            continue
        step_s = sorted(durations[step])[len(durations[step]) // 2]
        bound = max(MIN_COST_S, MIN_COST_FRACTION * step_s)
        out[step] = {rank for rank, seconds in ranks.items() if seconds - typical[rank] >= bound}
    return out


_JUDGED_CAUSES = (
    semconv.CAUSE_COMPUTE,
    semconv.CAUSE_NETWORK,
    semconv.CAUSE_HOST_WORK,
    semconv.CAUSE_UNKNOWN,
)


def unexplained_flags(
    spans: Iterable[FileSpan], flags: Mapping[int, Mapping[int, str]], injected: int | None
) -> dict[int, list[int]]:
    """Per step, the ranks flagged for compute, network or unknown (other than ``injected``,
    the fault's rank) whose own measured times do not explain it. A rank's times are long in a
    step when its forward, backward and optimizer step (long_work) or all it did outside its
    collectives (long_own_time) ran longer than the step's median rank by the root-cause
    bound, or its transfers ran longer than its own typical transfer by that bound
    (long_transfers). A flag is explained when FLAG_K of the last FLAG_WINDOW steps were
    long, or when the Collector's hysteresis (expected_flagged) applied to the long steps
    keeps it (one of the last CLEAR_STEPS long, after it was raised). Long steps of either
    kind count for a flag of either cause, as the Collector's window counts namings of any
    cause: a rank descheduled in one step's transfers and the next step's backward is named
    for its network and then its compute, and flagged for the vote of the two. On a busy
    machine a descheduled rank really computes longer, or really takes longer over a transfer
    it was descheduled in, and then its flag is the job's own evidence, not a false one. A
    flag for ``unknown`` is a rank named for excess time that no traced phase holds (a rank
    descheduled between its phases, as DeepSpeed ZeRO-3's between its layers' gathers): its
    long own time is that evidence. Flags for data are not judged here."""
    spans = list(spans)
    kinds = (long_work(spans), long_own_time(spans), long_transfers(spans))
    evidence = {step: set().union(*(kind.get(step, set()) for kind in kinds))
                for step in set().union(*kinds)}  # fmt: skip
    steps = sorted(set(flags).union(evidence))

    held: dict[int, tuple[set[int], dict[int, bool]]] = {}
    out: dict[int, list[int]] = {}
    for step, flagged in sorted(flags.items()):
        for rank, cause in flagged.items():
            if rank == injected or cause not in _JUDGED_CAUSES:
                continue
            if rank not in held:
                long_steps = {s for s, ranks in evidence.items() if rank in ranks}
                named = {s: ({rank: cause} if s in long_steps else {}) for s in steps}
                held[rank] = long_steps, expected_flagged(named, rank)
            long_steps, kept = held[rank]
            recent = range(step - FLAG_WINDOW + 1, step + 1)
            if kept.get(step, False) or sum(s in long_steps for s in recent) >= FLAG_K:
                continue
            out.setdefault(step, []).append(rank)
    return out


def assert_false_flags_explained(
    spans: Iterable[FileSpan], false_flag_steps: Mapping[str, Iterable[int]]
) -> None:
    """The worst bug: a verdict on a rank with nothing wrong. A demo summary lists the steps
    at which a rank was flagged with no fault to explain it (``false_flag_steps``, rank to
    steps; a faulty rank's own flags during its fault are not among them); per analyzed step,
    each such flag for compute must be one the job's own timings explain (unexplained_flags:
    the rank's forward, backward and optimizer step really ran long, as on two shared cores
    running the whole suite a descheduled rank does). A flag for network is not counted
    against the job when its own transfer times explain it (they really ran long: a rank
    descheduled in the middle of its transfers shows as a slow link, and no span tells the two
    apart). The rest, network flags without that evidence (the tail of a flag whose steps cost
    just over the threshold) and flags for another cause (data, unknown), which have no
    evidence to judge them by, are tolerated for a short stretch (at most 6 rank-steps,
    counted and printed, and measured in docs/evaluation.md), never one that lasts a quarter
    of a 26-step run."""
    false = {int(rank): {int(s) for s in steps} for rank, steps in false_flag_steps.items()}
    if not any(false.values()):
        return
    spans = list(spans)
    others = {
        step: {rank: cause for rank, cause in flags.items() if step in false.get(rank, set())}
        for step, flags in flagged_by_step(spans).items()
    }
    unexplained = unexplained_flags(spans, others, injected=None)
    compute = {
        step: [rank for rank in ranks if others[step][rank] == semconv.CAUSE_COMPUTE]
        for step, ranks in unexplained.items()
    }
    assert not any(compute.values()), (false, compute, others)
    tolerated = {
        (step, rank): cause
        for step, flags in others.items()
        for rank, cause in flags.items()
        if cause != semconv.CAUSE_COMPUTE
        and (cause not in _JUDGED_CAUSES or rank in unexplained.get(step, []))
    }
    print(f"false flags without evidence, tolerated: {len(tolerated)} rank-steps {tolerated}")
    assert len(tolerated) <= 6, (false, tolerated, others)


def step_variation(spans: Iterable[FileSpan]) -> float:
    """The job's own step-to-step noise: the median change of its step time (each step's
    median over ranks) from one step to the next, over the median step time. A level shift (a
    fault from some step on) moves it by one change only; a busy machine raises it."""
    by_step = step_durations(spans)
    series = [median(by_step[step]) for step in sorted(by_step)]
    if len(series) < 3:
        return 0.0
    changes = [abs(b - a) for a, b in pairwise(series)]
    level = median(series)
    return median(changes) / level if level > 0 else 0.0


def assert_phase_flags_follow_root_causes(
    spans: list[FileSpan], phase: Mapping[str, Any], ranks: Mapping[int, str]
) -> bool:
    """Per analyzed step of a summarized run's ``phase`` (``skewtrace demo``'s summary), on the
    job's own evidence: each faulty rank of ``ranks`` (rank: the fault's cause) is flagged
    exactly where the Collector's hysteresis and cause vote make that of the steps' replayed
    root causes (:func:`flags_follow_root_causes`), from two steps after the onset (the
    fault's first steps are mixed) to the run's end (so the flag also clears where the root
    causes stop); and the replay saw the fault (named the rank for its cause in a step of the
    phase) wherever the job's own timings show it. A busy machine changes how many steps name
    it, not this. Returns whether the verdict was due in the phase: every rank's fault showed,
    and in a step of the phase the root causes made the Collector flag each of them for its
    cause and no other rank (a healthy rank descheduled beside a busy-looping straggler is
    flagged too; whether its own timings explain that is assert_false_flags_explained's)."""
    named, flagged = root_causes(spans), flagged_by_step(spans)
    first, last = phase["onset_step"], phase["steps"][1]
    long = long_work(spans)
    due = True
    phase_steps = range(first, last + 1)
    for rank, cause in ranks.items():
        missed = flags_follow_root_causes(
            named, flagged, rank, range(first + 2, max(flagged, default=0) + 1)
        )
        assert not missed, (rank, cause, missed, named, flagged)
        if cause == semconv.CAUSE_COMPUTE:
            # Busy-looped compute on two cores shared with the rest of the suite can be hidden:
            # when the healthy ranks are descheduled as long, no rank straggles. Then the job's
            # own timings show it (its work long in fewer than FLAG_K steps of the phase).
            shown = sum(rank in long.get(s, set()) for s in phase_steps)
            if shown < FLAG_K:
                due = False
                continue
        seen = [s for s in phase_steps if named.get(s, {}).get(rank) == cause]
        assert seen, (rank, cause, named)
    if not due:
        return False
    expected = {rank: expected_flags(named, rank) for rank in ranks}
    return any(
        all(expected[rank].get(s) == cause for rank, cause in ranks.items())
        and set(flagged.get(s, {})) <= set(ranks)
        for s in phase_steps
    )


def assert_phase_link_follows_link_causes(
    spans: list[FileSpan], phase: Mapping[str, Any], link: str
) -> bool:
    """As :func:`assert_phase_flags_follow_root_causes`, for a part of the fabric (``link``, a
    suspect key such as ``uplink:leaf0``) with no rank behind it to flag. Per analyzed step,
    from two steps after the onset to the run's end, the Collector suspects ``link`` exactly
    where its hysteresis (the ranks' flag rule, applied to the steps whose replay located the
    link: their ``link_causes``) makes it; and the replay located the link in a step of the
    phase wherever the job's own transfer times show the fault (two or more ranks' transfers
    long, :func:`long_transfers`, in FLAG_K or more of the phase's steps). Which steps locate
    it depends on how busy the machine is (a step whose transfers were stretched everywhere by
    descheduled ranks locates nothing, or the switch), not this. Returns whether the verdict
    was due in the phase: the fault showed, and in a step of the phase the hysteresis made the
    Collector suspect the link with no rank flagged."""
    summaries = _summaries(spans)
    located = {s.step: ({0: semconv.CAUSE_NETWORK} if any(c.key == link for c in s.link_causes)
                        else {}) for s in summaries}  # fmt: skip
    suspected = {s.step: ({0: semconv.CAUSE_NETWORK} if any(x.key == link for x in s.suspects)
                          else {}) for s in summaries}  # fmt: skip
    flagged = {s.step: s.flagged for s in summaries}
    expected = expected_flags(located, 0)
    first, last = phase["onset_step"], phase["steps"][1]
    missed = flags_follow_root_causes(
        located, suspected, 0, range(first + 2, max(suspected, default=0) + 1)
    )
    assert not missed, (link, missed, located, suspected)
    phase_steps = range(first, last + 1)
    long = long_transfers(spans)
    if sum(len(long.get(s, ())) >= 2 for s in phase_steps) < FLAG_K:
        return False
    assert any(located.get(s) for s in phase_steps), (link, located, long)
    return any(expected.get(s) is not None and not flagged.get(s) for s in phase_steps)
